package registry

// Server requests on the legacy SSE transport. mcp-go's SSE client has no
// handler for them: it drops a request the server sends on the event
// stream (or, when its id is that of a request of ours in flight, takes it
// for the answer), and the server's tool waits until it gives up. So the
// session's event stream is read here first: a request is taken out of it
// and answered at once with an error, POSTed to the session's endpoint,
// and logged and counted.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// sseRefusal is the error a server's request over legacy SSE gets.
const sseRefusal = "this client cannot take server requests over the legacy SSE transport; use streamable HTTP"

// sseAnswerTimeout bounds the POST that answers a server's request.
const sseAnswerTimeout = 5 * time.Second

// sseRequests answers the requests the server of one SSE session sends.
type sseRequests struct {
	c       *conn
	base    http.RoundTripper
	baseURL *url.URL
	headers map[string]string

	mu       sync.Mutex
	endpoint *url.URL // from the stream's endpoint event
}

// sseRequests returns the answerer of spec's SSE session, whose POSTs go
// through base; nil for other transports.
func (c *conn) sseRequests(spec Spec, base http.RoundTripper) *sseRequests {
	if spec.Transport != TransportSSE {
		return nil
	}
	u, err := url.Parse(spec.URL)
	if err != nil {
		return nil // the transport refuses it too
	}
	return &sseRequests{c: c, base: base, baseURL: u, headers: spec.Headers}
}

// filter returns body, an SSE event stream, without the server's
// requests, which it answers.
func (r *sseRequests) filter(body io.ReadCloser) io.ReadCloser {
	return &sseFilter{body: body, br: bufio.NewReader(body), r: r}
}

// setEndpoint records the endpoint event's URL, as mcp-go resolves it.
func (r *sseRequests) setEndpoint(data string) {
	u, err := r.baseURL.Parse(strings.TrimSpace(data))
	if err != nil || u.Host != r.baseURL.Host {
		return // mcp-go refuses it too
	}
	r.mu.Lock()
	r.endpoint = u
	r.mu.Unlock()
}

// answer answers the server's request id (method), off the stream's
// reader: a ping with an empty result, anything else with an error, which
// is logged and counted.
func (r *sseRequests) answer(id json.RawMessage, method string) {
	c := r.c
	msg := map[string]any{"jsonrpc": mcp.JSONRPC_VERSION, "id": id, "result": map[string]any{}}
	if method != string(mcp.MethodPing) {
		c.reg.logger.Warn("the server asked for "+method+", which the SSE transport cannot carry; answered with an error",
			append(c.logAttrs(), slog.String("method", method))...)
		c.reg.metrics.refused(c, method)
		delete(msg, "result")
		msg["error"] = map[string]any{"code": mcp.METHOD_NOT_FOUND, "message": sseRefusal}
	}
	r.mu.Lock()
	endpoint := r.endpoint
	r.mu.Unlock()
	if endpoint == nil || !c.reg.enter() {
		return
	}
	body, _ := json.Marshal(msg)
	go func() {
		defer c.reg.bg.Done()
		ctx, cancel := context.WithTimeout(c.reg.life, sseAnswerTimeout)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint.String(), bytes.NewReader(body))
		if err != nil {
			return
		}
		req.Header.Set("Content-Type", "application/json")
		for k, v := range r.headers {
			req.Header.Set(k, v)
		}
		resp, err := r.base.RoundTrip(req)
		if err != nil {
			c.reg.logger.Debug("answering the server's request over SSE failed",
				append(c.logAttrs(), slog.String("error", c.redact.err(err).Error()))...)
			return
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
	}()
}

// sseFilter reads an SSE stream event by event and passes on every event
// but the server's requests.
type sseFilter struct {
	body io.ReadCloser
	br   *bufio.Reader
	r    *sseRequests

	out        bytes.Buffer // passed on, not yet read
	raw        []byte       // the current event's lines, as read
	name, data string       // the current event's type and data
	data1      bool         // a data line was seen
	err        error
}

func (f *sseFilter) Read(p []byte) (int, error) {
	for f.out.Len() == 0 {
		if f.err != nil {
			return 0, f.err
		}
		line, err := f.br.ReadBytes('\n')
		if len(line) > 0 {
			f.line(line)
		}
		if err != nil {
			f.out.Write(f.raw) // an unfinished event goes on as it is
			f.raw = nil
			f.err = err
		}
	}
	return f.out.Read(p)
}

func (f *sseFilter) Close() error { return f.body.Close() }

// line takes one line of the stream; a blank one ends the event.
func (f *sseFilter) line(line []byte) {
	f.raw = append(f.raw, line...)
	s := strings.TrimRight(string(line), "\r\n")
	switch {
	case s == "":
		f.dispatch()
	case strings.HasPrefix(s, "event:"):
		f.name = strings.TrimSpace(s[len("event:"):])
	case strings.HasPrefix(s, "data:"):
		v := strings.TrimPrefix(s[len("data:"):], " ")
		if f.data1 {
			f.data += "\n" + v
		} else {
			f.data, f.data1 = v, true
		}
	}
}

// dispatch ends the current event: a server's request is answered and
// dropped, anything else passed on.
func (f *sseFilter) dispatch() {
	raw, name, data := f.raw, f.name, f.data
	f.raw, f.name, f.data, f.data1 = nil, "", "", false
	switch name {
	case "endpoint":
		f.r.setEndpoint(data)
	case "", "message":
		if id, method, ok := serverRequest(data); ok {
			f.r.answer(id, method)
			return
		}
	}
	f.out.Write(raw)
}

// serverRequest reports whether data is a JSON-RPC request (a method and
// an id), and returns them.
func serverRequest(data string) (json.RawMessage, string, bool) {
	var m struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
	}
	if json.Unmarshal([]byte(data), &m) != nil || m.Method == "" || len(m.ID) == 0 || string(m.ID) == "null" {
		return nil, "", false
	}
	return m.ID, m.Method, true
}

// refused counts a server request answered with an error because the
// transport cannot carry it.
func (x *metrics) refused(c *conn, method string) {
	x.serverRefused.Add(context.Background(), 1, metric.WithAttributeSet(labels(c.spec, attribute.String("method", method))))
}
