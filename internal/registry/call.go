package registry

// The call path: running a tool over the live session, mending a session
// the server forgot, and probing a session after a call timed out.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	"go.opentelemetry.io/otel/trace"

	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/registry/elicit"
	"github.com/connector-svc/connector-svc/internal/registry/msglimit"
	"github.com/connector-svc/connector-svc/internal/registry/progress"
	"github.com/connector-svc/connector-svc/internal/registry/sessionless"
	"github.com/connector-svc/connector-svc/internal/registry/tasks"
)

// suspect checks, in the background and at most once a second, whether s
// still answers after a call on it timed out: a server that takes requests
// but never answers them is found in seconds, not at the next health check.
func (c *conn) suspect(s *session, gen uint64) {
	now := time.Now().UnixNano()
	last := c.lastProbe.Load()
	if now-last < int64(time.Second) || !c.lastProbe.CompareAndSwap(last, now) || !c.reg.enter() {
		return
	}
	c.reg.logger.Debug("connector call timed out; probing its session", c.logAttrs()...)
	go func() {
		defer c.reg.bg.Done()
		ctx, cancel := context.WithTimeout(c.reg.life, c.reg.cfg.ProbeTimeout)
		defer cancel()
		if _, err := c.listTools(ctx, s, gen); err != nil && c.reg.life.Err() == nil {
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				err = fmt.Errorf("%w within %s: %w", errNoAnswer, c.reg.cfg.ProbeTimeout, err)
			}
			c.drop(s, fmt.Errorf("a call timed out and a probe got %w", err))
		}
	}()
}

// reinitialize starts a new MCP session on the same client and HTTP
// transport after a streamable-HTTP server forgot ours. Concurrent callers
// that hit the same lost session share one re-initialize. It sends the
// initialize handshake through the transport rather than calling
// client.Initialize, which writes client state without synchronization
// and so cannot run beside calls in flight; the transport keeps the new
// session id under its own lock, and the protocol version stays the one
// negotiated at connect. Like a connect, its span starts a trace linked to
// the span of the caller (link) who found the session lost.
func (c *conn) reinitialize(s *session, gen, epoch uint64, link trace.Link) error {
	key := "reinit-" + strconv.FormatUint(gen, 10) + "-" + strconv.FormatUint(epoch, 10)
	_, err, _ := c.flight.Do(key, func() (_ any, err error) {
		if c.epoch.Load() != epoch {
			return nil, nil // mended since this caller's request went out
		}
		ctx, span := c.reg.tracer.Start(c.reg.life, "mcp.reinitialize", trace.WithAttributes(c.attrs()...), trace.WithLinks(link))
		defer func() { endSpan(span, c.redact.err(err)) }()
		ctx, cancel := context.WithTimeout(ctx, c.spec.ConnectTimeout)
		defer cancel()
		c.reg.logger.Debug("connector session unknown to the server; re-initializing", c.logAttrs()...)
		if err := handshake(ctx, s.client, key, s.asks.capabilities()); err != nil {
			return nil, fmt.Errorf("re-initialize: %w", err)
		}
		c.epoch.Add(1)
		c.usage.reinits.Add(1)
		c.reg.metrics.count(c.reg.metrics.reinits, c)
		c.reg.logger.Info("connector session re-initialized", c.logAttrs()...)
		return nil, nil
	})
	return err
}

// handshake sends initialize and notifications/initialized over cl's
// transport, as the negotiated protocol version, declaring caps.
func handshake(ctx context.Context, cl *client.Client, id string, caps mcp.ClientCapabilities) error {
	tr := cl.GetTransport()
	req := initializeRequest()
	resp, err := tr.SendRequest(ctx, transport.JSONRPCRequest{
		JSONRPC: mcp.JSONRPC_VERSION,
		ID:      mcp.NewRequestId(id),
		Method:  string(mcp.MethodInitialize),
		Params: map[string]any{
			"protocolVersion": cl.ProtocolVersion(),
			"clientInfo":      req.Params.ClientInfo,
			"capabilities":    caps,
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

// call runs one tool of the current catalog over the persistent session.
// A lost session is re-initialized and the call retried once (it never
// ran). A broken connection is rebuilt, and the call retried only if the
// tool is annotated read-only or idempotent. Errors never carry secret
// values.
func (c *conn) call(ctx context.Context, name string, args map[string]any, opts CallOptions) (res *mcp.CallToolResult, err error) {
	ctx, span := c.callSpan(ctx, name)
	defer func() { endSpan(span, err) }()
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	start := time.Now()
	defer func() {
		if errors.Is(err, errReplaced) || errors.Is(err, ErrToolNotFound) || errors.Is(err, ErrToolDisabled) {
			return // refused before it ran, or counted where it runs
		}
		c.reg.metrics.called(ctx, c, name, time.Since(start), res, err)
		c.usage.lastUsed.Store(time.Now().UnixNano())
		c.usage.calls.Add(1)
		if (err != nil && !awaitsInput(err)) || (res != nil && res.IsError) {
			c.usage.errors.Add(1)
		}
		err = c.redact.err(err)
	}()

	s, gen, tool, err := c.acquire(ctx, name)
	if err != nil {
		return nil, err
	}
	defer s.release()
	opts.asTask = tasks.Required(tool)
	epoch := c.epoch.Load()
	res, err = callTool(ctx, s, name, args, opts)
	switch why := c.closedCause(); {
	case err == nil:
		return res, nil
	case errors.Is(err, ErrResultTooLarge), IsAuthError(err):
		// Refused as it was read, or by the authorizing transport before
		// it went out: the session goes on.
		return nil, err
	case why != nil && why != errReplaced:
		return nil, why // deleted, deactivated or shut down under the call
	case ctx.Err() != nil:
		if EndedByDeadline(ctx) {
			c.suspect(s, gen)
		}
		return nil, endedWith(ctx, err)
	case isSessionLost(err) && !tasks.Ran(err):
		// The request was refused for its session and never ran: mend the
		// session and run it again, whatever the tool.
		if s, err = c.renewSession(ctx, s, gen, epoch); err != nil {
			return nil, c.unavailable(err)
		}
		c.reg.logger.Debug("retrying call on the renewed session", append(c.logAttrs(), slog.String("tool", name))...)
		return callTool(ctx, s, name, args, opts)
	case !isConnectionBroken(err):
		return nil, err
	}
	c.drop(s, err)
	// It broke mid-flight and may have run: only retry-safe tools run again.
	if !retrySafe(tool) {
		c.reg.logger.Debug("call broke mid-flight; not retried: the tool is not read-only or idempotent",
			append(c.logAttrs(), slog.String("tool", name))...)
		return nil, c.unavailable(err)
	}
	c.reg.logger.Debug("call broke mid-flight; retrying on a new connection: the tool is read-only or idempotent",
		append(c.logAttrs(), slog.String("tool", name))...)
	// acquire waits for the reconnect the drop scheduled, or finds the
	// session that took this one's place.
	s2, _, _, err := c.acquire(ctx, name)
	if err != nil {
		return nil, err
	}
	defer s2.release()
	return callTool(ctx, s2, name, args, opts)
}

// acquire finds the live session, counts a call on it and returns the
// named tool as the session's catalog has it. A session retired between
// the two steps is looked up again.
func (c *conn) acquire(ctx context.Context, name string) (*session, uint64, mcp.Tool, error) {
	for {
		s, gen, cat, err := c.ready(ctx)
		if err != nil {
			return nil, 0, mcp.Tool{}, err
		}
		t, err := cat.callable(name)
		if err != nil {
			return nil, 0, mcp.Tool{}, err
		}
		if s.acquire() {
			return s, gen, t, nil
		}
		if err := ctx.Err(); err != nil {
			return nil, 0, mcp.Tool{}, err
		}
	}
}

func retrySafe(t mcp.Tool) bool {
	return t.Annotations.ReadOnlyHint != nil && *t.Annotations.ReadOnlyHint ||
		t.Annotations.IdempotentHint != nil && *t.Annotations.IdempotentHint
}

// renewSession mends a session the server no longer knows and returns the
// session to use. Streamable HTTP is re-initialized on the same client.
// Otherwise, or if the server refuses that (mcp-go clears a dead session id
// only on a 404, and servers that answer 400, like the TypeScript SDK's,
// reject the stale id), a new client starts on the connector's own
// connection pool: once per lost session, however many callers hit it.
func (c *conn) renewSession(ctx context.Context, s *session, gen, epoch uint64) (*session, error) {
	if c.canReinitialize() && c.reinitialize(s, gen, epoch, trace.LinkFromContext(ctx)) == nil {
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
		return nil, c.connect(trace.LinkFromContext(ctx), s)
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return nil, r.Err
		}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	s, _, _, err := c.ready(ctx)
	return s, err
}

// callTool sends one tools/call over s, as a task if opts say so (see
// package tasks). With opts.Progress, the request gets a progress token of its
// own, routed to it while it runs (see CallOptions.Progress). An answer
// over the size limit is ErrResultTooLarge; a classic server's -32042 an
// *ask.URLRequiredError. While it runs, the call is one of s's calls in
// flight, to which the server's requests may be routed (see asks.route).
func callTool(ctx context.Context, s *session, name string, args map[string]any, opts CallOptions) (*mcp.CallToolResult, error) {
	defer s.asks.track(ctx)()
	defer s.get.enter(ctx)()
	if opts.asTask {
		res, err := tasks.Call(ctx, s.taskSession(), name, args, tasks.Options{Progress: opts.Progress, TaskID: opts.TaskID})
		return res, elicit.URLRequired(msglimit.AsTooLarge(err))
	}
	res, err := sendCall(ctx, s, name, args, opts)
	return res, elicit.URLRequired(msglimit.AsTooLarge(err))
}

func sendCall(ctx context.Context, s *session, name string, args map[string]any, opts CallOptions) (*mcp.CallToolResult, error) {
	if args == nil {
		args = map[string]any{} // servers validate arguments as an object; null is refused
	}
	var req mcp.CallToolRequest
	req.Params.Name = name
	req.Params.Arguments = args
	send := func() (*mcp.CallToolResult, error) {
		if s.sessionless(opts.Retry) {
			return sessionless.Call(ctx, s.sessionlessSession(), name, args, req.Params.Meta, opts.Retry)
		}
		return s.client.CallTool(ctx, req)
	}
	if opts.Progress == nil {
		if s.asks != nil {
			// A token of its own lets a server name the call its requests
			// belong to (see asks.route); its progress goes nowhere.
			token := s.asks.newToken()
			req.Params.Meta = &mcp.Meta{ProgressToken: token}
			s.relateToken(ctx, token)
		}
		return send()
	}
	token, q := s.progress.Add()
	defer s.progress.Remove(token)
	req.Params.Meta = &mcp.Meta{ProgressToken: token}
	s.relateToken(ctx, token)
	return progress.Call(q, opts.Progress, send)
}

// sessionless reports whether calls on s take the raw path: a session of
// the sessionless protocol that declares something a server may ask for,
// or a call that carries answers.
func (s *session) sessionless(retry *ask.Retry) bool {
	return mcp.IsModernProtocol(s.version) && (s.asks != nil || retry != nil)
}

// sessionlessSession is s as package sessionless runs a call on it: its
// sampling requests are served through Config.Sample, the call's clock
// stopped meanwhile.
func (s *session) sessionlessSession() sessionless.Session {
	ss := sessionless.Session{Transport: s.client.GetTransport(), Version: s.version, Capabilities: s.asks.capabilities(),
		ClientInfo: initializeRequest().Params.ClientInfo}
	if a := s.asks; a != nil {
		ss.Elicit = a.elicit
		ss.Sample = func(ctx context.Context, asker ask.Asker, call ask.Call, req mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			resume, _ := pauseCall(ctx)
			defer resume()
			return a.c.sample(ctx, asker, call, req)
		}
	}
	return ss
}
