package mcpserve

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

// A 2025-11-25 session's id is signed, not remembered: it carries the
// endpoint it was made for and what the client declared it can do
// (elicitation, sampling), under an HMAC with a key every replica
// derives from SECRET_KEY. So any replica behind a balancer without
// affinity takes a session another one started, and knows whether it may
// ask the client. What a session holds upstream (a per_session
// connector's connection) is keyed by the session id (serviceSession) and
// found by the service's session routing on whichever replica holds it.
//
// DELETE ends a session: its upstream sessions close, and this replica
// refuses its id from then on; another replica takes it until its
// signature's age passes sessionTTL (a client that deleted its session
// does not send its id again).

// sessionTTL bounds how long a session id is taken.
const sessionTTL = 7 * 24 * time.Hour

// sessionClaims is what a session id says.
type sessionClaims struct {
	Path        string `json:"p"`
	Elicitation bool   `json:"e,omitempty"`
	URLElicit   bool   `json:"u,omitempty"`
	Sampling    bool   `json:"s,omitempty"`
	Issued      int64  `json:"t"`
	Nonce       string `json:"n"`
}

type sessionIDs struct {
	key []byte

	mu         sync.Mutex
	terminated map[string]time.Time
	// verified caches ids whose signature checked (a request checks its
	// session id twice: mcp-go's Validate, then its client's capabilities);
	// cleared when it reaches maxVerified.
	verified map[string]sessionClaims
}

const maxVerified = 10000

func newSessionIDs(key []byte) *sessionIDs {
	if len(key) == 0 {
		key = make([]byte, 32)
		_, _ = rand.Read(key) // one replica's sessions, then
	}
	return &sessionIDs{key: key, terminated: map[string]time.Time{}, verified: map[string]sessionClaims{}}
}

func (s *sessionIDs) sign(c sessionClaims) string {
	body, _ := json.Marshal(c)
	payload := base64.RawURLEncoding.EncodeToString(body)
	return payload + "." + base64.RawURLEncoding.EncodeToString(s.mac(payload))
}

func (s *sessionIDs) mac(payload string) []byte {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte("mcp-session\x00" + payload))
	return m.Sum(nil)
}

var errBadSession = errors.New("not a session id of this endpoint")

// parse checks id's signature and age.
func (s *sessionIDs) parse(id string) (sessionClaims, error) {
	s.mu.Lock()
	c, ok := s.verified[id]
	s.mu.Unlock()
	if ok && time.Since(time.Unix(c.Issued, 0)) <= sessionTTL {
		return c, nil
	}
	c, err := s.verify(id)
	if err != nil {
		return c, err
	}
	s.mu.Lock()
	if len(s.verified) >= maxVerified {
		clear(s.verified)
	}
	s.verified[id] = c
	s.mu.Unlock()
	return c, nil
}

// verify checks id's signature and age.
func (s *sessionIDs) verify(id string) (sessionClaims, error) {
	payload, sig, ok := strings.Cut(id, ".")
	if !ok {
		return sessionClaims{}, errBadSession
	}
	want := s.mac(payload)
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || !hmac.Equal(got, want) {
		return sessionClaims{}, errBadSession
	}
	body, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil {
		return sessionClaims{}, errBadSession
	}
	var c sessionClaims
	if err := json.Unmarshal(body, &c); err != nil {
		return sessionClaims{}, errBadSession
	}
	if time.Since(time.Unix(c.Issued, 0)) > sessionTTL {
		return sessionClaims{}, errBadSession
	}
	return c, nil
}

func (s *sessionIDs) terminate(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for k, at := range s.terminated {
		if now.Sub(at) > sessionTTL {
			delete(s.terminated, k)
		}
	}
	s.terminated[id] = now
}

func (s *sessionIDs) isTerminated(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.terminated[id]
	return ok
}

// manager is mcp-go's SessionIdManager for one request of one endpoint:
// Generate signs the claims of the initialize request it carries.
type manager struct {
	ids      *sessionIDs
	path     string
	claims   sessionClaims
	onDelete func(id string)
	// sweep: the manager of mcp-go's idle sweeper, which forgets this
	// replica's state of an idle session; the session is not ended (its
	// client may be using it through other replicas).
	sweep bool
}

func (m *manager) Generate() string {
	nonce := make([]byte, 12)
	_, _ = rand.Read(nonce)
	c := m.claims
	c.Path, c.Issued, c.Nonce = m.path, time.Now().Unix(), base64.RawURLEncoding.EncodeToString(nonce)
	return m.ids.sign(c)
}

func (m *manager) Validate(id string) (bool, error) {
	c, err := m.ids.parse(id)
	if err != nil || c.Path != m.path {
		return false, errBadSession
	}
	return m.ids.isTerminated(id), nil
}

func (m *manager) Terminate(id string) (bool, error) {
	if m.sweep {
		return false, nil
	}
	if _, err := m.Validate(id); err != nil {
		return false, err
	}
	m.ids.terminate(id)
	if m.onDelete != nil {
		m.onDelete(id)
	}
	return false, nil
}

// resolver gives each request a manager that knows its initialize
// request's capabilities.
type resolver struct {
	ids      *sessionIDs
	path     string
	onDelete func(id string)
}

func (r *resolver) ResolveSessionIdManager(req *http.Request) server.SessionIdManager {
	if req == nil { // the idle sweeper's
		return &manager{ids: r.ids, path: r.path, sweep: true}
	}
	m := &manager{ids: r.ids, path: r.path, onDelete: r.onDelete}
	if caps, ok := req.Context().Value(initializeKey{}).(*mcp.ClientCapabilities); ok && caps != nil {
		m.claims.Elicitation = caps.Elicitation != nil
		m.claims.URLElicit = caps.Elicitation != nil && caps.Elicitation.URL != nil
		m.claims.Sampling = caps.Sampling != nil
	}
	return m
}

type initializeKey struct{}

// withInitialize records an initialize request's client capabilities
// for the session id it gets.
func withInitialize(ctx context.Context, body []byte) context.Context {
	if !bytes.Contains(body, []byte(`"initialize"`)) {
		return ctx // the common case, without a decode
	}
	var msg struct {
		Method string `json:"method"`
		Params struct {
			Capabilities mcp.ClientCapabilities `json:"capabilities"`
		} `json:"params"`
	}
	if json.Unmarshal(body, &msg) != nil || msg.Method != string(mcp.MethodInitialize) {
		return ctx
	}
	return context.WithValue(ctx, initializeKey{}, &msg.Params.Capabilities)
}

// clientCaps is what the client of a request declared: the request's own
// _meta (2026-07-28), else its session's id.
func (h *Handler) clientCaps(ctx context.Context, meta *mcp.Meta) sessionClaims {
	if caps := meta.ClientCapabilities(); caps != nil {
		return sessionClaims{Elicitation: caps.Elicitation != nil, URLElicit: caps.Elicitation != nil && caps.Elicitation.URL != nil,
			Sampling: caps.Sampling != nil}
	}
	if s := server.ClientSessionFromContext(ctx); s != nil {
		if c, err := h.ids.parse(s.SessionID()); err == nil {
			return c
		}
	}
	return sessionClaims{}
}

// serviceSession is the service's session id of MCP session id: a
// per_session connector's calls in one MCP session run on one upstream
// session. It is a function of the id, so every replica finds the same.
func serviceSession(mcpSession string) string {
	if mcpSession == "" {
		return ""
	}
	return "mcp-" + hash(mcpSession)[:32]
}
