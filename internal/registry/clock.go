package registry

// A call's timeout that does not count the time the call waits on what its
// server asked for: a user answering an elicitation may take minutes,
// which the connector's call timeout (a minute by default) is not meant to
// bound. ElicitationTimeout bounds that wait instead.

import (
	"context"
	"sync"
	"time"

	"github.com/connector-svc/connector-svc/internal/ask"
)

// callContext bounds a call made under ctx by the connector's call
// timeout. A call that may wait on its server's requests (its context
// carries an Asker, and the connector elicits or samples) gets a clock
// that stops while it waits (see pauseCall); any other, a plain timeout.
func (c *conn) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, _, ok := ask.From(ctx); ok && (c.spec.Elicitation || c.spec.Sampling) {
		return withCallClock(ctx, c.spec.CallTimeout)
	}
	return context.WithTimeout(ctx, c.spec.CallTimeout)
}

// callClock is a context that ends timeout after it starts, not counting
// the time it is paused, or when its parent ends. Its Err is
// context.DeadlineExceeded when its own time ran out, as a timeout's is;
// Deadline reports when it would end if it ran on from now.
type callClock struct {
	parent context.Context
	done   chan struct{}
	stop   func() bool // unhooks it from parent

	mu       sync.Mutex
	err      error
	deadline time.Time     // while running
	left     time.Duration // while paused
	paused   int
	timer    *time.Timer
}

type clockKey struct{}

func withCallClock(parent context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	c := &callClock{parent: parent, done: make(chan struct{}), deadline: time.Now().Add(timeout)}
	c.mu.Lock()
	c.timer = time.AfterFunc(timeout, func() { c.end(context.DeadlineExceeded) })
	c.mu.Unlock()
	c.stop = context.AfterFunc(parent, func() { c.end(parent.Err()) })
	return c, func() {
		c.stop()
		c.end(context.Canceled)
	}
}

func (c *callClock) end(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	c.err = err
	c.timer.Stop()
	close(c.done)
}

func (c *callClock) Done() <-chan struct{} { return c.done }

func (c *callClock) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *callClock) Value(key any) any {
	if key == (clockKey{}) {
		return c
	}
	return c.parent.Value(key)
}

func (c *callClock) Deadline() (time.Time, bool) {
	c.mu.Lock()
	d := c.deadline
	if c.paused > 0 {
		d = time.Now().Add(c.left)
	}
	c.mu.Unlock()
	if pd, ok := c.parent.Deadline(); ok && pd.Before(d) {
		d = pd
	}
	return d, true
}

// pause stops the clock until resume is called; pauses nest.
func (c *callClock) pause() (resume func()) {
	c.mu.Lock()
	if c.paused == 0 && c.err == nil {
		c.timer.Stop()
		c.left = time.Until(c.deadline)
	}
	c.paused++
	c.mu.Unlock()
	return sync.OnceFunc(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.paused--
		if c.paused == 0 && c.err == nil {
			c.deadline = time.Now().Add(c.left)
			c.timer.Reset(c.left)
		}
	})
}

// pauseCall stops the clock of the call made under ctx, if it has one,
// until resume is called; and returns the deadline of whoever made the
// call (zero if none), which the pause does not stop.
func pauseCall(ctx context.Context) (resume func(), callerDeadline time.Time) {
	if ctx == nil {
		return func() {}, time.Time{}
	}
	c, ok := ctx.Value(clockKey{}).(*callClock)
	if !ok {
		d, _ := ctx.Deadline()
		return func() {}, d
	}
	d, _ := c.parent.Deadline()
	return c.pause(), d
}
