package oauth

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/oauthtest"
	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

// Two users of one connector: each call carries its own user's token, and
// a user who has not authorized gets NO_TOKEN without a request being sent.
func TestTwoUsers(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	as := oauthtest.Start(t, oauthtest.Options{})
	m := e.manager(nil)
	c := e.connector("ws", "files", as.MCPURL, ModeUser)

	st, err := m.Start(ctx, c, "alice", "https://app.example/done", nil)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	u, _ := url.Parse(st.URL)
	q := u.Query()
	for k, want := range map[string]string{
		"response_type": "code", "redirect_uri": redirectURL, "code_challenge_method": "S256",
		"resource": as.MCPURL, "scope": "mcp:tools",
	} {
		if got := q.Get(k); got != want {
			t.Errorf("authorization URL %s = %q, want %q", k, got, want)
		}
	}
	if len(q.Get("state")) < 43 || len(q.Get("code_challenge")) != 43 || q.Get("client_id") == "" {
		t.Errorf("authorization URL state/code_challenge/client_id: %q %q %q", q.Get("state"), q.Get("code_challenge"), q.Get("client_id"))
	}
	if !slices.Equal(st.Scopes, []string{"mcp:tools"}) || time.Until(st.ExpiresAt) < 9*time.Minute {
		t.Errorf("Started = scopes %v, expires in %v", st.Scopes, time.Until(st.ExpiresAt))
	}
	loc, err := as.Authorize(ctx, st.URL, "alice")
	if err != nil {
		t.Fatal(err)
	}
	done, err := m.Complete(ctx, loc.Query().Get("state"), loc.Query().Get("code"), loc.Query().Get("iss"), "")
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	g := done.Grant
	if done.ReturnTo != "https://app.example/done" || g.UserID != "alice" || g.ConnectorExternalID != "files" ||
		g.WorkspaceID != "ws" || g.Issuer != as.Issuer || !g.Refreshable || !slices.Equal(g.Scopes, []string{"mcp:tools"}) ||
		time.Until(g.ExpiresAt) < 50*time.Minute {
		t.Errorf("Completed = %+v", done)
	}

	e.mustWhoami(ctx, m, c, "alice")
	before := as.Counts().MCPRequests
	_, err = e.whoami(ctx, m, c, "bob")
	re := required(t, err, ReasonNoToken)
	if re.UserID != "bob" || re.ConnectorID != c.ID {
		t.Errorf("RequiredError = %+v", re)
	}
	if n := as.Counts().MCPRequests - before; n != 0 {
		t.Errorf("bob's call without a token sent %d requests to the MCP server, want none", n)
	}
	if ok, err := m.Usable(ctx, c, "alice"); !ok || err != nil {
		t.Errorf("Usable(alice) = %t, %v", ok, err)
	}
	if ok, err := m.Usable(ctx, c, "bob"); ok || err != nil {
		t.Errorf("Usable(bob) = %t, %v", ok, err)
	}

	e.authorize(ctx, m, as, c, "bob")
	e.mustWhoami(ctx, m, c, "bob")
	e.mustWhoami(ctx, m, c, "alice")
	gs, err := m.List(ctx, ListFilter{WorkspaceID: "ws"})
	if err != nil || len(gs) != 2 || gs[0].UserID != "alice" || gs[1].UserID != "bob" {
		t.Errorf("List = %+v, %v", gs, err)
	}
	if gs, _ := m.List(ctx, ListFilter{WorkspaceID: "ws", After: gs[0].Cursor(), Limit: 1}); len(gs) != 1 || gs[0].UserID != "bob" {
		t.Errorf("List after alice = %+v", gs)
	}
	if gs, _ := m.List(ctx, ListFilter{WorkspaceID: "other"}); len(gs) != 0 {
		t.Errorf("List of another workspace = %+v", gs)
	}
	if c := as.Counts(); c.Registrations != 1 || c.TokenCodeExchanges != 2 {
		t.Errorf("counts: %+v; want one registration and two code exchanges", c)
	}
	a1, r1 := e.tokens(c, "alice")
	a2, r2 := e.tokens(c, "bob")
	e.assertNowhere(a1, r1, a2, r2)
}

// The token goes only to the connector's own origin, over any static
// Authorization header.
func TestTransportSendsTokenOnlyToItsOrigin(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	as := oauthtest.Start(t, oauthtest.Options{})
	m := e.manager(nil)
	c := e.connector("ws", "files", as.MCPURL, ModeUser)
	e.authorize(ctx, m, as, c, "alice")
	access, _ := e.tokens(c, "alice")

	var mu sync.Mutex
	var got []string
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get("Authorization"))
		mu.Unlock()
	}))
	defer other.Close()
	hc := &http.Client{Transport: m.Transport(http.DefaultTransport, c, "alice")}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, other.URL+"/mcp", nil)
	req.Header.Set("Authorization", "Bearer static")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	mu.Lock()
	if len(got) != 1 || got[0] != "Bearer static" {
		t.Errorf("another origin got Authorization %q, want the request's own", got)
	}
	mu.Unlock()

	// To the connector's origin the user's token replaces a static one.
	req, _ = http.NewRequestWithContext(ctx, http.MethodPost, as.MCPURL, strings.NewReader(probeBody))
	req.Header.Set("Authorization", "Bearer static")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	var captured string
	rt := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		captured = r.Header.Get("Authorization")
		return http.DefaultTransport.RoundTrip(r)
	})
	resp, err = (&http.Client{Transport: m.Transport(rt, c, "alice")}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if captured != "Bearer "+access || resp.StatusCode != http.StatusOK {
		t.Errorf("the MCP server got a %d with a token that is not the user's", resp.StatusCode)
	}
	if req.Header.Get("Authorization") != "Bearer static" {
		t.Error("the transport changed the caller's request")
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A token that expires soon is refreshed before it is sent: no request
// fails, and the server never sees an expired token.
func TestRefreshAheadOfExpiry(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	as := oauthtest.Start(t, oauthtest.Options{AccessTTL: 2 * time.Second})
	m := e.manager(nil)
	c := e.connector("ws", "files", as.MCPURL, ModeUser)
	e.authorize(ctx, m, as, c, "alice")
	e.mustWhoami(ctx, m, c, "alice")
	before := as.Counts()
	testsupport.WaitWithin(t, 10*time.Second, "a refresh ahead of expiry", func() bool {
		e.mustWhoami(ctx, m, c, "alice")
		return as.Counts().Refreshes >= 1
	})
	after := as.Counts()
	if after.Unauthorized401 != before.Unauthorized401 {
		t.Errorf("%d requests were refused (401) around the refresh, want none", after.Unauthorized401-before.Unauthorized401)
	}
	row, _ := e.db.OAuthToken(ctx, c.ID, "alice")
	if !slices.Equal(row.Scopes, []string{"mcp:tools"}) || row.SealedRefresh == nil || time.Until(*row.ExpiresAt) <= 0 {
		t.Errorf("after the refresh: scopes %v, refreshable %t, expires %v", row.Scopes, row.SealedRefresh != nil, row.ExpiresAt)
	}
	last := as.LastTokenRequest()
	if last.Get("grant_type") != "refresh_token" || last.Get("resource") != as.MCPURL || last.Get("scope") != "mcp:tools" {
		t.Errorf("the refresh request sent %v", last)
	}
}

// A token the server refuses (401 invalid_token) is refreshed and the
// request sent again, once.
func TestRefreshOn401(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	as := oauthtest.Start(t, oauthtest.Options{})
	m := e.manager(nil)
	c := e.connector("ws", "files", as.MCPURL, ModeUser)
	e.authorize(ctx, m, as, c, "alice")
	e.mustWhoami(ctx, m, c, "alice")
	old, _ := e.tokens(c, "alice")
	as.ExpireTokens()
	before := as.Counts()
	e.mustWhoami(ctx, m, c, "alice")
	after := as.Counts()
	if n := after.Refreshes - before.Refreshes; n != 1 {
		t.Errorf("%d refreshes, want 1", n)
	}
	if n := after.Unauthorized401 - before.Unauthorized401; n != 1 {
		t.Errorf("%d requests refused, want the 1 that led to the refresh", n)
	}
	if now, _ := e.tokens(c, "alice"); now == old {
		t.Error("the stored access token did not change")
	}
}

// A refused refresh means that user, and only that user, must authorize
// again; after they do, calls work.
func TestFailedRefreshReauthorizesThatUserOnly(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	as := oauthtest.Start(t, oauthtest.Options{})
	m := e.manager(nil)
	c := e.connector("ws", "files", as.MCPURL, ModeUser)
	e.authorize(ctx, m, as, c, "alice")
	e.authorize(ctx, m, as, c, "bob")
	e.mustWhoami(ctx, m, c, "alice")
	e.mustWhoami(ctx, m, c, "bob")

	as.RevokeRefreshTokens("alice")
	as.ExpireTokens()
	_, err := e.whoami(ctx, m, c, "alice")
	re := required(t, err, ReasonReauthorize)
	if re.UserID != "alice" {
		t.Errorf("RequiredError for %q", re.UserID)
	}
	e.mustWhoami(ctx, m, c, "bob")
	row, _ := e.db.OAuthToken(ctx, c.ID, "alice")
	if !row.NeedsReauth || !strings.Contains(row.ReauthReason, "invalid_grant") {
		t.Errorf("alice's row: needs_reauth %t, reason %q", row.NeedsReauth, row.ReauthReason)
	}
	if ok, _ := m.Usable(ctx, c, "alice"); ok {
		t.Error("Usable(alice) after a refused refresh")
	}
	if ok, _ := m.Usable(ctx, c, "bob"); !ok {
		t.Error("Usable(bob) false")
	}
	// Further calls fail at once, without asking the server again.
	before := as.Counts()
	_, err = e.whoami(ctx, m, c, "alice")
	required(t, err, ReasonReauthorize)
	if after := as.Counts(); after.TokenErrors != before.TokenErrors || after.MCPRequests != before.MCPRequests {
		t.Errorf("a call of a user who must authorize again reached the servers: %+v -> %+v", before, after)
	}

	e.authorize(ctx, m, as, c, "alice")
	e.mustWhoami(ctx, m, c, "alice")
	if ok, _ := m.Usable(ctx, c, "alice"); !ok {
		t.Error("Usable(alice) false after authorizing again")
	}
}

// A tool that needs more scopes answers INSUFFICIENT_SCOPE with the union
// of what was granted and what the server asks; authorizing those makes
// it work, and keeps what was granted.
func TestStepUp(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	as := oauthtest.Start(t, oauthtest.Options{})
	m := e.manager(nil)
	c := e.connector("ws", "files", as.MCPURL, ModeUser)
	e.authorize(ctx, m, as, c, "alice")
	_, err := e.call(ctx, m, c, "alice", "admin_action")
	re := required(t, err, ReasonInsufficientScope)
	if !slices.Equal(re.Scopes, []string{"mcp:tools", "admin"}) {
		t.Errorf("scopes to ask: %v", re.Scopes)
	}
	st, err := m.Start(ctx, c, "alice", "", []string{"admin"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(st.Scopes, []string{"mcp:tools", "admin"}) {
		t.Errorf("the step-up asks %v", st.Scopes)
	}
	e.authorize(ctx, m, as, c, "alice", re.Scopes...)
	text, err := e.call(ctx, m, c, "alice", "admin_action")
	if err != nil || text != "admin done for alice" {
		t.Errorf("admin_action after the step-up: %q, %v", text, err)
	}
	who, _ := e.call(ctx, m, c, "alice", "whoami")
	if who != "user=alice scopes=mcp:tools admin" {
		t.Errorf("whoami after the step-up: %q", who)
	}
}

// A server that refuses a token for insufficient_scope naming only scopes
// the token holds gets no step-up: authorizing again would ask for the
// same and be refused the same (the conformance suite's
// auth/scope-retry-limit issued such URLs). The call fails, saying so,
// and no authorization starts.
func TestStepUpForHeldScopes(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	as := oauthtest.Start(t, oauthtest.Options{StepUpScope: "mcp:tools"})
	m := e.manager(nil)
	c := e.connector("ws", "files", as.MCPURL, ModeUser)
	e.authorize(ctx, m, as, c, "alice")
	before := as.Counts()
	_, err := e.call(ctx, m, c, "alice", "admin_action")
	var held *ScopesHeldError
	if !errors.As(err, &held) || !slices.Equal(held.Scopes, []string{"mcp:tools"}) {
		t.Fatalf("a challenge for held scopes = %v, want a ScopesHeldError naming mcp:tools", err)
	}
	var re *RequiredError
	if errors.As(err, &re) {
		t.Errorf("a challenge for held scopes asks for an authorization: %v", re)
	}
	if after := as.Counts(); after.Forbidden403 != before.Forbidden403+1 || after.Authorizations != before.Authorizations {
		t.Errorf("counts %+v -> %+v: want one 403 and no authorization", before, after)
	}
	e.mustWhoami(ctx, m, c, "alice")
}

// Revoking revokes both tokens at the server and deletes them; calls then
// need an authorization.
func TestRevoke(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	as := oauthtest.Start(t, oauthtest.Options{})
	m := e.manager(nil)
	c := e.connector("ws", "files", as.MCPURL, ModeUser)
	e.authorize(ctx, m, as, c, "alice")
	e.authorize(ctx, m, as, c, "bob")
	e.mustWhoami(ctx, m, c, "alice")

	atServer, err := m.Revoke(ctx, c, "alice")
	if err != nil || !atServer {
		t.Fatalf("Revoke = %t, %v", atServer, err)
	}
	if n := as.Counts().Revocations; n != 2 {
		t.Errorf("%d revocations at the server, want 2 (refresh and access token)", n)
	}
	_, err = e.whoami(ctx, m, c, "alice")
	required(t, err, ReasonNoToken)
	if _, err := m.Revoke(ctx, c, "alice"); !errors.Is(err, ErrNoGrant) {
		t.Errorf("second Revoke: %v, want ErrNoGrant", err)
	}
	e.mustWhoami(ctx, m, c, "bob")

	// RevokeAll, for the connector's deletion.
	e.authorize(ctx, m, as, c, "alice")
	if err := m.RevokeAll(ctx, c); err != nil {
		t.Fatal(err)
	}
	if n := as.Counts().Revocations; n != 6 {
		t.Errorf("%d revocations at the server, want 6", n)
	}
	if gs, _ := m.List(ctx, ListFilter{WorkspaceID: "ws"}); len(gs) != 0 {
		t.Errorf("after RevokeAll: %+v", gs)
	}
}

// Without a revocation endpoint the tokens are deleted all the same.
func TestRevokeWithoutRevocationEndpoint(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	as := oauthtest.Start(t, oauthtest.Options{NoRevocation: true})
	m := e.manager(nil)
	c := e.connector("ws", "files", as.MCPURL, ModeUser)
	e.authorize(ctx, m, as, c, "alice")
	atServer, err := m.Revoke(ctx, c, "alice")
	if err != nil || atServer {
		t.Fatalf("Revoke = %t, %v; want deleted here only", atServer, err)
	}
	if _, err := e.db.OAuthToken(ctx, c.ID, "alice"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the token is still stored: %v", err)
	}
}

// A revocation through one replica ends the user's calls through another
// that had just read their token, where the authorization server cannot
// revoke it: the other's next connection reads Postgres, not its cache.
func TestRevokeThroughAnotherReplica(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	as := oauthtest.Start(t, oauthtest.Options{NoRevocation: true})
	a, b := e.manager(nil), e.manager(nil)
	c := e.connector("ws", "files", as.MCPURL, ModeUser)
	e.authorize(ctx, a, as, c, "alice")
	e.mustWhoami(ctx, a, c, "alice") // a holds her token now
	if _, err := b.Revoke(ctx, c, "alice"); err != nil {
		t.Fatal(err)
	}
	_, err := e.whoami(ctx, a, c, "alice")
	required(t, err, ReasonNoToken)
}

// A refresh the authorization server does not answer is an error that may
// pass: the user is not asked to authorize again, and the next call
// refreshes.
func TestRefreshUnreachableIsRetryable(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	as := oauthtest.Start(t, oauthtest.Options{})
	var down atomic.Bool
	hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if down.Load() && strings.HasSuffix(r.URL.Path, "/token") {
			return nil, errors.New("connect: connection refused")
		}
		return http.DefaultTransport.RoundTrip(r)
	})}
	m := e.manager(func(c *Config) { c.HTTPClient = hc })
	c := e.connector("ws", "files", as.MCPURL, ModeUser)
	e.authorize(ctx, m, as, c, "alice")
	e.mustWhoami(ctx, m, c, "alice")

	down.Store(true)
	as.ExpireTokens()
	_, err := e.whoami(ctx, m, c, "alice")
	var re *RequiredError
	if err == nil || errors.As(err, &re) || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("whoami while the token endpoint is down: %v; want a plain error saying why", err)
	}
	if row, _ := e.db.OAuthToken(ctx, c.ID, "alice"); row.NeedsReauth {
		t.Error("an unreachable authorization server marked the user for authorization")
	}
	if ok, _ := m.Usable(ctx, c, "alice"); !ok {
		t.Error("Usable false while the authorization server is down")
	}
	down.Store(false)
	e.mustWhoami(ctx, m, c, "alice")
	if n := as.Counts().Refreshes; n != 1 {
		t.Errorf("%d refreshes, want 1", n)
	}
}

// Rotating SECRET_KEY: Reseal seals every OAuth secret under the new key,
// after which the old one can go; CheckKey tells a key that cannot open
// the stored tokens.
func TestResealAndCheckKey(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	as := oauthtest.Start(t, oauthtest.Options{})
	m := e.manager(nil)
	c := e.connector("ws", "files", as.MCPURL, ModeUser)
	if err := CheckKey(ctx, e.db, e.box); err != nil {
		t.Fatalf("CheckKey with nothing stored: %v", err)
	}
	e.authorize(ctx, m, as, c, "alice")
	if _, err := m.Start(ctx, c, "bob", "", nil); err != nil { // a pending verifier
		t.Fatal(err)
	}
	newRaw := bytes.Repeat([]byte{7}, 32)
	newKey, _ := secret.NewBox(newRaw)
	rotating, _ := secret.NewBox(newRaw, e.key) // SECRET_KEY=new,old
	if err := CheckKey(ctx, e.db, newKey); !errors.Is(err, secret.ErrOpen) {
		t.Errorf("CheckKey with a key that did not seal them: %v, want ErrOpen", err)
	}
	n, err := Reseal(ctx, e.db, rotating)
	if err != nil || n != 3 {
		t.Fatalf("Reseal = %d, %v; want 3 values (access, refresh, verifier)", n, err)
	}
	if err := CheckKey(ctx, e.db, newKey); err != nil {
		t.Errorf("CheckKey with the new key after Reseal: %v", err)
	}
	e.box = newKey
	m2 := e.manager(nil)
	e.mustWhoami(ctx, m2, c, "alice")
}
