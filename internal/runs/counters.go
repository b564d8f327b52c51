package runs

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	noopmetric "go.opentelemetry.io/otel/metric/noop"

	"github.com/connector-svc/connector-svc/internal/store"
)

// CounterStore adds to a connector's counters.
type CounterStore interface {
	AddCounters(ctx context.Context, id int64, d store.Counters) error
}

// Counters gathers the counters of connectors' calls, queries and input
// requests in memory and writes them to the store in the background (Run),
// one statement per connector per interval, so no call waits for a write.
// A write that fails is kept and tried again with the next one. Input
// requests' outcomes go to the connector.inputs metric. Safe for
// concurrent use.
type Counters struct {
	db       CounterStore
	logger   *slog.Logger
	interval time.Duration
	inputs   metric.Int64Counter // connector.inputs

	mu      sync.Mutex
	pending map[int64]store.Counters
}

// NewCounters writes to db every interval; mp (nil: none) carries the
// connector.inputs metric.
func NewCounters(db CounterStore, interval time.Duration, mp metric.MeterProvider, logger *slog.Logger) *Counters {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Counters{db: db, logger: logger, interval: interval, inputs: newInputCounter(mp), pending: map[int64]store.Counters{}}
}

// Add counts d for connector id.
func (q *Counters) Add(id int64, d store.Counters) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.pending[id] = merge(q.pending[id], d)
}

// Unwritten returns what is counted for connector id but not written yet,
// so a connector's rendering is exact at once.
func (q *Counters) Unwritten(id int64) store.Counters {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.pending[id]
}

// With returns stored, connector id's counters as the store has them, with
// what is counted but not written yet added, so a connector's rendering is
// exact at once.
func (q *Counters) With(id int64, stored store.Counters) store.Counters {
	return merge(stored, q.Unwritten(id))
}

// flush writes what is pending.
func (q *Counters) flush(ctx context.Context) {
	q.mu.Lock()
	batch := q.pending
	q.pending = make(map[int64]store.Counters, len(batch))
	q.mu.Unlock()
	for id, d := range batch {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := q.db.AddCounters(wctx, id, d)
		cancel()
		if err != nil {
			q.logger.Error("write query counters; kept for the next try", slog.Int64("connector_row_id", id), slog.String("error", err.Error()))
			q.Add(id, d)
		}
	}
}

// Run writes the counters every interval until ctx is done, then what is
// left, within grace, and returns nil.
func (q *Counters) Run(ctx context.Context, grace time.Duration) error {
	tick := time.NewTicker(q.interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			last, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
			defer cancel()
			q.flush(last)
			return nil
		case <-tick.C:
			q.flush(ctx)
		}
	}
}

// merge adds d to c; the later last-used time wins.
func merge(c, d store.Counters) store.Counters {
	c.Calls += d.Calls
	c.Errors += d.Errors
	c.Reconnects += d.Reconnects
	c.Reinitializations += d.Reinitializations
	c.Queries += d.Queries
	c.QueryErrors += d.QueryErrors
	c.PromptTokens += d.PromptTokens
	c.CompletionTokens += d.CompletionTokens
	c.Inputs += d.Inputs
	c.Samplings += d.Samplings
	if d.LastUsedAt != nil && (c.LastUsedAt == nil || d.LastUsedAt.After(*c.LastUsedAt)) {
		c.LastUsedAt = d.LastUsedAt
	}
	return c
}

// newInputCounter is connector.inputs on mp (nil: none).
func newInputCounter(mp metric.MeterProvider) metric.Int64Counter {
	if mp == nil {
		mp = noopmetric.NewMeterProvider()
	}
	// The meter keeps the name it had when the server counted inputs: it
	// is the otel_scope_name label of the series dashboards read.
	c, _ := mp.Meter("github.com/connector-svc/connector-svc/internal/server").Int64Counter("connector.inputs",
		metric.WithUnit("{input}"),
		metric.WithDescription("Input requests of connectors' servers to their users, by mode (form, url, sampling) and outcome: "+
			"accept, decline, cancel, timeout (nobody answered by the deadline), unanswerable (nobody could be asked) or failed."))
	return c
}

// CountInput counts an input request of c's server: asked (in the
// connector's input_count), or how it ended (in connector.inputs).
func (q *Counters) CountInput(c *store.Connector, mode, outcome string) {
	if outcome == "asked" {
		now := time.Now()
		q.Add(c.ID, store.Counters{Inputs: 1, LastUsedAt: &now})
		return
	}
	q.inputs.Add(context.Background(), 1, metric.WithAttributeSet(attribute.NewSet(attribute.String("workspace", c.WorkspaceID),
		attribute.String("connector", c.ExternalID), attribute.String("mode", mode), attribute.String("outcome", outcome))))
}
