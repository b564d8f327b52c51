package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"golang.org/x/sync/singleflight"

	"github.com/connector-svc/connector-svc/internal/registry/httppool"
	"github.com/connector-svc/connector-svc/internal/registry/msglimit"
	"github.com/connector-svc/connector-svc/internal/registry/tasks"
)

// Session modes a Spec may name.
const (
	// SessionShared connectors serve every caller over one connection.
	SessionShared = "shared"
	// SessionPerSession connectors open one connection per caller session
	// id, for servers that keep state per connection (a browser profile, a
	// shell, a login).
	SessionPerSession = "per_session"
)

// ErrSessionRequired means a per_session connector was called without a
// session id.
var ErrSessionRequired = errors.New("the connector is per_session: a session_id is required")

// SessionLimitError means a connector has as many open sessions as it may.
type SessionLimitError struct{ Limit int }

func (e *SessionLimitError) Error() string {
	return fmt.Sprintf("the connector has %d open sessions, its limit; close one (CloseSession) or wait for an idle one to expire", e.Limit)
}

// SessionInfo describes one open per-session connection.
type SessionInfo struct {
	ConnectorID       int64 // the source's key
	WorkspaceID       string
	ConnectorExternal string // the connector's id as callers name it
	SessionID         string
	OpenedAt          time.Time
	LastUsed          time.Time
	Calls, Errors     int64
	State             State // StateConnecting, StateReady or StateDegraded (its connection broke; rebuilt on next use)
	PID               int   // stdio server process id; 0 for HTTP
}

// sessConn is one caller session's own connection to a per_session
// connector. Its tools come from the connector's catalog; it is not swept
// by health checks: a failed call handles it. mu guards state, never I/O.
type sessConn struct {
	parent *conn
	id     string
	opened time.Time

	mu      sync.Mutex
	sess    *session // nil until connected, or after its connection broke
	lastErr string
	closed  bool
	// adopt is the handle the next connect attaches to instead of opening
	// a session (see Registry.Adopt).
	adopt *SessionHandle
	// had says the caller session has had an MCP session (opened here or
	// adopted): a new one is a restart (see CallOptions.Restarted).
	had bool
	// hc is the HTTP client of an oauth_user connector's user connection
	// (see client); nil until first needed.
	hc *http.Client

	flight   singleflight.Group
	lastUsed atomic.Int64 // unix nanos
	// inUse counts the calls that hold the session, from sessionFor to
	// their end: an idle expiry skips it meanwhile. c.mu guards its rise
	// from 0, so that an expiry never takes a session a call just got.
	inUse  atomic.Int64
	calls  atomic.Int64
	errors atomic.Int64
}

// sessionsOf holds a per_session connector's open sessions. c.mu guards it.
type sessionsOf map[string]*sessConn

// sessionFor returns the session connection of id, opening the entry if
// there is none (the connection itself opens on first use), and counts
// the caller in its inUse: the caller calls done when it is through.
// Returns a *SessionLimitError at the connector's cap.
func (c *conn) sessionFor(id string) (*sessConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, c.closedErr
	}
	if sc := c.sessions[id]; sc != nil {
		sc.inUse.Add(1)
		return sc, nil
	}
	if limit := c.reg.cfg.MaxSessions; len(c.sessions) >= limit {
		return nil, &SessionLimitError{Limit: limit}
	}
	if c.sessions == nil {
		c.sessions = sessionsOf{}
	}
	sc := &sessConn{parent: c, id: id, opened: time.Now()}
	sc.lastUsed.Store(sc.opened.UnixNano())
	sc.inUse.Add(1)
	c.sessions[id] = sc
	return sc, nil
}

// done ends a use of sc that sessionFor counted.
func (sc *sessConn) done() { sc.inUse.Add(-1) }

// callSession runs a tool on the connection of the caller's session,
// opening it on first use (concurrent first uses share one connect).
func (c *conn) callSession(ctx context.Context, name string, args map[string]any, opts CallOptions) (res *mcp.CallToolResult, err error) {
	ctx, span := c.callSpan(ctx, name)
	defer func() { endSpan(span, err) }() // after the redaction below
	start := time.Now()
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	_, _, cat, err := c.ready(ctx)
	if err != nil {
		return nil, err
	}
	if cat == nil && c.spec.perUser() {
		// No user's connection has listed the tools yet: this user's,
		// opened first, lists them.
		if cat, err = c.openUserFirst(ctx, opts.Session); err != nil {
			return nil, err
		}
	}
	tool, err := cat.callable(name)
	if err != nil {
		return nil, err
	}
	opts.asTask = tasks.Required(tool)
	sc, err := c.sessionFor(opts.Session)
	if err != nil {
		return nil, err
	}
	defer func() {
		sc.done()
		if IsAuthError(err) {
			c.forgetUnopened(sc)
		}
	}()
	defer func() {
		if errors.Is(err, errReplaced) {
			return // counted where it runs
		}
		c.reg.metrics.called(ctx, c, name, time.Since(start), res, err)
		sc.lastUsed.Store(time.Now().UnixNano())
		c.usage.lastUsed.Store(time.Now().UnixNano())
		sc.calls.Add(1)
		c.usage.calls.Add(1)
		if (err != nil && !awaitsInput(err)) || (res != nil && res.IsError) {
			sc.errors.Add(1)
			c.usage.errors.Add(1)
		}
		err = c.redact.err(err)
	}()
	return sc.call(ctx, name, args, opts)
}

// call runs one tool over the session's connection. A lost MCP session is
// renewed (a new client for this session only) and the call retried once:
// it never ran. A broken connection is dropped and reported; the next use
// opens a new one.
func (sc *sessConn) call(ctx context.Context, name string, args map[string]any, opts CallOptions) (*mcp.CallToolResult, error) {
	for attempt := 0; ; attempt++ {
		s, err := sc.current(ctx)
		if err != nil {
			return nil, err
		}
		if !s.acquire() {
			return nil, sc.closedErr()
		}
		res, err := callTool(ctx, s, name, args, opts)
		s.release()
		if s.restart.Swap(false) {
			opts.restarted()
		}
		switch {
		case err == nil:
			return res, nil
		case ctx.Err() != nil, IsAuthError(err):
			// An authorization refused is the user's to mend, not the
			// connection's.
			return nil, err
		case isSessionLost(err) && attempt == 0 && !tasks.Ran(err):
			sc.dropConn(s, err)
			sc.parent.reg.logger.Debug("retrying call on a new session connection", append(sc.parent.logAttrs(),
				slog.String("session_id", sc.id), slog.String("tool", name))...)
		case isSessionLost(err), isConnectionBroken(err):
			sc.dropConn(s, err)
			return nil, retryNext(err)
		default:
			return nil, err
		}
	}
}

// current returns the session's live connection, connecting it first if
// it has none; concurrent callers share one connect.
func (sc *sessConn) current(ctx context.Context) (*session, error) {
	for range 2 {
		sc.mu.Lock()
		s, closed := sc.sess, sc.closed
		sc.mu.Unlock()
		if closed {
			return nil, sc.closedErr()
		}
		if s != nil {
			return s, nil
		}
		ch := sc.flight.DoChan("connect", func() (any, error) { return nil, sc.connect() })
		select {
		case r := <-ch:
			if r.Err != nil && IsAuthError(r.Err) {
				return nil, r.Err
			}
			if r.Err != nil {
				return nil, retryNext(r.Err)
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return nil, retryNext(errors.New("the session's connection was lost again right after it was made"))
}

// closedErr is why a call cannot use the closed session: its connector
// was replaced (errReplaced: the caller goes to the new one), deleted,
// deactivated or shut down, or the session was closed.
func (sc *sessConn) closedErr() error {
	if why := sc.parent.closedCause(); why != nil {
		return why
	}
	return unavailable(errors.New("the session was closed"))
}

// connect opens the session's own MCP connection with the handshake the
// connector negotiated, or attaches to the session Adopt gave it; it lists
// no tools. A new session in place of one the caller session had is a
// restart, which the first call on it reports. Config.OnSessionOpened
// hears of it before any call runs on it.
func (sc *sessConn) connect() error {
	c := sc.parent
	if !c.reg.enter() {
		return ErrClosed
	}
	defer c.reg.bg.Done()
	ctx, cancel := context.WithTimeout(c.reg.life, c.spec.ConnectTimeout)
	defer cancel()
	sc.mu.Lock()
	adopt := sc.adopt
	sc.adopt = nil
	sc.mu.Unlock()
	var s *session
	var err error
	hc := sc.client()
	if adopt != nil {
		s, err = c.attach(sc.spec(), hc, *adopt)
	} else {
		s, _, err = c.openBare(ctx, sc.spec(), hc)
	}
	if err == nil && c.spec.perUser() {
		// A user's connection lists the tools: the connector's catalog
		// is what its users' connections list.
		if err = c.listForCatalog(ctx, s); err != nil {
			s.close(c.reg.cfg.CloseGrace)
		}
	}
	if err != nil {
		err = c.redact.err(err)
		sc.mu.Lock()
		sc.lastErr = err.Error()
		sc.mu.Unlock()
		return err
	}
	sc.mu.Lock()
	if sc.closed {
		sc.mu.Unlock()
		s.close(c.reg.cfg.CloseGrace)
		return errors.New("the session was closed")
	}
	s.restart.Store(sc.had && adopt == nil)
	sc.sess, sc.lastErr, sc.had, sc.adopt = s, "", true, nil
	sc.mu.Unlock()
	s.watch(func(err error) { sc.dropConn(s, err) })
	c.reg.logger.Debug("session connection opened", append(c.logAttrs(), slog.String("session_id", sc.id),
		slog.Bool("adopted", adopt != nil), slog.Bool("restarted", s.restart.Load()))...)
	if fn := c.reg.cfg.OnSessionOpened; fn != nil {
		h, _ := s.handle()
		fn(c.spec.ID, sc.id, h)
	}
	return nil
}

// SessionEnv is the environment variable that tells a per-session stdio
// server which caller session it serves, so that it can keep that
// session's state apart (a browser profile directory per session, say).
const SessionEnv = "CONNECTOR_SESSION_ID"

// spec is the connector's spec as this session's connection uses it. HTTP
// sessions share the connector's connection pool: they differ by MCP
// session, not by TCP connection.
func (sc *sessConn) spec() Spec {
	spec := sc.parent.spec
	if spec.Transport == TransportStdio {
		env := make(map[string]string, len(spec.Env)+1)
		for k, v := range spec.Env {
			env[k] = v
		}
		env[SessionEnv] = sc.id
		spec.Env = env
	}
	return spec
}

// dropConn forgets the session's connection s after it failed with err and
// closes it in the background; the next call opens a new one.
func (sc *sessConn) dropConn(s *session, cause error) {
	sc.mu.Lock()
	if sc.sess != s {
		sc.mu.Unlock()
		return
	}
	sc.sess = nil
	s.markDead()
	sc.lastErr = sc.parent.redact.text(s.deathCause(cause, 0).Error())
	why := sc.lastErr
	sc.mu.Unlock()
	sc.parent.reg.logger.Debug("session connection dropped", append(sc.parent.logAttrs(), slog.String("session_id", sc.id),
		slog.String("cause", why))...)
	sc.parent.reg.closeLater(s)
}

// close closes the session's connection (stdio process group included),
// after letting the calls running on it finish for up to drain, and
// returns what it was. With detach, a session another replica can adopt
// (see SessionHandle), or one adopted and not yet used, is left to it:
// its MCP session is not ended (no DELETE), and Config.OnSessionClosed is
// not told. Any other session's end is told to Config.OnSessionClosed.
func (sc *sessConn) close(drain time.Duration, detach bool) SessionInfo {
	info := sc.info()
	sc.mu.Lock()
	sc.closed = true
	s, adopt := sc.sess, sc.adopt
	sc.sess, sc.adopt = nil, nil
	sc.mu.Unlock()
	if s != nil && drain > 0 {
		s.drain(drain)
	}
	handedOver := false
	if detach {
		if s != nil {
			_, handedOver = s.handle()
		} else {
			handedOver = adopt != nil
		}
	}
	if s != nil {
		if handedOver {
			s.detach()
		}
		s.close(sc.parent.reg.cfg.CloseGrace)
	}
	c := sc.parent
	if handedOver {
		c.reg.logger.Debug("session connection detached", append(c.logAttrs(), slog.String("session_id", sc.id))...)
	} else if fn := c.reg.cfg.OnSessionClosed; fn != nil {
		fn(c.spec.ID, sc.id)
	}
	return info
}

func (sc *sessConn) info() SessionInfo {
	c := sc.parent
	sc.mu.Lock()
	defer sc.mu.Unlock()
	in := SessionInfo{
		ConnectorID: c.spec.ID, WorkspaceID: c.spec.WorkspaceID, ConnectorExternal: c.spec.ConnectorID,
		SessionID: sc.id, OpenedAt: sc.opened, LastUsed: time.Unix(0, sc.lastUsed.Load()),
		Calls: sc.calls.Load(), Errors: sc.errors.Load(), State: StateConnecting,
	}
	switch {
	case sc.sess != nil:
		in.State = StateReady
		if p := sc.sess.proc; p != nil {
			in.PID = p.PID()
		}
	case sc.lastErr != "":
		in.State = StateDegraded
	}
	return in
}

// openAs starts a session for spec and initializes it, with the classic
// handshake or else the sessionless one first (see openBare), without
// listing tools. It returns the protocol version agreed.
func (c *conn) openAs(ctx context.Context, spec Spec, hc *http.Client, classic bool) (*session, string, error) {
	own, end := httppool.SessionClient(hc)
	if sse := c.sseRequests(spec, end.Base()); sse != nil {
		end.SetFilter(sse.Filter)
	}
	asks := c.newAsks(spec)
	s, err := newSession(c.reg.life, spec, own, append(c.clientOptions(classic), asks.options()...), c.spec.ConnectTimeout,
		msglimit.ForResult(c.reg.cfg.MaxResultBytes), c.mcpLogger(), c.reg.metrics, SessionHandle{})
	if err != nil {
		return nil, "", transportHint(spec.Transport, err, end.Streamed())
	}
	s.end, s.asks = end, asks
	res, err := s.client.Initialize(ctx, initializeRequest())
	if err != nil {
		s.close(c.reg.cfg.CloseGrace)
		return nil, "", s.withStderr(transportHint(spec.Transport, fmt.Errorf("initialize: %w", err), false))
	}
	s.version = res.ProtocolVersion
	s.listen(c, spec, own) // the GET stream, where a server may ask (getstream.go)
	return s, res.ProtocolVersion, nil
}

// takeSessions removes and returns the sessions of c that match: all of
// them if sessionID is empty.
func (c *conn) takeSessions(sessionID string) []*sessConn {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*sessConn
	for id, sc := range c.sessions {
		if sessionID == "" || id == sessionID {
			out = append(out, sc)
			delete(c.sessions, id)
		}
	}
	return out
}

// takeIdle removes and returns the sessions unused since before cutoff
// and not in use now.
func (c *conn) takeIdle(cutoff time.Time) []*sessConn {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*sessConn
	for id, sc := range c.sessions {
		if sc.inUse.Load() == 0 && time.Unix(0, sc.lastUsed.Load()).Before(cutoff) {
			out = append(out, sc)
			delete(c.sessions, id)
		}
	}
	return out
}

// closeSessions closes scs in parallel, each after draining its calls for
// up to drain (detach: see sessConn.close), and returns what they were.
func closeSessions(scs []*sessConn, drain time.Duration, detach bool) []SessionInfo {
	out := make([]SessionInfo, len(scs))
	var wg sync.WaitGroup
	for i, sc := range scs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = sc.close(drain, detach)
		}()
	}
	wg.Wait()
	slices.SortFunc(out, func(a, b SessionInfo) int {
		return strings.Compare(a.ConnectorExternal+"\x00"+a.SessionID, b.ConnectorExternal+"\x00"+b.SessionID)
	})
	return out
}

// Sessions returns the open sessions of connector id, by session id.
func (r *Registry) Sessions(id int64) ([]SessionInfo, error) {
	c, err := r.get(id)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	scs := make([]*sessConn, 0, len(c.sessions))
	for _, sc := range c.sessions {
		scs = append(scs, sc)
	}
	c.mu.Unlock()
	out := make([]SessionInfo, 0, len(scs))
	for _, sc := range scs {
		out = append(out, sc.info())
	}
	slices.SortFunc(out, func(a, b SessionInfo) int { return strings.Compare(a.SessionID, b.SessionID) })
	return out, nil
}

// SessionCount returns how many sessions connector id has open; 0 if the
// registry does not hold it.
func (r *Registry) SessionCount(id int64) int {
	c, err := r.get(id)
	if err != nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.sessions)
}

// CloseSession closes a workspace's session: on connector id, or on every
// connector of the workspace if id is 0. It returns the sessions it closed
// (none is not an error) once their connections are closed.
func (r *Registry) CloseSession(workspaceID, sessionID string, id int64) []SessionInfo {
	var scs []*sessConn
	for _, c := range r.snapshot() {
		if c.spec.WorkspaceID == workspaceID && (id == 0 || c.spec.ID == id) {
			scs = append(scs, c.takeSessions(sessionID)...)
		}
	}
	closed := closeSessions(scs, 0, false)
	for _, in := range closed {
		r.logger.Info("session closed", slog.String("workspace_id", in.WorkspaceID),
			slog.String("connector_id", in.ConnectorExternal), slog.String("session_id", in.SessionID))
	}
	return closed
}

// expireSessions closes sessions idle longer than SessionIdleTTL, in the
// background.
func (r *Registry) expireSessions() {
	cutoff := time.Now().Add(-r.cfg.SessionIdleTTL)
	var scs []*sessConn
	for _, c := range r.snapshot() {
		scs = append(scs, c.takeIdle(cutoff)...)
	}
	if len(scs) == 0 || !r.enter() {
		return
	}
	go func() {
		defer r.bg.Done()
		for _, in := range closeSessions(scs, 0, false) {
			r.logger.Info("idle session closed", slog.String("workspace_id", in.WorkspaceID),
				slog.String("connector_id", in.ConnectorExternal), slog.String("session_id", in.SessionID))
		}
	}()
}
