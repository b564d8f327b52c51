package oauth

import (
	"context"
	"errors"
	"testing"

	"github.com/connector-svc/connector-svc/internal/oauthtest"
	"github.com/connector-svc/connector-svc/internal/store"
)

// storedClientID is the client_id of the service's registration at as,
// or "" if there is none.
func (e *env) storedClientID(as *oauthtest.Server) string {
	e.t.Helper()
	cl, err := e.db.OAuthClient(context.Background(), as.Issuer, redirectURL)
	if errors.Is(err, store.ErrNotFound) {
		return ""
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return cl.ClientID
}

// An authorization server that forgot the service's registration (it
// restarted) refuses the refresh with invalid_client: the user must
// authorize again, and that authorization registers anew.
func TestForgottenRegistrationOnRefresh(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	as := oauthtest.Start(t, oauthtest.Options{})
	m := e.manager(nil)
	c := e.connector("ws", "files", as.MCPURL, ModeUser)
	e.authorize(ctx, m, as, c, "alice")
	e.mustWhoami(ctx, m, c, "alice")
	old := e.storedClientID(as)

	as.ForgetClient(old)
	as.ExpireTokens()
	_, err := e.whoami(ctx, m, c, "alice")
	required(t, err, ReasonReauthorize)
	if id := e.storedClientID(as); id != "" {
		t.Fatalf("the registration %q the server forgot is still stored", id)
	}
	row, _ := e.db.OAuthToken(ctx, c.ID, "alice")
	if !row.NeedsReauth {
		t.Error("alice's row is not marked for authorization")
	}

	metadataBefore := as.Counts().MetadataFetches
	e.authorize(ctx, m, as, c, "alice")
	e.mustWhoami(ctx, m, c, "alice")
	if n := as.Counts().Registrations; n != 2 {
		t.Errorf("%d registrations, want 2 (the second after the server forgot the first)", n)
	}
	if id := e.storedClientID(as); id == "" || id == old {
		t.Errorf("stored registration %q after registering again (the forgotten one was %q)", id, old)
	}
	if as.Counts().MetadataFetches == metadataBefore {
		t.Error("the authorization server's metadata was not fetched again after it forgot the registration")
	}
}

// A code exchange refused with invalid_client drops the registration it
// was made with, but not one another replica stored meanwhile.
func TestForgottenRegistrationOnCodeExchange(t *testing.T) {
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
	first := e.storedClientID(as)
	as.ForgetClient(first)
	q := loc.Query()
	_, err = m.Complete(ctx, q.Get("state"), q.Get("code"), q.Get("iss"), "")
	var ase *AuthServerError
	if !errors.As(err, &ase) || ase.Code != "invalid_client" {
		t.Fatalf("Complete with a forgotten client: %v, want AuthServerError invalid_client", err)
	}
	if id := e.storedClientID(as); id != "" {
		t.Fatalf("the forgotten registration %q is still stored", id)
	}
	e.authorize(ctx, m, as, c, "alice")
	second := e.storedClientID(as)
	if second == "" || second == first || as.Counts().Registrations != 2 {
		t.Fatalf("after the refusal: registration %q (first %q), %d registrations", second, first, as.Counts().Registrations)
	}

	// bob's authorization is started with the second registration; the
	// server forgets it, and before bob comes back another replica has
	// registered a third time (an operator's ForgetRegistration, then a
	// Start there). bob's refusal must leave the third one be.
	st, err = m.Start(ctx, c, "bob", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	loc, err = as.Authorize(ctx, st.URL, "bob")
	if err != nil {
		t.Fatal(err)
	}
	as.ForgetClient(second)
	if n, err := m.ForgetRegistration(ctx, as.Issuer); n != 1 || err != nil {
		t.Fatalf("ForgetRegistration = %d, %v; want 1", n, err)
	}
	if _, err := e.manager(nil).Start(ctx, c, "carol", "", nil); err != nil {
		t.Fatal(err)
	}
	third := e.storedClientID(as)
	if third == "" || third == second {
		t.Fatalf("the other replica's registration %q", third)
	}
	q = loc.Query()
	if _, err := m.Complete(ctx, q.Get("state"), q.Get("code"), q.Get("iss"), ""); !errors.As(err, &ase) || ase.Code != "invalid_client" {
		t.Fatalf("bob's Complete: %v, want invalid_client", err)
	}
	if id := e.storedClientID(as); id != third {
		t.Errorf("stored registration %q after bob's refusal, want the other replica's %q kept", id, third)
	}
}

// ForgetRegistration drops the service's registrations at an issuer, so
// the next authorization registers again; pre-registered clients are not
// touched, and a client credentials connector's refusal is kept as it is.
func TestForgetRegistration(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	as := oauthtest.Start(t, oauthtest.Options{})
	m := e.manager(nil)
	c := e.connector("ws", "files", as.MCPURL, ModeUser)
	e.authorize(ctx, m, as, c, "alice")
	if n, err := m.ForgetRegistration(ctx, "https://unknown.example"); n != 0 || err != nil {
		t.Errorf("ForgetRegistration of an unknown issuer = %d, %v", n, err)
	}
	old := e.storedClientID(as)
	if n, err := m.ForgetRegistration(ctx, as.Issuer); n != 1 || err != nil {
		t.Fatalf("ForgetRegistration = %d, %v; want 1", n, err)
	}
	if id := e.storedClientID(as); id != "" {
		t.Fatalf("registration %q still stored", id)
	}
	e.authorize(ctx, m, as, c, "bob")
	if id := e.storedClientID(as); id == "" || id == old || as.Counts().Registrations != 2 {
		t.Errorf("after ForgetRegistration: registration %q (old %q), %d registrations", id, old, as.Counts().Registrations)
	}

	// A pre-registered client credentials client the server does not know:
	// its refusal as it is, and the service's registration stays.
	cc := e.connector("ws", "machine", as.MCPURL, ModeClientCredentials)
	cc.ClientID, cc.ClientSecret = "never-registered", "cc-secret-canary-1b2c3d"
	_, err := e.call(ctx, m, cc, "", "whoami")
	var ase *AuthServerError
	if !errors.As(err, &ase) || ase.Code != "invalid_client" {
		t.Errorf("unknown client credentials client: %v, want AuthServerError invalid_client", err)
	}
	if id := e.storedClientID(as); id == "" {
		t.Error("a client credentials refusal dropped the service's registration")
	}
	e.assertNowhere("cc-secret-canary-1b2c3d")
}

// Forget drops a principal's cached token at once: a revocation on one
// replica takes effect on another as soon as it is told, even where the
// server would still take the token.
func TestForgetDropsCachedToken(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	as := oauthtest.Start(t, oauthtest.Options{NoRevocation: true})
	m1, m2 := e.manager(nil), e.manager(nil)
	c := e.connector("ws", "files", as.MCPURL, ModeUser)
	e.authorize(ctx, m1, as, c, "alice")
	e.authorize(ctx, m1, as, c, "bob")
	e.mustWhoami(ctx, m2, c, "alice") // m2 holds alice's token now
	e.mustWhoami(ctx, m2, c, "bob")

	if _, err := m1.Revoke(ctx, c, "alice"); err != nil {
		t.Fatal(err)
	}
	m2.Forget(c.ID, "alice")
	before := as.Counts().MCPRequests
	_, err := e.whoami(ctx, m2, c, "alice")
	required(t, err, ReasonNoToken)
	if n := as.Counts().MCPRequests - before; n != 0 {
		t.Errorf("%d requests reached the MCP server after the revocation, want none", n)
	}
	e.mustWhoami(ctx, m2, c, "bob") // only alice was forgotten
}
