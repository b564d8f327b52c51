package httppool

// How a session ends: the DELETE with which mcp-go's streamable-HTTP
// transport ends an MCP session.

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
)

// deleteTimeout bounds the DELETE that ends a live streamable-HTTP
// session; mcp-go allows it 5s.
const deleteTimeout = time.Second

// SessionEnd is the RoundTripper of a session's own HTTP client, over its
// connector's connection pool. It sends no DELETE for a session known dead
// (lost, or found not answering): a server that stopped answering would
// hold it for nothing. Any other DELETE is bounded by deleteTimeout. Every
// other request goes to the pool as it is.
type SessionEnd struct {
	base http.RoundTripper
	dead atomic.Bool
	// streamed says a GET opened an event stream: an SSE session whose
	// start then times out got no endpoint event on it.
	streamed atomic.Bool
	// filter, if set, reads every event stream a GET opens first (on a
	// legacy SSE session, package ssereq takes the server's requests out
	// of it and answers them).
	filter func(io.ReadCloser) io.ReadCloser
}

// SessionClient returns hc as one session uses it, with the SessionEnd
// that ends the session.
func SessionClient(hc *http.Client) (*http.Client, *SessionEnd) {
	e := &SessionEnd{base: hc.Transport}
	if e.base == nil {
		e.base = http.DefaultTransport
	}
	own := *hc
	own.Transport = e
	return &own, e
}

// RoundTrip implements http.RoundTripper.
func (e *SessionEnd) RoundTrip(req *http.Request) (*http.Response, error) {
	switch req.Method {
	case http.MethodDelete:
	case http.MethodGet:
		resp, err := e.base.RoundTrip(req)
		if err == nil && resp.StatusCode == http.StatusOK && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			e.streamed.Store(true)
			if e.filter != nil {
				resp.Body = e.filter(resp.Body)
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

// Base is the RoundTripper under e: the connector's pool, or hc's.
func (e *SessionEnd) Base() http.RoundTripper { return e.base }

// SetFilter makes f read every event stream a GET opens first. Call it
// before the session's first request.
func (e *SessionEnd) SetFilter(f func(io.ReadCloser) io.ReadCloser) { e.filter = f }

// MarkDead records that the session is known dead (or handed over to
// another replica): closing it sends the server nothing.
func (e *SessionEnd) MarkDead() { e.dead.Store(true) }

// Streamed reports whether a GET opened an event stream.
func (e *SessionEnd) Streamed() bool { return e.streamed.Load() }

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
