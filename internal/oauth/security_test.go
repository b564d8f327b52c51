package oauth

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/oauthtest"
	"github.com/connector-svc/connector-svc/internal/store"
)

// A state works once, only before it expires, and only while its
// connector exists.
func TestStateSingleUse(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	as := oauthtest.Start(t, oauthtest.Options{})
	m := e.manager(nil)
	c := e.connector("ws", "files", as.MCPURL, ModeUser)

	st, err := m.Start(ctx, c, "alice", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	loc, err := as.Authorize(ctx, st.URL, "alice")
	if err != nil {
		t.Fatal(err)
	}
	q := loc.Query()
	if _, err := m.Complete(ctx, q.Get("state"), q.Get("code"), q.Get("iss"), ""); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Complete(ctx, q.Get("state"), q.Get("code"), q.Get("iss"), ""); !errors.Is(err, ErrStateInvalid) {
		t.Errorf("replayed state: %v, want ErrStateInvalid", err)
	}
	for _, state := range []string{"", "made-up-state", q.Get("state") + "x"} {
		if _, err := m.Complete(ctx, state, q.Get("code"), q.Get("iss"), ""); !errors.Is(err, ErrStateInvalid) {
			t.Errorf("state %q: %v, want ErrStateInvalid", state, err)
		}
	}
	if n := as.Counts().TokenCodeExchanges; n != 1 {
		t.Errorf("%d code exchanges, want 1", n)
	}

	short := e.manager(func(c *Config) { c.StateTTL = time.Millisecond })
	st, err = short.Start(ctx, c, "alice", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	loc, err = as.Authorize(ctx, st.URL, "alice")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond) // past the 1ms the state lives
	if _, err := short.Complete(ctx, loc.Query().Get("state"), loc.Query().Get("code"), loc.Query().Get("iss"), ""); !errors.Is(err, ErrStateInvalid) {
		t.Errorf("expired state: %v, want ErrStateInvalid", err)
	}

	// A refusal at the server: the state is spent, the error says why,
	// and where to send the browser back to comes with it.
	st, _ = m.Start(ctx, c, "alice", "https://app.example/back", nil)
	state := mustQuery(t, st.URL).Get("state")
	done, err := m.Complete(ctx, state, "", "", "access_denied")
	var ase *AuthServerError
	if !errors.As(err, &ase) || ase.Code != "access_denied" {
		t.Errorf("error redirect: %v, want AuthServerError access_denied", err)
	}
	if done == nil || done.ReturnTo != "https://app.example/back" || done.Grant.UserID != "" || done.Grant.ConnectorID != 0 {
		t.Errorf("error redirect: Completed %+v, want ReturnTo and no grant", done)
	}
	if err != nil && strings.Count(err.Error(), "refused") != 1 {
		t.Errorf("error redirect: %q says refused more than once", err)
	}
	if _, err := m.Complete(ctx, state, "x", "", ""); !errors.Is(err, ErrStateInvalid) {
		t.Errorf("state after a refusal: %v", err)
	}

	// A connector deleted meanwhile takes its pending authorizations along.
	st, _ = m.Start(ctx, c, "alice", "", nil)
	loc, _ = as.Authorize(ctx, st.URL, "alice")
	if _, err := e.db.DeleteConnector(ctx, "ws", "files"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Complete(ctx, loc.Query().Get("state"), loc.Query().Get("code"), loc.Query().Get("iss"), ""); !errors.Is(err, ErrStateInvalid) {
		t.Errorf("state of a deleted connector: %v", err)
	}
}

// PendingWorkspace names the workspace of an authorization in progress
// without spending its state.
func TestPendingWorkspace(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	as := oauthtest.Start(t, oauthtest.Options{})
	m := e.manager(nil)
	c := e.connector("ws-a", "files", as.MCPURL, ModeUser)
	st, err := m.Start(ctx, c, "alice", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	loc, err := as.Authorize(ctx, st.URL, "alice")
	if err != nil {
		t.Fatal(err)
	}
	q := loc.Query()
	for range 2 {
		if ws, err := m.PendingWorkspace(ctx, q.Get("state")); ws != "ws-a" || err != nil {
			t.Fatalf("PendingWorkspace = %q, %v; want ws-a", ws, err)
		}
	}
	for _, state := range []string{"", "made-up", q.Get("state") + "x"} {
		if _, err := m.PendingWorkspace(ctx, state); !errors.Is(err, ErrStateInvalid) {
			t.Errorf("PendingWorkspace(%q): %v, want ErrStateInvalid", state, err)
		}
	}
	if _, err := m.Complete(ctx, q.Get("state"), q.Get("code"), q.Get("iss"), ""); err != nil {
		t.Fatalf("Complete after PendingWorkspace: %v", err)
	}
	if _, err := m.PendingWorkspace(ctx, q.Get("state")); !errors.Is(err, ErrStateInvalid) {
		t.Errorf("PendingWorkspace of a used state: %v, want ErrStateInvalid", err)
	}
	short := e.manager(func(c *Config) { c.StateTTL = time.Millisecond })
	st, err = short.Start(ctx, c, "bob", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond) // past the 1ms the state lives
	if _, err := m.PendingWorkspace(ctx, mustQuery(t, st.URL).Get("state")); !errors.Is(err, ErrStateInvalid) {
		t.Errorf("PendingWorkspace of an expired state: %v, want ErrStateInvalid", err)
	}
}

// An authorization server's refusal says it refused once, naming the
// OAuth error, the description and the HTTP status.
func TestAuthServerErrorMessage(t *testing.T) {
	for _, tc := range []struct {
		err  *AuthServerError
		want string
	}{
		{newAuthServerError("access_denied", "", 0), "the authorization server refused with OAuth error access_denied"},
		{newAuthServerError("invalid_grant", "The refresh token expired.", 400),
			"the authorization server refused with OAuth error invalid_grant (HTTP 400): The refresh token expired."},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("Error() = %q, want %q", got, tc.want)
		}
	}
}

func mustQuery(t *testing.T, raw string) url.Values {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u.Query()
}

// return_to must be an absolute http(s) URL under an allowed prefix: the
// same scheme, host and port, and a path at or below the prefix's on a
// segment boundary. Refused ones are refused before any request is made,
// with an error saying what is wrong.
func TestReturnTo(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	as := oauthtest.Start(t, oauthtest.Options{})
	m := e.manager(func(c *Config) {
		c.ReturnToAllowed = []string{"https://chat.example.com", "https://app.example/chat", "https://files.example/a/"}
	})
	c := e.connector("ws", "files", as.MCPURL, ModeUser)
	for rt, want := range map[string]string{
		"https://chat.example.com@evil.net/steal":               "user information",
		"https://chat.example.com.evil.net/steal":               "not under any allowed prefix",
		"https://chat.example.com:8443/x":                       "not under any allowed prefix",
		"http://chat.example.com/x":                             "not under any allowed prefix",
		"https://app.example/chatroom":                          "not under any allowed prefix",
		"https://app.example/":                                  "not under any allowed prefix",
		"https://app.example/chat/../admin":                     "dot segment",
		"https://app.example/chat/%2e%2e/admin":                 "dot segment",
		"https://files.example/ab":                              "not under any allowed prefix",
		"https://evil.example/":                                 "not under any allowed prefix",
		"/relative":                                             "absolute http(s) URL",
		"//chat.example.com/x":                                  "absolute http(s) URL",
		"javascript:alert(1)":                                   "absolute http(s) URL",
		"https:///x":                                            "absolute http(s) URL",
		"https://chat.example.com/a\x00b":                       "character",
		"https://chat.example.com/a b":                          "character",
		"https://chat.example.com/\r\nSet-Cookie:x":             "character",
		"https://chat.example.com/<script>":                     "character",
		"https://chat.example.com/é":                            "character",
		"https://chat.example.com/" + strings.Repeat("a", 2048): "longer than 2048 bytes",
	} {
		_, err := m.Start(ctx, c, "alice", rt, nil)
		if !errors.Is(err, ErrReturnToNotAllowed) || !strings.Contains(err.Error(), want) {
			t.Errorf("return_to %q: %v, want ErrReturnToNotAllowed saying %q", rt, err, want)
		}
		if err != nil && strings.ContainsAny(err.Error(), "\x00\r\n") {
			t.Errorf("return_to %q: the error %q carries control characters", rt, err)
		}
	}
	if n := as.Counts().MCPRequests; n != 0 {
		t.Errorf("a refused return_to still probed the server (%d requests)", n)
	}
	for _, rt := range []string{"", "https://chat.example.com", "https://CHAT.Example.com:443/any/path?x=1#frag",
		"https://app.example/chat", "https://app.example/chat/", "https://app.example/chat/thread/1?x=%20",
		"https://files.example/a/", "https://files.example/a/b"} {
		if _, err := m.Start(ctx, c, "alice", rt, nil); err != nil {
			t.Errorf("return_to %q: %v, want allowed", rt, err)
		}
	}

	none := e.manager(func(c *Config) { c.ReturnToAllowed = nil })
	_, err := none.Start(ctx, c, "alice", "https://chat.example.com/x", nil)
	if !errors.Is(err, ErrReturnToNotAllowed) || err.Error() != "no return_to is allowed: OAUTH_RETURN_TO_ALLOWED is empty" {
		t.Errorf("without an allow list: %v", err)
	}
}

// RFC 9207: a wrong iss is refused, and a missing one where the server
// says it sends one; nothing is exchanged.
func TestIssuerChecked(t *testing.T) {
	ctx := context.Background()
	t.Run("wrong", func(t *testing.T) {
		e := newEnv(t)
		as := oauthtest.Start(t, oauthtest.Options{WrongIss: true})
		m := e.manager(nil)
		c := e.connector("ws", "files", as.MCPURL, ModeUser)
		_, err := e.tryAuthorize(ctx, m, as, c, "alice")
		if !errors.Is(err, ErrIssuerMismatch) {
			t.Fatalf("wrong iss: %v, want ErrIssuerMismatch", err)
		}
		if n := as.Counts().TokenCodeExchanges; n != 0 {
			t.Errorf("%d codes exchanged", n)
		}
		if _, err := e.db.OAuthToken(ctx, c.ID, "alice"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("a token was stored: %v", err)
		}
	})
	t.Run("missing though advertised", func(t *testing.T) {
		e := newEnv(t)
		as := oauthtest.Start(t, oauthtest.Options{})
		m := e.manager(nil)
		c := e.connector("ws", "files", as.MCPURL, ModeUser)
		st, _ := m.Start(ctx, c, "alice", "", nil)
		loc, err := as.Authorize(ctx, st.URL, "alice")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Complete(ctx, loc.Query().Get("state"), loc.Query().Get("code"), "", ""); !errors.Is(err, ErrIssuerMismatch) {
			t.Fatalf("missing iss: %v, want ErrIssuerMismatch", err)
		}
		if n := as.Counts().TokenCodeExchanges; n != 0 {
			t.Errorf("%d codes exchanged", n)
		}
	})
	t.Run("missing and not advertised", func(t *testing.T) {
		e := newEnv(t)
		as := oauthtest.Start(t, oauthtest.Options{NoIssParam: true})
		m := e.manager(nil)
		c := e.connector("ws", "files", as.MCPURL, ModeUser)
		e.authorize(ctx, m, as, c, "alice")
		e.mustWhoami(ctx, m, c, "alice")
	})
}

// PKCE and the resource are checked by the server: a URL whose resource
// or challenge was changed gets nothing.
func TestPKCEAndResourceChecked(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	as := oauthtest.Start(t, oauthtest.Options{})
	m := e.manager(nil)
	c := e.connector("ws", "files", as.MCPURL, ModeUser)

	tamper := func(key, value string) string {
		st, err := m.Start(ctx, c, "alice", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		u, _ := url.Parse(st.URL)
		q := u.Query()
		q.Set(key, value)
		u.RawQuery = q.Encode()
		return u.String()
	}
	if loc, err := as.Authorize(ctx, tamper("resource", "http://127.0.0.1:1/other"), "alice"); err == nil ||
		!strings.Contains(err.Error(), "invalid_target") {
		t.Errorf("changed resource: %v, %v; want invalid_target", loc, err)
	}

	other := sha256.Sum256([]byte("another verifier entirely, not the one sealed"))
	loc, err := as.Authorize(ctx, tamper("code_challenge", base64.RawURLEncoding.EncodeToString(other[:])), "alice")
	if err != nil {
		t.Fatal(err)
	}
	code := loc.Query().Get("code")
	_, err = m.Complete(ctx, loc.Query().Get("state"), code, loc.Query().Get("iss"), "")
	var ase *AuthServerError
	if !errors.As(err, &ase) || ase.Code != "invalid_grant" || ase.Status != http.StatusBadRequest {
		t.Fatalf("changed code_challenge: %v, want the server's invalid_grant", err)
	}
	if strings.Contains(err.Error(), code) {
		t.Error("the error shows the code")
	}
	last := as.LastTokenRequest()
	if last.Get("grant_type") != "authorization_code" || last.Get("code_verifier") != "<set>" || last.Get("resource") != as.MCPURL ||
		last.Get("redirect_uri") != redirectURL || last.Get("client_id") == "" {
		t.Errorf("the code exchange sent %v", last)
	}
	if _, err := e.db.OAuthToken(ctx, c.ID, "alice"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a token was stored: %v", err)
	}
}

// The service registers once per authorization server, whatever the
// replicas and restarts; an authorization started on one replica
// completes on another.
func TestRegistrationSharedByReplicas(t *testing.T) {
	ctx := context.Background()
	t.Run("one after the other", func(t *testing.T) {
		e := newEnv(t)
		as := oauthtest.Start(t, oauthtest.Options{})
		c := e.connector("ws", "files", as.MCPURL, ModeUser)
		e.authorize(ctx, e.manager(nil), as, c, "alice")
		e.authorize(ctx, e.manager(nil), as, c, "bob")   // a second replica
		e.authorize(ctx, e.manager(nil), as, c, "carol") // a restart
		if n := as.Counts().Registrations; n != 1 {
			t.Errorf("%d registrations, want 1", n)
		}
	})

	e := newEnv(t)
	as := oauthtest.Start(t, oauthtest.Options{})
	c := e.connector("ws", "files", as.MCPURL, ModeUser)

	// Two fresh replicas start at once: one registration is stored and
	// both use it.
	m1, m2 := e.manager(nil), e.manager(nil)
	var wg sync.WaitGroup
	ids := make([]string, 8)
	for i := range ids {
		m := m1
		if i%2 == 1 {
			m = m2
		}
		wg.Go(func() {
			st, err := m.Start(ctx, c, "alice", "", nil)
			if err != nil {
				t.Errorf("Start: %v", err)
				return
			}
			ids[i] = mustQuery(t, st.URL).Get("client_id")
		})
	}
	wg.Wait()
	for _, id := range ids {
		if id != ids[0] || id == "" {
			t.Fatalf("replicas use clients %v, want one", ids)
		}
	}
	if n := as.Counts().Registrations; n < 1 || n > 2 {
		t.Errorf("%d registrations, want 1 (2 if both replicas raced)", n)
	}
	regs := as.Registrations()
	r := regs[0]
	if len(r.RedirectURIs) != 1 || r.RedirectURIs[0] != redirectURL || r.TokenEndpointAuthMethod != "none" ||
		r.ApplicationType != "web" || r.ClientName != "connector-svc" || strings.Join(r.GrantTypes, ",") != "authorization_code,refresh_token" ||
		strings.Join(r.ResponseTypes, ",") != "code" {
		t.Errorf("registration request %+v", r)
	}

	// A restart (a new Manager) registers no more, and completes what
	// another replica started.
	before := as.Counts().Registrations
	m3 := e.manager(nil)
	st, err := m1.Start(ctx, c, "alice", "https://app.example/x", nil)
	if err != nil {
		t.Fatal(err)
	}
	loc, err := as.Authorize(ctx, st.URL, "alice")
	if err != nil {
		t.Fatal(err)
	}
	done, err := m3.Complete(ctx, loc.Query().Get("state"), loc.Query().Get("code"), loc.Query().Get("iss"), "")
	if err != nil || done.ReturnTo != "https://app.example/x" {
		t.Fatalf("Complete on another replica: %+v, %v", done, err)
	}
	e.authorize(ctx, m3, as, c, "bob")
	if n := as.Counts().Registrations; n != before {
		t.Errorf("a restarted replica registered again (%d -> %d)", before, n)
	}
	e.mustWhoami(ctx, m3, c, "alice")
	e.mustWhoami(ctx, m2, c, "alice")
	e.mustWhoami(ctx, m1, c, "bob")
}

// Two replicas whose user's token is refused at once spend one refresh
// token between them.
func TestConcurrentRefreshAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	as := oauthtest.Start(t, oauthtest.Options{})
	m1, m2 := e.manager(nil), e.manager(nil)
	c := e.connector("ws", "files", as.MCPURL, ModeUser)
	e.authorize(ctx, m1, as, c, "alice")
	e.mustWhoami(ctx, m1, c, "alice")
	e.mustWhoami(ctx, m2, c, "alice")
	as.ExpireTokens()

	var wg sync.WaitGroup
	for i := range 6 {
		m := m1
		if i%2 == 1 {
			m = m2
		}
		wg.Go(func() {
			if who, err := e.whoami(ctx, m, c, "alice"); err != nil || who != "alice" {
				t.Errorf("whoami: %q, %v", who, err)
			}
		})
	}
	wg.Wait()
	if n := as.Counts().Refreshes; n != 1 {
		t.Errorf("%d refreshes, want 1", n)
	}
	if n := as.Counts().TokenErrors; n != 0 {
		t.Errorf("%d token requests refused (a refresh token spent twice?)", n)
	}
	if ok, _ := m1.Usable(ctx, c, "alice"); !ok {
		t.Error("alice's grant is no longer usable")
	}
}

// A client credentials connector gets its own token, and a new one when
// the server refuses it.
func TestClientCredentials(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	as := oauthtest.Start(t, oauthtest.Options{})
	const secretValue = "cc-secret-canary-7f3a9c"
	as.RegisterClient("svc-client", secretValue)
	m := e.manager(nil)
	c := e.connector("ws", "machine", as.MCPURL, ModeClientCredentials)
	c.ClientID, c.ClientSecret = "svc-client", secretValue

	if ok, _ := m.Usable(ctx, c, ""); !ok {
		t.Error("Usable false for a client credentials connector")
	}
	text, _ := e.call(ctx, m, c, "", "whoami")
	if text != "user=svc-client scopes=mcp:tools" {
		t.Errorf("whoami = %q", text)
	}
	if n := as.Counts().ClientCredentials; n != 1 {
		t.Errorf("%d client credentials grants, want 1 (the token is reused)", n)
	}
	last := as.LastTokenRequest()
	if last.Get("grant_type") != "client_credentials" || last.Get("resource") != as.MCPURL || last.Has("client_secret") {
		t.Errorf("the grant sent %v (the secret goes in the Basic header)", last)
	}
	as.ExpireTokens()
	if text, err := e.call(ctx, m, c, "", "whoami"); err != nil || !strings.HasPrefix(text, "user=svc-client") {
		t.Errorf("after the server refused the token: %q, %v", text, err)
	}
	if n := as.Counts().ClientCredentials; n != 2 {
		t.Errorf("%d client credentials grants, want 2", n)
	}
	gs, _ := m.List(ctx, ListFilter{WorkspaceID: "ws"})
	if len(gs) != 1 || gs[0].UserID != "" || gs[0].Refreshable {
		t.Errorf("List = %+v", gs)
	}

	// A wrong secret: the server's refusal, without the secret.
	bad := e.connector("ws", "bad", as.MCPURL, ModeClientCredentials)
	bad.ClientID, bad.ClientSecret = "svc-client", "wrong-secret-canary-5521"
	_, err := e.call(ctx, m, bad, "", "whoami")
	var ase *AuthServerError
	if !errors.As(err, &ase) || ase.Code != "invalid_client" {
		t.Errorf("wrong secret: %v, want AuthServerError invalid_client", err)
	}
	access, _ := e.tokens(c, "")
	e.assertNowhere(secretValue, "wrong-secret-canary-5521", access)
}

// Pre-registered clients, public and confidential, are used as they are:
// no registration.
func TestPreRegisteredClients(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	as := oauthtest.Start(t, oauthtest.Options{})
	const secretValue = "pre-secret-canary-99d1e2"
	as.RegisterClient("pre-public", "")
	as.RegisterClient("pre-conf", secretValue, "authorization_code", "refresh_token")
	m := e.manager(nil)
	pub := e.connector("ws", "pub", as.MCPURL, ModeUser)
	pub.ClientID = "pre-public"
	conf := e.connector("ws", "conf", as.MCPURL, ModeUser)
	conf.ClientID, conf.ClientSecret = "pre-conf", secretValue

	for _, c := range []Connector{pub, conf} {
		st, err := m.Start(ctx, c, "alice", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		if id := mustQuery(t, st.URL).Get("client_id"); id != c.ClientID {
			t.Errorf("client_id %q, want %q", id, c.ClientID)
		}
		e.authorize(ctx, m, as, c, "alice")
		e.mustWhoami(ctx, m, c, "alice")
	}
	as.ExpireTokens()
	e.mustWhoami(ctx, m, conf, "alice") // a refresh as the confidential client
	if c := as.Counts(); c.Registrations != 0 || c.Refreshes != 1 {
		t.Errorf("counts %+v: want no registration and one refresh", c)
	}
	if atServer, err := m.Revoke(ctx, conf, "alice"); err != nil || !atServer {
		t.Errorf("Revoke as the confidential client: %t, %v", atServer, err)
	}
	e.assertNowhere(secretValue)
}

// Where the server takes client ID metadata documents and the service has
// one, its URL is the client: no registration.
func TestClientIDMetadataDocument(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	var m *Manager
	doc := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, ok := m.ClientMetadata()
		if !ok || r.URL.Path != "/oauth/client.json" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	defer doc.Close()
	as := oauthtest.Start(t, oauthtest.Options{CIMD: true, CIMDClient: doc.Client()})
	m = e.manager(func(c *Config) { c.ClientMetadataURL = doc.URL + "/oauth/client.json" })
	c := e.connector("ws", "files", as.MCPURL, ModeUser)
	st, err := m.Start(ctx, c, "alice", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if id := mustQuery(t, st.URL).Get("client_id"); id != doc.URL+"/oauth/client.json" {
		t.Errorf("client_id %q", id)
	}
	e.authorize(ctx, m, as, c, "alice")
	e.mustWhoami(ctx, m, c, "alice")
	as.ExpireTokens()
	e.mustWhoami(ctx, m, c, "alice")
	if c := as.Counts(); c.Registrations != 0 || c.CIMDFetches < 1 || c.Refreshes != 1 {
		t.Errorf("counts %+v: want no registration, the document fetched, one refresh", c)
	}

	// Without the document configured, the same server gets a registration.
	e2 := newEnv(t)
	m2 := e2.manager(nil)
	c2 := e2.connector("ws", "files", as.MCPURL, ModeUser)
	e2.authorize(ctx, m2, as, c2, "bob")
	if n := as.Counts().Registrations; n != 1 {
		t.Errorf("%d registrations without a document, want 1", n)
	}
	if _, ok := m2.ClientMetadata(); ok {
		t.Error("ClientMetadata served without ClientMetadataURL")
	}
}

// Codes, verifiers, tokens and secrets never show in the database, the
// logs or errors, through failures as well as successes.
func TestSecretsNeverShow(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	as := oauthtest.Start(t, oauthtest.Options{AccessTTL: time.Hour})
	m := e.manager(nil)
	c := e.connector("ws", "files", as.MCPURL, ModeUser)

	st, err := m.Start(ctx, c, "alice", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	state := mustQuery(t, st.URL).Get("state")
	p, err := e.db.ConsumeOAuthPending(ctx, stateHash(state)) // read it (this spends it)
	if err != nil {
		t.Fatal(err)
	}
	verifier, err := e.box.OpenBytes(p.SealedVerifier, pendingContext(p.StateHash, "verifier"))
	if err != nil || len(verifier) < 43 {
		t.Fatalf("verifier: %d bytes, %v", len(verifier), err)
	}
	st, _ = m.Start(ctx, c, "alice", "", nil)
	loc, err := as.Authorize(ctx, st.URL, "alice")
	if err != nil {
		t.Fatal(err)
	}
	code := loc.Query().Get("code")
	if _, err := m.Complete(ctx, loc.Query().Get("state"), code, loc.Query().Get("iss"), ""); err != nil {
		t.Fatal(err)
	}
	access1, refresh1 := e.tokens(c, "alice")

	// A refresh, a refused refresh, a step-up refusal, a replayed code.
	as.ExpireTokens()
	e.mustWhoami(ctx, m, c, "alice")
	access2, refresh2 := e.tokens(c, "alice")
	_, err = e.call(ctx, m, c, "alice", "admin_action")
	required(t, err, ReasonInsufficientScope)
	as.RevokeRefreshTokens("alice")
	as.ExpireTokens()
	_, err = e.whoami(ctx, m, c, "alice")
	required(t, err, ReasonReauthorize)
	_, err = m.Complete(ctx, loc.Query().Get("state"), code, loc.Query().Get("iss"), "")
	e.seen(err)

	e.assertNowhere(state, string(verifier), code, access1, refresh1, access2, refresh2)
	if !strings.Contains(e.logs.String(), "the user must authorize again") {
		t.Errorf("the logs do not say alice must authorize again:\n%s", e.logs.String())
	}
}
