package server_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/oauth"
	"github.com/connector-svc/connector-svc/internal/oauthtest"
	"github.com/connector-svc/connector-svc/internal/server"
)

// authorizeAs plays user's browser at authURL on the authorization server
// and hands the redirect it gets to CompleteAuthorization, as a chat
// backend receiving the redirect does.
func (f *fixture) authorizeAs(t *testing.T, as *oauthtest.Server, authURL, user string) *connectorv1.CompleteAuthorizationResponse {
	t.Helper()
	redirect, err := as.Authorize(ctx(t), authURL, user)
	if err != nil {
		t.Fatalf("authorize as %s: %v", user, err)
	}
	q := redirect.Query()
	resp, err := f.client.CompleteAuthorization(ctx(t), &connectorv1.CompleteAuthorizationRequest{
		State: q.Get("state"), Code: q.Get("code"), Iss: q.Get("iss"), Error: q.Get("error")})
	if err != nil {
		t.Fatalf("CompleteAuthorization for %s: %v", user, err)
	}
	return resp
}

func (f *fixture) callAs(t *testing.T, connector, tool, user string) (string, error) {
	t.Helper()
	resp, err := f.client.CallTool(ctx(t), &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: connector,
		ToolName: tool, UserId: user})
	if err != nil {
		return "", err
	}
	return resp.GetContent()[0].GetText().GetText(), nil
}

// The whole way through the service, against a real authorization server
// and the MCP server it guards: two users with their own tokens, the
// authorization a call asks for, a step-up, a query that waits for its
// user's authorization, a revocation, and a client credentials connector.
func TestOAuthEndToEnd(t *testing.T) {
	as := oauthtest.Start(t, oauthtest.Options{})
	model := llmtest.New(t)
	f := setup(t, options{realOAuth: true, llmURL: model.URL()})
	f.create(t, "ws", mcpConnector("p", as.MCPURL))
	if _, err := update(f, t, &connectorv1.Connector{ConnectorId: "p",
		Auth: &connectorv1.AuthConfig{Mode: connectorv1.AuthMode_AUTH_MODE_OAUTH_USER}}, "auth"); err != nil {
		t.Fatal(err)
	}
	f.waitReachable(t, "ws", "p")

	// Alice authorizes first, through StartAuthorization.
	st, err := f.client.StartAuthorization(ctx(t), &connectorv1.StartAuthorizationRequest{WorkspaceId: "ws", ConnectorId: "p",
		UserId: "alice", ReturnTo: "https://chat.test/done"})
	if err != nil {
		t.Fatal(err)
	}
	if done := f.authorizeAs(t, as, st.GetAuthorizationUrl(), "alice"); done.GetReturnTo() != "https://chat.test/done" ||
		done.GetAuthorization().GetUserId() != "alice" || !done.GetAuthorization().GetRefreshable() {
		t.Fatalf("alice's authorization = %v", done)
	}
	if who, err := f.callAs(t, "p", "whoami", "alice"); err != nil || !strings.HasPrefix(who, "user=alice ") {
		t.Fatalf("alice's whoami = %q, %v", who, err)
	}

	// Bob has not: his call says where to authorize.
	_, err = f.callAs(t, "p", "whoami", "bob")
	ar := authorizationRequired(t, err)
	if ar.GetUserId() != "bob" || ar.GetReason() != oauth.ReasonNoToken || !strings.HasPrefix(ar.GetAuthorizationUrl(), as.Issuer) {
		t.Fatalf("bob's AuthorizationRequired = %v", ar)
	}
	f.authorizeAs(t, as, ar.GetAuthorizationUrl(), "bob")
	for _, user := range []string{"bob", "alice", "bob"} {
		if who, err := f.callAs(t, "p", "whoami", user); err != nil || !strings.HasPrefix(who, "user="+user+" ") {
			t.Fatalf("%s's whoami = %q, %v", user, who, err)
		}
	}
	_, err = f.callAs(t, "p", "whoami", "")
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "user_id")

	// A tool that needs more scopes: a step-up for the union.
	_, err = f.callAs(t, "p", "admin_action", "alice")
	up := authorizationRequired(t, err)
	if up.GetReason() != oauth.ReasonInsufficientScope || !slices.Contains(up.GetScopes(), oauthtest.AdminScope) {
		t.Fatalf("step-up = %v", up)
	}
	f.authorizeAs(t, as, up.GetAuthorizationUrl(), "alice")
	if got, err := f.callAs(t, "p", "admin_action", "alice"); err != nil || got != "admin done for alice" {
		t.Fatalf("admin_action after the step-up = %q, %v", got, err)
	}

	// Carol's query waits for her authorization, then goes on as her.
	resp, err := f.client.QueryConnector(ctx(t), &connectorv1.QueryConnectorRequest{WorkspaceId: "ws", ConnectorId: "p",
		Query: "who am I?", UserId: "carol"})
	if err != nil {
		t.Fatal(err)
	}
	paused := resp.GetResult()
	if paused.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_AWAITING_AUTHORIZATION || paused.GetAuthorization().GetAuthorizationUrl() == "" {
		t.Fatalf("carol's query = %v", paused)
	}
	urlExpiry(t, paused.GetAuthorization().GetExpireTime().AsTime(), oauth.DefaultStateTTL)
	f.authorizeAs(t, as, paused.GetAuthorization().GetAuthorizationUrl(), "carol")
	model.Then(llmtest.CallTools(llmtest.Call{Tool: "whoami", Args: `{}`}), llmtest.Answer("You are carol."))
	resumed, err := f.client.ResumeQuery(ctx(t), &connectorv1.ResumeQueryRequest{WorkspaceId: "ws", RunId: paused.GetRunId()})
	if err != nil {
		t.Fatal(err)
	}
	if r := resumed.GetResult(); r.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_COMPLETED || r.GetRunId() != paused.GetRunId() ||
		!strings.HasPrefix(r.GetSteps()[0].GetCalls()[0].GetResultExcerpt(), "user=carol ") {
		t.Fatalf("carol's resumed query = %v", r)
	}

	// Dave's query meets a tool that needs more scopes: the run pauses at
	// that call, and runs it again once he has granted them.
	st, err = f.client.StartAuthorization(ctx(t), &connectorv1.StartAuthorizationRequest{WorkspaceId: "ws", ConnectorId: "p", UserId: "dave"})
	if err != nil {
		t.Fatal(err)
	}
	f.authorizeAs(t, as, st.GetAuthorizationUrl(), "dave")
	model.Then(llmtest.CallTools(llmtest.Call{Tool: "admin_action", Args: `{}`}), llmtest.Answer("Done, dave."))
	resp, err = f.client.QueryConnector(ctx(t), &connectorv1.QueryConnectorRequest{WorkspaceId: "ws", ConnectorId: "p",
		Query: "do the admin thing", UserId: "dave"})
	if err != nil {
		t.Fatal(err)
	}
	mid := resp.GetResult()
	if mid.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_AWAITING_AUTHORIZATION ||
		mid.GetAuthorization().GetReason() != oauth.ReasonInsufficientScope ||
		!slices.Contains(mid.GetAuthorization().GetScopes(), oauthtest.AdminScope) || len(mid.GetSteps()) != 1 ||
		!mid.GetSteps()[0].GetCalls()[0].GetPending() {
		t.Fatalf("dave's query = %v", mid)
	}
	urlExpiry(t, mid.GetAuthorization().GetExpireTime().AsTime(), oauth.DefaultStateTTL)
	if !mid.GetExpireTime().AsTime().After(mid.GetAuthorization().GetExpireTime().AsTime().Add(time.Hour)) {
		t.Errorf("dave's run expires at %v, not after its URL (%v)", mid.GetExpireTime().AsTime(), mid.GetAuthorization().GetExpireTime().AsTime())
	}
	run, err := f.client.GetQueryRun(ctx(t), &connectorv1.GetQueryRunRequest{WorkspaceId: "ws", RunId: mid.GetRunId()})
	if err != nil || run.GetRun().GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_AWAITING_AUTHORIZATION ||
		run.GetRun().GetResult().GetAuthorization().GetReason() != oauth.ReasonInsufficientScope {
		t.Fatalf("GetQueryRun of dave's paused run = %v, %v", run, err)
	}
	f.authorizeAs(t, as, mid.GetAuthorization().GetAuthorizationUrl(), "dave")
	resumed, err = f.client.ResumeQuery(ctx(t), &connectorv1.ResumeQueryRequest{WorkspaceId: "ws", RunId: mid.GetRunId()})
	if err != nil {
		t.Fatal(err)
	}
	if r := resumed.GetResult(); r.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_COMPLETED || r.GetAnswer() != "Done, dave." ||
		r.GetSteps()[0].GetCalls()[0].GetResultExcerpt() != "admin done for dave" || !slices.Equal(r.GetToolsUsed(), []string{"admin_action"}) {
		t.Fatalf("dave's resumed query = %v", r)
	}

	// Listed, without tokens; revoked, then the next call must authorize.
	list, err := f.client.ListAuthorizations(ctx(t), &connectorv1.ListAuthorizationsRequest{WorkspaceId: "ws", ConnectorId: "p"})
	if err != nil || len(list.GetAuthorizations()) != 4 {
		t.Fatalf("ListAuthorizations = %v, %v", list, err)
	}
	rv, err := f.client.RevokeAuthorization(ctx(t), &connectorv1.RevokeAuthorizationRequest{WorkspaceId: "ws", ConnectorId: "p", UserId: "bob"})
	if err != nil || !rv.GetRevokedAtServer() {
		t.Fatalf("RevokeAuthorization = %v, %v", rv, err)
	}
	_, err = f.callAs(t, "p", "whoami", "bob")
	if ar := authorizationRequired(t, err); ar.GetReason() != oauth.ReasonNoToken {
		t.Errorf("bob after revocation: %v", ar)
	}
	if who, err := f.callAs(t, "p", "whoami", "alice"); err != nil || !strings.HasPrefix(who, "user=alice ") {
		t.Errorf("alice after bob's revocation = %q, %v", who, err)
	}

	// A client credentials connector calls as its client.
	const clientSecret = "cc-secret-canary-51d2e8"
	as.RegisterClient("svc-client", clientSecret)
	cc := mcpConnector("cc", as.MCPURL)
	cc.Auth = &connectorv1.AuthConfig{Mode: connectorv1.AuthMode_AUTH_MODE_OAUTH_CLIENT_CREDENTIALS, ClientId: "svc-client",
		ClientSecret: clientSecret}
	f.create(t, "ws", cc)
	f.waitReady(t, "ws", "cc")
	if who, err := f.callAs(t, "cc", "whoami", ""); err != nil || !strings.HasPrefix(who, "user=svc-client ") {
		t.Fatalf("client credentials whoami = %q, %v", who, err)
	}

	// Nothing secret in any response or log line.
	got, _ := f.client.ListConnectors(ctx(t), &connectorv1.ListConnectorsRequest{WorkspaceId: "ws"})
	b, _ := protojson.Marshal(got)
	b2, _ := protojson.Marshal(list)
	for _, s := range []string{string(b), string(b2), f.logs.String()} {
		if strings.Contains(s, clientSecret) {
			t.Error("the client secret leaked into a response or a log line")
		}
	}
	// Deleting the connector revokes its users' tokens at the server.
	before := as.Counts().Revocations
	if _, err := f.client.DeleteConnector(ctx(t), &connectorv1.DeleteConnectorRequest{WorkspaceId: "ws", ConnectorId: "p"}); err != nil {
		t.Fatal(err)
	}
	if after := as.Counts().Revocations; after <= before {
		t.Errorf("revocations at the server: %d before the deletion, %d after", before, after)
	}
}
