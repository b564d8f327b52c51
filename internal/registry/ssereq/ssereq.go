// Package ssereq answers the requests a server sends on a legacy SSE
// session's event stream. mcp-go's SSE client has no handler for them: it
// drops a request the server sends on the event stream (or, when its id is
// that of a request of ours in flight, takes it for the answer), and the
// server's tool waits until it gives up. So the session's event stream is
// read here first: a request is taken out of it and answered at once (a
// ping with an empty result, anything else with an error), POSTed to the
// session's endpoint; the caller's hooks log and count what was refused.
// It owns nothing of the registry's: the caller passes the session's URL,
// headers, RoundTripper and hooks.
package ssereq

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
)

// Refusal is the error a server's request over legacy SSE gets.
const Refusal = "this client cannot take server requests over the legacy SSE transport; use streamable HTTP"

// answerTimeout bounds the POST that answers a server's request.
const answerTimeout = 5 * time.Second

// Hooks are what a Requests asks of its owner.
type Hooks struct {
	// Refused is called, on the stream's reader, for each request other
	// than a ping, before it is answered with an error.
	Refused func(method string)
	// Go runs f off the stream's reader as background work its owner's
	// shutdown waits for, with a context its shutdown cancels; it returns
	// false (and does not run f) once shutdown has begun.
	Go func(f func(life context.Context)) bool
	// Failed is called when the POST of an answer failed.
	Failed func(err error)
}

// Requests answers the requests the server of one SSE session sends.
type Requests struct {
	base    http.RoundTripper
	baseURL *url.URL
	headers map[string]string
	hooks   Hooks

	mu       sync.Mutex
	endpoint *url.URL // from the stream's endpoint event
}

// New returns the answerer of the SSE session at rawURL, whose POSTs go
// through base with headers; nil if rawURL does not parse (the transport
// refuses it too).
func New(rawURL string, headers map[string]string, base http.RoundTripper, hooks Hooks) *Requests {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil
	}
	return &Requests{base: base, baseURL: u, headers: headers, hooks: hooks}
}

// Filter returns body, an SSE event stream, without the server's
// requests, which it answers.
func (r *Requests) Filter(body io.ReadCloser) io.ReadCloser {
	return &filter{body: body, br: bufio.NewReader(body), r: r}
}

// setEndpoint records the endpoint event's URL, as mcp-go resolves it.
func (r *Requests) setEndpoint(data string) {
	u, err := r.baseURL.Parse(strings.TrimSpace(data))
	if err != nil || u.Host != r.baseURL.Host {
		return // mcp-go refuses it too
	}
	r.mu.Lock()
	r.endpoint = u
	r.mu.Unlock()
}

// answer answers the server's request id (method), off the stream's
// reader: a ping with an empty result, anything else with an error.
func (r *Requests) answer(id json.RawMessage, method string) {
	msg := map[string]any{"jsonrpc": mcp.JSONRPC_VERSION, "id": id, "result": map[string]any{}}
	if method != string(mcp.MethodPing) {
		r.hooks.Refused(method)
		delete(msg, "result")
		msg["error"] = map[string]any{"code": mcp.METHOD_NOT_FOUND, "message": Refusal}
	}
	r.mu.Lock()
	endpoint := r.endpoint
	r.mu.Unlock()
	if endpoint == nil {
		return
	}
	body, _ := json.Marshal(msg)
	r.hooks.Go(func(life context.Context) {
		ctx, cancel := context.WithTimeout(life, answerTimeout)
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
			r.hooks.Failed(err)
			return
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
	})
}

// filter reads an SSE stream event by event and passes on every event
// but the server's requests.
type filter struct {
	body io.ReadCloser
	br   *bufio.Reader
	r    *Requests

	out        bytes.Buffer // passed on, not yet read
	raw        []byte       // the current event's lines, as read
	name, data string       // the current event's type and data
	data1      bool         // a data line was seen
	err        error
}

func (f *filter) Read(p []byte) (int, error) {
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

func (f *filter) Close() error { return f.body.Close() }

// line takes one line of the stream; a blank one ends the event.
func (f *filter) line(line []byte) {
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
func (f *filter) dispatch() {
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
