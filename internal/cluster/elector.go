package cluster

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/connector-svc/connector-svc/internal/store"
)

// Elector takes part in electing the one leader of the cluster, by a lease
// row with terms (as riverqueue/river's elector): it tries to elect itself
// or renew its term every Config.Heartbeat, with jitter, and trusts its
// leadership only until the start of its last successful attempt plus the
// TTL minus a safety margin, by the local clock; so a leader that cannot
// reach the database stops leading before its lease can pass to another.
// Safe for concurrent use; hooks are set before Run.
type Elector struct {
	db   Store
	cfg  Config
	wake chan struct{}

	onLead []func(ctx context.Context)

	mu           sync.Mutex
	term         time.Time // zero while not elected
	trustedUntil time.Time
	leading      bool
	stopLead     context.CancelFunc
	trustTimer   *time.Timer

	crash bool // tests: Run ends without resigning, like a killed process
}

// NewElector returns the elector of the replica cfg names.
func NewElector(db Store, cfg Config) *Elector {
	return &Elector{db: db, cfg: cfg.withDefaults(), wake: make(chan struct{}, 1)}
}

// OnLead adds a hook run, in its own goroutine, each time this replica
// becomes the leader, with a context cancelled the moment it stops being
// the leader (lease lost, trust lapsed, or Run ending). Run waits for it.
func (e *Elector) OnLead(fn func(ctx context.Context)) { e.onLead = append(e.onLead, fn) }

// IsLeader reports whether this replica leads now: elected, and within the
// time it may trust its lease.
func (e *Elector) IsLeader() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.leading && time.Now().Before(e.trustedUntil)
}

// Notified takes a payload of store.ClusterChannel: a leader event (a
// resignation), or "" after a re-LISTEN, makes Run try to elect at once.
func (e *Elector) Notified(payload string) {
	if ev := parseEvent(payload); ev.Kind == "" || ev.Kind == store.EventLeader {
		poke(e.wake)
	}
}

// safetyMargin is how much earlier than its lease a leader stops trusting
// it: river's 1 s on a 15 s TTL.
func (e *Elector) safetyMargin() time.Duration { return e.cfg.TTL / 15 }

// Run elects or renews until ctx ends, then stops leading, waits for the
// OnLead hooks to return and resigns, notifying the others. Returns nil.
func (e *Elector) Run(ctx context.Context) error {
	var hooks sync.WaitGroup
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			e.stop()
			hooks.Wait()
			e.resignAtEnd(ctx)
			return nil
		case <-timer.C:
		case <-e.wake:
		}
		e.attempt(ctx, &hooks)
		timer.Reset(e.cfg.Heartbeat + rand.N(e.cfg.Heartbeat/5+1))
	}
}

// attempt renews the current term, or elects when there is none.
func (e *Elector) attempt(ctx context.Context, hooks *sync.WaitGroup) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Heartbeat)
	defer cancel()
	e.mu.Lock()
	term := e.term
	e.mu.Unlock()
	if !term.IsZero() {
		ok, err := e.db.RenewLeader(ctx, e.cfg.ID, term, e.cfg.TTL)
		if err != nil {
			e.logFailure(ctx, "renew", err) // trust lapses on its own if this goes on
			return
		}
		if ok {
			e.trust(ctx, start, term, hooks)
			return
		}
		e.cfg.Logger.InfoContext(ctx, "cluster: leadership lost", slog.String("replica", e.cfg.ID))
		e.stop()
		e.mu.Lock()
		e.term = time.Time{}
		e.mu.Unlock()
	}
	term, ok, err := e.db.ElectLeader(ctx, e.cfg.ID, e.cfg.TTL)
	if err != nil {
		e.logFailure(ctx, "elect", err)
		return
	}
	if ok {
		e.cfg.Logger.InfoContext(ctx, "cluster: elected leader", slog.String("replica", e.cfg.ID))
		e.trust(ctx, start, term, hooks)
	}
}

func (e *Elector) logFailure(ctx context.Context, what string, err error) {
	if ctx.Err() == nil {
		e.cfg.Logger.WarnContext(ctx, "cluster: "+what+" leader failed", slog.Any("error", err))
	}
}

// trust records a successful attempt that started at start: the replica
// leads term until start + TTL - margin, and the hooks run if it was not
// leading.
func (e *Elector) trust(ctx context.Context, start, term time.Time, hooks *sync.WaitGroup) {
	until := start.Add(e.cfg.TTL - e.safetyMargin())
	e.mu.Lock()
	defer e.mu.Unlock()
	e.term, e.trustedUntil = term, until
	if e.trustTimer != nil {
		e.trustTimer.Stop()
	}
	e.trustTimer = time.AfterFunc(time.Until(until), e.lapse)
	if e.leading {
		return
	}
	e.leading = true
	leadCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	e.stopLead = cancel
	for _, fn := range e.onLead {
		hooks.Go(func() { fn(leadCtx) })
	}
}

// lapse stops leading once the trust ran out without a renewal.
func (e *Elector) lapse() {
	e.mu.Lock()
	lapsed := e.leading && !time.Now().Before(e.trustedUntil)
	e.mu.Unlock()
	if lapsed {
		e.cfg.Logger.Warn("cluster: leadership not renewed in time; stopped leading", slog.String("replica", e.cfg.ID))
		e.stop()
	}
}

// stop ends leading: the hooks' context is cancelled. The term is kept, so
// a later renewal of it can lead again.
func (e *Elector) stop() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.trustTimer != nil {
		e.trustTimer.Stop()
	}
	if e.stopLead != nil {
		e.stopLead()
		e.stopLead = nil
	}
	e.leading = false
}

func (e *Elector) resignAtEnd(ctx context.Context) {
	e.mu.Lock()
	term := e.term
	e.term = time.Time{}
	e.mu.Unlock()
	if term.IsZero() || e.crash {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaveTimeout)
	defer cancel()
	if err := e.db.ResignLeader(ctx, e.cfg.ID, term); err != nil {
		e.cfg.Logger.WarnContext(ctx, "cluster: resign failed; the lease lapses after the TTL", slog.Any("error", err))
	}
}
