package oauthtest_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/oauthtest"
)

const redirectURI = "http://127.0.0.1:9/callback"

// pkce is a fresh S256 verifier and its challenge.
func pkce(t *testing.T) (verifier, challenge string) {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	verifier = base64.RawURLEncoding.EncodeToString(b)
	sum := sha256.Sum256([]byte(verifier))
	return verifier, base64.RawURLEncoding.EncodeToString(sum[:])
}

// getJSON GETs u and decodes its JSON body, failing unless it answers 200.
func getJSON(t *testing.T, u string) map[string]any {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", u, resp.Status)
	}
	var m map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	return m
}

func status(t *testing.T, method, u string) int {
	t.Helper()
	req, _ := http.NewRequest(method, u, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// tokenResponse is a token endpoint's answer, success or error.
type tokenResponse struct {
	status       int
	AccessToken  string `json:"access_token"`
	RefreshToken string `json:"refresh_token"`
	TokenType    string `json:"token_type"`
	ExpiresIn    int    `json:"expires_in"`
	Scope        string `json:"scope"`
	Error        string `json:"error"`
	Description  string `json:"error_description"`
}

// String shows tr without its tokens, for failure messages.
func (tr tokenResponse) String() string {
	set := func(v string) string {
		if v == "" {
			return "none"
		}
		return "set"
	}
	return fmt.Sprintf("%d access_token:%s refresh_token:%s type:%s expires_in:%d scope:%q error:%s %s",
		tr.status, set(tr.AccessToken), set(tr.RefreshToken), tr.TokenType, tr.ExpiresIn, tr.Scope, tr.Error, tr.Description)
}

// post POSTs form to u, with basic auth if user is set.
func post(t *testing.T, u string, form url.Values, user, pass string) tokenResponse {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if user != "" {
		req.SetBasicAuth(url.QueryEscape(user), url.QueryEscape(pass))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var tr tokenResponse
	body, _ := io.ReadAll(resp.Body)
	if len(body) > 0 {
		if err := json.Unmarshal(body, &tr); err != nil {
			t.Fatalf("POST %s: %s: %v", u, body, err)
		}
	}
	tr.status = resp.StatusCode
	return tr
}

// asMetadata fetches the RFC 8414 metadata of s's issuer.
func asMetadata(t *testing.T, s *oauthtest.Server) map[string]any {
	t.Helper()
	u, _ := url.Parse(s.Issuer)
	return getJSON(t, u.Scheme+"://"+u.Host+"/.well-known/oauth-authorization-server"+u.Path)
}

// register registers a public client by DCR.
func register(t *testing.T, md map[string]any, body map[string]any) map[string]any {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(md["registration_endpoint"].(string), "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("registration: %s %v", resp.Status, out)
	}
	return out
}

// authURL is an authorization request URL.
func authURL(md map[string]any, params map[string]string) string {
	q := url.Values{}
	for k, v := range params {
		if v != "" {
			q.Set(k, v)
		}
	}
	return md["authorization_endpoint"].(string) + "?" + q.Encode()
}

// flow is one authorization code grant: the client, the verifier, the
// tokens.
type flow struct {
	clientID string
	tokens   tokenResponse
}

// login runs the authorization code flow for user with clientID (a
// public client), asking scope.
func login(t *testing.T, s *oauthtest.Server, md map[string]any, clientID, user, scope string) tokenResponse {
	t.Helper()
	verifier, challenge := pkce(t)
	loc, err := s.Authorize(context.Background(), authURL(md, map[string]string{
		"response_type": "code", "client_id": clientID, "redirect_uri": redirectURI, "scope": scope,
		"state": "state-" + user + "-0123456789", "code_challenge": challenge, "code_challenge_method": "S256",
		"resource": s.MCPURL,
	}), user)
	if err != nil {
		t.Fatalf("authorize: %v", err)
	}
	tr := post(t, md["token_endpoint"].(string), url.Values{
		"grant_type": {"authorization_code"}, "code": {loc.Query().Get("code")}, "redirect_uri": {redirectURI},
		"client_id": {clientID}, "code_verifier": {verifier}, "resource": {s.MCPURL},
	}, "", "")
	if tr.status != http.StatusOK {
		t.Fatalf("code exchange: %d %s %s", tr.status, tr.Error, tr.Description)
	}
	return tr
}

// dial starts an initialized mcp-go client of s's MCP server with token.
func dial(t *testing.T, s *oauthtest.Server, token string) *client.Client {
	t.Helper()
	tr, err := transport.NewStreamableHTTP(s.MCPURL, transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + token}))
	if err != nil {
		t.Fatal(err)
	}
	c := client.NewClient(tr)
	ctx := context.Background()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	var init mcp.InitializeRequest
	init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcp.Implementation{Name: "oauthtest", Version: "1"}
	if _, err := c.Initialize(ctx, init); err != nil {
		t.Fatalf("initialize: %v", err)
	}
	return c
}

func callTool(c *client.Client, name string) (*mcp.CallToolResult, error) {
	var req mcp.CallToolRequest
	req.Params.Name = name
	return c.CallTool(context.Background(), req)
}

func text(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// whoami calls whoami with token over a new client.
func whoami(t *testing.T, s *oauthtest.Server, token string) string {
	t.Helper()
	res, err := callTool(dial(t, s, token), "whoami")
	if err != nil {
		t.Fatalf("whoami: %v", err)
	}
	return text(res)
}

// probe POSTs an initialize to the MCP endpoint with token ("" for none)
// and returns its status and WWW-Authenticate.
func probe(t *testing.T, s *oauthtest.Server, method, token, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, s.MCPURL, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("WWW-Authenticate")
}

const initBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`

func TestFlow(t *testing.T) {
	s := oauthtest.Start(t, oauthtest.Options{})
	ctx := context.Background()

	// Discovery: the unauthenticated probe, the PRM, the AS metadata.
	code, ch := probe(t, s, http.MethodPost, "", initBody)
	wantCh := `Bearer scope="mcp:tools", resource_metadata="` + s.PRMURL() + `"`
	if code != http.StatusUnauthorized || ch != wantCh {
		t.Fatalf("probe: %d %q, want 401 %q", code, ch, wantCh)
	}
	if !strings.HasSuffix(s.PRMURL(), "/.well-known/oauth-protected-resource/mcp") {
		t.Fatalf("PRM URL %s", s.PRMURL())
	}
	prm := getJSON(t, s.PRMURL())
	if prm["resource"] != s.MCPURL || prm["authorization_servers"].([]any)[0] != s.Issuer {
		t.Fatalf("PRM %v", prm)
	}
	md := asMetadata(t, s)
	if md["issuer"] != s.Issuer || md["code_challenge_methods_supported"].([]any)[0] != "S256" ||
		md["authorization_response_iss_parameter_supported"] != true || md["revocation_endpoint"] == nil {
		t.Fatalf("metadata %v", md)
	}

	// DCR.
	reg := register(t, md, map[string]any{
		"redirect_uris": []string{redirectURI}, "token_endpoint_auth_method": "none",
		"grant_types": []string{"authorization_code", "refresh_token"}, "response_types": []string{"code"},
		"application_type": "web", "client_name": "connector-svc",
	})
	clientID, _ := reg["client_id"].(string)
	if clientID == "" || reg["client_secret"] != nil {
		t.Fatalf("registration answered %v", reg)
	}
	if regs := s.Registrations(); len(regs) != 1 || regs[0].ApplicationType != "web" || regs[0].Raw["client_name"] != "connector-svc" {
		t.Fatalf("registrations %+v", regs)
	}

	// Authorization with PKCE S256 and the resource.
	verifier, challenge := pkce(t)
	loc, err := s.Authorize(ctx, authURL(md, map[string]string{
		"response_type": "code", "client_id": clientID, "redirect_uri": redirectURI, "scope": "mcp:tools",
		"state": "the-state-0123456789", "code_challenge": challenge, "code_challenge_method": "S256",
		"resource": s.MCPURL,
	}), "alice")
	if err != nil {
		t.Fatal(err)
	}
	q := loc.Query()
	if got := loc.Scheme + "://" + loc.Host + loc.Path; got != redirectURI || q.Get("code") == "" ||
		q.Get("state") != "the-state-0123456789" || q.Get("iss") != s.Issuer {
		t.Fatalf("redirect %s", loc.Redacted())
	}

	tokenURL := md["token_endpoint"].(string)
	t0 := post(t, tokenURL, url.Values{
		"grant_type": {"authorization_code"}, "code": {q.Get("code")}, "redirect_uri": {redirectURI},
		"client_id": {clientID}, "code_verifier": {verifier}, "resource": {s.MCPURL},
	}, "", "")
	if t0.status != http.StatusOK || t0.AccessToken == "" || t0.RefreshToken == "" || t0.Scope != "mcp:tools" ||
		!strings.EqualFold(t0.TokenType, "bearer") || t0.ExpiresIn < 3500 || t0.ExpiresIn > 3600 {
		t.Fatalf("code exchange: %+v", t0)
	}
	if last := s.LastTokenRequest(); last.Get("code_verifier") != "<set>" || last.Get("code") != "<set>" ||
		last.Get("resource") != s.MCPURL || last.Get("grant_type") != "authorization_code" {
		t.Fatalf("last token request %v", last)
	}

	// The MCP server, through an mcp-go client.
	c := dial(t, s, t0.AccessToken)
	res, err := callTool(c, "whoami")
	if err != nil || text(res) != "user=alice scopes=mcp:tools" {
		t.Fatalf("whoami: %v %v", err, res)
	}
	if sc, _ := res.StructuredContent.(map[string]any); sc["user"] != "alice" {
		t.Fatalf("whoami structured content %v", res.StructuredContent)
	}
	before := s.Counts()
	if _, err := callTool(c, "admin_action"); err == nil {
		t.Fatal("admin_action without scope admin succeeded")
	}
	if got := s.Counts().Forbidden403 - before.Forbidden403; got != 1 {
		t.Fatalf("403s: %d", got)
	}
	c.Close()
	if n := s.Counts().Unauthorized401; n != 1 {
		t.Fatalf("401s after the session (its DELETE too): %d, want the probe's 1", n)
	}

	// Refresh rotates.
	t1 := post(t, tokenURL, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {t0.RefreshToken},
		"client_id": {clientID}, "resource": {s.MCPURL}}, "", "")
	if t1.status != http.StatusOK || t1.RefreshToken == "" || t1.RefreshToken == t0.RefreshToken || t1.Scope != "mcp:tools" {
		t.Fatalf("refresh: %+v", t1)
	}
	if got := whoami(t, s, t1.AccessToken); got != "user=alice scopes=mcp:tools" {
		t.Fatalf("whoami after refresh: %s", got)
	}

	// ExpireTokens: 401 invalid_token; the refresh token still works.
	s.ExpireTokens()
	code, ch = probe(t, s, http.MethodPost, t1.AccessToken, initBody)
	if code != http.StatusUnauthorized || !strings.Contains(ch, `error="invalid_token"`) ||
		!strings.Contains(ch, `resource_metadata="`+s.PRMURL()+`"`) || !strings.Contains(ch, `scope="mcp:tools"`) {
		t.Fatalf("expired token: %d %q", code, ch)
	}
	t2 := post(t, tokenURL, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {t1.RefreshToken},
		"client_id": {clientID}}, "", "")
	if t2.status != http.StatusOK {
		t.Fatalf("refresh after ExpireTokens: %+v", t2)
	}
	if got := whoami(t, s, t2.AccessToken); got != "user=alice scopes=mcp:tools" {
		t.Fatalf("whoami after the second refresh: %s", got)
	}

	// Revocation of the refresh token ends the grant: its access token too.
	if r := post(t, md["revocation_endpoint"].(string), url.Values{"token": {t2.RefreshToken},
		"token_type_hint": {"refresh_token"}, "client_id": {clientID}}, "", ""); r.status != http.StatusOK {
		t.Fatalf("revocation: %+v", r)
	}
	if code, _ := probe(t, s, http.MethodPost, t2.AccessToken, initBody); code != http.StatusUnauthorized {
		t.Fatalf("access token after revocation: %d", code)
	}
	if r := post(t, tokenURL, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {t2.RefreshToken},
		"client_id": {clientID}}, "", ""); r.Error != "invalid_grant" {
		t.Fatalf("refresh with a revoked token: %+v", r)
	}
	// A rotated-out refresh token is refused.
	if r := post(t, tokenURL, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {t0.RefreshToken},
		"client_id": {clientID}}, "", ""); r.Error != "invalid_grant" {
		t.Fatalf("refresh with a used token: %+v", r)
	}

	got := s.Counts()
	want := oauthtest.Counts{
		Authorizations: 1, TokenCodeExchanges: 1, Refreshes: 2, Registrations: 1, Revocations: 1,
		MetadataFetches: 1, PRMFetches: 1, Unauthorized401: 3, Forbidden403: 1, TokenErrors: 2,
	}
	got.MCPRequests = 0
	if got != want {
		t.Fatalf("counts %+v, want %+v", got, want)
	}
}

func TestEverySessionRequestIsAuthenticated(t *testing.T) {
	s := oauthtest.Start(t, oauthtest.Options{})
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodDelete} {
		if code, ch := probe(t, s, m, "", ""); code != http.StatusUnauthorized || !strings.HasPrefix(ch, "Bearer ") {
			t.Errorf("%s without a token: %d %q", m, code, ch)
		}
		if code, ch := probe(t, s, m, "not-a-token", ""); code != http.StatusUnauthorized || !strings.Contains(ch, `error="invalid_token"`) {
			t.Errorf("%s with a bad token: %d %q", m, code, ch)
		}
	}
}

func TestAuthorizationRefusals(t *testing.T) {
	s := oauthtest.Start(t, oauthtest.Options{})
	s.RegisterClient("app", "")
	md := asMetadata(t, s)
	_, challenge := pkce(t)
	base := map[string]string{
		"response_type": "code", "client_id": "app", "redirect_uri": redirectURI, "scope": "mcp:tools",
		"state": "the-state-0123456789", "code_challenge": challenge, "code_challenge_method": "S256",
		"resource": s.MCPURL,
	}
	with := func(k, v string) map[string]string {
		p := map[string]string{}
		for k, v := range base {
			p[k] = v
		}
		p[k] = v
		return p
	}
	for _, tc := range []struct {
		name, user string
		params     map[string]string
		redirected bool   // refused by error redirect (rather than an error page)
		want       string // in the error
	}{
		{"missing resource", "alice", with("resource", ""), true, "invalid_target"},
		{"other resource", "alice", with("resource", s.MCPURL+"/other"), true, "invalid_target"},
		{"plain PKCE", "alice", with("code_challenge_method", "plain"), true, "invalid_request"},
		{"no PKCE", "alice", with("code_challenge", ""), true, "invalid_request"},
		{"unknown client", "alice", with("client_id", "nobody"), false, "invalid_client"},
		{"http redirect off loopback", "alice", with("redirect_uri", "http://example.com/cb"), false, "invalid_request"},
		{"no user", "", base, false, "login required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			loc, err := s.Authorize(context.Background(), authURL(md, tc.params), tc.user)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one with %q", err, tc.want)
			}
			if tc.redirected != (loc != nil) {
				t.Fatalf("redirect %v, want one: %v", loc, tc.redirected)
			}
			if loc != nil && loc.Query().Get("iss") != s.Issuer {
				t.Fatalf("error redirect without iss: %s", loc)
			}
		})
	}
	if c := s.Counts(); c.Authorizations != 0 || c.AuthorizeRefusals != 7 {
		t.Fatalf("counts %+v", c)
	}
	// The pre-registered client may use any https redirect.
	loc, err := s.Authorize(context.Background(), authURL(md, with("redirect_uri", "https://app.example/cb")), "alice")
	if err != nil || loc.Host != "app.example" {
		t.Fatalf("https redirect: %v %v", loc, err)
	}
}

func TestWrongVerifierRefused(t *testing.T) {
	s := oauthtest.Start(t, oauthtest.Options{})
	s.RegisterClient("app", "")
	md := asMetadata(t, s)
	_, challenge := pkce(t)
	other, _ := pkce(t)
	loc, err := s.Authorize(context.Background(), authURL(md, map[string]string{
		"response_type": "code", "client_id": "app", "redirect_uri": redirectURI,
		"state": "the-state-0123456789", "code_challenge": challenge, "code_challenge_method": "S256",
		"resource": s.MCPURL,
	}), "alice")
	if err != nil {
		t.Fatal(err)
	}
	form := url.Values{"grant_type": {"authorization_code"}, "code": {loc.Query().Get("code")}, "redirect_uri": {redirectURI},
		"client_id": {"app"}, "code_verifier": {other}, "resource": {s.MCPURL}}
	if r := post(t, md["token_endpoint"].(string), form, "", ""); r.Error != "invalid_grant" || r.AccessToken != "" {
		t.Fatalf("wrong verifier: %+v", r)
	}
	form.Del("resource")
	if r := post(t, md["token_endpoint"].(string), form, "", ""); r.Error != "invalid_target" {
		t.Fatalf("no resource: %+v", r)
	}
	if c := s.Counts(); c.TokenCodeExchanges != 0 || c.TokenErrors != 2 {
		t.Fatalf("counts %+v", c)
	}
}

func TestInsufficientScope(t *testing.T) {
	s := oauthtest.Start(t, oauthtest.Options{})
	s.RegisterClient("app", "")
	md := asMetadata(t, s)
	tr := login(t, s, md, "app", "alice", "mcp:tools")
	call := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"admin_action","arguments":{}}}`
	code, ch := probe(t, s, http.MethodPost, tr.AccessToken, call)
	if code != http.StatusForbidden || !strings.Contains(ch, `error="insufficient_scope"`) ||
		!strings.Contains(ch, `scope="mcp:tools admin"`) || !strings.Contains(ch, `resource_metadata="`+s.PRMURL()+`"`) {
		t.Fatalf("admin_action without admin: %d %q", code, ch)
	}

	// Step up: with admin, it works.
	tr = login(t, s, md, "app", "alice", "mcp:tools admin unknown:scope")
	if tr.Scope != "mcp:tools admin" {
		t.Fatalf("granted %q", tr.Scope)
	}
	res, err := callTool(dial(t, s, tr.AccessToken), "admin_action")
	if err != nil || text(res) != "admin done for alice" {
		t.Fatalf("admin_action: %v %v", res, err)
	}

	// A refresh may narrow the scope, not widen it.
	tokenURL := md["token_endpoint"].(string)
	narrow := post(t, tokenURL, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tr.RefreshToken},
		"client_id": {"app"}, "scope": {"mcp:tools"}}, "", "")
	if narrow.status != http.StatusOK || narrow.Scope != "mcp:tools" {
		t.Fatalf("narrowing refresh: %+v", narrow)
	}
	if r := post(t, tokenURL, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {narrow.RefreshToken},
		"client_id": {"app"}, "scope": {"mcp:tools admin"}}, "", ""); r.Error != "invalid_scope" {
		t.Fatalf("widening refresh: %+v", r)
	}
}

func TestClientCredentials(t *testing.T) {
	s := oauthtest.Start(t, oauthtest.Options{})
	const secret = "canary-client-secret-7f3a"
	s.RegisterClient("machine", secret)
	md := asMetadata(t, s)
	tokenURL := md["token_endpoint"].(string)

	if r := post(t, tokenURL, url.Values{"grant_type": {"client_credentials"}, "scope": {"mcp:tools admin"}}, "machine", secret); r.Error != "invalid_target" {
		t.Fatalf("without resource: %+v", r)
	}
	if r := post(t, tokenURL, url.Values{"grant_type": {"client_credentials"}, "resource": {s.MCPURL}}, "machine", "wrong"); r.Error != "invalid_client" {
		t.Fatalf("wrong secret: %+v", r)
	}
	tr := post(t, tokenURL, url.Values{"grant_type": {"client_credentials"}, "scope": {"mcp:tools admin"}, "resource": {s.MCPURL}}, "machine", secret)
	if tr.status != http.StatusOK || tr.RefreshToken != "" || tr.Scope != "mcp:tools admin" {
		t.Fatalf("client credentials: %+v", tr)
	}
	if last := s.LastTokenRequest(); last.Get("resource") != s.MCPURL || strings.Contains(last.Encode(), "canary") {
		t.Fatalf("last token request %v", last)
	}
	// client_secret_post works too.
	post2 := post(t, tokenURL, url.Values{"grant_type": {"client_credentials"}, "resource": {s.MCPURL},
		"client_id": {"machine"}, "client_secret": {secret}}, "", "")
	if post2.status != http.StatusOK || post2.Scope != "mcp:tools" {
		t.Fatalf("client_secret_post: %+v", post2)
	}
	if last := s.LastTokenRequest(); last.Get("client_secret") != "<set>" {
		t.Fatalf("last token request %v", last)
	}
	c := dial(t, s, tr.AccessToken)
	res, err := callTool(c, "whoami")
	if err != nil || text(res) != "user=machine scopes=mcp:tools admin" {
		t.Fatalf("whoami: %v %v", res, err)
	}
	res, err = callTool(c, "admin_action")
	if err != nil || text(res) != "admin done for machine" {
		t.Fatalf("admin_action: %v %v", res, err)
	}
	if n := s.Counts().ClientCredentials; n != 2 {
		t.Fatalf("client credentials grants: %d", n)
	}
}

func TestRevokeRefreshTokensOfOneUser(t *testing.T) {
	s := oauthtest.Start(t, oauthtest.Options{})
	s.RegisterClient("app", "")
	md := asMetadata(t, s)
	alice := login(t, s, md, "app", "alice", "mcp:tools")
	bob := login(t, s, md, "app", "bob", "mcp:tools")
	s.RevokeRefreshTokens("alice")
	tokenURL := md["token_endpoint"].(string)
	if r := post(t, tokenURL, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {alice.RefreshToken}, "client_id": {"app"}}, "", ""); r.Error != "invalid_grant" {
		t.Fatalf("alice's refresh: %+v", r)
	}
	r := post(t, tokenURL, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {bob.RefreshToken}, "client_id": {"app"}}, "", "")
	if r.status != http.StatusOK {
		t.Fatalf("bob's refresh: %+v", r)
	}
	if got := whoami(t, s, r.AccessToken); got != "user=bob scopes=mcp:tools" {
		t.Fatalf("whoami: %s", got)
	}
}

func TestShortAccessTTLAndNoRefresh(t *testing.T) {
	s := oauthtest.Start(t, oauthtest.Options{AccessTTL: time.Second, NoRefresh: true})
	s.RegisterClient("app", "")
	md := asMetadata(t, s)
	for _, g := range md["grant_types_supported"].([]any) {
		if g == "refresh_token" {
			t.Fatalf("grant types %v", md["grant_types_supported"])
		}
	}
	tr := login(t, s, md, "app", "alice", "mcp:tools")
	if tr.RefreshToken != "" || tr.ExpiresIn > 1 {
		t.Fatalf("tokens %+v", tr)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, ch := probe(t, s, http.MethodPost, tr.AccessToken, initBody)
		if code == http.StatusUnauthorized && strings.Contains(ch, `error="invalid_token"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the access token still works after its lifetime: %d", code)
		}
		time.Sleep(100 * time.Millisecond) // waiting for the clock, not for another goroutine
	}
}

func TestCodeWorksOnce(t *testing.T) {
	s := oauthtest.Start(t, oauthtest.Options{})
	s.RegisterClient("app", "")
	md := asMetadata(t, s)
	verifier, challenge := pkce(t)
	loc, err := s.Authorize(context.Background(), authURL(md, map[string]string{
		"response_type": "code", "client_id": "app", "redirect_uri": redirectURI,
		"state": "the-state-0123456789", "code_challenge": challenge, "code_challenge_method": "S256",
		"resource": s.MCPURL,
	}), "alice")
	if err != nil {
		t.Fatal(err)
	}
	form := url.Values{"grant_type": {"authorization_code"}, "code": {loc.Query().Get("code")}, "redirect_uri": {redirectURI},
		"client_id": {"app"}, "code_verifier": {verifier}, "resource": {s.MCPURL}}
	first := post(t, md["token_endpoint"].(string), form, "", "")
	if first.status != http.StatusOK || first.Scope != "mcp:tools" {
		t.Fatalf("exchange: %+v", first)
	}
	if again := post(t, md["token_endpoint"].(string), form, "", ""); again.Error != "invalid_grant" {
		t.Fatalf("second exchange of a code: %+v", again)
	}
	// The replay ends what the code gave (RFC 6749 section 4.1.2).
	if code, _ := probe(t, s, http.MethodPost, first.AccessToken, initBody); code != http.StatusUnauthorized {
		t.Fatalf("access token after the code's replay: %d", code)
	}
}

func TestDiscoveryShapes(t *testing.T) {
	origin := func(u string) string {
		p, _ := url.Parse(u)
		return p.Scheme + "://" + p.Host
	}
	t.Run("issuer path, RFC 8414", func(t *testing.T) {
		s := oauthtest.Start(t, oauthtest.Options{IssuerPath: "/tenant1"})
		as := origin(s.Issuer)
		if s.Issuer != as+"/tenant1" {
			t.Fatalf("issuer %s", s.Issuer)
		}
		md := getJSON(t, as+"/.well-known/oauth-authorization-server/tenant1")
		if md["issuer"] != s.Issuer || md["token_endpoint"] != s.Issuer+"/token" {
			t.Fatalf("metadata %v", md)
		}
		for _, u := range []string{as + "/.well-known/oauth-authorization-server", as + "/.well-known/openid-configuration",
			as + "/tenant1/.well-known/openid-configuration", as + "/.well-known/openid-configuration/tenant1"} {
			if code := status(t, http.MethodGet, u); code != http.StatusNotFound {
				t.Errorf("%s: %d", u, code)
			}
		}
		// The whole flow works under the path.
		s.RegisterClient("app", "")
		if got := whoami(t, s, login(t, s, md, "app", "alice", "mcp:tools").AccessToken); got != "user=alice scopes=mcp:tools" {
			t.Fatal(got)
		}
	})
	t.Run("issuer path, OpenID only", func(t *testing.T) {
		s := oauthtest.Start(t, oauthtest.Options{IssuerPath: "/tenant1", OIDCOnly: true})
		as := origin(s.Issuer)
		if md := getJSON(t, s.Issuer+"/.well-known/openid-configuration"); md["issuer"] != s.Issuer {
			t.Fatalf("metadata %v", md)
		}
		if code := status(t, http.MethodGet, as+"/.well-known/oauth-authorization-server/tenant1"); code != http.StatusNotFound {
			t.Fatalf("RFC 8414 metadata: %d", code)
		}
	})
	t.Run("OpenID only", func(t *testing.T) {
		s := oauthtest.Start(t, oauthtest.Options{OIDCOnly: true})
		if md := getJSON(t, s.Issuer+"/.well-known/openid-configuration"); md["issuer"] != s.Issuer {
			t.Fatalf("metadata %v", md)
		}
		if code := status(t, http.MethodGet, s.Issuer+"/.well-known/oauth-authorization-server"); code != http.StatusNotFound {
			t.Fatalf("RFC 8414 metadata: %d", code)
		}
		if n := s.Counts().MetadataFetches; n != 1 {
			t.Fatalf("metadata fetches %d", n)
		}
	})
	t.Run("features off", func(t *testing.T) {
		s := oauthtest.Start(t, oauthtest.Options{NoS256: true, NoDCR: true, NoIssParam: true, NoRevocation: true, Scopes: []string{"read"}})
		md := asMetadata(t, s)
		for _, k := range []string{"code_challenge_methods_supported", "registration_endpoint", "revocation_endpoint",
			"authorization_response_iss_parameter_supported", "client_id_metadata_document_supported"} {
			if v, ok := md[k]; ok {
				t.Errorf("%s: %v", k, v)
			}
		}
		if sc := md["scopes_supported"].([]any); len(sc) != 1 || sc[0] != "read" {
			t.Errorf("scopes %v", sc)
		}
		for _, p := range []string{"/register", "/revoke"} {
			if code := status(t, http.MethodPost, s.Issuer+p); code != http.StatusNotFound {
				t.Errorf("%s: %d", p, code)
			}
		}
		s.RegisterClient("app", "")
		_, challenge := pkce(t)
		loc, err := s.Authorize(context.Background(), authURL(md, map[string]string{
			"response_type": "code", "client_id": "app", "redirect_uri": redirectURI, "scope": "read",
			"state": "the-state-0123456789", "code_challenge": challenge, "code_challenge_method": "S256",
			"resource": s.MCPURL,
		}), "alice")
		if err != nil || loc.Query().Has("iss") {
			t.Fatalf("redirect %v %v", loc, err)
		}
	})
	t.Run("wrong iss", func(t *testing.T) {
		s := oauthtest.Start(t, oauthtest.Options{WrongIss: true})
		s.RegisterClient("app", "")
		md := asMetadata(t, s)
		if md["authorization_response_iss_parameter_supported"] != true {
			t.Fatalf("metadata %v", md)
		}
		_, challenge := pkce(t)
		loc, err := s.Authorize(context.Background(), authURL(md, map[string]string{
			"response_type": "code", "client_id": "app", "redirect_uri": redirectURI,
			"state": "the-state-0123456789", "code_challenge": challenge, "code_challenge_method": "S256",
			"resource": s.MCPURL,
		}), "alice")
		if err != nil || loc.Query().Get("iss") != oauthtest.WrongIssuer || loc.Query().Get("code") == "" {
			t.Fatalf("redirect %v %v", loc, err)
		}
	})
	for _, tc := range []struct {
		at, path string
	}{
		{"root", "/.well-known/oauth-protected-resource"},
		{"header-only", "/prm-x"},
	} {
		t.Run("PRM at "+tc.at, func(t *testing.T) {
			s := oauthtest.Start(t, oauthtest.Options{PRMAt: tc.at})
			rs := origin(s.MCPURL)
			if s.PRMURL() != rs+tc.path {
				t.Fatalf("PRM URL %s", s.PRMURL())
			}
			_, ch := probe(t, s, http.MethodPost, "", initBody)
			if !strings.Contains(ch, `resource_metadata="`+rs+tc.path+`"`) {
				t.Fatalf("challenge %q", ch)
			}
			if prm := getJSON(t, s.PRMURL()); prm["resource"] != s.MCPURL {
				t.Fatalf("PRM %v", prm)
			}
			for _, p := range []string{"/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource", "/prm-x"} {
				if p != tc.path {
					if code := status(t, http.MethodGet, rs+p); code != http.StatusNotFound {
						t.Errorf("%s: %d", p, code)
					}
				}
			}
		})
	}
	t.Run("no challenge metadata", func(t *testing.T) {
		s := oauthtest.Start(t, oauthtest.Options{NoChallengeMetadata: true, ChallengeScope: "mcp:tools admin"})
		if _, ch := probe(t, s, http.MethodPost, "", initBody); ch != `Bearer scope="mcp:tools admin"` {
			t.Fatalf("challenge %q", ch)
		}
	})
}

func TestObserve(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	s := oauthtest.Start(t, oauthtest.Options{Observe: func(endpoint string, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		seen[endpoint+" "+r.Method]++
	}})
	asMetadata(t, s)
	getJSON(t, s.PRMURL())
	status(t, http.MethodGet, s.Issuer+"/.well-known/openid-configuration")
	probe(t, s, http.MethodPost, "", initBody)
	mu.Lock()
	defer mu.Unlock()
	want := map[string]int{"metadata GET": 1, "prm GET": 1, " GET": 1, "mcp POST": 1}
	if !reflect.DeepEqual(seen, want) {
		t.Fatalf("seen %v, want %v", seen, want)
	}
}

func TestClientIDMetadataDocument(t *testing.T) {
	var docURL string
	var docClientID string
	docs := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"client_id": docClientID, "client_name": "connector-svc", "redirect_uris": []string{redirectURI},
			"grant_types": []string{"authorization_code", "refresh_token"}, "token_endpoint_auth_method": "none",
		})
	}))
	t.Cleanup(docs.Close)
	docURL = docs.URL + "/client.json"

	s := oauthtest.Start(t, oauthtest.Options{CIMD: true, CIMDClient: docs.Client()})
	md := asMetadata(t, s)
	if md["client_id_metadata_document_supported"] != true {
		t.Fatalf("metadata %v", md)
	}

	// A document whose client_id is not its URL is refused.
	docClientID = "https://elsewhere.example/client.json"
	_, challenge := pkce(t)
	params := map[string]string{
		"response_type": "code", "client_id": docURL, "redirect_uri": redirectURI,
		"state": "the-state-0123456789", "code_challenge": challenge, "code_challenge_method": "S256",
		"resource": s.MCPURL,
	}
	if _, err := s.Authorize(context.Background(), authURL(md, params), "alice"); err == nil || !strings.Contains(err.Error(), "invalid_client") {
		t.Fatalf("mismatched document: %v", err)
	}

	docClientID = docURL
	// A redirect_uri the document does not list is refused.
	params["redirect_uri"] = "http://127.0.0.1:9/other"
	if _, err := s.Authorize(context.Background(), authURL(md, params), "alice"); err == nil {
		t.Fatal("unlisted redirect_uri accepted")
	}
	if got := whoami(t, s, login(t, s, md, docURL, "alice", "mcp:tools").AccessToken); got != "user=alice scopes=mcp:tools" {
		t.Fatal(got)
	}
	if n := s.Counts().CIMDFetches; n != 2 {
		t.Fatalf("document fetches %d (the good one is kept)", n)
	}
}

func TestConfidentialDCRClient(t *testing.T) {
	s := oauthtest.Start(t, oauthtest.Options{})
	md := asMetadata(t, s)
	// Without token_endpoint_auth_method, RFC 7591's default: client_secret_basic.
	reg := register(t, md, map[string]any{"redirect_uris": []string{redirectURI}, "application_type": "web"})
	id, secret := reg["client_id"].(string), reg["client_secret"].(string)
	if reg["token_endpoint_auth_method"] != "client_secret_basic" || secret == "" {
		t.Fatalf("registration %v", reg)
	}
	verifier, challenge := pkce(t)
	loc, err := s.Authorize(context.Background(), authURL(md, map[string]string{
		"response_type": "code", "client_id": id, "redirect_uri": redirectURI,
		"state": "the-state-0123456789", "code_challenge": challenge, "code_challenge_method": "S256",
		"resource": s.MCPURL,
	}), "alice")
	if err != nil {
		t.Fatal(err)
	}
	form := url.Values{"grant_type": {"authorization_code"}, "code": {loc.Query().Get("code")}, "redirect_uri": {redirectURI},
		"code_verifier": {verifier}, "resource": {s.MCPURL}}
	// Without the secret: refused.
	noSecret := url.Values{"client_id": {id}}
	for k, v := range form {
		noSecret[k] = v
	}
	if r := post(t, md["token_endpoint"].(string), noSecret, "", ""); r.Error != "invalid_client" {
		t.Fatalf("without the secret: %+v", r)
	}
	if r := post(t, md["token_endpoint"].(string), form, id, secret); r.status != http.StatusOK || r.RefreshToken == "" {
		t.Fatalf("with the secret: %+v", r)
	}
}

func TestConcurrentUsers(t *testing.T) {
	s := oauthtest.Start(t, oauthtest.Options{})
	s.RegisterClient("app", "")
	md := asMetadata(t, s)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			user := fmt.Sprintf("user%d", i)
			tr := login(t, s, md, "app", user, "mcp:tools")
			for range 3 {
				res, err := callTool(dial(t, s, tr.AccessToken), "whoami")
				if err != nil || text(res) != "user="+user+" scopes=mcp:tools" {
					t.Errorf("%s: whoami %v %v", user, res, err)
					return
				}
				r := post(t, md["token_endpoint"].(string), url.Values{"grant_type": {"refresh_token"},
					"refresh_token": {tr.RefreshToken}, "client_id": {"app"}}, "", "")
				if r.status != http.StatusOK {
					t.Errorf("%s: refresh %+v", user, r)
					return
				}
				tr = r
			}
		}()
	}
	wg.Wait()
	if c := s.Counts(); c.Authorizations != 8 || c.Refreshes != 24 || c.Unauthorized401 != 0 {
		t.Fatalf("counts %+v", c)
	}
}

func TestRefreshEndsTheOldAccessToken(t *testing.T) {
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprint("keep=", keep), func(t *testing.T) {
			s := oauthtest.Start(t, oauthtest.Options{KeepAccessOnRefresh: keep})
			s.RegisterClient("app", "")
			md := asMetadata(t, s)
			tr := login(t, s, md, "app", "alice", "mcp:tools")
			c := dial(t, s, tr.AccessToken)
			r := post(t, md["token_endpoint"].(string), url.Values{"grant_type": {"refresh_token"},
				"refresh_token": {tr.RefreshToken}, "client_id": {"app"}}, "", "")
			if r.status != http.StatusOK {
				t.Fatalf("refresh %+v", r)
			}
			_, err := callTool(c, "whoami")
			if keep != (err == nil) {
				t.Fatalf("the old access token after a refresh: %v", err)
			}
			if got := whoami(t, s, r.AccessToken); got != "user=alice scopes=mcp:tools" {
				t.Fatal(got)
			}
		})
	}
}
