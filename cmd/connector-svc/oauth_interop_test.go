package main

import (
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

// TestOAuthInteropTypeScriptSDK runs the service's OAuth client against
// the reference TypeScript SDK's example MCP server and its demo
// authorization server, the whole way through the service as deployed
// (the callback on its own listener): the connector-level probe, a call
// that asks for the user's authorization, the user's browser through the
// authorization server and back to the callback (dynamic registration,
// PKCE, resource), calls with each user's own token, a query that waits
// for its user's authorization, the listing, a revocation and the
// connector's deletion. With --oauth-strict the server accepts only
// tokens issued for its own URL, which proves the service asks for the
// right resource (RFC 8707).
func TestOAuthInteropTypeScriptSDK(t *testing.T) {
	for _, tc := range []struct {
		name   string
		strict bool
	}{{"oauth", false}, {"oauth-strict", true}} {
		t.Run(tc.name, func(t *testing.T) { oauthInterop(t, tc.strict) })
	}
}

func oauthInterop(t *testing.T, strict bool) {
	ts := startTSOAuthServer(t, strict)
	model := llmtest.New(t,
		llmtest.CallTools(llmtest.Call{Tool: "greet", Args: `{"name":"dave"}`}),
		llmtest.Answer("The server greeted dave."))
	_, cbPort, _ := net.SplitHostPort(freeAddr(t))
	redirectURL := "http://localhost:" + cbPort + "/oauth/callback"
	const returnTo = "https://chat.example.test/authorized"
	dbURL := storetest.NewURL(t)
	svc := start(t, dbURL, map[string]string{
		"SECRET_KEY": testKey, "HEALTH_INTERVAL": "1s",
		"OAUTH_REDIRECT_URL": redirectURL, "OAUTH_CALLBACK_ADDR": "127.0.0.1:" + cbPort,
		"OAUTH_RETURN_TO_ALLOWED": "https://chat.example.test/",
		"LLM_BASE_URL":            model.URL(), "LLM_MODEL": "fake-model", "LLM_API_KEY": distinctive,
	})
	client := connectorv1.NewConnectorServiceClient(dial(t, svc.addr))
	began := time.Now()

	// 1. The connector: READY once its unauthenticated probe meets the
	// server's 401 Bearer challenge.
	_, err := client.CreateConnector(testCtx(t), &connectorv1.CreateConnectorRequest{WorkspaceId: "acme",
		Connector: &connectorv1.Connector{ConnectorId: "ts-demo", Name: "TypeScript demo", ApprovalPolicy: noApproval,
			Transport:  connectorv1.Transport_TRANSPORT_STREAMABLE_HTTP,
			Connection: &connectorv1.Connector_Http{Http: &connectorv1.HttpConfig{Url: ts.MCPURL}},
			Auth:       &connectorv1.AuthConfig{Mode: connectorv1.AuthMode_AUTH_MODE_OAUTH_USER}}})
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, client, "ts-demo", connectorv1.ConnectorState_CONNECTOR_STATE_READY)

	greet := func(user string) (string, error) {
		t.Helper()
		args, _ := structpb.NewStruct(map[string]any{"name": user})
		resp, err := client.CallTool(testCtx(t), &connectorv1.CallToolRequest{WorkspaceId: "acme", ConnectorId: "ts-demo",
			ToolName: "greet", Arguments: args, UserId: user})
		if err != nil {
			return "", err
		}
		if len(resp.GetContent()) != 1 || resp.GetIsError() {
			t.Fatalf("%s's greet = %v", user, resp)
		}
		return resp.GetContent()[0].GetText().GetText(), nil
	}
	var authCodes []string // authorization codes, which must never show in the service's output

	// 2. Alice has not authorized: her call says where to.
	_, err = greet("alice")
	ar := needsAuthorization(t, err, "alice", ts.Issuer)
	if ar.GetReason() != "NO_TOKEN" || !slices.Equal(ar.GetScopes(), []string{"mcp:tools"}) || ar.GetConnectorId() != "ts-demo" ||
		ar.GetRunId() != "" || !ar.GetExpireTime().AsTime().After(time.Now()) {
		t.Fatalf("alice's AuthorizationRequired = %v", ar)
	}
	u, _ := url.Parse(ar.GetAuthorizationUrl())
	q := u.Query()
	for k, want := range map[string]string{"response_type": "code", "redirect_uri": redirectURL, "code_challenge_method": "S256",
		"resource": ts.MCPURL, "scope": "mcp:tools"} {
		if q.Get(k) != want {
			t.Errorf("the authorization URL's %s = %q, want %q", k, q.Get(k), want)
		}
	}
	if q.Get("client_id") == "" || len(q.Get("code_challenge")) != 43 || len(q.Get("state")) < 32 {
		t.Errorf("the authorization URL has client_id %t, a code_challenge of %d characters and a state of %d, "+
			"want a registered client_id, an S256 challenge (43) and a long random state",
			q.Has("client_id"), len(q.Get("code_challenge")), len(q.Get("state")))
	}

	// 3. Alice's browser: the demo authorization server approves at once
	// and sends her to the callback, which exchanges the code.
	st, loc, body, code := authorizeInBrowser(t, ar.GetAuthorizationUrl(), redirectURL)
	authCodes = append(authCodes, code)
	if st != http.StatusOK || loc != "" || !strings.Contains(body, "Authorized") {
		t.Fatalf("the callback answered %d (Location %q): %q, want 200 Authorized", st, loc, body)
	}
	// The same redirect again: the state was used.
	if st, _, _ := browse(t, redirectURL+"?code="+url.QueryEscape(code)+"&state="+url.QueryEscape(q.Get("state"))); st != http.StatusBadRequest {
		t.Errorf("the callback replayed: %d, want 400", st)
	}

	// 4. Alice's calls work with her token; bob still needs his own.
	for range 2 {
		if got, err := greet("alice"); err != nil || got != "Hello, alice!" {
			t.Fatalf("alice's greet after authorizing = %q, %v", got, err)
		}
	}
	list := func() []*connectorv1.Authorization {
		t.Helper()
		resp, err := client.ListAuthorizations(testCtx(t), &connectorv1.ListAuthorizationsRequest{WorkspaceId: "acme", ConnectorId: "ts-demo"})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetAuthorizations()
	}
	auths := list()
	if len(auths) != 1 {
		t.Fatalf("ListAuthorizations = %v, want alice's only", auths)
	}
	a := auths[0]
	// The demo server's tokens last an hour and come without a refresh token.
	if exp := a.GetExpireTime().AsTime(); a.GetUserId() != "alice" || !slices.Equal(a.GetScopes(), []string{"mcp:tools"}) ||
		a.GetIssuer() != ts.Issuer || a.GetRefreshable() || exp.Before(began.Add(59*time.Minute)) || exp.After(time.Now().Add(61*time.Minute)) {
		t.Errorf("alice's authorization = %v, want scopes [mcp:tools], issuer %s, not refreshable, expiring in an hour", a, ts.Issuer)
	}
	_, err = greet("bob")
	needsAuthorization(t, err, "bob", ts.Issuer)

	// Bob authorizes through StartAuthorization, with a return_to: the
	// callback sends his browser there.
	sa, err := client.StartAuthorization(testCtx(t), &connectorv1.StartAuthorizationRequest{WorkspaceId: "acme", ConnectorId: "ts-demo",
		UserId: "bob", ReturnTo: returnTo})
	if err != nil {
		t.Fatal(err)
	}
	st, loc, _, code = authorizeInBrowser(t, sa.GetAuthorizationUrl(), redirectURL)
	authCodes = append(authCodes, code)
	if st != http.StatusSeeOther || loc != returnTo {
		t.Fatalf("bob's callback answered %d to %q, want 303 to %s", st, loc, returnTo)
	}
	for _, user := range []string{"bob", "alice"} {
		if got, err := greet(user); err != nil || got != "Hello, "+user+"!" {
			t.Fatalf("%s's greet = %q, %v", user, got, err)
		}
	}
	// The connector's catalog is what its users' connections listed.
	tools, err := client.ListTools(testCtx(t), &connectorv1.ListToolsRequest{WorkspaceId: "acme", ConnectorId: "ts-demo"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tools.GetTools() {
		names = append(names, tool.GetName())
	}
	if !slices.Contains(names, "greet") || !slices.Contains(names, "multi-greet") {
		t.Errorf("the connector's tools: %v, want the example's greet and multi-greet among them", names)
	}

	// 7. Dave's query waits for his authorization, then goes on as him.
	qr, err := client.QueryConnector(testCtx(t), &connectorv1.QueryConnectorRequest{WorkspaceId: "acme", ConnectorId: "ts-demo",
		Query: "Greet me.", UserId: "dave"})
	if err != nil {
		t.Fatal(err)
	}
	paused := qr.GetResult()
	need := paused.GetAuthorization()
	if paused.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_AWAITING_AUTHORIZATION || need.GetUserId() != "dave" ||
		need.GetRunId() != paused.GetRunId() || !strings.HasPrefix(need.GetAuthorizationUrl(), ts.Issuer+"authorize?") {
		t.Fatalf("dave's query = %v, want AWAITING_AUTHORIZATION with his authorization URL", paused)
	}
	_, err = client.ResumeQuery(testCtx(t), &connectorv1.ResumeQueryRequest{WorkspaceId: "acme", RunId: paused.GetRunId()})
	if status.Code(err) != codes.FailedPrecondition || reasonOf(err) != "AUTHORIZATION_REQUIRED" {
		t.Errorf("ResumeQuery before dave authorized: %v, want FAILED_PRECONDITION AUTHORIZATION_REQUIRED", err)
	}
	st, _, _, code = authorizeInBrowser(t, need.GetAuthorizationUrl(), redirectURL)
	authCodes = append(authCodes, code)
	if st != http.StatusOK {
		t.Fatalf("dave's callback answered %d", st)
	}
	resumed, err := client.ResumeQuery(testCtx(t), &connectorv1.ResumeQueryRequest{WorkspaceId: "acme", RunId: paused.GetRunId()})
	if err != nil {
		t.Fatal(err)
	}
	if r := resumed.GetResult(); r.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_COMPLETED || r.GetAnswer() != "The server greeted dave." ||
		r.GetSteps()[0].GetCalls()[0].GetResultExcerpt() != "Hello, dave!" {
		t.Fatalf("dave's resumed query = %v", r)
	}
	if n := len(model.Requests()); n != 2 {
		t.Errorf("the fake LLM got %d requests, want the 2 of its script", n)
	}

	// 5. Revoking alice: the demo server offers no revocation endpoint, so
	// the tokens are deleted here only; she must authorize again, and bob
	// goes on.
	rv, err := client.RevokeAuthorization(testCtx(t), &connectorv1.RevokeAuthorizationRequest{WorkspaceId: "acme", ConnectorId: "ts-demo", UserId: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if rv.GetRevokedAtServer() {
		t.Error("RevokeAuthorization says the server revoked alice's token; the demo server has no revocation endpoint")
	}
	// Her connection closed while her token was still good: the server
	// hears her session end (the DELETE goes out in the background).
	ended := func() int { return strings.Count(ts.Log(), "Received session termination request") }
	for deadline := time.Now().Add(5 * time.Second); ended() == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if n, failed := ended(), strings.Contains(svc.out.String(), "failed to send close request"); n != 1 || failed {
		t.Errorf("the server heard %d MCP sessions end, want alice's (the service logged a failed close: %t)", n, failed)
	}
	_, err = greet("alice")
	if ar := needsAuthorization(t, err, "alice", ts.Issuer); ar.GetReason() != "NO_TOKEN" {
		t.Errorf("alice's call after the revocation: reason %q, want NO_TOKEN", ar.GetReason())
	}
	if got, err := greet("bob"); err != nil || got != "Hello, bob!" {
		t.Fatalf("bob's greet after alice's revocation = %q, %v", got, err)
	}
	_, err = client.RevokeAuthorization(testCtx(t), &connectorv1.RevokeAuthorizationRequest{WorkspaceId: "acme", ConnectorId: "ts-demo", UserId: "alice"})
	if status.Code(err) != codes.NotFound {
		t.Errorf("revoking alice twice: %v, want NOT_FOUND", err)
	}
	var users []string
	for _, a := range list() {
		users = append(users, a.GetUserId())
	}
	if !slices.Equal(users, []string{"bob", "dave"}) {
		t.Errorf("ListAuthorizations after alice's revocation: %v, want bob and dave", users)
	}

	// One dynamic registration with the demo server served every user.
	db, err := pgx.Connect(testCtx(t), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(testCtx(t))
	var regs int
	var issuer, method string
	if err := db.QueryRow(testCtx(t), `SELECT count(*), min(issuer), min(token_endpoint_auth_method) FROM oauth_clients`).Scan(&regs, &issuer, &method); err != nil {
		t.Fatal(err)
	}
	if regs != 1 || issuer != ts.Issuer || method != "none" {
		t.Errorf("registrations: %d, at %q, auth method %q; want 1 at %s as a public client (none)", regs, issuer, method, ts.Issuer)
	}

	// Deleting the connector deletes its users' tokens.
	if _, err := client.DeleteConnector(testCtx(t), &connectorv1.DeleteConnectorRequest{WorkspaceId: "acme", ConnectorId: "ts-demo"}); err != nil {
		t.Fatal(err)
	}
	resp, err := client.ListAuthorizations(testCtx(t), &connectorv1.ListAuthorizationsRequest{WorkspaceId: "acme"})
	if err != nil || len(resp.GetAuthorizations()) != 0 {
		t.Errorf("ListAuthorizations after the connector's deletion: %v, %v; want none", resp.GetAuthorizations(), err)
	}

	// The server saw three users' tokens, and neither they nor the codes
	// ever showed in the service's output.
	if err := svc.stop(); err != nil {
		t.Fatal(err)
	}
	tokens := ts.bearerTokens()
	slices.Sort(tokens)
	if tokens = slices.Compact(tokens); len(tokens) != 3 {
		t.Errorf("the MCP server accepted %d distinct tokens, want alice's, bob's and dave's", len(tokens))
	}
	out := svc.out.String()
	for _, s := range append(append(tokens, authCodes...), distinctive) {
		if strings.Contains(out, s) {
			t.Errorf("the service's output holds a token, code or key (%d characters)", len(s))
		}
	}
	for _, bad := range []string{"Invalid resource", "Token was not issued for this resource", "Invalid or expired token"} {
		if strings.Contains(ts.Log(), bad) {
			t.Errorf("the TypeScript server logged %q", bad)
		}
	}
}

// waitState waits until a connector of workspace acme reaches state.
func waitState(t *testing.T, client connectorv1.ConnectorServiceClient, id string, state connectorv1.ConnectorState) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := client.GetConnector(testCtx(t), &connectorv1.GetConnectorRequest{WorkspaceId: "acme", ConnectorId: id})
		if err != nil {
			t.Fatal(err)
		}
		h := got.GetConnector().GetHealth()
		if h.GetState() == state {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("connector %s is %v (%q) after 20s, want %v", id, h.GetState(), h.GetLastError(), state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
