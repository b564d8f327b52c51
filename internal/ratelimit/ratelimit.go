// Package ratelimit owns connectors' rate limits: a token bucket per
// connector that holds across replicas.
//
// Every call that reaches a connector's server takes a token. A direct
// call without one is refused (Allow). A query or a resume takes one to
// start the same way; then each of its tool calls takes one more through
// its gate (Throttle), waiting for it when the bucket is empty, unless the
// wait would leave the run less than a margin of its deadline (Margin): then
// the call runs at once and the bucket goes into debt. So a query that was
// admitted finishes (the margin is the time its tool call and the model's
// answer to it still need), and what comes after it waits for the bucket
// to refill.
//
// With M live replicas, each enforces its share of a limit in memory:
// rate/M per second and a burst of burst/M (rounded down), so that, with
// calls spread evenly over the replicas (client-side round robin), the
// replicas together allow the limit. A share that would round badly
// (under one call a second, or a burst under one) would let M replicas
// allow far more, or far less, than the limit: such a limit is enforced
// exactly instead, on one bucket in Postgres that every replica takes
// from, at the cost of a statement per call. When M changes, each bucket
// takes its new share at its next call.
package ratelimit

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Limit is a connector's rate_limit: PerSecond tokens a second, up to
// Burst (below 1 counts as 1). PerSecond of 0 or less is no limit.
type Limit struct {
	PerSecond float64
	Burst     int
}

func (l Limit) burst() int { return max(l.Burst, 1) }

// Exact holds the shared buckets in Postgres; *store.DB implements it.
// Declared here so this package needs no SQL.
type Exact interface {
	// TakeRateToken takes a token at at if one is there.
	TakeRateToken(ctx context.Context, id int64, rate float64, burst int, at time.Time) (taken bool, left float64, err error)
	// OweRateToken takes a token at at, in debt if none is there.
	OweRateToken(ctx context.Context, id int64, rate float64, burst int, at time.Time) (left float64, err error)
	// RateTokens is the tokens there at at.
	RateTokens(ctx context.Context, id int64, rate float64, burst int, at time.Time) (float64, error)
}

// Config is a Limiter's collaborators.
type Config struct {
	// Replicas returns M, the number of live replicas; nil, or a result
	// below 1, means 1. It is called on every take: make it cheap (an
	// atomic load).
	Replicas func() int
	// Exact holds the buckets of limits whose share rounds badly; nil
	// means none, and every limit is enforced on its share (its burst
	// rounded up to 1).
	Exact Exact
	// Logger reports a failing Exact (at most every ten seconds); nil
	// means discard.
	Logger *slog.Logger
	// Now is the clock of the buckets; nil means time.Now. Deadlines and
	// waits use real time.
	Now func() time.Time
}

// Limiter keeps the rate limit of each connector. Safe for concurrent use.
type Limiter struct {
	cfg Config

	mu      sync.Mutex
	buckets map[int64]*bucket

	lastLog atomic.Int64 // unix nanos of the last Exact failure logged
}

// bucket is a connector's limit as this replica enforces it.
type bucket struct {
	lim Limit
	m   int
	// local is this replica's share. It is also the fallback of an exact
	// bucket while Postgres fails, so a failing database neither stops
	// every call nor lifts the limit.
	local *rate.Limiter
	exact bool // take from Postgres
}

// New returns a Limiter.
func New(cfg Config) *Limiter {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Limiter{cfg: cfg, buckets: map[int64]*bucket{}}
}

// Share is what one of m replicas enforces of lim: its rate and burst,
// and whether they round well. They round badly when the rate is under
// one a second or the burst under one (then burst is 1); one replica's
// share is always lim itself.
func Share(lim Limit, m int) (perSecond float64, burst int, ok bool) {
	m = max(m, 1)
	if m == 1 {
		return lim.PerSecond, lim.burst(), true
	}
	perSecond, burst = lim.PerSecond/float64(m), lim.burst()/m
	return perSecond, max(burst, 1), perSecond >= 1 && burst >= 1
}

// replicas is M now.
func (l *Limiter) replicas() int {
	if l.cfg.Replicas == nil {
		return 1
	}
	return max(l.cfg.Replicas(), 1)
}

// bucket returns connector id's bucket for lim with M replicas, nil when
// lim sets no limit (forgetting the bucket of an earlier one). A changed
// limit gets a new, full bucket; a changed M changes the share of the
// same bucket, keeping its tokens up to the new burst.
func (l *Limiter) bucket(id int64, lim Limit) (local *rate.Limiter, exact bool) {
	if lim.PerSecond <= 0 {
		l.Forget(id)
		return nil, false
	}
	m := l.replicas()
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[id]
	if b != nil && b.lim == lim && b.m == m {
		return b.local, b.exact
	}
	r, burst, ok := Share(lim, m)
	if b == nil || b.lim != lim {
		b = &bucket{lim: lim, local: rate.NewLimiter(rate.Limit(r), burst)}
		l.buckets[id] = b
	} else {
		now := l.cfg.Now()
		b.local.SetLimitAt(now, rate.Limit(r))
		b.local.SetBurstAt(now, burst)
	}
	b.m, b.exact = m, !ok && l.cfg.Exact != nil
	return b.local, b.exact
}

// Forget drops connector id's bucket: for a deleted connector.
func (l *Limiter) Forget(id int64) {
	l.mu.Lock()
	delete(l.buckets, id)
	l.mu.Unlock()
}

// Allow takes a token of connector id's limit lim now, and reports whether
// there was one; no limit always allows. For a direct call, and for the
// start of a query or a resume.
func (l *Limiter) Allow(ctx context.Context, id int64, lim Limit) bool {
	local, exact := l.bucket(id, lim)
	if local == nil {
		return true
	}
	if exact {
		ok, _, err := l.cfg.Exact.TakeRateToken(ctx, id, lim.PerSecond, lim.burst(), l.cfg.Now())
		if err == nil {
			return ok
		}
		l.exactFailed(ctx, id, err)
	}
	return local.AllowN(l.cfg.Now(), 1)
}

// Throttle returns the gate of a query's tool calls on connector id with
// limit lim, nil without a limit: each call through it takes a token,
// waiting while the wait leaves Margin of ctx's deadline, and in debt
// past that. The gate returns ctx's error if ctx ends while it waits.
func (l *Limiter) Throttle(id int64, lim Limit) func(context.Context) error {
	if lim.PerSecond <= 0 {
		l.Forget(id)
		return nil
	}
	return func(ctx context.Context) error {
		local, exact := l.bucket(id, lim)
		if local == nil {
			return nil
		}
		if exact {
			done, err := l.waitExact(ctx, id, lim)
			if done {
				return err
			}
		}
		return l.waitLocal(ctx, local)
	}
}

// waitLocal takes a token of local, waiting as Throttle says.
func (l *Limiter) waitLocal(ctx context.Context, local *rate.Limiter) error {
	now := l.cfg.Now()
	r := local.ReserveN(now, 1)
	wait := r.DelayFrom(now)
	if wait == 0 || inDebt(ctx, wait) {
		return nil
	}
	if err := sleep(ctx, wait); err != nil {
		r.CancelAt(l.cfg.Now())
		return err
	}
	return nil
}

// MinMargin and MarginShare are the margin a gate's wait leaves before the
// run's deadline: a quarter of what is left of the run when the call
// reaches the gate, and at least 5 s. A wait that would leave less runs the
// call at once, in debt: waiting to the edge of the deadline would leave
// the call and the model's next answer no time, and the admitted query
// would end DEADLINE_EXCEEDED instead of finishing.
const (
	MinMargin   = 5 * time.Second
	MarginShare = 4
)

// Margin is the time a gate's wait must leave of left, what remains before
// a run's deadline.
func Margin(left time.Duration) time.Duration { return max(MinMargin, left/MarginShare) }

// inDebt reports whether a call must run at once, in debt, rather than
// wait: when the wait would leave less than Margin of ctx's deadline.
// Without a deadline, a call waits.
func inDebt(ctx context.Context, wait time.Duration) bool {
	deadline, ok := ctx.Deadline()
	if !ok {
		return false
	}
	left := time.Until(deadline)
	return left-wait < Margin(left)
}

// exactTimeout bounds one read or write of a shared bucket in a gate.
const exactTimeout = 2 * time.Second

// waitExact takes a token of connector id's shared bucket, waiting as
// Throttle says: it reads how far the bucket is from a token, waits that
// long, and tries again (another replica may have taken it meanwhile).
// done is false when Postgres failed and the caller should use the local
// share instead.
func (l *Limiter) waitExact(ctx context.Context, id int64, lim Limit) (done bool, err error) {
	// The bucket's reads and writes are not bounded by the call's own
	// deadline: a call whose deadline is near runs in debt, rather than
	// fail because Postgres took longer than what was left of it. Its
	// cancellation still ends the wait.
	db, cancel := context.WithTimeout(context.WithoutCancel(ctx), exactTimeout)
	defer cancel()
	defer context.AfterFunc(ctx, func() {
		if errors.Is(ctx.Err(), context.Canceled) {
			cancel()
		}
	})()
	for {
		ok, _, err := l.cfg.Exact.TakeRateToken(db, id, lim.PerSecond, lim.burst(), l.cfg.Now())
		if err != nil {
			return l.exactFailedWhile(ctx, id, err)
		}
		if ok {
			return true, nil
		}
		tokens, err := l.cfg.Exact.RateTokens(db, id, lim.PerSecond, lim.burst(), l.cfg.Now())
		if err != nil {
			return l.exactFailedWhile(ctx, id, err)
		}
		wait := max(time.Duration((1-tokens)/lim.PerSecond*float64(time.Second)), time.Millisecond)
		if inDebt(ctx, wait) {
			if _, err := l.cfg.Exact.OweRateToken(db, id, lim.PerSecond, lim.burst(), l.cfg.Now()); err != nil {
				l.exactFailed(ctx, id, err) // the call runs anyway: it would have in debt
			}
			return true, nil
		}
		if err := sleep(ctx, wait); err != nil {
			return true, err
		}
	}
}

// exactFailedWhile handles a failure of Exact during a gate's wait: the
// context's own end is the gate's answer; anything else is logged and
// the local share takes over.
func (l *Limiter) exactFailedWhile(ctx context.Context, id int64, err error) (bool, error) {
	if ctx.Err() != nil {
		return true, ctx.Err()
	}
	l.exactFailed(ctx, id, err)
	return false, nil
}

// logEvery is the least time between two logged Exact failures.
const logEvery = 10 * time.Second

// exactFailed logs a failure of Exact, at most once every logEvery.
func (l *Limiter) exactFailed(ctx context.Context, id int64, err error) {
	if ctx.Err() != nil {
		return // the caller gave up: not the database's failure
	}
	now := time.Now().UnixNano()
	last := l.lastLog.Load()
	if now-last < int64(logEvery) || !l.lastLog.CompareAndSwap(last, now) {
		return
	}
	l.cfg.Logger.WarnContext(ctx, "the shared rate limit bucket failed; this replica enforces its share of the limit meanwhile",
		slog.Int64("connector", id), slog.Any("error", err))
}

// sleep waits for d or ctx's end, and returns ctx's error then.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
