package authorizations_test

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/authorizations"
	"github.com/connector-svc/connector-svc/internal/oauth"
	"github.com/connector-svc/connector-svc/internal/oauthtest"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

func TestMain(m *testing.M) { storetest.Main(m) }

// closer stands for the sessions use case: it records the sessions closed.
type closer struct {
	mu     sync.Mutex
	closed []string // "<workspace>/<connector>/<session>"
	err    error
}

func (c *closer) Close(_ context.Context, ws, connector, session string) ([]registry.SessionInfo, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = append(c.closed, ws+"/"+connector+"/"+session)
	return nil, c.err
}

func (c *closer) all() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.closed)
}

// fixture is the use case over a real database and a real oauth.Manager,
// against oauthtest's authorization server and the MCP server it guards.
type fixture struct {
	svc    *authorizations.Service
	db     *store.DB
	as     *oauthtest.Server
	closer *closer
}

func setup(t *testing.T) *fixture {
	t.Helper()
	db := storetest.NewDB(t)
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	box, err := secret.NewBox(key)
	if err != nil {
		t.Fatal(err)
	}
	m, err := oauth.New(oauth.Config{DB: db, Box: box, RedirectURL: "http://127.0.0.1:9/oauth/callback",
		ReturnToAllowed: []string{"https://chat.test/"}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{db: db, as: oauthtest.Start(t, oauthtest.Options{}), closer: &closer{}}
	f.svc = authorizations.New(authorizations.Deps{OAuth: authorizations.NewAuthorizer(m), Connectors: db, Box: box,
		Sessions: f.closer})
	return f
}

// connector creates an HTTP connector of the authorization server's MCP
// server, in auth mode mode.
func (f *fixture) connector(t *testing.T, id, mode string) *store.Connector {
	t.Helper()
	row, err := f.db.CreateConnector(context.Background(), &store.Connector{WorkspaceID: "ws", ExternalID: id, Name: id,
		Transport: store.TransportStreamableHTTP, Active: true,
		Config: store.Config{URL: f.as.MCPURL, CallTimeout: store.Duration(10 * time.Second), Auth: &store.AuthConfig{Mode: mode}}})
	if err != nil {
		t.Fatal(err)
	}
	return row
}

// consent plays user's browser at authURL and returns the redirect's
// parameters as a CompleteRequest.
func (f *fixture) consent(t *testing.T, authURL, user string) authorizations.CompleteRequest {
	t.Helper()
	loc, err := f.as.Authorize(context.Background(), authURL, user)
	if err != nil {
		t.Fatalf("authorize as %s: %v", user, err)
	}
	q := loc.Query()
	return authorizations.CompleteRequest{State: q.Get("state"), Code: q.Get("code"), Iss: q.Get("iss")}
}

// A user's authorization, the whole way: started at a caller's request,
// completed, listed, usable, revoked with the user's connection closed
// before and after, and then gone.
func TestAuthorizeListRevoke(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	row := f.connector(t, "p", store.AuthUser)

	if required, err := f.svc.Required(ctx, row, "alice"); err != nil || required == nil || required.Reason != oauth.ReasonNoToken {
		t.Fatalf("Required before any authorization = %+v, %v; want NO_TOKEN", required, err)
	}
	st, err := f.svc.Begin(ctx, authorizations.BeginRequest{WorkspaceID: "ws", ConnectorID: "p", UserID: "alice",
		ReturnTo: "https://chat.test/done"})
	if err != nil {
		t.Fatal(err)
	}
	done, err := f.svc.Complete(ctx, f.consent(t, st.URL, "alice"))
	if err != nil {
		t.Fatal(err)
	}
	if done.ReturnTo != "https://chat.test/done" || done.Grant.UserID != "alice" || done.Grant.ConnectorExternalID != "p" {
		t.Fatalf("Completed = %+v", done)
	}
	if required, err := f.svc.Required(ctx, row, "alice"); err != nil || required != nil {
		t.Fatalf("Required once authorized = %+v, %v; want nil", required, err)
	}

	grants, err := f.svc.List(ctx, authorizations.ListRequest{WorkspaceID: "ws", ConnectorID: "p", Limit: 10})
	if err != nil || len(grants) != 1 || grants[0].UserID != "alice" {
		t.Fatalf("List = %+v, %v", grants, err)
	}
	if grants, err := f.svc.List(ctx, authorizations.ListRequest{WorkspaceID: "ws", After: authorizations.GrantCursor(grants[0]),
		Limit: 10}); err != nil || len(grants) != 0 {
		t.Errorf("List after alice's = %+v, %v; want none", grants, err)
	}
	var nf *store.ConnectorNotFoundError
	if _, err := f.svc.List(ctx, authorizations.ListRequest{WorkspaceID: "ws", ConnectorID: "nope", Limit: 10}); !errors.As(err, &nf) {
		t.Errorf("List of an unknown connector = %v, want ConnectorNotFoundError", err)
	}

	atServer, err := f.svc.Revoke(ctx, authorizations.RevokeRequest{WorkspaceID: "ws", ConnectorID: "p", UserID: "alice"})
	if err != nil || !atServer {
		t.Fatalf("Revoke = %t, %v", atServer, err)
	}
	session := "ws/p/" + registry.UserSession("alice")
	if got := f.closer.all(); !slices.Equal(got, []string{session, session}) {
		t.Errorf("sessions closed by the revocation: %q; want alice's connection, before and after", got)
	}
	if required, err := f.svc.Required(ctx, row, "alice"); err != nil || required == nil {
		t.Errorf("Required after the revocation = %+v, %v; want NO_TOKEN", required, err)
	}
	if _, err := f.svc.Revoke(ctx, authorizations.RevokeRequest{WorkspaceID: "ws", ConnectorID: "p", UserID: "alice"}); !errors.Is(err, oauth.ErrNoGrant) {
		t.Errorf("a second Revoke = %v, want oauth.ErrNoGrant", err)
	}
}

// A failed close is logged; the revocation goes on.
func TestRevokeSurvivesAFailedClose(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	f.connector(t, "p", store.AuthUser)
	st, err := f.svc.Begin(ctx, authorizations.BeginRequest{WorkspaceID: "ws", ConnectorID: "p", UserID: "bob"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.Complete(ctx, f.consent(t, st.URL, "bob")); err != nil {
		t.Fatal(err)
	}
	f.closer.err = errors.New("a replica is down")
	if atServer, err := f.svc.Revoke(ctx, authorizations.RevokeRequest{WorkspaceID: "ws", ConnectorID: "p", UserID: "bob"}); err != nil || !atServer {
		t.Errorf("Revoke with failing closes = %t, %v", atServer, err)
	}
}

// Only a key of the authorization's workspace completes it; a key of
// another is refused before the state is used, which stays usable.
func TestCompleteTakesAKeyOfItsWorkspace(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	f.connector(t, "p", store.AuthUser)
	st, err := f.svc.Begin(ctx, authorizations.BeginRequest{WorkspaceID: "ws", ConnectorID: "p", UserID: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	req := f.consent(t, st.URL, "alice")
	req.Key = &authorizations.Key{ID: "k1", WorkspaceID: "other"}
	var wrong *authorizations.WrongWorkspaceError
	if _, err := f.svc.Complete(ctx, req); !errors.As(err, &wrong) || wrong.KeyID != "k1" || wrong.KeyWorkspaceID != "other" {
		t.Fatalf("Complete with another workspace's key = %v, want WrongWorkspaceError", err)
	}
	req.Key = &authorizations.Key{ID: "k2", WorkspaceID: "ws"}
	if done, err := f.svc.Complete(ctx, req); err != nil || done.Grant.UserID != "alice" {
		t.Fatalf("Complete with the workspace's key = %+v, %v", done, err)
	}
	if _, err := f.svc.Complete(ctx, req); !errors.Is(err, oauth.ErrStateInvalid) {
		t.Errorf("Complete of a used state = %v, want oauth.ErrStateInvalid", err)
	}
}

// A refusal carries the authorization's return address and the server's
// error code; without a return address it is the server's error as it is.
func TestRefusal(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	f.connector(t, "p", store.AuthUser)
	for _, returnTo := range []string{"https://chat.test/back", ""} {
		st, err := f.svc.Begin(ctx, authorizations.BeginRequest{WorkspaceID: "ws", ConnectorID: "p", UserID: "alice", ReturnTo: returnTo})
		if err != nil {
			t.Fatal(err)
		}
		req := f.consent(t, st.URL, "alice")
		req.Code, req.Error = "", "access_denied"
		_, err = f.svc.Complete(ctx, req)
		var refused *authorizations.RefusedError
		var server *oauth.AuthServerError
		switch {
		case returnTo != "" && (!errors.As(err, &refused) || refused.Code != "access_denied" || refused.ReturnTo != returnTo):
			t.Errorf("a refusal with return_to = %v, want RefusedError", err)
		case returnTo == "" && (errors.As(err, &refused) || !errors.As(err, &server) || server.Code != "access_denied"):
			t.Errorf("a refusal without return_to = %v, want oauth.AuthServerError", err)
		}
	}
}

// Runs and calls that meet a missing or too narrow token start an
// authorization: a step-up asks for the scopes on top, at most
// MaxStepUps (2) a window; a connector of its own identity is told to fix its
// credentials.
func TestNeeded(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	row := f.connector(t, "p", store.AuthUser)

	err := f.svc.Needed(ctx, row, "alice", &oauth.RequiredError{ConnectorID: row.ID, UserID: "alice", Reason: oauth.ReasonNoToken}, "run-1")
	var needed *authorizations.RequiredError
	if !errors.As(err, &needed) {
		t.Fatalf("Needed = %v, want RequiredError", err)
	}
	if a := needed.Authorization; a.RunID != "run-1" || a.UserID != "alice" || a.ConnectorID != "p" || a.Reason != oauth.ReasonNoToken ||
		a.URL == "" || time.Until(a.ExpiresAt) < 9*time.Minute {
		t.Errorf("Authorization = %+v", a)
	}

	// Three authorizations in all: the one that gave the token, and two
	// step-ups (the conformance suite's auth/scope-retry-limit).
	more := &oauth.RequiredError{ConnectorID: row.ID, UserID: "alice", Reason: oauth.ReasonInsufficientScope, Scopes: []string{oauthtest.AdminScope}}
	for i := range 2 {
		a, err := f.svc.Start(ctx, row, "alice", more.Reason, more.Scopes)
		if err != nil || !slices.Contains(a.Scopes, oauthtest.AdminScope) || a.Reason != oauth.ReasonInsufficientScope {
			t.Fatalf("step-up %d = %+v, %v", i+1, a, err)
		}
	}
	var limit *authorizations.StepUpLimitError
	if err := f.svc.Needed(ctx, row, "alice", more, ""); !errors.As(err, &limit) || limit.Window != authorizations.DefaultWindow {
		t.Errorf("one step-up too many = %v, want StepUpLimitError", err)
	}
	if _, err := f.svc.Start(ctx, row, "bob", more.Reason, more.Scopes); err != nil {
		t.Errorf("another user's step-up = %v; the limit is each user's", err)
	}

	own := &store.Connector{ID: row.ID, WorkspaceID: "ws", ExternalID: "m",
		Config: store.Config{Auth: &store.AuthConfig{Mode: store.AuthClientCredentials}}}
	var ownErr *authorizations.OwnAuthorizationError
	if err := f.svc.Needed(ctx, own, "", &oauth.RequiredError{Reason: oauth.ReasonNoToken}, ""); !errors.As(err, &ownErr) {
		t.Errorf("Needed of a client credentials connector = %v, want OwnAuthorizationError", err)
	}
}

// What a connector's auth mode does not allow.
func TestModes(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	f.connector(t, "plain", store.AuthNone)
	f.connector(t, "p", store.AuthUser)
	var notUser *authorizations.NotOAuthUserError
	if _, err := f.svc.Begin(ctx, authorizations.BeginRequest{WorkspaceID: "ws", ConnectorID: "plain", UserID: "alice"}); !errors.As(err, &notUser) ||
		notUser.Revoking || notUser.Mode != store.AuthNone || notUser.ConnectorID != "plain" {
		t.Errorf("Begin on a connector without OAuth = %v, want NotOAuthUserError", err)
	}
	if _, err := f.svc.Revoke(ctx, authorizations.RevokeRequest{WorkspaceID: "ws", ConnectorID: "plain"}); !errors.As(err, &notUser) || !notUser.Revoking {
		t.Errorf("Revoke on a connector without OAuth = %v, want NotOAuthUserError (revoking)", err)
	}
	var userRequired *authorizations.UserRequiredError
	if _, err := f.svc.Revoke(ctx, authorizations.RevokeRequest{WorkspaceID: "ws", ConnectorID: "p"}); !errors.As(err, &userRequired) || userRequired.ConnectorID != "p" {
		t.Errorf("Revoke of an oauth_user connector without a user = %v, want UserRequiredError", err)
	}
	if got := f.closer.all(); len(got) != 0 {
		t.Errorf("refused revocations closed %q", got)
	}
}

// Without OAuth every use says so, and the listing is empty.
func TestNotConfigured(t *testing.T) {
	svc := authorizations.New(authorizations.Deps{})
	ctx := context.Background()
	row := &store.Connector{ID: 1, WorkspaceID: "ws", ExternalID: "p", Config: store.Config{Auth: &store.AuthConfig{Mode: store.AuthUser}}}
	_, begin := svc.Begin(ctx, authorizations.BeginRequest{WorkspaceID: "ws", ConnectorID: "p", UserID: "alice"})
	_, complete := svc.Complete(ctx, authorizations.CompleteRequest{State: "s", Code: "c"})
	_, revoke := svc.Revoke(ctx, authorizations.RevokeRequest{WorkspaceID: "ws", ConnectorID: "p", UserID: "alice"})
	_, start := svc.Start(ctx, row, "alice", "", nil)
	_, required := svc.Required(ctx, row, "alice")
	needed := svc.Needed(ctx, row, "alice", &oauth.RequiredError{Reason: oauth.ReasonNoToken}, "")
	for name, err := range map[string]error{"Begin": begin, "Complete": complete, "Revoke": revoke, "Start": start,
		"Required": required, "Needed": needed} {
		if !errors.Is(err, authorizations.ErrNotConfigured) {
			t.Errorf("%s without OAuth = %v, want ErrNotConfigured", name, err)
		}
	}
	if grants, err := svc.List(ctx, authorizations.ListRequest{WorkspaceID: "ws", Limit: 10}); err != nil || len(grants) != 0 {
		t.Errorf("List without OAuth = %v, %v; want none", grants, err)
	}
}

// A cursor that is not a GrantCursor is refused.
func TestBadCursor(t *testing.T) {
	f := setup(t)
	_, err := f.svc.List(context.Background(), authorizations.ListRequest{WorkspaceID: "ws", After: "x:alice", Limit: 10})
	if !errors.Is(err, authorizations.ErrBadCursor) {
		t.Errorf("List after a bad cursor = %v, want ErrBadCursor", err)
	}
}
