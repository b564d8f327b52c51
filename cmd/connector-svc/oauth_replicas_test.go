package main

// OAuth through the real binary on several replicas (the harness is in
// replicas_harness_test.go): three processes on one database behind one
// public callback URL (OAUTH_REDIRECT_URL, as a load balancer would have),
// each serving the callback on a listener of its own. The test plays the
// chat backend (gRPC to whichever replica it likes) and the end users'
// browsers (at the authorization server of internal/oauthtest, then at
// whichever replica's callback it picks, as the load balancer would).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/loudskip"
	"github.com/connector-svc/connector-svc/internal/oauth"
	"github.com/connector-svc/connector-svc/internal/oauthtest"
	"github.com/connector-svc/connector-svc/internal/server"
)

const (
	// chatReturnTo is the allow-listed prefix (OAUTH_RETURN_TO_ALLOWED) the
	// browser may be sent back to.
	chatReturnTo = "https://chat.test/"
	// ccSecretCanary is a client credentials connector's client secret:
	// it must appear in no log and nowhere in the database.
	ccSecretCanary = "cc-secret-canary-7f3a91d2c4e8"
	// fastTTL is the access token lifetime of the authorization server the
	// refresh scenario runs against. Its token responses say expires_in in
	// whole seconds, rounded down (fosite's): the service is told
	// fastAnnounced. (A whole number of seconds would be announced as one
	// less whenever the response is a moment late, so the service would
	// renew at times that vary.)
	fastTTL       = 2500 * time.Millisecond
	fastAnnounced = 2 * time.Second
)

// fositeTokenPrefixes start every access token, refresh token and
// authorization code the test authorization server (fosite) issues.
var fositeTokenPrefixes = []string{"ory_at_", "ory_rt_", "ory_ac_"}

// oauthCluster is the replicas with the authorization servers and the
// fake model they are tested with.
type oauthCluster struct {
	c     *testCluster
	db    *pgx.Conn         // the test's own queries, one at a time
	as    *oauthtest.Server // connector p's, tokens valid 1h
	fast  *oauthtest.Server // connector fast's, tokens valid fastTTL
	norev *oauthtest.Server // connector norev's, with no revocation endpoint
	model *llmtest.Server
	// redirect is the OAUTH_REDIRECT_URL every replica shares; no
	// listener serves it, the browser goes to a replica's callback.
	redirect *url.URL

	// aliceCallback is the callback URL alice's browser came back with,
	// for the replay.
	aliceCallback *url.URL

	mu     sync.Mutex
	states []string // every state a browser carried: canaries too
}

// TestOAuthReplicas runs the OAuth scenarios through three replicas of the
// real binary, one after the other on one cluster: each goes on from what
// the ones before left (users authorized, tokens stored). Connector p is
// oauth_user on as, fast is oauth_user on an authorization server whose
// access tokens live fastTTL, and norev is oauth_user on one that offers
// no revocation; cc and fastcc are client credentials on as and fast.
func TestOAuthReplicas(t *testing.T) {
	as := oauthtest.Start(t, oauthtest.Options{})
	fast := oauthtest.Start(t, oauthtest.Options{AccessTTL: fastTTL})
	norev := oauthtest.Start(t, oauthtest.Options{NoRevocation: true})
	as.RegisterClient("svc-client", ccSecretCanary)
	fast.RegisterClient("fast-svc", ccSecretCanary)
	model := llmtest.New(t)
	redirect, err := url.Parse("http://localhost:" + portOf(freeAddr(t)) + "/oauth/callback")
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{"a", "b", "c"}
	c := newCluster(t, map[string]string{
		"OAUTH_REDIRECT_URL": redirect.String(), "OAUTH_CALLBACK_ADDR": "127.0.0.1:0", "OAUTH_RETURN_TO_ALLOWED": chatReturnTo,
		"LLM_BASE_URL": model.URL(), "LLM_MODEL": "fake-model",
		"LOG_LEVEL": "debug", // every line the canaries are looked for in
	}, ids...)
	c.waitMembers(ids...)
	o := &oauthCluster{c: c, db: c.db(), as: as, fast: fast, norev: norev, model: model, redirect: redirect}
	for _, id := range ids {
		if c.get(id).callback == "" {
			t.Fatalf("replica %s serves no OAuth callback listener (no oauth_callback_addr in its serving line)", id)
		}
	}
	a := c.client("a")
	for _, conn := range []*connectorv1.Connector{
		oauthUserConnector("p", as.MCPURL),
		oauthUserConnector("fast", fast.MCPURL),
		oauthUserConnector("norev", norev.MCPURL),
		clientCredentialsConnector("cc", as.MCPURL, "svc-client"),
		clientCredentialsConnector("fastcc", fast.MCPURL, "fast-svc"),
	} {
		create(t, a, conn)
	}

	steps := []struct {
		name    string
		restart bool // every replica restarts first
		run     func(t *testing.T)
	}{
		{"two users across replicas", false, o.twoUsers},
		{"client credentials", false, o.clientCredentials},
		{"callback replay and wrong iss", false, o.replayAndWrongIss},
		{"restart keeps tokens and registrations", true, o.restartKeepsTokens},
		{"revoke on one replica", false, o.revokeEverywhere},
		{"revoke without revocation at the server", false, o.revokeWithoutServer},
		{"refresh across replicas", false, o.refreshAcrossReplicas},
		{"paused query resumed on another replica", false, o.pausedQuery},
		{"no secret in logs or database", false, o.canaries},
	}
	for _, s := range steps {
		if s.restart {
			o.restartAll(ids...) // here: the harness fails the test it was made with
		}
		if !t.Run(s.name, s.run) {
			t.FailNow() // each scenario goes on from the last one's state
		}
	}
}

func oauthUserConnector(id, url string) *connectorv1.Connector {
	conn := httpConnector(id, url)
	conn.Auth = &connectorv1.AuthConfig{Mode: connectorv1.AuthMode_AUTH_MODE_OAUTH_USER}
	return conn
}

// clientCredentialsConnector is a client credentials connector with the
// pre-registered client clientID, whose secret is ccSecretCanary.
func clientCredentialsConnector(id, url, clientID string) *connectorv1.Connector {
	conn := httpConnector(id, url)
	conn.Auth = &connectorv1.AuthConfig{Mode: connectorv1.AuthMode_AUTH_MODE_OAUTH_CLIENT_CREDENTIALS, ClientId: clientID,
		ClientSecret: ccSecretCanary}
	return conn
}

func portOf(addr string) string {
	_, port, _ := net.SplitHostPort(addr)
	return port
}

// client is replica id's gRPC client, failing t (not the cluster's test)
// if it is not running.
func (o *oauthCluster) client(t *testing.T, id string) connectorv1.ConnectorServiceClient {
	t.Helper()
	return o.replica(t, id).client
}

func (o *oauthCluster) replica(t *testing.T, id string) *replicaProc {
	t.Helper()
	o.c.mu.Lock()
	r := o.c.byID[id]
	o.c.mu.Unlock()
	if r == nil {
		t.Fatalf("replica %s is not running", id)
	}
	return r
}

// restartAll stops every replica with SIGTERM, one after the other, then
// starts them all again.
func (o *oauthCluster) restartAll(ids ...string) {
	c := o.c
	for _, id := range ids {
		c.term(id)
	}
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		go func() { defer wg.Done(); c.start(id) }()
	}
	wg.Wait()
	for _, id := range ids {
		if !c.get(id).running() {
			c.t.Fatalf("replica %s did not start again", id)
		}
	}
	c.waitMembers(ids...)
}

// callbackAnswer is what a replica's callback listener answered a browser.
type callbackAnswer struct {
	status   int
	location string
	body     string
}

// browse plays user's browser at authURL: the authorization server's
// consent (as oauthtest.Authorize does), then its redirect to the shared
// callback URL, sent to replica on's callback listener. It returns the
// callback's answer and the redirect as the authorization server made it.
func (o *oauthCluster) browse(t *testing.T, as *oauthtest.Server, authURL, user, on string) (callbackAnswer, *url.URL) {
	t.Helper()
	loc := o.authorize(t, as, authURL, user)
	return o.deliver(t, loc, on), loc
}

// authorize plays user's browser at the authorization server and checks
// that it redirects to the shared callback URL with a code and a state.
func (o *oauthCluster) authorize(t *testing.T, as *oauthtest.Server, authURL, user string) *url.URL {
	t.Helper()
	loc, err := as.Authorize(ctxFor(t, 15*time.Second), authURL, user)
	if err != nil {
		t.Fatalf("%s at the authorization server: %v", user, err)
	}
	q := loc.Query()
	if loc.Scheme != o.redirect.Scheme || loc.Host != o.redirect.Host || loc.Path != o.redirect.Path ||
		q.Get("code") == "" || q.Get("state") == "" || q.Get("iss") != as.Issuer {
		t.Fatalf("the authorization server redirected %s to %s%s (code set %v, state set %v, iss %q); want %s with a code, "+
			"a state and iss %s", user, loc.Host, loc.Path, q.Get("code") != "", q.Get("state") != "", q.Get("iss"), o.redirect, as.Issuer)
	}
	o.mu.Lock()
	o.states = append(o.states, q.Get("state"))
	o.mu.Unlock()
	return loc
}

// deliver sends the browser to redirect (the shared callback URL with its
// query) through replica on's callback listener, without following the
// callback's own redirect.
func (o *oauthCluster) deliver(t *testing.T, redirect *url.URL, on string) callbackAnswer {
	t.Helper()
	u := *redirect
	u.Host = o.replica(t, on).callback
	hc := &http.Client{Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := hc.Get(u.String())
	if err != nil {
		t.Fatalf("the browser at replica %s's callback: %v", on, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return callbackAnswer{status: resp.StatusCode, location: resp.Header.Get("Location"), body: string(body)}
}

// call calls tool on connector through replica on as user, again while
// the replica answers NOT_FOUND or UNAVAILABLE (it does not know the
// connector yet, or is still connecting it), for up to 15 s.
func (o *oauthCluster) call(t *testing.T, on, connector, tool, user string) (string, error) {
	t.Helper()
	client := o.client(t, on)
	var resp *connectorv1.CallToolResponse
	var err error
	poll(15*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		resp, err = client.CallTool(ctx, &connectorv1.CallToolRequest{WorkspaceId: "acme", ConnectorId: connector,
			ToolName: tool, UserId: user})
		code := status.Code(err)
		return code != codes.NotFound && code != codes.Unavailable
	})
	switch {
	case err != nil:
		return "", err
	case resp.GetIsError():
		return "", fmt.Errorf("%s answered an error result: %q", tool, text(resp))
	}
	return text(resp), nil
}

// wantUser checks that whoami on connector through replica on runs as user.
func (o *oauthCluster) wantUser(t *testing.T, on, connector, user string) {
	t.Helper()
	got, err := o.call(t, on, connector, "whoami", user)
	if err != nil || !strings.HasPrefix(got, "user="+user+" ") {
		t.Fatalf("whoami on %s through replica %s as %s = %q, %v; want user=%s", connector, on, user, got, err, user)
	}
}

// wantAuthorization checks that whoami on connector through replica on as
// user is refused until user authorizes, for reason, and returns what
// the refusal says.
func (o *oauthCluster) wantAuthorization(t *testing.T, on, connector, user, reason string) *connectorv1.AuthorizationRequired {
	t.Helper()
	got, err := o.call(t, on, connector, "whoami", user)
	if err == nil {
		t.Fatalf("whoami on %s through replica %s as %s = %q; want AUTHORIZATION_REQUIRED", connector, on, user, got)
	}
	ar, why := authorizationRequiredOf(err)
	if why != "" {
		t.Fatalf("whoami on %s through replica %s as %s: %s", connector, on, user, why)
	}
	if ar.GetUserId() != user || ar.GetConnectorId() != connector || ar.GetReason() != reason {
		t.Fatalf("whoami on %s through replica %s as %s: AuthorizationRequired for user %q, connector %q, reason %q; want %s",
			connector, on, user, ar.GetUserId(), ar.GetConnectorId(), ar.GetReason(), reason)
	}
	return ar
}

// authorizationRequiredOf returns the AuthorizationRequired of err, or why
// err is not FAILED_PRECONDITION with ErrorInfo AUTHORIZATION_REQUIRED
// naming the same URL as the AuthorizationRequired beside it.
func authorizationRequiredOf(err error) (*connectorv1.AuthorizationRequired, string) {
	st := status.Convert(err)
	if st.Code() != codes.FailedPrecondition {
		return nil, fmt.Sprintf("%v (%s), want FAILED_PRECONDITION AUTHORIZATION_REQUIRED", st.Code(), st.Message())
	}
	var info *errdetails.ErrorInfo
	var ar *connectorv1.AuthorizationRequired
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *connectorv1.AuthorizationRequired:
			ar = d
		}
	}
	switch {
	case info == nil || info.GetReason() != server.ReasonAuthorizationRequired:
		return nil, fmt.Sprintf("FAILED_PRECONDITION with ErrorInfo %v, want reason %s (%s)", info, server.ReasonAuthorizationRequired, st.Message())
	case ar == nil || ar.GetAuthorizationUrl() == "":
		return nil, fmt.Sprintf("AUTHORIZATION_REQUIRED without an AuthorizationRequired with a URL in the details (%s)", st.Message())
	case info.GetMetadata()["authorization_url"] != ar.GetAuthorizationUrl():
		return nil, "the ErrorInfo's authorization_url is not the AuthorizationRequired's"
	}
	return ar, ""
}

// authorizations lists connector's authorizations through replica on, by
// user.
func (o *oauthCluster) authorizations(t *testing.T, on, connector string) map[string]*connectorv1.Authorization {
	t.Helper()
	resp, err := o.client(t, on).ListAuthorizations(ctxFor(t, 15*time.Second),
		&connectorv1.ListAuthorizationsRequest{WorkspaceId: "acme", ConnectorId: connector})
	if err != nil {
		t.Fatalf("ListAuthorizations of %s through %s: %v", connector, on, err)
	}
	m := map[string]*connectorv1.Authorization{}
	for _, a := range resp.GetAuthorizations() {
		m[a.GetUserId()] = a
	}
	return m
}

// sessions lists connector's sessions through replica on.
func (o *oauthCluster) sessions(t *testing.T, on, connector string) []string {
	t.Helper()
	resp, err := o.client(t, on).ListSessions(ctxFor(t, 15*time.Second),
		&connectorv1.ListSessionsRequest{WorkspaceId: "acme", ConnectorId: connector})
	if err != nil {
		t.Fatalf("ListSessions of %s through %s: %v", connector, on, err)
	}
	var ids []string
	for _, s := range resp.GetSessions() {
		ids = append(ids, s.GetSessionId())
	}
	return ids
}

// tokenRows counts the users' rows of oauth_tokens (not the client
// credentials connector's own), and the rows of oauth_clients.
func (o *oauthCluster) tokenRows(t *testing.T) (tokens, clients int) {
	t.Helper()
	ctx := ctxFor(t, 10*time.Second)
	if err := o.db.QueryRow(ctx, `SELECT (SELECT count(*) FROM oauth_tokens WHERE user_id <> ''), (SELECT count(*) FROM oauth_clients)`).
		Scan(&tokens, &clients); err != nil {
		t.Fatalf("counting OAuth rows: %v", err)
	}
	return tokens, clients
}

// twoUsers: alice and bob authorize connector p through different
// replicas, each calls as themself through every replica, and the service
// registered with the authorization server once.
func (o *oauthCluster) twoUsers(t *testing.T) {
	// Alice has not authorized: her call through b says where to.
	ar := o.wantAuthorization(t, "b", "p", "alice", oauth.ReasonNoToken)
	if !strings.HasPrefix(ar.GetAuthorizationUrl(), o.as.Issuer+"/authorize?") {
		t.Fatalf("alice's authorization_url %q is not at the authorization server %s", ar.GetAuthorizationUrl(), o.as.Issuer)
	}
	o.authorize(t, o.as, ar.GetAuthorizationUrl(), "alice") // the URL works (the browser goes no further)

	// She authorizes through StartAuthorization on a; her browser comes
	// back through c, which sends it on to return_to.
	returnTo := chatReturnTo + "conversations/42?tab=tools"
	st, err := o.client(t, "a").StartAuthorization(ctxFor(t, 15*time.Second), &connectorv1.StartAuthorizationRequest{
		WorkspaceId: "acme", ConnectorId: "p", UserId: "alice", ReturnTo: returnTo})
	if err != nil {
		t.Fatalf("StartAuthorization for alice through a: %v", err)
	}
	ans, loc := o.browse(t, o.as, st.GetAuthorizationUrl(), "alice", "c")
	if ans.status != http.StatusSeeOther || ans.location != returnTo {
		t.Fatalf("alice's callback through c answered %d to %q, want 303 to %s: %s", ans.status, ans.location, returnTo, ans.body)
	}
	o.aliceCallback = loc
	o.wantUser(t, "a", "p", "alice")
	o.wantUser(t, "b", "p", "alice")

	// Bob has not: through c his call says where; he authorizes and his
	// backend hands the redirect to CompleteAuthorization on b.
	ar = o.wantAuthorization(t, "c", "p", "bob", oauth.ReasonNoToken)
	q := o.authorize(t, o.as, ar.GetAuthorizationUrl(), "bob").Query()
	done, err := o.client(t, "b").CompleteAuthorization(ctxFor(t, 15*time.Second), &connectorv1.CompleteAuthorizationRequest{
		State: q.Get("state"), Code: q.Get("code"), Iss: q.Get("iss")})
	if err != nil {
		t.Fatalf("CompleteAuthorization for bob through b: %v", err)
	}
	if g := done.GetAuthorization(); g.GetUserId() != "bob" || g.GetConnectorId() != "p" || !g.GetRefreshable() || g.GetIssuer() != o.as.Issuer {
		t.Fatalf("bob's authorization = %v", g)
	}
	for _, on := range []string{"c", "a", "b"} {
		o.wantUser(t, on, "p", "bob")
		o.wantUser(t, on, "p", "alice")
	}
	for _, on := range []string{"a", "b", "c"} {
		if got := o.authorizations(t, on, "p"); len(got) != 2 || got["alice"] == nil || got["bob"] == nil {
			t.Errorf("ListAuthorizations of p through %s = %v, want alice and bob", on, got)
		}
	}
	if n := o.as.Counts().Registrations; n != 1 {
		t.Errorf("the authorization server registered %d clients, want 1: every replica uses the one registration", n)
	}
	if tokens, clients := o.tokenRows(t); tokens != 2 || clients != 1 {
		t.Errorf("oauth_tokens has %d rows and oauth_clients %d, want 2 (alice, bob) and 1", tokens, clients)
	}
}

// clientCredentials: the client credentials connector calls as its
// client through any replica.
func (o *oauthCluster) clientCredentials(t *testing.T) {
	for _, on := range []string{"b", "c"} {
		if got, err := o.call(t, on, "cc", "whoami", ""); err != nil || !strings.HasPrefix(got, "user=svc-client ") {
			t.Fatalf("whoami on cc through %s = %q, %v; want user=svc-client", on, got, err)
		}
	}
}

// replayAndWrongIss: a callback URL used once is refused on another
// replica, and so is one whose iss is not the authorization server's;
// neither stores anything.
func (o *oauthCluster) replayAndWrongIss(t *testing.T) {
	if o.aliceCallback == nil {
		t.Fatal("no callback URL of alice's to replay")
	}
	before := o.as.Counts()
	tokens, _ := o.tokenRows(t)
	grant := o.authorizations(t, "a", "p")["alice"]
	state, code := o.aliceCallback.Query().Get("state"), o.aliceCallback.Query().Get("code")
	for _, on := range []string{"a", "c"} {
		ans := o.deliver(t, o.aliceCallback, on)
		if ans.status != http.StatusBadRequest || strings.Contains(ans.body, state) || strings.Contains(ans.body, code) {
			t.Errorf("alice's callback URL again through %s: %d %q, want 400 that echoes nothing", on, ans.status, ans.body)
		}
	}

	// Dave's redirect, with iss rewritten: refused, and the state is spent.
	st, err := o.client(t, "b").StartAuthorization(ctxFor(t, 15*time.Second), &connectorv1.StartAuthorizationRequest{
		WorkspaceId: "acme", ConnectorId: "p", UserId: "dave"})
	if err != nil {
		t.Fatalf("StartAuthorization for dave through b: %v", err)
	}
	loc := o.authorize(t, o.as, st.GetAuthorizationUrl(), "dave")
	forged := *loc
	q := forged.Query()
	q.Set("iss", oauthtest.WrongIssuer)
	forged.RawQuery = q.Encode()
	if ans := o.deliver(t, &forged, "b"); ans.status != http.StatusBadRequest || strings.Contains(ans.body, oauthtest.WrongIssuer) {
		t.Errorf("dave's callback with iss %s through b: %d %q, want 400 that echoes nothing", oauthtest.WrongIssuer, ans.status, ans.body)
	}
	if ans := o.deliver(t, loc, "a"); ans.status != http.StatusBadRequest {
		t.Errorf("dave's callback with the right iss, after the wrong one, through a: %d %q; want 400: the state was spent", ans.status, ans.body)
	}

	after := o.as.Counts()
	if n := after.TokenCodeExchanges - before.TokenCodeExchanges; n != 0 {
		t.Errorf("%d codes were exchanged for a replayed callback and a wrong iss, want 0", n)
	}
	if n, _ := o.tokenRows(t); n != tokens {
		t.Errorf("oauth_tokens went from %d to %d rows, want no change", tokens, n)
	}
	now := o.authorizations(t, "c", "p")
	if now["dave"] != nil {
		t.Errorf("dave is authorized after a callback with a wrong iss: %v", now["dave"])
	}
	if g := now["alice"]; g == nil || !g.GetUpdateTime().AsTime().Equal(grant.GetUpdateTime().AsTime()) {
		t.Errorf("alice's authorization changed with the replay: %v, was %v", g, grant)
	}
}

// restartKeepsTokens: after every replica restarted, alice and bob call as
// themselves without authorizing again, and nobody registered again.
func (o *oauthCluster) restartKeepsTokens(t *testing.T) {
	before := o.as.Counts()
	for _, on := range []string{"a", "b", "c"} {
		o.wantUser(t, on, "p", "alice")
		o.wantUser(t, on, "p", "bob")
	}
	after := o.as.Counts()
	if after.Registrations != 1 || after.Authorizations != before.Authorizations || after.TokenCodeExchanges != before.TokenCodeExchanges {
		t.Errorf("after the restart: %d registrations (want 1), %d new authorizations and %d new code exchanges (want 0)",
			after.Registrations, after.Authorizations-before.Authorizations, after.TokenCodeExchanges-before.TokenCodeExchanges)
	}
}

// revokeEverywhere: alice's authorization revoked through b ends her
// connection and her calls through every replica; bob goes on.
func (o *oauthCluster) revokeEverywhere(t *testing.T) {
	const aliceSession = "user:alice"
	if got := o.sessions(t, "c", "p"); !slices.Contains(got, aliceSession) {
		t.Fatalf("sessions of p before the revocation = %v, want %s among them", got, aliceSession)
	}
	before := o.as.Counts()
	rv, err := o.client(t, "b").RevokeAuthorization(ctxFor(t, 15*time.Second),
		&connectorv1.RevokeAuthorizationRequest{WorkspaceId: "acme", ConnectorId: "p", UserId: "alice"})
	if err != nil || !rv.GetRevokedAtServer() {
		t.Fatalf("RevokeAuthorization of alice through b = %v, %v; want revoked at the server", rv, err)
	}
	if n := o.as.Counts().Revocations - before.Revocations; n < 1 {
		t.Errorf("the authorization server counted %d revocations, want at least 1", n)
	}
	for _, on := range []string{"a", "b", "c"} {
		if got := o.sessions(t, on, "p"); slices.Contains(got, aliceSession) {
			t.Errorf("sessions of p through %s after the revocation = %v: alice's connection is still open", on, got)
		}
	}
	for _, on := range []string{"a", "b", "c"} {
		o.wantAuthorization(t, on, "p", "alice", oauth.ReasonNoToken)
		if got := o.authorizations(t, on, "p"); got["alice"] != nil || got["bob"] == nil {
			t.Errorf("ListAuthorizations of p through %s after alice's revocation = %v, want bob only", on, got)
		}
	}
	for _, on := range []string{"a", "b", "c"} {
		o.wantUser(t, on, "p", "bob")
	}
}

// revokeWithoutServer: where the authorization server offers no
// revocation, dave's token stays good there after RevokeAuthorization;
// the service must not send it again from any replica, including the one
// that held his connection and had just read his token.
func (o *oauthCluster) revokeWithoutServer(t *testing.T) {
	st, err := o.client(t, "c").StartAuthorization(ctxFor(t, 15*time.Second), &connectorv1.StartAuthorizationRequest{
		WorkspaceId: "acme", ConnectorId: "norev", UserId: "dave"})
	if err != nil {
		t.Fatalf("StartAuthorization of norev for dave through c: %v", err)
	}
	if ans, _ := o.browse(t, o.norev, st.GetAuthorizationUrl(), "dave", "b"); ans.status != http.StatusOK {
		t.Fatalf("dave's callback through b: %d %q, want 200", ans.status, ans.body)
	}
	for _, on := range []string{"a", "b", "c"} {
		o.wantUser(t, on, "norev", "dave")
	}
	rv, err := o.client(t, "b").RevokeAuthorization(ctxFor(t, 15*time.Second),
		&connectorv1.RevokeAuthorizationRequest{WorkspaceId: "acme", ConnectorId: "norev", UserId: "dave"})
	if err != nil || rv.GetRevokedAtServer() {
		t.Fatalf("RevokeAuthorization of dave through b = %v, %v; want deleted here, not revoked at the server (it cannot)", rv, err)
	}
	for _, on := range []string{"a", "c", "b"} {
		o.wantAuthorization(t, on, "norev", "dave", oauth.ReasonNoToken)
	}
}

// refreshAcrossReplicas: alice calls connector fast, whose tokens live
// fastAnnounced, through a and b at once for several lifetimes, while
// connector fastcc (client credentials, on the same authorization server)
// is called through all three. Alice's calls run on her one connection
// wherever it is held; fastcc's run on every replica's own connection, all
// on one stored token. No call fails, and each token was renewed once per
// half lifetime (when the service renews) in all: not once per replica.
func (o *oauthCluster) refreshAcrossReplicas(t *testing.T) {
	st, err := o.client(t, "c").StartAuthorization(ctxFor(t, 15*time.Second), &connectorv1.StartAuthorizationRequest{
		WorkspaceId: "acme", ConnectorId: "fast", UserId: "alice"})
	if err != nil {
		t.Fatalf("StartAuthorization of fast for alice through c: %v", err)
	}
	start := time.Now() // her first token is from just after
	if ans, _ := o.browse(t, o.fast, st.GetAuthorizationUrl(), "alice", "a"); ans.status != http.StatusOK {
		t.Fatalf("alice's callback through a: %d %q, want 200 (no return_to)", ans.status, ans.body)
	}
	before := o.fast.Counts()
	const lifetimes = 3
	stop := start.Add(lifetimes * fastAnnounced)
	var calls atomic.Int64
	var mu sync.Mutex
	var failures []string
	var wg sync.WaitGroup
	for _, w := range []struct{ on, connector, user, want string }{
		{"a", "fast", "alice", "user=alice "}, {"b", "fast", "alice", "user=alice "},
		{"a", "fastcc", "", "user=fast-svc "}, {"b", "fastcc", "", "user=fast-svc "}, {"c", "fastcc", "", "user=fast-svc "},
	} {
		client := o.client(t, w.on)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
				resp, err := client.CallTool(ctx, &connectorv1.CallToolRequest{WorkspaceId: "acme", ConnectorId: w.connector,
					ToolName: "whoami", UserId: w.user})
				cancel()
				calls.Add(1)
				if got := text(resp); err != nil || resp.GetIsError() || !strings.HasPrefix(got, w.want) {
					mu.Lock()
					failures = append(failures, fmt.Sprintf("%s through %s at +%v: %q, %v", w.connector, w.on,
						time.Since(start).Round(time.Millisecond), got, err))
					mu.Unlock()
				}
				time.Sleep(20 * time.Millisecond) // a user's pace, not a flood
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	after := o.fast.Counts()
	refreshes, grants := after.Refreshes-before.Refreshes, after.ClientCredentials-before.ClientCredentials
	// A token is renewed once half its life is gone: at most once per half
	// lifetime, whatever number of replicas use it.
	most := int64(elapsed/(fastAnnounced/2)) + 1
	t.Logf("%d calls over %v: %d refreshes of alice's tokens, %d client credentials grants (at most %d each), %d failed",
		calls.Load(), elapsed.Round(time.Millisecond), refreshes, grants, most, len(failures))
	if len(failures) > 0 {
		t.Errorf("%d of %d calls failed while the tokens were renewed, want 0; first: %s", len(failures), calls.Load(),
			strings.Join(failures[:min(5, len(failures))], "; "))
	}
	for _, n := range []struct {
		what string
		n    int64
	}{{"refreshes of alice's tokens", refreshes}, {"client credentials grants", grants}} {
		if n.n < lifetimes-1 || n.n > most {
			t.Errorf("%d %s over %v with tokens valid %v, want %d to %d: one per half lifetime, not one per replica",
				n.n, n.what, elapsed.Round(time.Millisecond), fastAnnounced, lifetimes-1, most)
		}
	}
	if n := after.TokenErrors - before.TokenErrors; n != 0 {
		t.Errorf("the authorization server refused %d token requests, want 0 (no refresh token spent twice)", n)
	}
	if after.Registrations != 1 {
		t.Errorf("fast's authorization server registered %d clients, want 1", after.Registrations)
	}
}

// pausedQuery: carol's query through a waits for her authorization; she
// authorizes through c and the run resumes through b, as her.
func (o *oauthCluster) pausedQuery(t *testing.T) {
	resp, err := o.client(t, "a").QueryConnector(ctxFor(t, 30*time.Second), &connectorv1.QueryConnectorRequest{
		WorkspaceId: "acme", ConnectorId: "p", Query: "who am I?", UserId: "carol"})
	if err != nil {
		t.Fatalf("QueryConnector as carol through a: %v", err)
	}
	paused := resp.GetResult()
	ar := paused.GetAuthorization()
	if paused.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_AWAITING_AUTHORIZATION || ar.GetAuthorizationUrl() == "" ||
		ar.GetUserId() != "carol" || ar.GetRunId() != paused.GetRunId() {
		t.Fatalf("carol's query = %v, want AWAITING_AUTHORIZATION with her authorization_url", paused)
	}
	if ans, _ := o.browse(t, o.as, ar.GetAuthorizationUrl(), "carol", "c"); ans.status != http.StatusOK {
		t.Fatalf("carol's callback through c: %d %q, want 200", ans.status, ans.body)
	}
	o.model.Then(llmtest.CallTools(llmtest.Call{Tool: "whoami", Args: `{}`}), llmtest.Answer("You are carol."))
	done, err := o.client(t, "b").ResumeQuery(ctxFor(t, 30*time.Second), &connectorv1.ResumeQueryRequest{
		WorkspaceId: "acme", RunId: paused.GetRunId()})
	if err != nil {
		t.Fatalf("ResumeQuery of carol's run through b: %v", err)
	}
	r := done.GetResult()
	if r.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_COMPLETED || r.GetRunId() != paused.GetRunId() ||
		r.GetAnswer() != "You are carol." || len(r.GetSteps()) == 0 || len(r.GetSteps()[0].GetCalls()) == 0 ||
		!strings.HasPrefix(r.GetSteps()[0].GetCalls()[0].GetResultExcerpt(), "user=carol ") {
		t.Fatalf("carol's run resumed through b = %v, want COMPLETED with whoami run as carol", r)
	}
}

// canaries: no token, code or state the browsers carried, and no client
// secret, is in any replica's output or anywhere in the database.
func (o *oauthCluster) canaries(t *testing.T) {
	o.mu.Lock()
	secrets := append([]string{ccSecretCanary}, o.states...)
	o.mu.Unlock()
	found := func(where, s string) {
		t.Helper()
		for _, p := range fositeTokenPrefixes {
			if strings.Contains(s, p) {
				t.Errorf("%s contains a token or code of the authorization server (%s...)", where, p)
			}
		}
		for i, sec := range secrets {
			if strings.Contains(s, sec) {
				what := "the client credentials connector's client secret"
				if i > 0 {
					what = "a state parameter"
				}
				t.Errorf("%s contains %s", where, what)
			}
		}
	}
	outs := o.c.outputs()
	if len(outs) < 6 {
		t.Errorf("the output of %d replica processes, want 6 (three, restarted once)", len(outs))
	}
	for id, out := range outs {
		found("replica "+id+"'s output", out)
	}
	dump := pgDump(t, o.c.url)
	if !strings.Contains(dump, "COPY public.oauth_tokens") || !strings.Contains(dump, "\tbob\t") || !strings.Contains(dump, "svc-client") {
		t.Fatalf("the dump of %d bytes has no oauth_tokens row of bob's or no client credentials connector: not the cluster's database?", len(dump))
	}
	found("the database (pg_dump)", dump)
}

// pgDump dumps the database at url, schema and data.
func pgDump(t *testing.T, url string) string {
	t.Helper()
	bin, err := exec.LookPath("pg_dump")
	if err != nil {
		found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_dump")
		if len(found) == 0 {
			loudskip.Skip(t, "pg_dump is neither on PATH nor in /usr/lib/postgresql/*/bin: the database cannot be searched for secrets")
		}
		slices.Sort(found)
		bin = found[len(found)-1]
	}
	var out, stderr bytes.Buffer
	cmd := exec.CommandContext(ctxFor(t, 60*time.Second), bin, "--no-owner", "--dbname="+url)
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("%s: %v: %s", bin, err, stderr.String())
		}
		t.Fatalf("%s: %v", bin, err)
	}
	return out.String()
}
