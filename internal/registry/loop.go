package registry

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"
)

// Run connects the loaded connectors (at most Concurrency at once; calls
// are served meanwhile and wait for a connector's first connect), then
// health-checks and reconnects them until ctx is done, and finally closes
// every connection (stdio process groups included) before returning.
func (r *Registry) Run(ctx context.Context) error {
	defer r.shutdown()
	if err := r.Load(ctx); err != nil {
		return err
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.dispatch(ctx)
	}()
	defer wg.Wait()
	tick := time.NewTicker(r.cfg.UsageInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		r.expireSessions()
		r.reportUsage(ctx)
	}
}

// dispatch runs the job of each connector that comes due (see conn.arm),
// in the order they come due, at most Concurrency at once.
func (r *Registry) dispatch(ctx context.Context) {
	for {
		c := r.due.pop()
		if c == nil {
			select {
			case <-ctx.Done():
				return
			case <-r.due.wake:
			}
			continue
		}
		select {
		case r.sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		if !r.enter() {
			return
		}
		go func() {
			defer r.bg.Done()
			defer func() { <-r.sem }()
			c.job()
		}()
	}
}

// dueQueue holds the connectors whose timers fired, for dispatch.
type dueQueue struct {
	mu    sync.Mutex
	conns []*conn
	wake  chan struct{} // receives when conns may have become non-empty
}

func newDueQueue() *dueQueue { return &dueQueue{wake: make(chan struct{}, 1)} }

func (q *dueQueue) push(c *conn) {
	q.mu.Lock()
	q.conns = append(q.conns, c)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// pop returns the connector that came due first, or nil.
func (q *dueQueue) pop() *conn {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.conns) == 0 {
		return nil
	}
	c := q.conns[0]
	q.conns[0] = nil
	q.conns = q.conns[1:]
	return c
}

func (r *Registry) snapshot() []*conn {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*conn, 0, len(r.conns))
	for _, c := range r.conns {
		out = append(out, c)
	}
	return out
}

// backoff is the delay before reconnect attempt n (1-based): exponential
// with full jitter, capped.
func (r *Registry) backoff(n int) time.Duration {
	ceil := r.cfg.BackoffMax
	if n < 30 {
		ceil = min(r.cfg.BackoffBase<<(n-1), r.cfg.BackoffMax)
	}
	return time.Duration(rand.Int64N(int64(ceil) + 1))
}

// reportUsage hands each connector's counter increments to the source.
func (r *Registry) reportUsage(ctx context.Context) {
	for _, c := range r.snapshot() {
		r.reportConn(ctx, c)
	}
}

// reportConn hands c's counter increments since the last report to the
// source. It is also called for every connection the registry lets go,
// so no count is lost.
func (r *Registry) reportConn(ctx context.Context, c *conn) {
	u := Usage{
		Calls: c.usage.calls.Swap(0), Errors: c.usage.errors.Swap(0),
		Reconnects: c.usage.reconnects.Swap(0), Reinitializations: c.usage.reinits.Swap(0),
	}
	if ns := c.usage.lastUsed.Swap(0); ns != 0 {
		u.LastUsed = time.Unix(0, ns)
	}
	if u == (Usage{}) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := r.source.AddUsage(ctx, c.spec.ID, u); err != nil {
		r.logger.Error("report usage", append(c.logAttrs(), slog.String("error", err.Error()))...)
	}
}

// shutdown closes every connection in parallel and waits for background work.
func (r *Registry) shutdown() {
	r.mu.Lock()
	conns := r.conns
	r.conns, r.byRef = map[int64]*conn{}, map[ref]int64{}
	r.stopping = true
	r.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.close(ErrClosed)
			r.reportConn(context.Background(), c)
		}()
	}
	wg.Wait()
	r.cancel()
	r.bg.Wait()
	r.metrics.stop()
	r.logger.Info("registry closed", slog.Int("connections", len(conns)))
}

// arm sets c's timer to fire when its next connect or check is due, or
// stops it when none is. c.mu must be held.
func (c *conn) arm() {
	at, ok := c.dueAt()
	switch {
	case !ok:
		if c.timer != nil {
			c.timer.Stop()
		}
	case c.timer == nil:
		c.timer = time.AfterFunc(time.Until(at), func() { c.reg.due.push(c) })
	default:
		c.timer.Reset(time.Until(at))
	}
}

// dueAt returns when c's next connect (while down) or health check (while
// up) is due; false if none is. c.mu must be held.
func (c *conn) dueAt() (time.Time, bool) {
	switch {
	case c.closed:
		return time.Time{}, false
	case c.down():
		return c.nextTry, true
	case c.sess != nil && c.owner, c.spec.perUser() && c.owner:
		return c.nextCheck, true // the probe of an oauth_user connector
	}
	// A follower (see SetOwner), or a per_session connector: nothing of
	// its own to check.
	return time.Time{}, false
}

// job runs c's connect or health check if it is due, then arms c's timer
// for the next one.
func (c *conn) job() {
	c.mu.Lock()
	at, ok := c.dueAt()
	run := ok && !c.busy && !time.Now().Before(at)
	if run {
		c.busy = true
	}
	c.mu.Unlock()
	if !run {
		return // not due after all, or running: whoever moved it armed the timer
	}
	c.check()
	c.mu.Lock()
	c.busy = false
	c.arm()
	c.mu.Unlock()
}

// scheduleCheck sets c's next health check to the first moment on c's
// phase at least half an interval from now. After a check that ran on
// time that is one interval after the last, so checks of connectors
// loaded together stay spread over the interval instead of bunching up.
// c.mu must be held.
func (c *conn) scheduleCheck() {
	iv := c.reg.cfg.HealthInterval
	from := time.Now().Add(iv / 2)
	wait := (c.phase - time.Duration(from.UnixNano())%iv + iv) % iv
	c.nextCheck = from.Add(wait)
	c.arm()
}
