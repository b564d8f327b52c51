package registry

// The standalone GET stream of a classic streamable-HTTP session: the
// stream a server keeps for messages of its own, on which it may send
// elicitation/create, sampling/createMessage or a task's questions instead
// of on the call's response stream (mcp-go's servers always do). mcp-go's
// client opens it only with WithContinuousListening, which pins the
// client to the legacy protocol (it would never try the sessionless one),
// so the registry reads it itself: same session id, same protocol
// version, same HTTP client (the connector's headers and auth), and posts
// the answers as mcp-go would.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
)

// onGETStream marks the context of a server request that came on the
// standalone GET stream, which carries no call's context (see
// asks.route).
type onGETStream struct{}

// getRetry is how long the reader waits before opening the stream again
// after it ended or failed.
const getRetry = time.Second

// getLinger is how long the stream stays open after the session's last
// call ended, so that calls in a row do not each open it again.
const getLinger = 2 * time.Second

// getConnectWait bounds how long a call waits, before it is sent, for the
// stream to open: a server that asks at once must find it open.
const getConnectWait = time.Second

// listen prepares the GET stream of s, a session of spec initialized at
// version, when a server's requests may come on it (a classic
// streamable-HTTP session that declares elicitation or sampling) or its
// notifications of subscribed resources (one whose server takes
// subscriptions: see holdStream). The
// stream is open while calls run on the session (and getLinger after):
// a request there needs an open call to go to anyway, and a stream held
// open for good would keep a server (or a test's) from shutting down
// gracefully. A server that does not offer it (405) or no longer knows the
// session (404) is not asked again.
func (s *session) listen(c *conn, spec Spec, hc *http.Client) {
	h, ok := s.client.GetTransport().(*transport.StreamableHTTP)
	if !ok || (s.asks == nil && !s.caps().Subscribe) || spec.Transport != TransportStreamableHTTP || mcp.IsModernProtocol(s.version) ||
		h.GetSessionId() == "" {
		return
	}
	s.get = &getStream{s: s, c: c, url: spec.URL, headers: spec.Headers, hc: hc, session: h.GetSessionId()}
}

// enter counts a call on the session, opening the stream if it is not,
// and waits up to getConnectWait (or ctx) for it to be open; the returned
// func ends the call. A nil g does nothing, nor does one of a session
// that declares nothing a server may ask (its stream carries only the
// notifications of subscriptions: see hold).
func (g *getStream) enter(ctx context.Context) func() {
	if g == nil || g.s.asks == nil {
		return func() {}
	}
	return g.open1(ctx)
}

// hold opens the stream for good: the session holds subscriptions, whose
// notifications come on it.
func (g *getStream) hold(ctx context.Context) {
	if g != nil {
		g.open1(ctx)
	}
}

func (g *getStream) open1(ctx context.Context) func() {
	g.mu.Lock()
	g.calls++
	if g.linger != nil {
		g.linger.Stop()
		g.linger = nil
	}
	if g.cancel == nil && !g.stopped {
		rctx, cancel := context.WithCancel(g.s.life)
		g.cancel, g.open = cancel, make(chan struct{})
		go g.run(rctx, g.open)
	}
	open := g.open
	g.mu.Unlock()
	if open != nil {
		t := time.NewTimer(getConnectWait)
		select {
		case <-open:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	return g.leave
}

// leave ends a call counted by enter: the last one closes the stream
// after getLinger.
func (g *getStream) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls--
	if g.calls > 0 || g.cancel == nil {
		return
	}
	g.linger = time.AfterFunc(getLinger, func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.calls == 0 && g.cancel != nil {
			g.cancel()
			g.cancel, g.open = nil, nil
		}
	})
}

type getStream struct {
	s       *session
	c       *conn
	url     string
	headers map[string]string
	hc      *http.Client
	session string

	mu      sync.Mutex
	calls   int
	cancel  context.CancelFunc // ends the reader; nil when none runs
	open    chan struct{}      // closed once the reader's stream is open (or it gave up)
	linger  *time.Timer
	stopped bool // the server does not offer the stream
}

// errStop ends the reader for good.
var errStop = errors.New("the server does not offer the GET stream on this session")

// run reads the stream until ctx ends, opening it again after a break;
// open is closed once it is open, or once it cannot be.
func (g *getStream) run(ctx context.Context, open chan struct{}) {
	var once sync.Once
	opened := func() { once.Do(func() { close(open) }) }
	defer opened()
	for ctx.Err() == nil {
		err := g.read(ctx, opened)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errStop) {
			g.c.reg.logger.Debug("no standalone GET stream", append(g.c.logAttrs(), slog.String("error", err.Error()))...)
			g.mu.Lock()
			g.stopped = true
			g.mu.Unlock()
			return
		}
		opened() // a call does not wait for a stream that failed
		select {
		case <-ctx.Done():
			return
		case <-time.After(getRetry):
		}
	}
}

// request is an HTTP request on the session, with its headers.
func (g *getStream) request(ctx context.Context, method string, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, g.url, body)
	if err != nil {
		return nil, err
	}
	for k, v := range g.headers {
		req.Header.Set(k, v)
	}
	req.Header.Set(transport.HeaderKeySessionID, g.session)
	req.Header.Set(transport.HeaderKeyProtocolVersion, g.s.version)
	return req, nil
}

// read opens the stream once and reads it to its end, calling opened
// once it is open.
func (g *getStream) read(ctx context.Context, opened func()) error {
	req, err := g.request(ctx, http.MethodGet, nil)
	if err != nil {
		return fmt.Errorf("%w: %v", errStop, err)
	}
	req.Header.Set("Accept", "text/event-stream")
	resp, err := g.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusMethodNotAllowed || resp.StatusCode == http.StatusNotFound:
		return fmt.Errorf("%w (status %d)", errStop, resp.StatusCode)
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("GET stream: status %d", resp.StatusCode)
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/event-stream" {
		return fmt.Errorf("%w (content type %q)", errStop, mt)
	}
	opened()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var data []string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if len(data) > 0 {
				g.dispatch(ctx, []byte(strings.Join(data, "\n")))
			}
			data = data[:0]
		case strings.HasPrefix(line, "data:"):
			data = append(data, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		}
	}
	return sc.Err()
}

// message is a JSON-RPC message on the stream.
type message struct {
	ID     json.RawMessage `json:"id,omitempty"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params,omitempty"`
}

// dispatch handles one message: a request is answered (in its own
// goroutine: a user's answer may take long), a progress notification
// routed; anything else is not for the service.
func (g *getStream) dispatch(ctx context.Context, data []byte) {
	var m message
	if json.Unmarshal(data, &m) != nil || m.Method == "" {
		return
	}
	if len(m.ID) == 0 || string(m.ID) == "null" {
		var n mcp.JSONRPCNotification
		if json.Unmarshal(data, &n) == nil {
			g.s.progress.Route(n)
			g.c.contentNotified(n)
		}
		return
	}
	go g.answer(ctx, m)
}

// answer serves one server request and posts its answer; a request that
// cannot be served gets a JSON-RPC error at once.
func (g *getStream) answer(ctx context.Context, m message) {
	rctx, cancel := context.WithTimeout(context.WithValue(ctx, onGETStream{}, true), httpHandlerLimit)
	defer cancel()
	var result any
	err := error(&requestError{code: mcp.METHOD_NOT_FOUND, msg: "the client declared no capability for " + m.Method})
	if g.s.asks != nil {
		result, err = g.s.asks.serve(rctx, m.Method, m.Params)
	}
	out := map[string]any{"jsonrpc": "2.0", "id": m.ID}
	var rerr *requestError
	switch {
	case errors.As(err, &rerr):
		out["error"] = map[string]any{"code": rerr.code, "message": rerr.msg}
	case err != nil:
		out["error"] = map[string]any{"code": mcp.INTERNAL_ERROR, "message": err.Error()}
	default:
		out["result"] = result
	}
	body, _ := json.Marshal(out)
	// The answer goes even if the session is closing: the server waits.
	pctx, pcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer pcancel()
	req, err := g.request(pctx, http.MethodPost, bytes.NewReader(body))
	if err != nil {
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := g.hc.Do(req)
	if err != nil {
		g.c.reg.logger.Debug("answering the server's request on the GET stream failed",
			append(g.c.logAttrs(), slog.String("error", g.c.redact.err(err).Error()))...)
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
}

// requestError is a server request refused with a JSON-RPC error code.
type requestError struct {
	code int
	msg  string
}

func (e *requestError) Error() string { return e.msg }
