package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/oauth"
	"github.com/connector-svc/connector-svc/internal/server"
)

// fakeOAuth stands in for the oauth.Manager: it grants a token to a user
// when an authorization it started completes, and puts that user's token
// ("tok-<user>:<scopes>") on their connection's requests; a user without
// one gets a RequiredError, and a 403 insufficient_scope challenge one for
// more scopes, as the manager's transport does.
type fakeOAuth struct {
	mu            sync.Mutex
	grants        map[int64]map[string][]string // connector -> user -> scopes
	states        map[string]fakeState
	n             int
	starts        []fakeState
	revokeAll     atomic.Int64
	failRevokeAll bool
	forgets       []string // "<connector>/<user>" of each Forget
}

type fakeState struct {
	connector oauth.Connector
	user      string
	returnTo  string
	scopes    []string
}

func newFakeOAuth() *fakeOAuth {
	return &fakeOAuth{grants: map[int64]map[string][]string{}, states: map[string]fakeState{}}
}

func (f *fakeOAuth) grant(connector int64, user string, scopes ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.grants[connector] == nil {
		f.grants[connector] = map[string][]string{}
	}
	f.grants[connector][user] = scopes
}

func (f *fakeOAuth) Start(_ context.Context, c oauth.Connector, user, returnTo string, extra []string) (*oauth.Started, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	scopes := slices.Clone(c.Scopes)
	scopes = append(scopes, f.grants[c.ID][user]...)
	scopes = append(scopes, extra...)
	slices.Sort(scopes)
	scopes = slices.Compact(scopes)
	f.n++
	state := fmt.Sprintf("state-%d", f.n)
	st := fakeState{connector: c, user: user, returnTo: returnTo, scopes: scopes}
	f.states[state] = st
	f.starts = append(f.starts, st)
	return &oauth.Started{URL: "https://as.test/authorize?state=" + state + "&scope=" + url.QueryEscape(strings.Join(scopes, " ")),
		Scopes: scopes, ExpiresAt: time.Now().Add(10 * time.Minute)}, nil
}

func (f *fakeOAuth) PendingWorkspace(_ context.Context, state string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, ok := f.states[state]
	if !ok {
		return "", oauth.ErrStateInvalid
	}
	return st.connector.WorkspaceID, nil
}

func (f *fakeOAuth) Forget(connectorID int64, user string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.forgets = append(f.forgets, fmt.Sprintf("%d/%s", connectorID, user))
}

// forgotten returns the Forget calls so far.
func (f *fakeOAuth) forgotten() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.forgets)
}

func (f *fakeOAuth) Complete(_ context.Context, state, code, iss, errParam string) (*oauth.Completed, error) {
	f.mu.Lock()
	st, ok := f.states[state]
	delete(f.states, state)
	f.mu.Unlock()
	if !ok {
		return nil, oauth.ErrStateInvalid
	}
	if errParam != "" {
		return &oauth.Completed{ReturnTo: st.returnTo}, &oauth.AuthServerError{Code: errParam}
	}
	f.grant(st.connector.ID, st.user, st.scopes...)
	return &oauth.Completed{Grant: oauth.Grant{ConnectorID: st.connector.ID, WorkspaceID: st.connector.WorkspaceID,
		ConnectorExternalID: st.connector.ExternalID, UserID: st.user, Scopes: st.scopes, Issuer: "https://as.test",
		CreatedAt: time.Now(), UpdatedAt: time.Now()}, ReturnTo: st.returnTo}, nil
}

func (f *fakeOAuth) Usable(_ context.Context, c oauth.Connector, user string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.grants[c.ID][user]
	return ok, nil
}

func (f *fakeOAuth) ListGrants(_ context.Context, flt server.GrantFilter) ([]oauth.Grant, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []oauth.Grant
	for id, users := range f.grants {
		if flt.ConnectorID != 0 && id != flt.ConnectorID {
			continue
		}
		for user, scopes := range users {
			if flt.UserID != "" && user != flt.UserID {
				continue
			}
			g := oauth.Grant{ConnectorID: id, WorkspaceID: flt.WorkspaceID, ConnectorExternalID: fmt.Sprint("c", id), UserID: user, Scopes: scopes}
			if server.GrantCursor(g) > flt.After {
				out = append(out, g)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return server.GrantCursor(out[i]) < server.GrantCursor(out[j]) })
	if len(out) > flt.Limit {
		out = out[:flt.Limit]
	}
	return out, nil
}

func (f *fakeOAuth) Revoke(_ context.Context, c oauth.Connector, user string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.grants[c.ID][user]; !ok {
		return false, oauth.ErrNoGrant
	}
	delete(f.grants[c.ID], user)
	return true, nil
}

func (f *fakeOAuth) RevokeAll(_ context.Context, c oauth.Connector) error {
	f.revokeAll.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.grants, c.ID)
	if f.failRevokeAll {
		return errors.New("fake: the authorization server is down")
	}
	return nil
}

func (f *fakeOAuth) Transport(base http.RoundTripper, c oauth.Connector, user string) http.RoundTripper {
	return rtFunc(func(req *http.Request) (*http.Response, error) {
		name := user
		if name == "" {
			name = "machine"
		}
		f.mu.Lock()
		scopes, ok := f.grants[c.ID][name]
		f.mu.Unlock()
		if !ok {
			return nil, &oauth.RequiredError{ConnectorID: c.ID, UserID: user, Reason: oauth.ReasonNoToken}
		}
		req = req.Clone(req.Context())
		req.Header.Set("Authorization", "Bearer tok-"+name+":"+strings.Join(scopes, ","))
		resp, err := base.RoundTrip(req)
		if err != nil || resp.StatusCode != http.StatusForbidden {
			return resp, err
		}
		challenge := resp.Header.Get("WWW-Authenticate")
		resp.Body.Close()
		_, want, _ := strings.Cut(challenge, `scope="`)
		want, _, _ = strings.Cut(want, `"`)
		return nil, &oauth.RequiredError{ConnectorID: c.ID, UserID: user, Reason: oauth.ReasonInsufficientScope,
			Scopes: append(slices.Clone(scopes), strings.Fields(want)...)}
	})
}

type rtFunc func(*http.Request) (*http.Response, error)

func (f rtFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// protectedMCP is a real mcp-go streamable-HTTP server that wants a
// Bearer token "tok-<user>:<scopes>": whoami answers its user, and
// admin_action wants the scope "admin" (403 insufficient_scope without).
func protectedMCP(t *testing.T) string { return protectedMCPSeeing(t, nil) }

// protectedMCPSeeing is protectedMCP calling seen, if not nil, with each
// request it gets.
func protectedMCPSeeing(t *testing.T, seen func(*http.Request)) string {
	m := mcpserver.NewMCPServer("protected", "1.0", mcpserver.WithToolCapabilities(true))
	m.AddTool(mcp.NewTool("whoami", mcp.WithDescription("Says whose token the call carries")),
		func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText(ctx.Value(tokenUser{}).(string)), nil
		})
	m.AddTool(mcp.NewTool("admin_action", mcp.WithDescription("Needs the admin scope")),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText("done"), nil
		})
	h := mcpserver.NewStreamableHTTPServer(m, mcpserver.WithHTTPContextFunc(func(ctx context.Context, r *http.Request) context.Context {
		tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer tok-")
		user, _, _ := strings.Cut(tok, ":")
		return context.WithValue(ctx, tokenUser{}, user)
	}))
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if seen != nil {
			seen(r)
		}
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer tok-")
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer resource_metadata="http://`+r.Host+`/.well-known/oauth-protected-resource"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if r.Method == http.MethodPost {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			var msg struct {
				Method string `json:"method"`
				Params struct {
					Name string `json:"name"`
				} `json:"params"`
			}
			_ = json.Unmarshal(body, &msg)
			_, scopes, _ := strings.Cut(tok, ":")
			if msg.Method == "tools/call" && msg.Params.Name == "admin_action" && !slices.Contains(strings.Split(scopes, ","), "admin") {
				w.Header().Set("WWW-Authenticate", `Bearer error="insufficient_scope", scope="admin"`)
				w.WriteHeader(http.StatusForbidden)
				return
			}
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	return hs.URL + "/mcp"
}

type tokenUser struct{}

func oauthUserConnector(id, url string) *connectorv1.Connector {
	c := mcpConnector(id, url)
	c.Auth = &connectorv1.AuthConfig{Mode: connectorv1.AuthMode_AUTH_MODE_OAUTH_USER, Scopes: []string{"read"}}
	return c
}

// waitReachable waits until an oauth_user connector's probe made it READY.
func (f *fixture) waitReachable(t *testing.T, ws, id string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := f.client.GetConnector(ctx(t), &connectorv1.GetConnectorRequest{WorkspaceId: ws, ConnectorId: id})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetConnector().GetHealth().GetState() == connectorv1.ConnectorState_CONNECTOR_STATE_READY {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("connector %s not READY within 20s", id)
}

// authorizationRequired checks that err is FAILED_PRECONDITION with
// reason AUTHORIZATION_REQUIRED and returns its AuthorizationRequired.
func authorizationRequired(t *testing.T, err error) *connectorv1.AuthorizationRequired {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.FailedPrecondition {
		t.Fatalf("code = %v (%s), want FAILED_PRECONDITION", st.Code(), st.Message())
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
	if info == nil || info.GetReason() != server.ReasonAuthorizationRequired || info.GetDomain() != "connector-svc" || ar == nil ||
		info.GetMetadata()["authorization_url"] != ar.GetAuthorizationUrl() || info.GetMetadata()["reason"] != ar.GetReason() ||
		ar.GetAuthorizationUrl() == "" {
		t.Fatalf("details = %v, %v; want ErrorInfo AUTHORIZATION_REQUIRED with the URL and an AuthorizationRequired", info, ar)
	}
	return ar
}

// completeFor completes the authorization whose URL ar has, as the
// chat backend that receives the redirect would.
func (f *fixture) completeFor(t *testing.T, authURL string) *connectorv1.CompleteAuthorizationResponse {
	t.Helper()
	u, err := url.Parse(authURL)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := f.client.CompleteAuthorization(ctx(t), &connectorv1.CompleteAuthorizationRequest{
		State: u.Query().Get("state"), Code: "code", Iss: "https://as.test"})
	if err != nil {
		t.Fatalf("CompleteAuthorization: %v", err)
	}
	return resp
}

func (f *fixture) whoami(t *testing.T, connector, user string) (string, error) {
	t.Helper()
	resp, err := f.client.CallTool(ctx(t), &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: connector,
		ToolName: "whoami", UserId: user})
	if err != nil {
		return "", err
	}
	return resp.GetContent()[0].GetText().GetText(), nil
}

func TestOAuthConnectorSettings(t *testing.T) {
	f := setup(t, options{oauth: newFakeOAuth()})
	cc := mcpConnector("cc", "http://127.0.0.1:9/mcp")
	cc.Auth = &connectorv1.AuthConfig{Mode: connectorv1.AuthMode_AUTH_MODE_OAUTH_CLIENT_CREDENTIALS, ClientId: "svc",
		ClientSecret: distinctive + "-client-secret", Scopes: []string{"read"}}
	got := f.create(t, "ws", cc)
	if a := got.GetAuth(); a.GetMode() != connectorv1.AuthMode_AUTH_MODE_OAUTH_CLIENT_CREDENTIALS || a.GetClientId() != "svc" ||
		!a.GetHasClientSecret() || a.GetClientSecret() != "" || !slices.Equal(a.GetScopes(), []string{"read"}) {
		t.Fatalf("created auth = %v", a)
	}
	// Changing the scopes keeps the secret; clearing the secret is refused
	// for client credentials.
	changed, err := update(f, t, &connectorv1.Connector{ConnectorId: "cc", Auth: &connectorv1.AuthConfig{Scopes: []string{"read", "write"}}}, "auth.scopes")
	if err != nil || !changed.GetAuth().GetHasClientSecret() || len(changed.GetAuth().GetScopes()) != 2 {
		t.Fatalf("update auth.scopes = %v, %v", changed.GetAuth(), err)
	}
	_, err = update(f, t, &connectorv1.Connector{ConnectorId: "cc"}, "auth.client_secret")
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "connector.auth.client_secret")

	for _, tt := range []struct {
		name  string
		edit  func(c *connectorv1.Connector)
		field string
	}{
		{"stdio", func(c *connectorv1.Connector) {
			c.Transport, c.Connection = connectorv1.Transport_TRANSPORT_STDIO, &connectorv1.Connector_Stdio{Stdio: &connectorv1.StdioConfig{Command: "npx"}}
		}, "connector.auth.mode"},
		{"no client", func(c *connectorv1.Connector) {
			c.Auth = &connectorv1.AuthConfig{Mode: connectorv1.AuthMode_AUTH_MODE_OAUTH_CLIENT_CREDENTIALS}
		}, "connector.auth.client_id"},
		{"per session", func(c *connectorv1.Connector) { c.SessionMode = connectorv1.SessionMode_SESSION_MODE_PER_SESSION }, "connector.session_mode"},
		{"authorization header", func(c *connectorv1.Connector) {
			c.GetHttp().Headers = map[string]string{"authorization": "Bearer static"}
		}, "connector.http.headers"},
	} {
		c := oauthUserConnector("bad", "http://127.0.0.1:9/mcp")
		tt.edit(c)
		_, err := f.client.CreateConnector(ctx(t), &connectorv1.CreateConnectorRequest{WorkspaceId: "ws", Connector: c})
		wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, tt.field)
		if tt.name == "per session" && !strings.Contains(err.Error(), "oauth_user already opens one connection per user") {
			t.Errorf("per_session refusal %q does not say why", err)
		}
	}
	list, _ := f.client.ListConnectors(ctx(t), &connectorv1.ListConnectorsRequest{WorkspaceId: "ws"})
	b, _ := protojson.Marshal(list)
	if strings.Contains(string(b), distinctive+"-client-secret") || strings.Contains(f.logs.String(), distinctive+"-client-secret") {
		t.Error("the client secret leaked into a response or a log line")
	}
}

// Two users of one oauth_user connector: each call runs with its own
// user's token; a user without one gets FAILED_PRECONDITION with the URL
// to authorize at, and after authorizing, their own identity.
func TestOAuthUserCallsAndAuthorizations(t *testing.T) {
	fake := newFakeOAuth()
	f := setup(t, options{oauth: fake})
	f.create(t, "ws", oauthUserConnector("p", protectedMCP(t)))
	f.waitReachable(t, "ws", "p")
	plain := f.create(t, "ws", mcpConnector("plain", "http://127.0.0.1:9/mcp"))
	id, _ := f.reg.Lookup("ws", "p")
	fake.grant(id, "alice", "read")

	_, err := f.whoami(t, "p", "")
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "user_id")
	_, err = f.whoami(t, "p", strings.Repeat("u", 257))
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "user_id")
	// 256 characters, more bytes.
	_, err = f.whoami(t, "p", strings.Repeat("é", 256))
	if ar := authorizationRequired(t, err); ar.GetUserId() != strings.Repeat("é", 256) {
		t.Errorf("AuthorizationRequired of a 256-character user: %v", ar)
	}
	_, err = f.whoami(t, "p", strings.Repeat("é", 257))
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "user_id")
	if who, err := f.whoami(t, "p", "alice"); err != nil || who != "alice" {
		t.Fatalf("alice's whoami = %q, %v", who, err)
	}
	_, err = f.whoami(t, "p", "bob")
	ar := authorizationRequired(t, err)
	if ar.GetUserId() != "bob" || ar.GetConnectorId() != "p" || ar.GetReason() != oauth.ReasonNoToken || !slices.Equal(ar.GetScopes(), []string{"read"}) {
		t.Fatalf("bob's AuthorizationRequired = %v", ar)
	}
	done := f.completeFor(t, ar.GetAuthorizationUrl())
	if a := done.GetAuthorization(); a.GetUserId() != "bob" || a.GetConnectorId() != "p" {
		t.Errorf("completed authorization = %v", a)
	}
	for _, user := range []string{"bob", "alice", "bob"} {
		if who, err := f.whoami(t, "p", user); err != nil || who != user {
			t.Fatalf("%s's whoami = %q, %v", user, who, err)
		}
	}
	if n := f.reg.SessionCount(id); n != 2 {
		t.Errorf("user connections = %d, want 2", n)
	}

	// Started for a user, with a return_to; only for oauth_user connectors.
	st, err := f.client.StartAuthorization(ctx(t), &connectorv1.StartAuthorizationRequest{WorkspaceId: "ws", ConnectorId: "p",
		UserId: "carol", ReturnTo: "https://chat.test/back"})
	if err != nil || st.GetAuthorizationUrl() == "" || st.GetExpireTime() == nil {
		t.Fatalf("StartAuthorization = %v, %v", st, err)
	}
	if done := f.completeFor(t, st.GetAuthorizationUrl()); done.GetReturnTo() != "https://chat.test/back" {
		t.Errorf("return_to = %q", done.GetReturnTo())
	}
	_, err = f.client.StartAuthorization(ctx(t), &connectorv1.StartAuthorizationRequest{WorkspaceId: "ws", ConnectorId: plain.GetConnectorId(), UserId: "x"})
	wantStatus(t, err, codes.FailedPrecondition, server.ReasonNotOAuthUser, "")
	_, err = f.client.StartAuthorization(ctx(t), &connectorv1.StartAuthorizationRequest{WorkspaceId: "ws", ConnectorId: "p"})
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "user_id")

	// Listed a page at a time.
	var users []string
	token := ""
	for range 4 {
		page, err := f.client.ListAuthorizations(ctx(t), &connectorv1.ListAuthorizationsRequest{WorkspaceId: "ws", ConnectorId: "p",
			PageSize: 2, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range page.GetAuthorizations() {
			users = append(users, a.GetUserId())
		}
		if token = page.GetNextPageToken(); token == "" {
			break
		}
	}
	if !slices.Equal(users, []string{"alice", "bob", "carol"}) {
		t.Errorf("listed users = %v", users)
	}
	// A page token goes on with the filters it came from, and no others.
	first, err := f.client.ListAuthorizations(ctx(t), &connectorv1.ListAuthorizationsRequest{WorkspaceId: "ws", ConnectorId: "p", PageSize: 1})
	if err != nil || first.GetNextPageToken() == "" {
		t.Fatalf("ListAuthorizations = %v, %v", first, err)
	}
	for _, req := range []*connectorv1.ListAuthorizationsRequest{
		{WorkspaceId: "ws"},
		{WorkspaceId: "ws", ConnectorId: "p", UserId: "bob"},
		{WorkspaceId: "ws", UserId: "bob"},
		{WorkspaceId: "ws", ConnectorId: plain.GetConnectorId()},
		{WorkspaceId: "other", ConnectorId: "p"},
	} {
		req.PageToken = first.GetNextPageToken()
		_, err := f.client.ListAuthorizations(ctx(t), req)
		wantViolations(t, err, "page_token")
	}
	rest, err := f.client.ListAuthorizations(ctx(t), &connectorv1.ListAuthorizationsRequest{WorkspaceId: "ws", ConnectorId: "p",
		PageSize: 5, PageToken: first.GetNextPageToken()})
	if err != nil || len(rest.GetAuthorizations()) != 2 || rest.GetAuthorizations()[0].GetUserId() != "bob" {
		t.Errorf("the next page with another page_size = %v, %v", rest, err)
	}

	// Revoked: bob's connection closes, and his next call must authorize.
	if _, err := f.client.RevokeAuthorization(ctx(t), &connectorv1.RevokeAuthorizationRequest{WorkspaceId: "ws", ConnectorId: "p",
		UserId: "bob"}); err != nil {
		t.Fatal(err)
	}
	if n := f.reg.SessionCount(id); n != 1 {
		t.Errorf("user connections after bob's revocation = %d, want 1 (alice's)", n)
	}
	_, err = f.whoami(t, "p", "bob")
	if ar := authorizationRequired(t, err); ar.GetReason() != oauth.ReasonNoToken {
		t.Errorf("after revocation: reason %q", ar.GetReason())
	}
	if who, err := f.whoami(t, "p", "alice"); err != nil || who != "alice" {
		t.Errorf("alice after bob's revocation: %q, %v", who, err)
	}
	_, err = f.client.RevokeAuthorization(ctx(t), &connectorv1.RevokeAuthorizationRequest{WorkspaceId: "ws", ConnectorId: "p", UserId: "bob"})
	wantStatus(t, err, codes.NotFound, server.ReasonAuthorizationMissing, "")

	// Deleting the connector revokes every token, even if the
	// authorization server fails.
	fake.failRevokeAll = true
	if _, err := f.client.DeleteConnector(ctx(t), &connectorv1.DeleteConnectorRequest{WorkspaceId: "ws", ConnectorId: "p"}); err != nil {
		t.Fatalf("DeleteConnector with the authorization server down: %v", err)
	}
	if n := fake.revokeAll.Load(); n != 1 {
		t.Errorf("RevokeAll calls = %d, want 1", n)
	}
}

// A server that asks for more scopes gets a step-up authorization, twice
// within the window: with the authorization that gave the token it
// refused, three in all (the conformance suite's auth/scope-retry-limit).
func TestOAuthStepUp(t *testing.T) {
	fake := newFakeOAuth()
	f := setup(t, options{oauth: fake})
	f.create(t, "ws", oauthUserConnector("p", protectedMCP(t)))
	f.waitReachable(t, "ws", "p")
	id, _ := f.reg.Lookup("ws", "p")
	fake.grant(id, "alice", "read")
	// No user's connection is open to list the tools over yet.
	_, err := f.client.RefreshTools(ctx(t), &connectorv1.RefreshToolsRequest{WorkspaceId: "ws", ConnectorId: "p"})
	wantStatus(t, err, codes.FailedPrecondition, server.ReasonConnectorUnavailable, "")
	if !strings.Contains(err.Error(), "no user's connection is open") {
		t.Errorf("RefreshTools refusal %q does not say why", err)
	}
	admin := func() error {
		_, err := f.client.CallTool(ctx(t), &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: "p", ToolName: "admin_action", UserId: "alice"})
		return err
	}
	for i := range 2 {
		ar := authorizationRequired(t, admin())
		if ar.GetReason() != oauth.ReasonInsufficientScope || !slices.Equal(ar.GetScopes(), []string{"admin", "read"}) {
			t.Fatalf("step-up %d: %v", i, ar)
		}
	}
	wantStatus(t, admin(), codes.PermissionDenied, server.ReasonStepUpLimit, "")
	if who, err := f.whoami(t, "p", "alice"); err != nil || who != "alice" {
		t.Errorf("whoami after refused step-ups: %q, %v (the connection must be fine)", who, err)
	}
	refreshed, err := f.client.RefreshTools(ctx(t), &connectorv1.RefreshToolsRequest{WorkspaceId: "ws", ConnectorId: "p"})
	if err != nil || len(refreshed.GetTools()) != 2 {
		t.Errorf("RefreshTools over alice's connection = %v, %v", refreshed, err)
	}
}

// A query for a user without a token pauses as AWAITING_AUTHORIZATION and
// goes on, under the same run id, once they have authorized.
func TestOAuthQueryPausesForAuthorization(t *testing.T) {
	fake := newFakeOAuth()
	model := llmtest.New(t)
	f := setup(t, options{oauth: fake, llmURL: model.URL()})
	f.create(t, "ws", oauthUserConnector("p", protectedMCP(t)))
	f.waitReachable(t, "ws", "p")

	_, err := f.client.QueryConnector(ctx(t), &connectorv1.QueryConnectorRequest{WorkspaceId: "ws", ConnectorId: "p", Query: "who am I?"})
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "user_id")

	resp, err := f.client.QueryConnector(ctx(t), &connectorv1.QueryConnectorRequest{WorkspaceId: "ws", ConnectorId: "p",
		Query: "who am I?", UserId: "bob"})
	if err != nil {
		t.Fatal(err)
	}
	res := resp.GetResult()
	ar := res.GetAuthorization()
	if res.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_AWAITING_AUTHORIZATION || res.GetRunId() == "" ||
		ar.GetRunId() != res.GetRunId() || ar.GetUserId() != "bob" || ar.GetAuthorizationUrl() == "" {
		t.Fatalf("paused result = %v", res)
	}
	// The URL expires when its state does (the fake's 10 minutes); the
	// run, after APPROVAL_TIMEOUT (a day).
	urlExpiry(t, ar.GetExpireTime().AsTime(), 10*time.Minute)
	if until := time.Until(res.GetExpireTime().AsTime()); until < 23*time.Hour {
		t.Errorf("the run expires in %s, want the approval timeout's day", until)
	}
	if n := len(model.Requests()); n != 0 {
		t.Errorf("the model was asked %d times before the user authorized", n)
	}
	run, err := f.client.GetQueryRun(ctx(t), &connectorv1.GetQueryRunRequest{WorkspaceId: "ws", RunId: res.GetRunId()})
	if err != nil || run.GetRun().GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_AWAITING_AUTHORIZATION {
		t.Fatalf("GetQueryRun = %v, %v", run, err)
	}
	_, err = f.client.ResumeQuery(ctx(t), &connectorv1.ResumeQueryRequest{WorkspaceId: "ws", RunId: res.GetRunId(),
		Decisions: []*connectorv1.Decision{{CallId: "x", Kind: connectorv1.DecisionKind_DECISION_KIND_APPROVE}}})
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "decisions")
	_, err = f.client.ResumeQuery(ctx(t), &connectorv1.ResumeQueryRequest{WorkspaceId: "ws", RunId: res.GetRunId()})
	fresh := authorizationRequired(t, err)
	if fresh.GetRunId() != res.GetRunId() || fresh.GetAuthorizationUrl() == ar.GetAuthorizationUrl() {
		t.Errorf("resume before authorizing: %v; want a fresh URL for the run", fresh)
	}

	f.completeFor(t, fresh.GetAuthorizationUrl())
	model.Then(llmtest.CallTools(llmtest.Call{Tool: "whoami", Args: `{}`}), llmtest.Answer("You are bob."))
	resumed, err := f.client.ResumeQuery(ctx(t), &connectorv1.ResumeQueryRequest{WorkspaceId: "ws", RunId: res.GetRunId()})
	if err != nil {
		t.Fatal(err)
	}
	r := resumed.GetResult()
	if r.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_COMPLETED || r.GetRunId() != res.GetRunId() || r.GetAnswer() != "You are bob." ||
		len(r.GetSteps()) != 1 || r.GetSteps()[0].GetCalls()[0].GetResultExcerpt() != "bob" {
		t.Fatalf("resumed result = %v", r)
	}
	run, _ = f.client.GetQueryRun(ctx(t), &connectorv1.GetQueryRunRequest{WorkspaceId: "ws", RunId: res.GetRunId()})
	if run.GetRun().GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_COMPLETED {
		t.Errorf("run after resume = %v", run.GetRun().GetStatus())
	}

	// A stream says authorization_required, then the result.
	stream, err := f.client.StreamQueryConnector(ctx(t), &connectorv1.StreamQueryConnectorRequest{WorkspaceId: "ws", ConnectorId: "p",
		Query: "who am I?", UserId: "carol"})
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for {
		msg, err := stream.Recv()
		if err != nil {
			break
		}
		switch e := msg.GetEvent().(type) {
		case *connectorv1.StreamQueryConnectorResponse_AuthorizationRequired:
			if e.AuthorizationRequired.GetUserId() != "carol" || e.AuthorizationRequired.GetRunId() == "" {
				t.Errorf("event = %v", e.AuthorizationRequired)
			}
			urlExpiry(t, e.AuthorizationRequired.GetExpireTime().AsTime(), 10*time.Minute)
			kinds = append(kinds, "authorization_required")
		case *connectorv1.StreamQueryConnectorResponse_Result:
			kinds = append(kinds, "result:"+e.Result.GetStatus().String())
		}
	}
	if !slices.Equal(kinds, []string{"authorization_required", "result:QUERY_STATUS_AWAITING_AUTHORIZATION"}) {
		t.Errorf("stream = %v", kinds)
	}

	// A plan runs no tool: no token needed, and no pause.
	model.Then(llmtest.Answer(`{"plan":[{"tool":"whoami","purpose":"say who"}]}`))
	plan, err := f.client.QueryConnector(ctx(t), &connectorv1.QueryConnectorRequest{WorkspaceId: "ws", ConnectorId: "p",
		Query: "who am I?", UserId: "dave", PlanOnly: true})
	if err != nil || plan.GetResult().GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_PLANNED {
		t.Errorf("plan_only for a user without a token = %v, %v; want PLANNED, no pause", plan.GetResult().GetStatus(), err)
	}
}

// urlExpiry checks that an authorization URL expires within ttl from now,
// as its state does, and not much before.
func urlExpiry(t *testing.T, at time.Time, ttl time.Duration) {
	t.Helper()
	if until := time.Until(at); until > ttl || until < ttl-time.Minute {
		t.Errorf("the authorization URL expires in %s, want about %s (its state's)", until, ttl)
	}
}

// A client credentials connector calls as its own identity.
func TestOAuthClientCredentialsCalls(t *testing.T) {
	fake := newFakeOAuth()
	f := setup(t, options{oauth: fake})
	c := mcpConnector("cc", protectedMCP(t))
	c.Auth = &connectorv1.AuthConfig{Mode: connectorv1.AuthMode_AUTH_MODE_OAUTH_CLIENT_CREDENTIALS, ClientId: "svc", ClientSecret: "s3cret-value"}
	resp, err := f.client.CreateConnector(ctx(t), &connectorv1.CreateConnectorRequest{WorkspaceId: "ws", Connector: c,
		Active: new(bool)})
	if err != nil {
		t.Fatal(err)
	}
	_ = resp
	row, err := f.db.GetConnector(ctx(t), "ws", "cc")
	if err != nil {
		t.Fatal(err)
	}
	fake.grant(row.ID, "machine")
	if _, err := f.client.ActivateConnector(ctx(t), &connectorv1.ActivateConnectorRequest{WorkspaceId: "ws", ConnectorId: "cc"}); err != nil {
		t.Fatal(err)
	}
	f.waitReady(t, "ws", "cc")
	if who, err := f.whoami(t, "cc", ""); err != nil || who != "machine" {
		t.Fatalf("whoami = %q, %v; want the connector's own identity", who, err)
	}
	_, err = f.client.StartAuthorization(ctx(t), &connectorv1.StartAuthorizationRequest{WorkspaceId: "ws", ConnectorId: "cc", UserId: "x"})
	wantStatus(t, err, codes.FailedPrecondition, server.ReasonNotOAuthUser, "")
}

// violationFields are the fields err's BadRequest names.
func violationFields(err error) []string {
	var fields []string
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				fields = append(fields, v.GetField())
			}
		}
	}
	return fields
}

// wantViolations checks that err is INVALID_ARGUMENT naming exactly fields.
func wantViolations(t *testing.T, err error, fields ...string) {
	t.Helper()
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "")
	if got := violationFields(err); !slices.Equal(got, fields) {
		t.Errorf("violations name %v, want %v (%v)", got, fields, err)
	}
}

// A connector of auth mode none takes no client id, client secret or
// scopes, on create or update; scopes are RFC 6749 scope-tokens, each
// named once, in a connector's auth and in StartAuthorization.
func TestOAuthSettingsRefused(t *testing.T) {
	f := setup(t, options{oauth: newFakeOAuth()})
	secret := distinctive + "-unused-secret"
	for _, mode := range []connectorv1.AuthMode{connectorv1.AuthMode_AUTH_MODE_NONE, connectorv1.AuthMode_AUTH_MODE_UNSPECIFIED} {
		c := mcpConnector("n", "http://127.0.0.1:9/mcp")
		c.Auth = &connectorv1.AuthConfig{Mode: mode, ClientId: "svc", ClientSecret: secret, Scopes: []string{"read"}}
		_, err := f.client.CreateConnector(ctx(t), &connectorv1.CreateConnectorRequest{WorkspaceId: "ws", Connector: c})
		wantViolations(t, err, "connector.auth.client_id", "connector.auth.client_secret", "connector.auth.scopes")
		if !strings.Contains(err.Error(), "AUTH_MODE_NONE uses no OAuth") {
			t.Errorf("%s: %q does not say why", mode, err)
		}
	}
	f.create(t, "ws", mcpConnector("n", "http://127.0.0.1:9/mcp"))
	for path, a := range map[string]*connectorv1.AuthConfig{
		"auth.client_id":     {ClientId: "svc"},
		"auth.client_secret": {ClientSecret: secret},
		"auth.scopes":        {Scopes: []string{"read"}},
	} {
		_, err := update(f, t, &connectorv1.Connector{ConnectorId: "n", Auth: a}, path)
		wantViolations(t, err, "connector."+path)
	}
	_, err := update(f, t, &connectorv1.Connector{ConnectorId: "n", Auth: &connectorv1.AuthConfig{Scopes: []string{"read"}}}, "auth")
	wantViolations(t, err, "connector.auth.scopes")

	// A client credentials connector turned to none keeps its client
	// unless the whole auth is replaced.
	cc := mcpConnector("cc", "http://127.0.0.1:9/mcp")
	cc.Auth = &connectorv1.AuthConfig{Mode: connectorv1.AuthMode_AUTH_MODE_OAUTH_CLIENT_CREDENTIALS, ClientId: "svc", ClientSecret: secret}
	f.create(t, "ws", cc)
	_, err = update(f, t, &connectorv1.Connector{ConnectorId: "cc", Auth: &connectorv1.AuthConfig{Mode: connectorv1.AuthMode_AUTH_MODE_NONE}}, "auth.mode")
	wantViolations(t, err, "connector.auth.client_id", "connector.auth.client_secret")
	got, err := update(f, t, &connectorv1.Connector{ConnectorId: "cc", Auth: &connectorv1.AuthConfig{Mode: connectorv1.AuthMode_AUTH_MODE_NONE}}, "auth")
	if err != nil || got.GetAuth().GetClientId() != "" || got.GetAuth().GetHasClientSecret() {
		t.Fatalf("replacing the whole auth with AUTH_MODE_NONE = %v, %v", got.GetAuth(), err)
	}

	// Scopes.
	bad := []string{"a b", "caf\u00e9", "x\x01", `q"`, `back\slash`, "", strings.Repeat("s", 257), "read", "files:read", "read"}
	wantBad := []string{"scopes[0]", "scopes[1]", "scopes[2]", "scopes[3]", "scopes[4]", "scopes[5]", "scopes[6]", "scopes[9]"}
	p := oauthUserConnector("p", "http://127.0.0.1:9/mcp")
	p.Auth.Scopes = bad
	_, err = f.client.CreateConnector(ctx(t), &connectorv1.CreateConnectorRequest{WorkspaceId: "ws", Connector: p})
	var prefixed []string
	for _, w := range wantBad {
		prefixed = append(prefixed, "connector.auth."+w)
	}
	wantViolations(t, err, prefixed...)
	if !strings.Contains(err.Error(), `connector.auth.scopes[9]: repeats connector.auth.scopes[7] ("read")`) {
		t.Errorf("the repeated scope's refusal %q does not name the first", err)
	}
	p.Auth.Scopes = []string{"read", "files:read", "https://api.test/all", "[a]~!#$"}
	f.create(t, "ws", p)
	_, err = f.client.StartAuthorization(ctx(t), &connectorv1.StartAuthorizationRequest{WorkspaceId: "ws", ConnectorId: "p",
		UserId: "alice", Scopes: bad})
	wantViolations(t, err, wantBad...)

	if strings.Contains(f.logs.String(), secret) {
		t.Error("a refused client secret reached the logs")
	}
}

// CompleteAuthorization with a key of another workspace is refused before
// the state is used: the chat backend of the authorization's own
// workspace completes it afterwards. A user's refusal comes back with
// the return_to to send them to.
func TestCompleteAuthorizationWorkspace(t *testing.T) {
	fake := newFakeOAuth()
	f := setup(t, options{oauth: fake, auth: auth.ModeKeys})
	_, mine, err := f.keys.Create(context.Background(), "ws", []auth.Scope{auth.ScopeAdmin}, "")
	if err != nil {
		t.Fatal(err)
	}
	_, theirs, err := f.keys.Create(context.Background(), "other", []auth.Scope{auth.ScopeAdmin}, "")
	if err != nil {
		t.Fatal(err)
	}
	as := func(token string) context.Context { return bearer(ctx(t), token) }
	if _, err := f.client.CreateConnector(as(mine), &connectorv1.CreateConnectorRequest{WorkspaceId: "ws",
		Connector: oauthUserConnector("p", "http://127.0.0.1:9/mcp")}); err != nil {
		t.Fatal(err)
	}
	start := func(returnTo string) string {
		t.Helper()
		st, err := f.client.StartAuthorization(as(mine), &connectorv1.StartAuthorizationRequest{WorkspaceId: "ws", ConnectorId: "p",
			UserId: "alice", ReturnTo: returnTo})
		if err != nil {
			t.Fatal(err)
		}
		u, _ := url.Parse(st.GetAuthorizationUrl())
		return u.Query().Get("state")
	}
	state := start("")
	complete := &connectorv1.CompleteAuthorizationRequest{State: state, Code: "code", Iss: "https://as.test"}
	_, err = f.client.CompleteAuthorization(as(theirs), complete)
	wantStatus(t, err, codes.PermissionDenied, auth.ReasonWrongWorkspace, "")
	done, err := f.client.CompleteAuthorization(as(mine), complete)
	if err != nil || done.GetAuthorization().GetUserId() != "alice" {
		t.Fatalf("CompleteAuthorization by the workspace's own key after another's = %v, %v", done, err)
	}
	_, err = f.client.CompleteAuthorization(as(mine), complete)
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "state")
	_, err = f.client.CompleteAuthorization(as(theirs), &connectorv1.CompleteAuthorizationRequest{State: "unknown", Code: "code"})
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "state")

	// The user said no: the error names the OAuth error and the return_to.
	state = start("https://chat.test/back")
	_, err = f.client.CompleteAuthorization(as(mine), &connectorv1.CompleteAuthorizationRequest{State: state, Error: "access_denied"})
	wantStatus(t, err, codes.FailedPrecondition, server.ReasonAuthorizationFailed, "")
	var md map[string]string
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			md = info.GetMetadata()
		}
	}
	if md["return_to"] != "https://chat.test/back" || md["error"] != "access_denied" {
		t.Errorf("refusal metadata = %v, want return_to and error", md)
	}
	if msg := status.Convert(err).Message(); strings.Count(msg, "access_denied") != 1 {
		t.Errorf("refusal message %q names the OAuth error other than once", msg)
	}

	// Without a return_to, the metadata still names the OAuth error
	// (issue 27: it was there only with one).
	state = start("")
	_, err = f.client.CompleteAuthorization(as(mine), &connectorv1.CompleteAuthorizationRequest{State: state, Error: "access_denied"})
	wantStatus(t, err, codes.FailedPrecondition, server.ReasonAuthorizationFailed, "")
	md = nil
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			md = info.GetMetadata()
		}
	}
	if _, has := md["return_to"]; md["error"] != "access_denied" || has {
		t.Errorf("refusal metadata without a return_to = %v, want error and no return_to", md)
	}
}

// RevokeAuthorization: an oauth_user connector's needs the user; a
// connector of auth mode none has nothing to revoke; a client credentials
// connector's own token is revoked without a user.
func TestRevokeAuthorizationArguments(t *testing.T) {
	fake := newFakeOAuth()
	f := setup(t, options{oauth: fake})
	f.create(t, "ws", oauthUserConnector("p", "http://127.0.0.1:9/mcp"))
	f.create(t, "ws", mcpConnector("plain", "http://127.0.0.1:9/mcp"))
	cc := mcpConnector("cc", "http://127.0.0.1:9/mcp")
	cc.Auth = &connectorv1.AuthConfig{Mode: connectorv1.AuthMode_AUTH_MODE_OAUTH_CLIENT_CREDENTIALS, ClientId: "svc", ClientSecret: "s3cret"}
	f.create(t, "ws", cc)
	revoke := func(connector, user string) error {
		_, err := f.client.RevokeAuthorization(ctx(t), &connectorv1.RevokeAuthorizationRequest{WorkspaceId: "ws", ConnectorId: connector, UserId: user})
		return err
	}
	err := revoke("p", "")
	wantViolations(t, err, "user_id")
	if !strings.Contains(err.Error(), "AUTH_MODE_OAUTH_USER") {
		t.Errorf("%q does not say why user_id is required", err)
	}
	wantViolations(t, revoke("p", "al\x01ice"), "user_id")
	err = revoke("plain", "")
	wantStatus(t, err, codes.FailedPrecondition, server.ReasonNotOAuthUser, "")
	if !strings.Contains(err.Error(), `connector "plain" uses AUTH_MODE_NONE: it uses no OAuth`) {
		t.Errorf("revoking on a connector without OAuth: %q", err)
	}
	row, err := f.db.GetConnector(ctx(t), "ws", "cc")
	if err != nil {
		t.Fatal(err)
	}
	fake.grant(row.ID, "")
	if err := revoke("cc", ""); err != nil {
		t.Errorf("revoking a client credentials connector's token: %v", err)
	}
	if got := fake.forgotten(); len(got) != 0 {
		t.Errorf("forgot %v for no user's connection", got)
	}

	// Starting an authorization of a connector its users do not authorize.
	for connector, mode := range map[string]string{"plain": "AUTH_MODE_NONE", "cc": "AUTH_MODE_OAUTH_CLIENT_CREDENTIALS"} {
		_, err = f.client.StartAuthorization(ctx(t), &connectorv1.StartAuthorizationRequest{WorkspaceId: "ws", ConnectorId: connector, UserId: "x"})
		wantStatus(t, err, codes.FailedPrecondition, server.ReasonNotOAuthUser, "")
		if want := fmt.Sprintf("connector %q uses %s: only AUTH_MODE_OAUTH_USER connectors are authorized by their users", connector, mode); !strings.Contains(err.Error(), want) {
			t.Errorf("StartAuthorization of %s: %q, want %q", connector, err, want)
		}
	}
}
