// Package runs keeps the records of query runs. Log writes them off the
// request path and holds the runs this replica is resuming: while one goes
// on, its row's heartbeat is touched, so that a replica that dies during a
// run is noticed. Sweeper, which the leader alone runs, expires paused
// runs nobody decided about, fails runs whose holder stopped, and purges
// finished runs past their retention.
package runs

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/connector-svc/connector-svc/internal/store"
)

// Defaults of Config.
const (
	DefaultFlushInterval     = time.Second
	DefaultHeartbeatInterval = 10 * time.Second
	DefaultFlushGrace        = 5 * time.Second
)

// Config tunes a Log; zero values take the defaults.
type Config struct {
	// Replica is this replica's id: the holder recorded when it claims a
	// paused run to resume it.
	Replica string
	// FlushInterval is how often queued records are written (1 s);
	// HeartbeatInterval, how often held runs are touched (10 s); FlushGrace
	// bounds the last write when Run ends (5 s).
	FlushInterval, HeartbeatInterval, FlushGrace time.Duration
	Logger                                       *slog.Logger
}

// LogStore is where a Log writes: run records, and the heartbeat of the
// runs this replica holds. *store.DB implements it.
type LogStore interface {
	SaveRuns(ctx context.Context, runs []*store.Run) error
	SaveRunsAsyncCommit(ctx context.Context, runs []*store.Run) error
	TouchRuns(ctx context.Context, replica string, ids []string) (int64, error)
	GetRun(ctx context.Context, workspaceID, id string) (*store.Run, error)
}

// Log writes run records. A server without a store (as some tests build
// one) keeps nothing. Safe for concurrent use.
type Log struct {
	db  LogStore // nil: nothing is kept
	cfg Config

	mu      sync.Mutex
	pending []*store.Run
	held    map[string]int // running runs this replica holds: how many holds each
	// unwritten holds the finished runs whose callers have their ids and
	// whose rows are not written yet: GetRun reads them here.
	unwritten map[string]*store.Run
	kick      chan struct{}       // a finished run was queued: write now
	paused    map[string]struct{} // runs paused live for input here, their rows written: not finished yet
}

// NewLog returns a Log on db; Run writes what it queues.
func NewLog(db *store.DB, cfg Config) *Log {
	cfg.FlushInterval = cmp.Or(cfg.FlushInterval, DefaultFlushInterval)
	cfg.HeartbeatInterval = cmp.Or(cfg.HeartbeatInterval, DefaultHeartbeatInterval)
	cfg.FlushGrace = cmp.Or(cfg.FlushGrace, DefaultFlushGrace)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	l := &Log{cfg: cfg, held: map[string]int{}, unwritten: map[string]*store.Run{}, kick: make(chan struct{}, 1),
		paused: map[string]struct{}{}}
	if db != nil { // a nil *store.DB must stay a nil LogStore
		l.db = db
	}
	return l
}

// Replica is the holder this Log records in its claims.
func (l *Log) Replica() string { return l.cfg.Replica }

// Add queues a run for the next write.
func (l *Log) Add(r *store.Run) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending = append(l.pending, r)
}

// Save writes a run now. A run that can still go on (paused, or resumed
// and running) is committed durably; a finished one asynchronously, so the
// caller does not wait for a disk flush: its row is readable all the same.
func (l *Log) Save(ctx context.Context, r *store.Run) error {
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

// Hold marks run id as running here, claimed by this replica: Run touches
// its heartbeat until release is called.
func (l *Log) Hold(id string) (release func()) {
	l.mu.Lock()
	l.held[id]++
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.held[id]--; l.held[id] <= 0 {
			delete(l.held, id)
		}
	}
}

// Run writes the queued records every FlushInterval and touches the held
// runs' heartbeats every HeartbeatInterval, until ctx is done; then it
// writes what is left, within FlushGrace, and returns nil.
func (l *Log) Run(ctx context.Context) error {
	flush := time.NewTicker(l.cfg.FlushInterval)
	defer flush.Stop()
	beat := time.NewTicker(l.cfg.HeartbeatInterval)
	defer beat.Stop()
	for {
		select {
		case <-ctx.Done():
			last, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.FlushGrace)
			defer cancel()
			l.flush(last)
			return nil
		case <-flush.C:
			l.flush(ctx)
		case <-l.kick:
			l.flush(ctx)
		case <-beat.C:
			l.heartbeat(ctx)
		}
	}
}

// flush writes the queued runs; a batch that fails is kept for the next.
func (l *Log) flush(ctx context.Context) {
	if l.db == nil {
		return
	}
	l.mu.Lock()
	batch := l.pending
	l.pending = nil
	l.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err := l.db.SaveRuns(wctx, batch)
	cancel()
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.cfg.Logger.Error("write query runs; kept for the next try", slog.Int("runs", len(batch)), slog.String("error", err.Error()))
		l.pending = append(batch, l.pending...)
		return
	}
	for _, r := range batch {
		if l.unwritten[r.ID] == r {
			delete(l.unwritten, r.ID)
		}
	}
}

// freshFor is how long after its id was made GetRun waits for a run the
// store does not have: a finished run is written by its replica's Log
// within milliseconds of its answer (FlushInterval when writes fail).
const freshFor = 3 * time.Second

// GetRun reads run id of workspace workspaceID: a finished run of this
// replica's that is still on its way to the store from memory, else the
// store's row. A run the store does not have whose id was made less than
// freshFor ago may be on its way from another replica: GetRun waits for
// it, so that a run id its caller got reads at once on every replica.
func (l *Log) GetRun(ctx context.Context, workspaceID, id string) (*store.Run, error) {
	l.mu.Lock()
	r := l.unwritten[id]
	l.mu.Unlock()
	if r != nil && r.WorkspaceID == workspaceID {
		c := *r
		return &c, nil
	}
	for {
		run, err := l.db.GetRun(ctx, workspaceID, id)
		if !errors.Is(err, store.ErrRunNotFound) || !madeWithin(id, freshFor) {
			return run, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// madeWithin says whether id is a UUIDv7 (NewID) made less than d ago.
func madeWithin(id string, d time.Duration) bool {
	u, err := uuid.Parse(id)
	if err != nil || u.Version() != 7 {
		return false
	}
	sec, nsec := u.Time().UnixTime()
	return time.Since(time.Unix(sec, nsec)) < d
}

func (l *Log) heartbeat(ctx context.Context) {
	l.mu.Lock()
	ids := make([]string, 0, len(l.held))
	for id := range l.held {
		ids = append(ids, id)
	}
	l.mu.Unlock()
	if len(ids) == 0 || l.db == nil {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := l.db.TouchRuns(wctx, l.cfg.Replica, ids); err != nil {
		l.cfg.Logger.Warn("touch the heartbeats of resumed runs", slog.Int("runs", len(ids)), slog.String("error", err.Error()))
	}
}

// SweepStore is what a Sweeper changes: runs expired or failed, and old
// runs purged. *store.DB implements it.
type SweepStore interface {
	ExpireRuns(ctx context.Context, staleAfter time.Duration) (int64, error)
	PurgeRuns(ctx context.Context, t time.Time) (int64, error)
}

// Sweeper ends the runs nobody will end: paused runs past their approval
// time expire, resumed runs whose holder's heartbeat stopped fail, and
// finished runs past their retention are purged. Run it on one replica:
// the leader.
type Sweeper struct {
	db         SweepStore
	every      time.Duration
	retention  time.Duration
	staleAfter time.Duration
	logger     *slog.Logger
}

// NewSweeper sweeps db every interval: runs finished more than retention
// ago are purged, running ones whose heartbeat is older than staleAfter
// fail.
func NewSweeper(db SweepStore, every, retention, staleAfter time.Duration, logger *slog.Logger) *Sweeper {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Sweeper{db: db, every: every, retention: retention, staleAfter: staleAfter, logger: logger}
}

// Run sweeps at once and then every interval until ctx is done, and
// returns nil then.
func (s *Sweeper) Run(ctx context.Context) error {
	tick := time.NewTicker(s.every)
	defer tick.Stop()
	for {
		s.Sweep(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// Sweep expires, fails and purges once.
func (s *Sweeper) Sweep(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if n, err := s.db.ExpireRuns(ctx, s.staleAfter); err != nil {
		if ctx.Err() == nil {
			s.logger.Error("expire paused query runs", slog.String("error", err.Error()))
		}
	} else if n > 0 {
		s.logger.Info("query runs expired or failed", slog.Int64("runs", n))
	}
	if n, err := s.db.PurgeRuns(ctx, time.Now().Add(-s.retention)); err != nil {
		if ctx.Err() == nil {
			s.logger.Error("purge old query runs", slog.String("error", err.Error()))
		}
	} else if n > 0 {
		s.logger.Info("old query runs purged", slog.Int64("runs", n), slog.Duration("retention", s.retention))
	}
}
