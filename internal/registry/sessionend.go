package registry

// How a session ends: the DELETE with which mcp-go's streamable-HTTP
// transport ends an MCP session.

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/connector-svc/connector-svc/internal/registry/ssereq"
)

// deleteTimeout bounds the DELETE that ends a live streamable-HTTP
// session; mcp-go allows it 5s.
const deleteTimeout = time.Second

// sessionEnd is the RoundTripper of a session's own HTTP client, over its
// connector's connection pool. It sends no DELETE for a session known dead
// (lost, or found not answering): a server that stopped answering would
// hold it for nothing. Any other DELETE is bounded by deleteTimeout. Every
// other request goes to the pool as it is.
type sessionEnd struct {
	base http.RoundTripper
	dead atomic.Bool
	// streamed says a GET opened an event stream: an SSE session whose
	// start then times out got no endpoint event on it (see
	// transportHint).
	streamed atomic.Bool
	// sse, on a legacy SSE session, takes the server's requests out of
	// the event stream and answers them (package ssereq).
	sse *ssereq.Requests
}

// sessionClient returns hc as one session uses it, with the sessionEnd
// that ends the session.
func sessionClient(hc *http.Client) (*http.Client, *sessionEnd) {
	e := &sessionEnd{base: hc.Transport}
	if e.base == nil {
		e.base = http.DefaultTransport
	}
	own := *hc
	own.Transport = e
	return &own, e
}

// RoundTrip implements http.RoundTripper.
func (e *sessionEnd) RoundTrip(req *http.Request) (*http.Response, error) {
	switch req.Method {
	case http.MethodDelete:
	case http.MethodGet:
		resp, err := e.base.RoundTrip(req)
		if err == nil && resp.StatusCode == http.StatusOK && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			e.streamed.Store(true)
			if e.sse != nil {
				resp.Body = e.sse.Filter(resp.Body)
			}
		}
		return resp, err
	default:
		return e.base.RoundTrip(req)
	}
	if e.dead.Load() {
		// Not sent: to mcp-go, whose Close logs any error, the session
		// ended as it asked.
		return &http.Response{StatusCode: http.StatusNoContent, Status: "204 No Content", Proto: "HTTP/1.1",
			ProtoMajor: 1, ProtoMinor: 1, Header: http.Header{}, Body: http.NoBody, Request: req}, nil
	}
	ctx, cancel := context.WithTimeout(req.Context(), deleteTimeout)
	resp, err := e.base.RoundTrip(req.WithContext(ctx))
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = &closeThen{ReadCloser: resp.Body, then: cancel}
	return resp, nil
}

// markDead records that s is known dead: closing it sends the server
// nothing.
func (s *session) markDead() {
	if s.end != nil {
		s.end.dead.Store(true)
	}
}

// closeThen runs then after closing its body.
type closeThen struct {
	io.ReadCloser
	then func()
}

func (c *closeThen) Close() error {
	err := c.ReadCloser.Close()
	c.then()
	return err
}
