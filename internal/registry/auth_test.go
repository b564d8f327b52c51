package registry_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

// bearerServer is a real mcp-go streamable-HTTP server that wants a
// Bearer token "tok-<user>" on every request, as an MCP server with OAuth
// does: without one it answers 401 with a Bearer challenge. Its whoami
// tool answers the user of the request's token. It records the tokens
// each MCP session was sent.
type bearerServer struct {
	url       string
	noBearer  bool // answer 401 without a Bearer challenge
	mu        sync.Mutex
	bySession map[string]map[string]bool // MCP session id -> tokens seen
	probes    atomic.Int64               // requests without a token
}

type userKey struct{}

func newBearerServer(t *testing.T, opts ...func(*bearerServer)) *bearerServer {
	b := &bearerServer{bySession: map[string]map[string]bool{}}
	for _, o := range opts {
		o(b)
	}
	m := server.NewMCPServer("bearer", "1.0", server.WithToolCapabilities(true))
	m.AddTool(mcp.NewTool("whoami", mcp.WithDescription("Says whose token the call carries")),
		func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			u, _ := ctx.Value(userKey{}).(string)
			return mcp.NewToolResultText(u), nil
		})
	h := server.NewStreamableHTTPServer(m, server.WithHTTPContextFunc(func(ctx context.Context, r *http.Request) context.Context {
		tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer tok-")
		return context.WithValue(ctx, userKey{}, tok)
	}))
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok := r.Header.Get("Authorization")
		if !strings.HasPrefix(tok, "Bearer tok-") {
			b.probes.Add(1)
			if b.noBearer {
				w.Header().Set("WWW-Authenticate", `Basic realm="x"`)
			} else {
				w.Header().Set("WWW-Authenticate", `Bearer resource_metadata="`+b.url+`/.well-known/oauth-protected-resource"`)
			}
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		rec := &sessionRecorder{ResponseWriter: w}
		h.ServeHTTP(rec, r)
		id := r.Header.Get("Mcp-Session-Id")
		if id == "" {
			id = rec.Header().Get("Mcp-Session-Id")
		}
		b.mu.Lock()
		if b.bySession[id] == nil {
			b.bySession[id] = map[string]bool{}
		}
		b.bySession[id][tok] = true
		b.mu.Unlock()
	}))
	t.Cleanup(hs.Close)
	b.url = hs.URL
	return b
}

type sessionRecorder struct{ http.ResponseWriter }

func (r *sessionRecorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// sessionsWithTokens returns, for each MCP session, the tokens it saw.
func (b *bearerServer) sessionsWithTokens() map[string][]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[string][]string{}
	for id, toks := range b.bySession {
		for tok := range toks {
			out[id] = append(out[id], tok)
		}
	}
	return out
}

// needsAuth is the error the test hook's transport returns for a user
// without a token, as the OAuth manager's returns its RequiredError.
type needsAuth struct{ user string }

func (e *needsAuth) Error() string { return "user " + e.user + " must authorize" }

// tokenHook is a Config.Authorize that puts "tok-<user>" ("tok-machine"
// for the connector's own identity) on requests of the users it holds
// tokens for, and refuses the others with *needsAuth.
type tokenHook struct {
	mu     sync.Mutex
	tokens map[string]bool
	calls  atomic.Int64
}

func (h *tokenHook) grant(user string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.tokens[user] = true
}

func (h *tokenHook) authorize(base http.RoundTripper, spec registry.Spec, user string) http.RoundTripper {
	h.calls.Add(1)
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		name := user
		if name == "" {
			name = "machine"
		}
		h.mu.Lock()
		ok := h.tokens[name]
		h.mu.Unlock()
		if !ok {
			return nil, &needsAuth{user: name}
		}
		req = req.Clone(req.Context())
		req.Header.Set("Authorization", "Bearer tok-"+name)
		return base.RoundTrip(req)
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func oauthUserSpec(id int64, url string) registry.Spec {
	spec := httpSpec(id, url)
	spec.Auth = registry.AuthUser
	return spec
}

func asUser(user string) registry.CallOptions { return registry.CallOptions{UserID: user} }

// Each user's calls run on a connection of their own with their own
// token; a user without one gets the hook's error through, which breaks
// nothing: the connector stays READY and no session is left behind.
func TestOAuthUserConnectionsUseTheirOwnTokens(t *testing.T) {
	srv := newBearerServer(t)
	hook := &tokenHook{tokens: map[string]bool{"alice": true}}
	cfg := testConfig()
	cfg.Authorize = hook.authorize
	src := newSource(oauthUserSpec(1, srv.url+"/mcp"))
	reg := run(t, src, cfg)

	testsupport.WaitFor(t, "the unauthenticated probe makes it ready", func() bool {
		h, _ := reg.Health(1)
		return h.State == registry.StateReady
	})
	if _, err := reg.CallTool(ctxT(t), 1, "whoami", nil, registry.CallOptions{}); !errors.Is(err, registry.ErrUserRequired) {
		t.Fatalf("call without a user: %v, want ErrUserRequired", err)
	}
	if tools, _ := reg.Tools(1); len(tools) != 0 {
		t.Fatalf("catalog before any user's connection = %v, want empty", tools)
	}

	res, err := reg.CallTool(ctxT(t), 1, "whoami", nil, asUser("alice"))
	if err != nil {
		t.Fatalf("alice's call: %v", err)
	}
	if got := text(t, res); got != "alice" {
		t.Fatalf("alice's whoami = %q", got)
	}
	if names := src.toolNames(1); !slices.Equal(names, []string{"whoami"}) {
		t.Errorf("stored tools after alice's connection listed them = %v", names)
	}

	_, err = reg.CallTool(ctxT(t), 1, "whoami", nil, asUser("bob"))
	var na *needsAuth
	if !errors.As(err, &na) || na.user != "bob" || !registry.IsAuthError(err) || errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("bob's call without a token: %v; want the hook's error for bob, as an AuthError, not unavailable", err)
	}
	if h, _ := reg.Health(1); h.State != registry.StateReady {
		t.Errorf("health after bob's refusal = %+v, want ready", h)
	}
	if n := reg.SessionCount(1); n != 1 {
		t.Errorf("open sessions = %d, want 1 (alice's; bob's unopened one forgotten)", n)
	}

	hook.grant("bob")
	for _, user := range []string{"bob", "alice", "bob"} {
		res, err := reg.CallTool(ctxT(t), 1, "whoami", nil, asUser(user))
		if err != nil {
			t.Fatalf("%s's call: %v", user, err)
		}
		if got := text(t, res); got != user {
			t.Fatalf("%s's whoami = %q: another user's token", user, got)
		}
	}
	infos, err := reg.Sessions(1)
	if err != nil || len(infos) != 2 || infos[0].SessionID != registry.UserSession("alice") || infos[1].SessionID != registry.UserSession("bob") {
		t.Fatalf("Sessions = %+v, %v; want user:alice and user:bob", infos, err)
	}
	// The server never saw one MCP session with two users' tokens.
	sessions := srv.sessionsWithTokens()
	users := map[string]bool{}
	for id, toks := range sessions {
		if id == "" {
			continue // requests before the server assigned a session (initialize)
		}
		if len(toks) != 1 {
			t.Errorf("MCP session %s saw tokens %v, want one user's", id, toks)
		}
		users[toks[0]] = true
	}
	if !users["Bearer tok-alice"] || !users["Bearer tok-bob"] || len(users) != 2 {
		t.Errorf("users with MCP sessions = %v, want alice and bob", users)
	}

	// Closing a user's session closes that user's connection only.
	if closed := reg.CloseSession("ws", registry.UserSession("alice"), 1); len(closed) != 1 {
		t.Fatalf("CloseSession(alice) closed %d", len(closed))
	}
	if n := reg.SessionCount(1); n != 1 {
		t.Errorf("sessions after closing alice's = %d, want 1", n)
	}
	src.mu.Lock()
	u := src.usage[1]
	src.mu.Unlock()
	if u.Reconnects != 0 {
		t.Errorf("reconnects = %d, want none", u.Reconnects)
	}
}

// An oauth_user connector's catalog comes from a user's connection:
// RefreshTools needs one open, and a user whose catalog is empty opens
// theirs first (CatalogFor).
func TestOAuthUserCatalogAndRefresh(t *testing.T) {
	srv := newBearerServer(t)
	hook := &tokenHook{tokens: map[string]bool{"alice": true}}
	cfg := testConfig()
	cfg.Authorize = hook.authorize
	reg := run(t, newSource(oauthUserSpec(1, srv.url+"/mcp")), cfg)

	if _, err := reg.Refresh(ctxT(t), 1); !errors.Is(err, registry.ErrNoUserConnection) {
		t.Fatalf("Refresh with no user connection: %v, want ErrNoUserConnection", err)
	}
	var na *needsAuth
	if _, err := reg.CatalogFor(ctxT(t), 1, "bob"); !errors.As(err, &na) {
		t.Fatalf("CatalogFor(bob) without a token: %v, want the hook's error", err)
	}
	cat, err := reg.CatalogFor(ctxT(t), 1, "alice")
	if err != nil || len(cat.Enabled()) != 1 || cat.Enabled()[0].Name != "whoami" {
		t.Fatalf("CatalogFor(alice) = %v, %v; want whoami", cat.Enabled(), err)
	}
	if _, err := reg.Refresh(ctxT(t), 1); err != nil {
		t.Fatalf("Refresh over alice's connection: %v", err)
	}
}

// The probe of an oauth_user connector says what is wrong with a server
// that does not ask for OAuth as the specification says.
func TestOAuthUserProbeWithoutBearerChallenge(t *testing.T) {
	srv := newBearerServer(t, func(b *bearerServer) { b.noBearer = true })
	cfg := testConfig()
	cfg.Authorize = (&tokenHook{tokens: map[string]bool{}}).authorize
	src := newSource(oauthUserSpec(1, srv.url+"/mcp"))
	reg := run(t, src, cfg)
	testsupport.WaitFor(t, "the probe to fail", func() bool { return src.healthSaw(1, "without a Bearer challenge") })
	if h, _ := reg.Health(1); h.State == registry.StateReady {
		t.Errorf("health = %+v, want not ready", h)
	}
}

// A client credentials connector's every request carries its own
// identity's token; a refusal of that token is an AuthError the call gets.
func TestClientCredentialsConnector(t *testing.T) {
	srv := newBearerServer(t)
	hook := &tokenHook{tokens: map[string]bool{"machine": true}}
	cfg := testConfig()
	cfg.Authorize = hook.authorize
	spec := httpSpec(1, srv.url+"/mcp")
	spec.Auth, spec.ClientID, spec.ClientSecret = registry.AuthClientCredentials, "client", "canary-client-secret"
	reg := run(t, newSource(spec), cfg)

	res, err := reg.CallTool(ctxT(t), 1, "whoami", nil, registry.CallOptions{UserID: "ignored"})
	if err != nil {
		t.Fatal(err)
	}
	if got := text(t, res); got != "machine" {
		t.Fatalf("whoami = %q, want the machine identity", got)
	}
	hook.mu.Lock()
	delete(hook.tokens, "machine")
	hook.mu.Unlock()
	_, err = reg.CallTool(ctxT(t), 1, "whoami", nil, registry.CallOptions{})
	var na *needsAuth
	if !errors.As(err, &na) || errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("call with the token refused: %v; want the hook's error, not unavailable", err)
	}
	if h, _ := reg.Health(1); h.State != registry.StateReady {
		t.Errorf("health after a refused token = %+v, want still ready (the session is fine)", h)
	}
	if strings.Contains(err.Error(), "canary-client-secret") {
		t.Error("an error carries the client secret")
	}
}

// SessionUser reads back the user of a UserSession, and nothing else.
func TestSessionUser(t *testing.T) {
	for _, user := range []string{"alice", "user:bob", "é 1"} {
		if got, ok := registry.SessionUser(registry.UserSession(user)); !ok || got != user {
			t.Errorf("SessionUser(UserSession(%q)) = %q, %v", user, got, ok)
		}
	}
	for _, sid := range []string{"", "user:", "alice", "User:alice", "s-1"} {
		if got, ok := registry.SessionUser(sid); ok {
			t.Errorf("SessionUser(%q) = %q, true; want none", sid, got)
		}
	}
}
