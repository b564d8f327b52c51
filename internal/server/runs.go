package server

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc/status"

	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/store"
)

// Every query run is kept as a row of query_runs (store.Run). A run whose
// id its caller gets is written before the caller hears of it: GetQueryRun
// on that id must find it at once, on any replica, and resuming a paused
// run needs the row, after a restart too. Runs that failed, and rows whose
// write failed, are written in the background, in batches; Close writes
// what is left. The same loop expires paused runs nobody decided about and
// purges finished runs past their retention.

// Run record defaults (Config.ApprovalTimeout, Config.RunRetention).
const (
	DefaultApprovalTimeout = 24 * time.Hour
	DefaultRunRetention    = 30 * 24 * time.Hour
)

// runsInterval is how often finished runs are written; sweepInterval,
// how often paused runs expire and old runs are purged, unless
// Config.RunSweepInterval says otherwise.
const (
	runsInterval  = time.Second
	sweepInterval = time.Minute
)

// runLog writes run records off the request path.
type runLog struct {
	db        *store.DB
	logger    *slog.Logger
	retention time.Duration
	sweepEach time.Duration
	// staleAfter is how long a resumed run may say running: longer, and
	// the service that ran it stopped.
	staleAfter time.Duration

	mu        sync.Mutex
	pending   []*store.Run
	lastSweep time.Time

	bg *periodic
}

func newRunLog(db *store.DB, retention, sweepEach, staleAfter time.Duration, logger *slog.Logger) *runLog {
	l := &runLog{db: db, logger: logger, retention: retention, sweepEach: sweepEach, staleAfter: staleAfter, lastSweep: time.Now()}
	l.bg = startPeriodic(min(runsInterval, sweepEach), l.flush)
	return l
}

// add queues a run for the next write.
func (l *runLog) add(r *store.Run) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending = append(l.pending, r)
}

// save writes a run now. A run that can still go on (paused, or resumed
// and running) is committed durably; a finished one asynchronously, so the
// caller does not wait for a disk flush: its row is readable all the same.
func (l *runLog) save(ctx context.Context, r *store.Run) error {
	if l.db == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if r.FinishedAt != nil {
		return l.db.SaveRunsAsyncCommit(ctx, []*store.Run{r})
	}
	return l.db.SaveRuns(ctx, []*store.Run{r})
}

// flush writes the queued runs, and sweeps when it is time. A server
// built without a store (as some tests build one) keeps nothing.
func (l *runLog) flush(ctx context.Context) {
	if l.db == nil {
		return
	}
	l.mu.Lock()
	batch := l.pending
	l.pending = nil
	sweep := time.Since(l.lastSweep) >= l.sweepEach
	if sweep {
		l.lastSweep = time.Now()
	}
	l.mu.Unlock()
	if len(batch) > 0 {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := l.db.SaveRuns(wctx, batch)
		cancel()
		if err != nil {
			l.logger.Error("write query runs; kept for the next try", slog.Int("runs", len(batch)), slog.String("error", err.Error()))
			l.mu.Lock()
			l.pending = append(batch, l.pending...)
			l.mu.Unlock()
		}
	}
	if sweep {
		l.sweep(ctx)
	}
}

// sweep expires paused runs past their time and purges old finished ones.
func (l *runLog) sweep(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if n, err := l.db.ExpireRuns(ctx, l.staleAfter); err != nil {
		l.logger.Error("expire paused query runs", slog.String("error", err.Error()))
	} else if n > 0 {
		l.logger.Info("paused query runs expired", slog.Int64("runs", n))
	}
	if n, err := l.db.PurgeRuns(ctx, time.Now().Add(-l.retention)); err != nil {
		l.logger.Error("purge old query runs", slog.String("error", err.Error()))
	} else if n > 0 {
		l.logger.Info("old query runs purged", slog.Int64("runs", n), slog.Duration("retention", l.retention))
	}
}

// Close stops the background work and writes what is left, within ctx.
func (l *runLog) Close(ctx context.Context) { l.bg.Close(ctx) }

// newRunID returns a run id; ids sort by creation time (UUIDv7), which
// ListQueryRuns' order and paging rely on.
func newRunID() string {
	return uuid.Must(uuid.NewV7()).String()
}

// runTrace is what a run row's trace holds: the result without its
// contexts (the structured content of tool results, which can be large:
// the steps' excerpts stay) and without the resume state, which has its
// own column.
type runTrace struct {
	ConnectorName string
	Result        orchestrator.Result
}

var runStatuses = map[orchestrator.Status]string{
	orchestrator.StatusCompleted:        store.RunCompleted,
	orchestrator.StatusBudgetExhausted:  store.RunBudgetExhausted,
	orchestrator.StatusPlanned:          store.RunPlanned,
	orchestrator.StatusAwaitingApproval: store.RunAwaitingApproval,
}

// runRecord is the row of a run that ended with res and err (res may be
// nil when err is set). A paused run carries its state and expiry.
func (s *Server) runRecord(ctx context.Context, base *store.Run, name string, res *orchestrator.Result, runErr error) (*store.Run, error) {
	rec := *base
	now := time.Now()
	rec.ExpiresAt, rec.FinishedAt, rec.State = nil, nil, nil
	if res == nil {
		res = &orchestrator.Result{}
	}
	b, err := traceJSON(name, res)
	if err != nil {
		return nil, err
	}
	rec.Trace = b
	rec.Answer, rec.Duration = res.Answer, res.Duration
	rec.PromptTokens, rec.CompletionTokens = res.Usage.PromptTokens, res.Usage.CompletionTokens
	switch {
	case runErr != nil:
		rec.Status, rec.Error, rec.FinishedAt = store.RunFailed, status.Convert(s.toStatus(ctx, runErr)).Message(), &now
	case res.Status == orchestrator.StatusAwaitingApproval:
		rec.Status = store.RunAwaitingApproval
		if rec.State, err = orchestrator.EncodeState(res.State); err != nil {
			return nil, err
		}
		exp := now.Add(s.cfg.ApprovalTimeout)
		rec.ExpiresAt = &exp
	default:
		rec.Status, rec.FinishedAt = runStatuses[res.Status], &now
	}
	return &rec, nil
}

// keepRun records a run. A run whose id its caller gets (one that ended
// with a result or paused, and every resumed one) is written before the
// caller hears of it, so GetQueryRun finds it at once, on every replica.
// A paused run that cannot be written fails (it could never be resumed);
// a finished one is queued for the background writer instead, and its
// caller still gets the answer. A new run that failed gives its caller no
// id: it is queued.
func (s *Server) keepRun(ctx context.Context, rec *store.Run, resumed bool) error {
	if rec.Status == store.RunFailed && !resumed {
		s.runs.add(rec)
		return nil
	}
	err := s.runs.save(ctx, rec)
	if err != nil && rec.Status != store.RunAwaitingApproval {
		s.runs.add(rec)
	}
	return err
}

// traceJSON is the trace of a run of the connector named name.
func traceJSON(name string, res *orchestrator.Result) (json.RawMessage, error) {
	tr := runTrace{ConnectorName: name, Result: *res}
	tr.Result.Contexts, tr.Result.State = nil, nil
	return json.Marshal(tr)
}

// readTrace reads a run row's trace; numbers in arguments stay as written.
func readTrace(b []byte) (runTrace, error) {
	var tr runTrace
	if len(b) == 0 {
		return tr, nil
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	err := d.Decode(&tr)
	return tr, err
}
