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
	tick := time.NewTicker(r.tickInterval())
	defer tick.Stop()
	nextUsage := time.Now().Add(r.cfg.UsageInterval)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-r.wake:
		}
		r.schedule()
		if time.Now().After(nextUsage) {
			r.expireSessions()
			r.reportUsage(ctx)
			nextUsage = time.Now().Add(r.cfg.UsageInterval)
		}
	}
}

// tickInterval is how often the loop looks for due work.
func (r *Registry) tickInterval() time.Duration {
	return max(min(r.cfg.HealthInterval, r.cfg.BackoffBase)/4, 5*time.Millisecond)
}

// schedule starts a job for each connector whose connect or check is due,
// at most Concurrency at once.
func (r *Registry) schedule() {
	now := time.Now()
	for _, c := range r.snapshot() {
		c.mu.Lock()
		due := !c.busy && !c.closed && (c.down() && !now.Before(c.nextTry) || c.sess != nil && !now.Before(c.nextCheck))
		if due {
			c.busy = true
		}
		c.mu.Unlock()
		if !due {
			continue
		}
		if !r.enter() {
			return
		}
		go func() {
			defer r.bg.Done()
			select {
			case r.sem <- struct{}{}:
			case <-r.life.Done():
				return
			}
			defer func() { <-r.sem }()
			c.check()
			c.mu.Lock()
			c.busy = false
			c.mu.Unlock()
		}()
	}
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
			c.close()
			r.reportConn(context.Background(), c)
		}()
	}
	wg.Wait()
	r.cancel()
	r.bg.Wait()
	r.metrics.stop()
	r.logger.Info("registry closed", slog.Int("connections", len(conns)))
}
