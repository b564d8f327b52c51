package registry

// A connector's health: checked, recorded and written to the source by
// its owner.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// setDown records the connector as down with cause. c.mu must be held.
func (c *conn) setDown(cause error) {
	c.silent = errors.Is(cause, errNoAnswer)
	c.refused = !c.silent && isRefusal(cause)
	c.health.State = StateDegraded
	if c.failures >= c.reg.cfg.ErrorAfter {
		c.health.State = StateError
	}
	c.health.LastError = cause.Error()
	c.health.CheckedAt = time.Now()
}

// check probes the connection with tools/list, reconnecting a connector
// that is down, and re-syncs the catalog if the tool list changed.
func (c *conn) check() Health {
	if c.spec.perUser() {
		return c.checkProbe()
	}
	c.mu.Lock()
	s, gen := c.sess, c.gen
	c.mu.Unlock()
	if s == nil {
		_ = c.connectShared(c.reg.life)
		return c.snapshot()
	}
	ctx, cancel := context.WithTimeout(c.reg.life, c.reg.cfg.HealthTimeout)
	defer cancel()
	start := time.Now()
	seq := c.syncSeq.Add(1)
	list, err := c.listTools(ctx, s, gen)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("%w within %s: %w", errNoAnswer, c.reg.cfg.HealthTimeout, err)
		}
		c.drop(s, fmt.Errorf("health check: %w", err))
		return c.snapshot()
	}
	cat, _, err := c.syncCatalog(ctx, list.Tools, false)
	if err != nil {
		c.reg.logger.Error("sync tools", append(c.logAttrs(), slog.String("error", err.Error()))...)
	}
	c.mu.Lock()
	c.publishCatalog(cat, seq)
	if c.gen == gen {
		c.failures = 0
		c.health = Health{State: StateReady, Latency: time.Since(start), CheckedAt: time.Now(), ProtocolVersion: c.health.ProtocolVersion}
		c.scheduleCheck()
	}
	h := c.health
	c.mu.Unlock()
	c.saveHealth(h)
	c.checkContents(ctx)
	return h
}

// saveHealth writes h to the source when it says something new: a state,
// error or protocol version other than the last written, or a check time
// more than HealthSaveInterval past the last written one. Latency and check
// time alone are not news: they change on every check, and the registry
// serves them from memory (see Registry.Health). A failed write is tried
// again with the next health.
func (c *conn) saveHealth(h Health) {
	c.mu.Lock()
	if !c.owner {
		c.mu.Unlock()
		return // the owner writes it
	}
	last := c.saved
	news := h.State != last.State || h.LastError != last.LastError || h.ProtocolVersion != last.ProtocolVersion ||
		h.CheckedAt.Sub(last.CheckedAt) >= c.reg.cfg.HealthSaveInterval
	if news {
		c.saved = h
	}
	c.mu.Unlock()
	if !news {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.reg.source.SaveHealth(ctx, c.spec.ID, h); err != nil {
		c.reg.logger.Error("save health", append(c.logAttrs(), slog.String("error", err.Error()))...)
		c.mu.Lock()
		if c.saved == h {
			c.saved = Health{}
		}
		c.mu.Unlock()
	}
}

// setOwner gives c its role (see Registry.SetOwner). A new owner's check
// is due at once, and syncs the catalog and writes health whatever
// changed: a follower wrote neither. A new follower's checks stop.
func (c *conn) setOwner(owner bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.owner == owner {
		return
	}
	c.owner = owner
	if owner {
		c.synced, c.saved, c.nextCheck = false, Health{}, time.Now()
	}
	c.arm()
}

func (c *conn) snapshot() Health {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.health
	if c.down() && !c.connecting && !c.closed && h.State != StateConnecting {
		h.NextAttemptAt = c.nextTry
	}
	return h
}
