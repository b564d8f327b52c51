package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/singleflight"
)

// conn is one connector's persistent MCP session. Callers share the live
// session; mu guards only pointer and state swaps, never I/O.
type conn struct {
	reg  *Registry
	spec Spec
	// hc is the connector's HTTP connection pool, kept across sessions.
	hc *http.Client

	mu         sync.Mutex
	sess       *session // nil while down
	gen        uint64   // bumped whenever sess changes
	health     Health
	failures   int       // consecutive failures; 0 when healthy
	nextTry    time.Time // earliest reconnect while down
	nextCheck  time.Time // next health check while up
	busy       bool      // a scheduler job runs for this conn
	closed     bool
	legacy     bool           // the server answered only the initialize handshake
	tools      []mcp.Tool     // sorted by name
	toolByName map[string]int // index into tools
	toolsHash  string
	disabled   map[string]bool // operators' switched-off tools; nil until synced

	flight singleflight.Group
	// epoch counts re-initializes; a caller reads it before its request so
	// that a request that failed on a session already mended is just retried.
	epoch atomic.Uint64
	usage usage
}

// usage are counters not yet written to the source.
type usage struct {
	calls, errors, reconnects, reinits atomic.Int64
	lastUsed                           atomic.Int64 // unix nanos
}

func newConn(reg *Registry, spec Spec) *conn {
	hc := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	return &conn{reg: reg, spec: spec, hc: hc, health: Health{State: StateConnecting}}
}

// current returns the live session, joining the first connect if it is
// still under way. A connector that is down fails fast with ErrUnavailable
// and its last error: reconnecting is the scheduler's job.
func (c *conn) current(ctx context.Context) (*session, uint64, error) {
	c.mu.Lock()
	s, gen, closed, state, lastErr := c.sess, c.gen, c.closed, c.health.State, c.health.LastError
	c.mu.Unlock()
	switch {
	case closed:
		return nil, 0, ErrNotLoaded
	case s != nil:
		return s, gen, nil
	case state == StateConnecting:
		if err := c.connectShared(ctx); err != nil {
			return nil, 0, unavailable(err)
		}
		return c.current(ctx)
	default:
		return nil, 0, unavailable(errors.New(lastErr))
	}
}

// connectShared runs one connect for all concurrent callers and waits for
// it or for ctx. The connect itself is not bound to any caller's context.
func (c *conn) connectShared(ctx context.Context) error {
	ch := c.flight.DoChan("connect", func() (any, error) { return nil, c.connect() })
	select {
	case r := <-ch:
		return r.Err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// connect opens a new session, lists its tools and swaps it in, closing the
// previous session afterwards. On failure the connector goes down and the
// next try is scheduled with backoff.
func (c *conn) connect() (err error) {
	// Runs in singleflight's goroutine: register it so shutdown waits.
	if !c.reg.enter() {
		return ErrClosed
	}
	defer c.reg.bg.Done()
	ctx, span := c.reg.tracer.Start(c.reg.life, "mcp.connect", trace.WithAttributes(c.attrs()...))
	defer func() { endSpan(span, err) }()
	ctx, cancel := context.WithTimeout(ctx, c.spec.ConnectTimeout)
	defer cancel()
	start := time.Now()

	s, version, tools, err := c.open(ctx)
	if err != nil {
		c.fail(err)
		return err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		s.close(c.reg.cfg.CloseGrace)
		return ErrClosed
	}
	old, reconnect := c.sess, c.gen > 0
	c.sess, c.gen, c.failures = s, c.gen+1, 0
	c.legacy = !mcp.IsModernProtocol(version)
	c.health = Health{State: StateReady, Latency: time.Since(start), CheckedAt: time.Now(), ProtocolVersion: version}
	c.nextCheck = time.Now().Add(c.reg.cfg.HealthInterval)
	h := c.health
	c.mu.Unlock()

	if old != nil {
		old.close(c.reg.cfg.CloseGrace)
	}
	if reconnect {
		c.usage.reconnects.Add(1)
	}
	c.reg.logger.Info("connector connected", append(c.logAttrs(), slog.String("protocol_version", version),
		slog.Int("tools", len(tools)), slog.String("latency", h.Latency.String()))...)
	c.setTools(ctx, tools)
	c.reg.saveHealth(c, h)
	return nil
}

// open starts a session, initializes it and lists its tools.
func (c *conn) open(ctx context.Context) (*session, string, []mcp.Tool, error) {
	c.mu.Lock()
	legacy := c.legacy
	c.mu.Unlock()
	opts := []client.ClientOption{client.WithDiscoverTimeout(c.reg.cfg.DiscoverTimeout)}
	if legacy {
		opts = append(opts, client.WithLegacyProtocolOnly())
	}
	s, err := newSession(c.reg.life, c.spec, c.hc, opts, c.spec.ConnectTimeout)
	if err != nil {
		return nil, "", nil, err
	}
	res, err := s.client.Initialize(ctx, initializeRequest())
	if err != nil {
		err = c.withStderr(s, fmt.Errorf("initialize: %w", err))
		s.close(c.reg.cfg.CloseGrace)
		return nil, "", nil, err
	}
	list, err := s.client.ListTools(ctx, mcp.ListToolsRequest{})
	if err != nil {
		err = c.withStderr(s, fmt.Errorf("tools/list: %w", err))
		s.close(c.reg.cfg.CloseGrace)
		return nil, "", nil, err
	}
	s.client.OnNotification(func(n mcp.JSONRPCNotification) {
		if n.Method == string(mcp.MethodNotificationToolsListChanged) {
			c.reg.refreshLater(c)
		}
	})
	return s, res.ProtocolVersion, list.Tools, nil
}

func initializeRequest() mcp.InitializeRequest {
	var req mcp.InitializeRequest
	req.Params.ClientInfo = mcp.Implementation{Name: "connector-svc", Version: "1"}
	return req
}

// failSession takes the connector down after s failed with err. A stdio
// session is closed first: its server's last words on stderr are complete
// only once the process has been waited for.
func (c *conn) failSession(s *session, err error) {
	if s.proc != nil {
		s.close(c.reg.cfg.CloseGrace)
	}
	c.fail(c.withStderr(s, err))
}

// withStderr adds the tail of a stdio server's stderr to err.
func (c *conn) withStderr(s *session, err error) error {
	if tail := strings.TrimSpace(s.stderrText()); tail != "" {
		return fmt.Errorf("%w (stderr: %s)", err, lastLines(tail, 5))
	}
	return err
}

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// fail records a failed connect or check: the connector goes down (its
// session, if any, is closed) and the next try waits for the backoff.
func (c *conn) fail(cause error) {
	c.mu.Lock()
	old := c.sess
	if old != nil {
		c.sess, c.gen = nil, c.gen+1
	}
	c.failures++
	c.health.State = StateDegraded
	if c.failures >= c.reg.cfg.ErrorAfter {
		c.health.State = StateError
	}
	c.health.LastError = cause.Error()
	c.health.CheckedAt = time.Now()
	c.nextTry = time.Now().Add(c.reg.backoff(c.failures))
	h, closed := c.health, c.closed
	c.mu.Unlock()
	if old != nil {
		c.reg.closeLater(old)
	}
	if closed {
		return
	}
	c.reg.logger.Warn("connector down", append(c.logAttrs(), slog.String("state", string(h.State)),
		slog.String("error", h.LastError))...)
	c.reg.saveHealth(c, h)
}

// reinitialize starts a new MCP session on the same client and HTTP
// transport after a streamable-HTTP server forgot ours. Concurrent callers
// that hit the same lost session share one re-initialize. It sends the
// initialize handshake through the transport rather than calling
// client.Initialize, which writes client state without synchronization
// and so cannot run beside calls in flight; the transport keeps the new
// session id under its own lock, and the protocol version stays the one
// negotiated at connect.
func (c *conn) reinitialize(s *session, gen, epoch uint64) error {
	key := "reinit-" + strconv.FormatUint(gen, 10) + "-" + strconv.FormatUint(epoch, 10)
	_, err, _ := c.flight.Do(key, func() (_ any, err error) {
		if c.epoch.Load() != epoch {
			return nil, nil // mended since this caller's request went out
		}
		ctx, span := c.reg.tracer.Start(c.reg.life, "mcp.reinitialize", trace.WithAttributes(c.attrs()...))
		defer func() { endSpan(span, err) }()
		ctx, cancel := context.WithTimeout(ctx, c.spec.ConnectTimeout)
		defer cancel()
		if err := handshake(ctx, s.client, key); err != nil {
			return nil, fmt.Errorf("re-initialize: %w", err)
		}
		c.epoch.Add(1)
		c.usage.reinits.Add(1)
		c.reg.logger.Info("connector session re-initialized", c.logAttrs()...)
		return nil, nil
	})
	return err
}

// handshake sends initialize and notifications/initialized over cl's
// transport, as the negotiated protocol version.
func handshake(ctx context.Context, cl *client.Client, id string) error {
	tr := cl.GetTransport()
	req := initializeRequest()
	resp, err := tr.SendRequest(ctx, transport.JSONRPCRequest{
		JSONRPC: mcp.JSONRPC_VERSION,
		ID:      mcp.NewRequestId(id),
		Method:  string(mcp.MethodInitialize),
		Params: map[string]any{
			"protocolVersion": cl.ProtocolVersion(),
			"clientInfo":      req.Params.ClientInfo,
			"capabilities":    map[string]any{},
		},
	})
	if err != nil {
		return err
	}
	if resp.Error != nil {
		return resp.Error.AsError()
	}
	return tr.SendNotification(ctx, mcp.JSONRPCNotification{
		JSONRPC:      mcp.JSONRPC_VERSION,
		Notification: mcp.Notification{Method: string(mcp.MethodNotificationInitialized)},
	})
}

// canReinitialize reports whether a lost session is mended on the same
// client: only streamable HTTP on the session-based protocol. A lost SSE
// session is a dead stream, so that client is rebuilt.
func (c *conn) canReinitialize() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.spec.Transport == TransportStreamableHTTP && c.legacy
}

// call runs one tool over the persistent session. A lost session is
// re-initialized and the call retried once (it never ran). A broken
// connection is rebuilt, and the call retried only if retrySafe.
func (c *conn) call(ctx context.Context, name string, args map[string]any, retrySafe bool) (res *mcp.CallToolResult, err error) {
	ctx, span := c.reg.tracer.Start(ctx, "mcp.tools/call", trace.WithAttributes(append(c.attrs(), attribute.String("mcp.tool", name))...))
	defer func() { endSpan(span, err) }()
	ctx, cancel := context.WithTimeout(ctx, c.spec.CallTimeout)
	defer cancel()
	c.usage.lastUsed.Store(time.Now().UnixNano())
	defer func() {
		c.usage.calls.Add(1)
		if err != nil || (res != nil && res.IsError) {
			c.usage.errors.Add(1)
		}
	}()

	s, gen, err := c.current(ctx)
	if err != nil {
		return nil, err
	}
	epoch := c.epoch.Load()
	res, err = callTool(ctx, s, name, args)
	if err == nil || ctx.Err() != nil {
		return res, err
	}
	lost := isSessionLost(err)
	if lost {
		// The request was refused for its session and never ran: mend the
		// session and run it again, whatever the tool.
		if s, err = c.renewSession(ctx, s, gen, epoch); err != nil {
			return nil, unavailable(err)
		}
		return callTool(ctx, s, name, args)
	}
	if !isConnectionBroken(err) {
		return nil, err
	}
	c.failSession(s, err)
	// It broke mid-flight and may have run: only retry-safe tools run again.
	if !retrySafe {
		return nil, unavailable(err)
	}
	if err := c.connectShared(ctx); err != nil {
		return nil, unavailable(err)
	}
	if s, _, err = c.current(ctx); err != nil {
		return nil, err
	}
	return callTool(ctx, s, name, args)
}

// renewSession mends a session the server no longer knows and returns the
// session to use. Streamable HTTP is re-initialized on the same client.
// Otherwise, or if the server refuses that (mcp-go clears a dead session id
// only on a 404, and servers that answer 400, like the TypeScript SDK's,
// reject the stale id), a new client starts on the connector's own
// connection pool: once per lost session, however many callers hit it.
func (c *conn) renewSession(ctx context.Context, s *session, gen, epoch uint64) (*session, error) {
	if c.canReinitialize() && c.reinitialize(s, gen, epoch) == nil {
		return s, nil
	}
	ch := c.flight.DoChan("renew-"+strconv.FormatUint(gen, 10), func() (any, error) {
		c.mu.Lock()
		current := c.gen == gen
		c.mu.Unlock()
		if !current {
			return nil, nil // renewed already
		}
		c.reg.logger.Info("connector session lost; starting a new client", c.logAttrs()...)
		return nil, c.connect()
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return nil, r.Err
		}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	s, _, err := c.current(ctx)
	return s, err
}

func callTool(ctx context.Context, s *session, name string, args map[string]any) (*mcp.CallToolResult, error) {
	var req mcp.CallToolRequest
	req.Params.Name = name
	req.Params.Arguments = args
	return s.client.CallTool(ctx, req)
}

// check probes the connection with tools/list, reconnecting a connector
// that is down, and re-syncs the catalog if the tool list changed.
func (c *conn) check() Health {
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
	list, err := c.listTools(ctx, s, gen)
	if err != nil {
		c.failSession(s, fmt.Errorf("health check: %w", err))
		return c.snapshot()
	}
	c.mu.Lock()
	if c.gen == gen {
		c.failures = 0
		c.health = Health{State: StateReady, Latency: time.Since(start), CheckedAt: time.Now(), ProtocolVersion: c.health.ProtocolVersion}
		c.nextCheck = time.Now().Add(c.reg.cfg.HealthInterval)
	}
	h := c.health
	c.mu.Unlock()
	c.setTools(ctx, list.Tools)
	c.reg.saveHealth(c, h)
	return h
}

func (c *conn) snapshot() Health {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.health
}

// close marks the conn closed and closes its session and idle HTTP
// connections.
func (c *conn) close() {
	if s := c.sessionForClose(); s != nil {
		s.close(c.reg.cfg.CloseGrace)
	}
	c.hc.CloseIdleConnections()
}

func (c *conn) attrs() []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.String("connector.workspace_id", c.spec.WorkspaceID),
		attribute.String("connector.id", c.spec.ConnectorID),
		attribute.String("mcp.transport", c.spec.Transport),
	}
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
