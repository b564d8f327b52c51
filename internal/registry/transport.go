package registry

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"

	"github.com/connector-svc/connector-svc/internal/registry/httppool"
	"github.com/connector-svc/connector-svc/internal/registry/progress"
	"github.com/connector-svc/connector-svc/internal/registry/stdio"
	"github.com/connector-svc/connector-svc/internal/registry/tasks"
)

// Transports a Spec may name.
const (
	TransportStdio          = "stdio"
	TransportSSE            = "sse"
	TransportStreamableHTTP = "streamable_http"
)

// session is one live MCP client and what must be torn down with it. It
// counts the calls running on it so that a swap can drain them, and it
// reports its own death (an SSE stream that ends, a stdio process that
// exits or closes stdout) to whoever watches it.
type session struct {
	client *client.Client
	proc   *stdio.Process // stdio only
	cancel context.CancelFunc
	life   context.Context // ended by cancel: bounds the session's own streams (see listen)
	opened time.Time
	end    *httppool.SessionEnd // HTTP only: ends the session; see markDead
	// version is the protocol version negotiated (or adopted: see attach).
	version string
	// restart says the session took the place of one its caller session
	// had (see CallOptions.Restarted); the first call on it clears it.
	restart atomic.Bool
	// progress routes notifications/progress to the calls that asked.
	progress progress.Routes
	// asks serves the server's requests (elicitation, sampling); nil when
	// the session declares neither.
	asks *asks
	// get is the standalone GET stream a server may ask on (see
	// getstream.go); nil when the session does not read it.
	get *getStream

	mu       sync.Mutex
	calls    int           // calls running on the session
	draining bool          // takes no new calls
	idle     chan struct{} // closed when draining and calls reach 0
	closing  bool          // closed on purpose: its death is not news
	deadErr  error         // why the transport died on its own
	onDead   func(error)   // the watcher, told once
}

// newSession builds the transport for spec and starts it; the client is not
// initialized yet. life bounds the transport's background streams. HTTP
// transports use hc, the connector's own connection pool, which outlives
// any one session, and log through logger. The stdio transport, built on
// the process's pipes by transport.NewIO, takes no logger: it logs
// through slog's default one. m counts stdio processes until they are
// reaped. A stdio server's lines are limited to maxMessage bytes each. A
// streamable-HTTP session with an attach handle goes on with that MCP
// session (see Registry.Adopt); the zero handle starts a new one.
func newSession(life context.Context, spec Spec, hc *http.Client, opts []client.ClientOption, startTimeout time.Duration,
	maxMessage int, logger *slog.Logger, m *metrics, attach SessionHandle) (*session, error) {
	ctx, cancel := context.WithCancel(life)
	s := &session{cancel: cancel, life: ctx, opened: time.Now()}
	var tr transport.Interface
	switch spec.Transport {
	case TransportStdio:
		reaped := m.processStarted(spec)
		p, err := stdio.Start(spec.Command, spec.Args, spec.Env, func(err error) { reaped(); s.died(err) })
		if err != nil {
			reaped()
			cancel()
			return nil, err
		}
		s.proc = p
		tr = transport.NewIO(p.StdoutReader(maxMessage, s.died), p.Stdin(), nil)
	case TransportSSE:
		sse, err := transport.NewSSE(spec.URL, transport.WithHeaders(spec.Headers), transport.WithHTTPClient(hc),
			transport.WithSSELogger(logger))
		if err != nil {
			cancel()
			return nil, fmt.Errorf("sse transport: %w", err)
		}
		sse.SetConnectionLostHandler(func(err error) { s.died(fmt.Errorf("sse stream ended: %w", err)) })
		tr = sse
	case TransportStreamableHTTP:
		topts := []transport.StreamableHTTPCOption{transport.WithHTTPHeaders(spec.Headers), transport.WithHTTPBasicClient(hc),
			transport.WithHTTPLogger(logger)}
		if attach.MCPSessionID != "" {
			topts = append(topts, transport.WithSession(attach.MCPSessionID))
		}
		h, err := transport.NewStreamableHTTP(spec.URL, topts...)
		if err != nil {
			cancel()
			return nil, fmt.Errorf("streamable http transport: %w", err)
		}
		if attach.ProtocolVersion != "" {
			// An attached client negotiates nothing: its requests carry
			// the version the session was opened with.
			h.SetProtocolVersion(attach.ProtocolVersion)
		}
		tr = h
	default:
		cancel()
		return nil, fmt.Errorf("unknown transport %q", spec.Transport)
	}
	s.client = client.NewClient(tr, opts...)
	s.client.OnNotification(s.progress.Route)
	// Start binds background streams to its context, so it gets the
	// session's lifetime and is bounded by a timer instead.
	started := make(chan error, 1)
	go func() { started <- s.client.Start(ctx) }()
	select {
	case err := <-started:
		if err != nil {
			s.close(time.Second)
			return nil, fmt.Errorf("start: %w", err)
		}
	case <-time.After(startTimeout):
		s.close(time.Second)
		<-started
		return nil, fmt.Errorf("start: no answer within %s", startTimeout)
	}
	return s, nil
}

// taskSession is s as a task call runs on it (see package tasks).
func (s *session) taskSession() tasks.Session {
	return tasks.Session{Client: s.client, Version: s.version, Progress: &s.progress, Relate: s.relateTask,
		Broken: isConnectionBroken}
}

// markDead records that s is known dead: closing it sends the server
// nothing.
func (s *session) markDead() {
	if s.end != nil {
		s.end.MarkDead()
	}
}

// died records that the transport ended on its own and tells the watcher,
// once. A session being closed on purpose has not died.
func (s *session) died(err error) {
	s.mu.Lock()
	if s.closing || s.deadErr != nil {
		s.mu.Unlock()
		return
	}
	s.deadErr = err
	fn := s.onDead
	s.mu.Unlock()
	if fn != nil {
		fn(err)
	}
}

// watch sets fn to be told when the session dies; if it has died already,
// fn is told now. fn is told at most once.
func (s *session) watch(fn func(error)) {
	s.mu.Lock()
	s.onDead = fn
	err, closing := s.deadErr, s.closing
	s.mu.Unlock()
	if err != nil && !closing {
		fn(err)
	}
}

// acquire counts a call on the session; false means the session is
// draining or closed and the call must find the current one.
func (s *session) acquire() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining || s.closing {
		return false
	}
	s.calls++
	return true
}

// release ends a call counted by acquire.
func (s *session) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls--
	if s.calls == 0 && s.idle != nil {
		close(s.idle)
		s.idle = nil
	}
}

// drain stops new calls and waits up to timeout for the running ones.
func (s *session) drain(timeout time.Duration) {
	s.mu.Lock()
	s.draining = true
	if s.calls == 0 {
		s.mu.Unlock()
		return
	}
	idle := make(chan struct{})
	s.idle = idle
	s.mu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-idle:
	case <-t.C:
	}
}

// close closes the client and, for stdio, kills the server's whole process
// group once grace has passed, and returns when everything is gone. An
// HTTP session's close returns at once: what it sends the server (a
// DELETE) is bounded by the session's client (see httppool.SessionEnd), and waits
// for nothing. Safe to call more than once.
func (s *session) close(grace time.Duration) {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	if s.proc == nil {
		go func() { _ = s.client.Close() }()
		s.cancel()
		return
	}
	done := make(chan struct{})
	go func() {
		_ = s.client.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(grace):
	}
	s.cancel()
	if s.proc != nil {
		s.proc.Stop(grace)
	}
}

// deathCause is the best account of why s failed with err: for a stdio
// server that is exiting, its exit status and the tail of its stderr.
func (s *session) deathCause(err error, wait time.Duration) error {
	if s.proc == nil {
		return err
	}
	if exit := s.proc.ExitError(wait); exit != nil {
		return exit
	}
	return err
}

// stderrText is the tail of a closed stdio server's stderr, for errors.
func (s *session) stderrText() string {
	if s.proc == nil {
		return ""
	}
	return s.proc.StderrTail()
}

// mcpLogger is the logger of c's mcp-go transports: the registry's, naming
// the connector. mcp-go's errors come out as warnings: they are about one
// connection, whose loss the registry reports on its own.
func (c *conn) mcpLogger() *slog.Logger {
	return slog.New(warnAtMost{c.reg.logger.Handler()}).With(append(c.logAttrs(), slog.String("component", "mcp-go"))...)
}

// warnAtMost is a slog.Handler that lowers errors to warnings.
type warnAtMost struct{ slog.Handler }

func (h warnAtMost) Enabled(ctx context.Context, level slog.Level) bool {
	return h.Handler.Enabled(ctx, min(level, slog.LevelWarn))
}

func (h warnAtMost) Handle(ctx context.Context, r slog.Record) error {
	r.Level = min(r.Level, slog.LevelWarn)
	return h.Handler.Handle(ctx, r)
}

func (h warnAtMost) WithAttrs(attrs []slog.Attr) slog.Handler {
	return warnAtMost{h.Handler.WithAttrs(attrs)}
}

func (h warnAtMost) WithGroup(name string) slog.Handler { return warnAtMost{h.Handler.WithGroup(name)} }
