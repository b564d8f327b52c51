package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/singleflight"

	"github.com/connector-svc/connector-svc/internal/registry/httppool"
	"github.com/connector-svc/connector-svc/internal/registry/msglimit"
	"github.com/connector-svc/connector-svc/internal/registry/stdio"
)

// stableAfter is how long a session must live for its loss to count as a
// one-off: a session lost sooner is a flap, and the reconnect after it
// waits for the backoff instead of starting at once.
const stableAfter = 10 * time.Second

// conn is one connector's persistent MCP session and its tool catalog.
// Callers share the live session; mu guards only pointer and state swaps,
// never I/O.
type conn struct {
	reg  *Registry
	spec Spec
	// hc is the connector's HTTP client over pool, its share of the
	// transports of its origin, kept across sessions.
	hc     *http.Client
	pool   *httppool.Pool
	redact *redactor

	// mu is read-locked by every call (ready): a hot connector's callers
	// do not queue on it.
	mu         sync.RWMutex
	sess       *session // nil while down
	gen        uint64   // bumped whenever sess changes
	cat        *catalog // nil until first listed and synced
	catSeq     uint64   // syncSeq of the sync that published cat
	health     Health
	failures   int       // consecutive failures; 0 when healthy
	flaps      int       // sessions in a row lost before stableAfter
	lastTry    time.Time // start of the last connect
	nextTry    time.Time // earliest scheduled reconnect while down
	nextCheck  time.Time // next health check while up
	connecting bool      // a connect is under way
	busy       bool      // a scheduler job runs for this conn
	closed     bool
	// closedErr is what calls get once the conn is closed: ErrDeleted,
	// ErrDeactivated, ErrClosed (shutdown) or errReplaced.
	closedErr error
	// silent says the last failure was a server that took a request and
	// gave no answer in time (see errNoAnswer): a connect to it is likely
	// to hang too, so calls do not wait for one.
	silent bool
	// refused says the last failure was a refusal: a connection refused,
	// or a gateway's 502, 503 or 504 for the server behind it. It costs
	// the server nothing and tells nothing of the next attempt, so calls
	// retry it sooner (see probeAfter).
	refused bool
	// lostAt is when the live session was lost, if the connector went
	// down that way and no connect attempt has failed since; zero
	// otherwise. It names the last failure in the errors calls get.
	lostAt    time.Time
	replaced  bool        // closed because a new conn took its place
	legacy    bool        // the last session opened with the initialize handshake
	noClassic bool        // the server refused the initialize handshake
	sessions  sessionsOf  // per_session connectors: the open sessions
	timer     *time.Timer // fires when the next connect or check is due; see arm
	saved     Health      // as last written to the source; see saveHealth
	// owner says this replica owns the connector: it checks its health
	// periodically, writes health and syncs the catalog (see SetOwner).
	owner bool
	// synced says the current catalog's tools are in the source as this
	// replica last listed them; false forces the next sync.
	synced bool

	// phase places c's health checks within the interval: checks of
	// different connectors fall at different moments, not all at once.
	phase time.Duration

	flight singleflight.Group
	// epoch counts re-initializes; a caller reads it before its request so
	// that a request that failed on a session already mended is just retried.
	epoch     atomic.Uint64
	syncSeq   atomic.Uint64 // orders catalog syncs; see publishCatalog
	lastProbe atomic.Int64  // unix nanos of the last suspect probe
	usage     usage
	// callLabels are the metric attributes of each tool called, by name.
	callLabels sync.Map
	// contents are the server's resources and prompts, and the
	// subscriptions held (contents.go).
	contents contentsState
}

// usage are counters not yet written to the source.
type usage struct {
	calls, errors, reconnects, reinits atomic.Int64
	lastUsed                           atomic.Int64 // unix nanos
}

func newConn(reg *Registry, spec Spec) *conn {
	p, hc := httppool.NewPool(reg.transports, spec.URL, msglimit.ForResult(reg.cfg.MaxResultBytes))
	c := &conn{reg: reg, spec: spec, hc: hc, pool: p, redact: newRedactor(spec), health: Health{State: StateConnecting},
		phase: rand.N(reg.cfg.HealthInterval), owner: true}
	if spec.Auth == AuthClientCredentials {
		// Every request of the connector's, its sessions' too, as its
		// own identity.
		c.hc = c.authorizedClient("")
	}
	reg.metrics.startCounters(c)
	return c
}

// ready returns the live session and its catalog. A call that arrives
// while the connector first connects waits for that connect (within ctx).
// A connector that is down fails fast with ErrUnavailable and its last
// failure (see downError), unless a reconnect is due (its backoff is over,
// or its last attempt is older than ProbeAfter): then this call starts one
// reconnect, shared with every other caller, and waits for it. A call that
// finds a reconnect under way waits for it too, unless the server gave no
// answer last time: a reconnect to a server that takes requests and
// answers none hangs as long as its connect timeout, and callers would
// hang with it, so they fail fast, and a reconnect that is due starts in
// the background. A conn that was replaced answers errReplaced; one that
// was closed, why (ErrDeleted, ErrDeactivated, ErrClosed).
func (c *conn) ready(ctx context.Context) (*session, uint64, *catalog, error) {
	for range 3 {
		c.mu.RLock()
		s, gen, cat, closedErr, up := c.sess, c.gen, c.cat, c.closedErr, !c.down()
		now := time.Now()
		join, start := c.joinable(now)
		var downErr error
		if !join {
			downErr = c.downError(now, start)
		}
		state := c.health.State
		c.mu.RUnlock()
		switch {
		case closedErr != nil:
			return nil, 0, nil, closedErr
		case up:
			return s, gen, cat, nil
		case start && !join:
			c.connectLater(trace.LinkFromContext(ctx))
			return nil, 0, nil, downErr
		case !join:
			return nil, 0, nil, downErr
		}
		c.reg.logger.Debug("call waits for a connect", append(c.logAttrs(), slog.String("state", string(state)),
			slog.Bool("starts_it", start))...)
		if err := c.connectShared(ctx); err != nil {
			if closed := c.closedCause(); closed != nil {
				return nil, 0, nil, closed
			}
			if ctx.Err() == nil {
				// The attempt this call joined failed: said as any
				// failed attempt is, with when the next one is.
				c.mu.RLock()
				down, downErr := c.down() && !c.connecting, c.downError(time.Now(), false)
				c.mu.RUnlock()
				if down {
					return nil, 0, nil, downErr
				}
			}
			return nil, 0, nil, c.unavailable(err)
		}
	}
	return nil, 0, nil, c.unavailable(errors.New("the connection was lost again right after it was made"))
}

// joinable says whether a call to c, which is down, waits for a connect
// (join), and whether one must start for it (start). c.mu must be held.
func (c *conn) joinable(now time.Time) (join, start bool) {
	switch {
	case c.health.State == StateConnecting:
		return true, !c.connecting // the first connect
	case c.connecting:
		return !c.silent, false
	}
	due := !now.Before(c.nextTry) || now.Sub(c.lastTry) >= c.probeAfter()
	return due && !c.silent, due
}

// refusedProbeAfter is how old a refused connect attempt must be for a
// call to try again (ProbeAfter, if shorter): a refusal is answered in a
// round trip, and a server restarting behind a gateway is back in moments.
const refusedProbeAfter = 250 * time.Millisecond

// probeAfter is how old the last connect attempt must be for a call to a
// down connector to start one. c.mu must be held.
func (c *conn) probeAfter() time.Duration {
	if c.refused {
		return min(c.reg.cfg.ProbeAfter, refusedProbeAfter)
	}
	return c.reg.cfg.ProbeAfter
}

// downError is what a call to c, which is down, gets when it does not
// wait for a connect: the last failure, how long ago it was, and when the
// next attempt is (started says this call starts one now). It wraps
// ErrUnavailable. c.mu must be held.
func (c *conn) downError(now time.Time, started bool) error {
	last := "last connect attempt " + ago(now, c.health.CheckedAt) + " failed"
	if !c.lostAt.IsZero() {
		last = "connection lost " + ago(now, c.lostAt)
	}
	return unavailable(fmt.Errorf("%s: %s; %s", last, c.health.LastError, c.nextAttempt(now, started)))
}

// nextAttempt says when the next connect attempt of c is, for an error
// message: every UNAVAILABLE says it. started says the caller starts one
// now. c.mu must be held.
func (c *conn) nextAttempt(now time.Time, started bool) string {
	switch {
	case started:
		return "a new attempt starts now"
	case c.connecting:
		return "a new attempt has been under way for " + roundFor(now.Sub(c.lastTry))
	case !c.down():
		return "the connector is connected again: the call may be retried now"
	}
	at := c.nextTry
	if probe := c.lastTry.Add(c.probeAfter()); probe.Before(at) {
		at = probe // a call after it starts the attempt
	}
	return "next attempt in " + roundFor(at.Sub(now))
}

// unavailable wraps cause as ErrUnavailable, saying when the next connect
// attempt is (see nextAttempt).
func (c *conn) unavailable(cause error) error {
	c.mu.RLock()
	closed, next := c.closed, c.nextAttempt(time.Now(), false)
	c.mu.RUnlock()
	if closed {
		return unavailable(cause)
	}
	return unavailable(fmt.Errorf("%w; %s", cause, next))
}

// ago says how long before now t was, for an error message.
func ago(now, t time.Time) string { return roundFor(now.Sub(t)) + " ago" }

// roundFor rounds d for an error message: to the millisecond below a
// second, to the tenth of a second above.
func roundFor(d time.Duration) string {
	d = max(d, 0)
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(100 * time.Millisecond).String()
}

// connectShared runs one connect for all concurrent callers and waits for
// it or for ctx. The connect itself is not bound to any caller's context:
// its span starts a trace of its own, linked to the span of the caller
// that started it. A connector that is up by the time the connect would
// start is left as it is (see connect).
func (c *conn) connectShared(ctx context.Context) error {
	ch := c.flight.DoChan("connect", func() (any, error) { return nil, c.connect(trace.LinkFromContext(ctx), nil) })
	select {
	case r := <-ch:
		return r.Err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// connectLater starts one connect for all concurrent callers, and waits
// for nothing.
func (c *conn) connectLater(link trace.Link) {
	c.flight.DoChan("connect", func() (any, error) { return nil, c.connect(link, nil) })
}

// closedCause is why c was closed; nil while it is open.
func (c *conn) closedCause() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closedErr
}

// connect opens a new session, lists its tools, syncs the catalog and only
// then publishes session and catalog together as READY, closing the
// previous session afterwards. On failure the connector goes down and the
// next try is scheduled with backoff. link is the span of the caller who
// asked for it, if any. A connect replaces a live session only if it is
// replacing (one the server forgot): a connector that is up by the time a
// connect starts is left alone, so that a late request for a connect (a
// health check that saw the connector down, a call that failed on a
// session since replaced) never tears down the session that took its place.
func (c *conn) connect(link trace.Link, replacing *session) (err error) {
	// Runs in singleflight's goroutine: register it so shutdown waits.
	if !c.reg.enter() {
		return ErrClosed
	}
	defer c.reg.bg.Done()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return c.closedErr
	}
	if !c.down() && c.sess != replacing {
		c.mu.Unlock()
		return nil // connected meanwhile
	}
	c.connecting, c.lastTry = true, time.Now()
	failures := c.failures
	c.mu.Unlock()
	c.reg.logger.Debug("connector connecting", append(c.logAttrs(), slog.Int("failures_before", failures))...)
	defer func() {
		c.mu.Lock()
		c.connecting = false
		c.mu.Unlock()
	}()

	ctx, span := c.reg.tracer.Start(c.reg.life, "mcp.connect", trace.WithAttributes(c.attrs()...), trace.WithLinks(link))
	defer func() { endSpan(span, err) }()
	ctx, cancel := context.WithTimeout(ctx, c.spec.ConnectTimeout)
	defer cancel()
	if c.spec.perUser() {
		return c.connectProbe(ctx, replacing)
	}
	start := time.Now()

	s, version, tools, err := c.open(ctx)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("%w within the connect timeout (%s): %w", errNoAnswer, c.spec.ConnectTimeout, err)
		}
		err = c.redact.err(err)
		c.fail(err, replacing)
		return err
	}
	seq := c.syncSeq.Add(1)
	cat, _, err := c.syncCatalog(ctx, tools, false)
	if cat == nil {
		s.close(c.reg.cfg.CloseGrace)
		c.fail(err, replacing)
		return err
	}
	if c.spec.perSession() {
		// Its contents are listed on this connection too, before it
		// closes: the connector keeps none of its own to list on later.
		if _, err := c.listContentsOn(ctx, s); err != nil {
			c.reg.logger.Debug("list resources and prompts", append(c.logAttrs(), slog.String("error", err.Error()))...)
		}
	}
	return c.publishSession(s, version, len(tools), cat, seq, start, replacing)
}

// publishSession makes s, just opened with version and listed (tools
// tools, their catalog cat, synced as seq), the live session and cat the
// catalog, as READY, unless c was closed or another connect came first;
// then it closes the previous session. A per_session connector keeps
// none: s only listed the tools. start is when the connect began.
func (c *conn) publishSession(s *session, version string, tools int, cat *catalog, seq uint64, start time.Time,
	replacing *session) error {
	perSession := c.spec.perSession()
	if perSession {
		// Its sessions open connections of their own; this one only
		// listed the tools, and must not hold what they need (a lock on a
		// browser profile, say).
		s.close(c.reg.cfg.CloseGrace)
	}
	c.mu.Lock()
	if c.closed || (!c.down() && c.sess != replacing) {
		closedErr := c.closedErr // nil: another connect came first
		c.mu.Unlock()
		s.close(c.reg.cfg.CloseGrace)
		return closedErr
	}
	old, reconnect := c.sess, c.gen > 0
	c.sess, c.gen, c.failures, c.silent, c.lostAt = s, c.gen+1, 0, false, time.Time{}
	if perSession {
		c.sess = nil
	}
	c.publishCatalog(cat, seq)
	c.legacy = !mcp.IsModernProtocol(version)
	c.health = Health{State: StateReady, Latency: time.Since(start), CheckedAt: time.Now(), ProtocolVersion: version}
	c.scheduleCheck()
	h := c.health
	c.mu.Unlock()

	if !perSession {
		s.watch(func(err error) { c.drop(s, err) })
	}
	if old != nil {
		c.reg.closeLater(old)
	}
	if reconnect {
		c.usage.reconnects.Add(1)
		c.reg.metrics.count(c.reg.metrics.reconnects, c)
	}
	c.reg.logger.Info("connector connected", append(c.logAttrs(), slog.String("protocol_version", version),
		slog.Int("tools", tools), slog.String("latency", h.Latency.String()))...)
	c.saveHealth(h)
	if !perSession {
		// A per_session connector's contents are listed when asked for:
		// listing them now would open one more connection of its own.
		c.reg.contentsLater(c)
	}
	return nil
}

// open starts a session, initializes it and lists its tools.
func (c *conn) open(ctx context.Context) (*session, string, []mcp.Tool, error) {
	s, version, err := c.openBare(ctx, c.spec, c.hc)
	if err != nil {
		return nil, "", nil, err
	}
	list, err := s.client.ListTools(ctx, mcp.ListToolsRequest{})
	if err != nil {
		s.close(c.reg.cfg.CloseGrace)
		return nil, "", nil, s.withStderr(fmt.Errorf("tools/list: %w", err))
	}
	s.client.OnNotification(func(n mcp.JSONRPCNotification) {
		if n.Method == string(mcp.MethodNotificationToolsListChanged) {
			c.reg.refreshLater(c)
			return
		}
		c.contentNotified(n)
	})
	return s, version, list.Tools, nil
}

func initializeRequest() mcp.InitializeRequest {
	var req mcp.InitializeRequest
	req.Params.ClientInfo = mcp.Implementation{Name: "connector-svc", Version: "1"}
	return req
}

// withStderr adds the tail of a closed stdio server's stderr to err.
func (s *session) withStderr(err error) error {
	if tail := s.stderrText(); tail != "" {
		return fmt.Errorf("%w (stderr: %s)", err, stdio.LastLines(tail, 5))
	}
	return err
}

// fail records a failed connect: the connector stays down and the next
// try waits for the backoff. A connector that another connect brought up
// meanwhile stays up. replacing is the session the connect was to replace.
func (c *conn) fail(cause error, replacing *session) {
	c.mu.Lock()
	if !c.down() && c.sess != replacing {
		c.mu.Unlock()
		return
	}
	c.failures++
	c.lostAt = time.Time{}
	c.setDown(cause)
	delay := c.reg.backoff(c.failures)
	c.nextTry = time.Now().Add(delay)
	c.arm()
	h, closed, failures := c.health, c.closed, c.failures
	c.mu.Unlock()
	if closed {
		return
	}
	c.reg.metrics.count(c.reg.metrics.connectErrs, c)
	c.reg.logger.Debug("connector reconnect scheduled", append(c.logAttrs(), slog.String("delay", delay.String()),
		slog.Int("failures", failures))...)
	c.reg.logger.Warn("connector connect failed", append(c.logAttrs(), slog.String("state", string(h.State)),
		slog.String("error", h.LastError))...)
	c.saveHealth(h)
}

// drop takes the connector down because its session s died or stopped
// answering, closes s, and schedules a reconnect: at once, unless sessions
// keep dying young, in which case the backoff applies. A session that is
// no longer the current one is left to whoever swapped it out.
func (c *conn) drop(s *session, cause error) {
	cause = c.redact.err(s.deathCause(cause, time.Second))
	c.mu.Lock()
	if c.sess != s || c.closed {
		c.mu.Unlock()
		return
	}
	c.sess, c.gen = nil, c.gen+1
	s.markDead()
	c.lostAt = time.Now()
	if time.Since(s.opened) < stableAfter {
		c.flaps++
	} else {
		c.flaps = 0
	}
	c.failures++
	c.setDown(cause)
	c.nextTry = time.Now()
	if c.flaps > 1 {
		c.nextTry = c.nextTry.Add(c.reg.backoff(c.flaps - 1))
	}
	c.arm()
	h, delay, flaps := c.health, time.Until(c.nextTry), c.flaps
	c.mu.Unlock()
	c.reg.logger.Debug("connector reconnect scheduled", append(c.logAttrs(), slog.String("delay", max(delay, 0).String()),
		slog.String("session_age", time.Since(s.opened).Round(time.Millisecond).String()), slog.Int("flaps", flaps))...)
	c.reg.closeLater(s)
	c.reg.logger.Warn("connector connection lost", append(c.logAttrs(), slog.String("state", string(h.State)),
		slog.String("error", h.LastError))...)
	c.saveHealth(h)
}

// down reports whether the connector needs a connect. c.mu must be held.
func (c *conn) down() bool {
	return c.sess == nil && !(c.spec.ownConnections() && c.health.State == StateReady)
}

// retire marks the conn closed and hands back its session, if any. why
// is what calls get from now on: errReplaced sends callers who still hold
// this conn to the new one.
func (c *conn) retire(why error) *session {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sess
	c.sess, c.closed, c.replaced, c.closedErr = nil, true, why == errReplaced, why
	c.arm()
	return s
}

// close closes the conn now: its session, its per-session connections, in
// parallel, and its idle HTTP connections. Calls running on it, or waiting
// for it, fail with why: ErrDeleted, ErrDeactivated or ErrClosed.
func (c *conn) close(why error) {
	s := c.retire(why)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// At shutdown, per-session HTTP sessions may be left for another
		// replica to adopt (Config.DetachSessions).
		closeSessions(c.takeSessions(""), 0, why == ErrClosed && c.reg.cfg.DetachSessions)
	}()
	if s != nil {
		s.close(c.reg.cfg.CloseGrace)
	}
	wg.Wait()
	c.pool.Close()
}

// closeDrained closes a conn that a new one replaced: its session, and
// each per-session connection, takes no new calls, the calls running on it
// finish (bounded by the call timeout), and then it closes.
func (c *conn) closeDrained() {
	s := c.retire(errReplaced)
	closeSessions(c.takeSessions(""), c.spec.CallTimeout, false)
	if s != nil {
		s.drain(c.spec.CallTimeout)
		s.close(c.reg.cfg.CloseGrace)
	}
	c.pool.Close()
}

func (c *conn) attrs() []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.String("connector.workspace_id", c.spec.WorkspaceID),
		attribute.String("connector.id", c.spec.ConnectorID),
		attribute.String("mcp.transport", c.spec.Transport),
	}
}

// callSpan starts the span of a call of tool name: a child of the caller's.
// It carries the connector and the tool, never the arguments. A tool
// called before has its options made already (toolLabels); any other name
// gets them made for this call only, so that callers naming tools that do
// not exist cannot grow the cache.
func (c *conn) callSpan(ctx context.Context, name string) (context.Context, trace.Span) {
	if o, ok := c.callLabels.Load(name); ok {
		return c.reg.tracer.Start(ctx, "mcp.tools/call", o.(*callOptions).span...)
	}
	return c.reg.tracer.Start(ctx, "mcp.tools/call", c.callSpanOptions(name)...)
}

func (c *conn) callSpanOptions(name string) []trace.SpanStartOption {
	return []trace.SpanStartOption{trace.WithAttributes(append(c.attrs(), attribute.String("mcp.tool", name))...)}
}

func (c *conn) logAttrs() []any {
	return []any{
		slog.String("workspace_id", c.spec.WorkspaceID),
		slog.String("connector_id", c.spec.ConnectorID),
		slog.String("transport", c.spec.Transport),
	}
}

func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
