package registry

// Adoptable per-session connections: another replica continues a caller
// session's MCP session where this one left it (classic streamable HTTP
// only: the server keeps the session under its Mcp-Session-Id).

import (
	"net/http"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/registry/httppool"
	"github.com/connector-svc/connector-svc/internal/registry/msglimit"
)

// SessionHandle is what another replica needs to continue an MCP session
// of classic streamable HTTP: the id the server assigned it and the
// protocol version negotiated. It is no secret, but names a live session
// at the server: keep it where callers cannot read it.
type SessionHandle struct {
	MCPSessionID    string
	ProtocolVersion string
	// OpenedAt, if set, is when the caller session was first opened, on
	// whichever replica: an adopted session keeps it in ListSessions. Only
	// Adopt reads it; SessionHandle leaves it unset.
	OpenedAt time.Time
}

// adoptable reports whether h names a session another replica can attach
// to: one with a server-assigned id, on a protocol version with sessions.
func (h SessionHandle) adoptable() bool {
	return h.MCPSessionID != "" && h.ProtocolVersion != "" && !mcp.IsModernProtocol(h.ProtocolVersion)
}

// handle returns the handle of s, if another replica can attach to it:
// classic streamable HTTP with a server-assigned session id, not ended.
func (s *session) handle() (SessionHandle, bool) {
	tr, ok := s.client.GetTransport().(*transport.StreamableHTTP)
	if !ok {
		return SessionHandle{}, false
	}
	h := SessionHandle{MCPSessionID: tr.GetSessionId(), ProtocolVersion: s.version}
	return h, h.adoptable()
}

// SessionHandle returns the handle of caller session sessionID's live MCP
// session on per_session connector id; false if it has none here, or if
// it cannot be adopted (stdio, SSE, the sessionless protocol, or no
// session id from the server).
func (r *Registry) SessionHandle(id int64, sessionID string) (SessionHandle, bool) {
	c, err := r.get(id)
	if err != nil {
		return SessionHandle{}, false
	}
	c.mu.Lock()
	sc := c.sessions[sessionID]
	c.mu.Unlock()
	if sc == nil {
		return SessionHandle{}, false
	}
	sc.mu.Lock()
	s := sc.sess
	sc.mu.Unlock()
	if s == nil {
		return SessionHandle{}, false
	}
	return s.handle()
}

// Adopt makes caller session sessionID of per_session connector id
// continue the MCP session of h, which another replica opened (see
// SessionHandle, Config.DetachSessions): its next call here attaches to
// that session, with no initialize. It returns false, and changes
// nothing, where that cannot be: a connector this registry does not hold,
// a shared one, stdio or SSE, a server of the sessionless protocol, or a
// handle without a session id; the caller then lets the next call open a
// new session, and tells its caller the session restarted. A session
// already live here is kept: true if it is h's, false if not. If the
// server no longer knows h's session (it answers 404), the call opens a
// new one and reports it through CallOptions.Restarted. An adopted
// session counts towards MaxSessions: false at the cap.
func (r *Registry) Adopt(id int64, sessionID string, h SessionHandle) bool {
	c, err := r.get(id)
	if err != nil || !c.spec.ownConnections() || c.spec.Transport != TransportStreamableHTTP || !h.adoptable() || sessionID == "" {
		return false
	}
	c.mu.Lock()
	sessionless := c.noClassic
	c.mu.Unlock()
	if sessionless {
		return false
	}
	sc, err := c.sessionFor(sessionID)
	if err != nil {
		return false
	}
	defer sc.done()
	sc.mu.Lock()
	defer sc.mu.Unlock()
	switch {
	case sc.closed:
		return false
	case sc.sess != nil:
		cur, ok := sc.sess.handle()
		return ok && cur.MCPSessionID == h.MCPSessionID
	}
	if !h.OpenedAt.IsZero() && h.OpenedAt.Before(sc.opened) {
		sc.opened = h.OpenedAt
	}
	h.OpenedAt = time.Time{} // the handle as the session's own
	sc.adopt, sc.had = &h, true
	return true
}

// attach starts a session on the live MCP session of h, as another
// replica left it: no handshake, and so nothing sent yet.
func (c *conn) attach(spec Spec, hc *http.Client, h SessionHandle) (*session, error) {
	own, end := httppool.SessionClient(hc)
	asks := c.newAsks(spec)
	opts := append([]client.ClientOption{client.WithSession(), client.WithProtocolVersion(h.ProtocolVersion)}, asks.options()...)
	s, err := newSession(c.reg.life, spec, own, opts, c.spec.ConnectTimeout, msglimit.ForResult(c.reg.cfg.MaxResultBytes),
		c.mcpLogger(), c.reg.metrics, h)
	if err != nil {
		return nil, err
	}
	s.end, s.version, s.asks = end, h.ProtocolVersion, asks
	s.listen(c, spec, own) // the GET stream, where a server may ask (getstream.go)
	return s, nil
}

// detach marks s as handed over: closing it sends the server nothing (no
// DELETE), so that another replica can go on with its MCP session.
func (s *session) detach() {
	if s.end != nil {
		s.end.MarkDead()
	}
}

// HasSession reports whether caller session sessionID of connector id has
// its connection entry here (open, opening, or adopted and not used yet).
func (r *Registry) HasSession(id int64, sessionID string) bool {
	c, err := r.get(id)
	if err != nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sessions[sessionID] != nil
}

// Restarted tells caller session sessionID of per_session connector id
// that it had an MCP session elsewhere (on a replica that stopped) that
// cannot be adopted: the first call that runs on the new session here
// reports CallOptions.Restarted. False where the registry does not hold
// the connector or the session is live here already.
func (r *Registry) Restarted(id int64, sessionID string) bool {
	c, err := r.get(id)
	if err != nil || !c.spec.ownConnections() || sessionID == "" {
		return false
	}
	sc, err := c.sessionFor(sessionID)
	if err != nil {
		return false
	}
	defer sc.done()
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.closed || sc.sess != nil {
		return false
	}
	sc.had = true
	return true
}
