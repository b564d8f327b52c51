package console

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/server"
)

// fakeKeys verifies the tokens of a map; revoked ones are refused.
type fakeKeys struct {
	mu      sync.Mutex
	keys    map[string]auth.Key
	revoked map[string]bool
}

func (f *fakeKeys) Verify(_ context.Context, token string) (auth.Key, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k, ok := f.keys[token]
	switch {
	case !ok:
		return auth.Key{}, auth.ErrUnknownKey
	case f.revoked[token]:
		return k, auth.ErrRevoked
	}
	return k, nil
}

// fakeAPI answers ListConnectors with n connectors and everything else
// UNIMPLEMENTED, over a real gRPC connection; these tests are about the
// console's own checks (the browser test runs the real API).
type fakeAPI struct {
	connectorv1.UnimplementedConnectorServiceServer
	n int
}

// client serves api in-process and returns a client of it.
func client(t *testing.T, api connectorv1.ConnectorServiceServer) connectorv1.ConnectorServiceClient {
	t.Helper()
	pipe := bufconn.Listen(1 << 20)
	g := grpc.NewServer()
	connectorv1.RegisterConnectorServiceServer(g, api)
	go func() { _ = g.Serve(pipe) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient("passthrough:///test", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return pipe.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return connectorv1.NewConnectorServiceClient(conn)
}

func (f fakeAPI) ListConnectors(context.Context, *connectorv1.ListConnectorsRequest) (*connectorv1.ListConnectorsResponse, error) {
	resp := &connectorv1.ListConnectorsResponse{}
	for i := range f.n {
		resp.Connectors = append(resp.Connectors, &connectorv1.Connector{ConnectorId: fmt.Sprintf("connector-%03d", i),
			Name: "A connector with a name", Active: true, ToolCount: 12,
			Health: &connectorv1.ConnectorHealth{State: connectorv1.ConnectorState_CONNECTOR_STATE_READY, ProtocolVersion: "2025-11-25"}})
	}
	return resp, nil
}

const (
	adminToken = "csk_admin"
	queryToken = "csk_query"
	callToken  = "csk_call"
)

type fixture struct {
	h    *Handler
	srv  *httptest.Server
	keys *fakeKeys
	now  time.Time
	mu   sync.Mutex
}

func newFixture(t *testing.T, connectors int) *fixture {
	return newFixtureAPI(t, fakeAPI{n: connectors})
}

func newFixtureAPI(t *testing.T, api connectorv1.ConnectorServiceServer) *fixture {
	t.Helper()
	keys := &fakeKeys{keys: map[string]auth.Key{
		adminToken: {ID: "admin", WorkspaceID: "acme", Scopes: []auth.Scope{auth.ScopeAdmin}},
		queryToken: {ID: "query", WorkspaceID: "acme", Scopes: []auth.Scope{auth.ScopeQuery}},
		callToken:  {ID: "call", WorkspaceID: "acme", Scopes: []auth.Scope{auth.ScopeCall}},
	}, revoked: map[string]bool{}}
	h, err := New(Deps{API: client(t, api), Keys: keys},
		Config{CookieKey: []byte(strings.Repeat("k", 32)), SessionTTL: time.Hour, ScopeOf: server.ScopeOf, Refresh: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{h: h, keys: keys, now: time.Now()}
	h.seal.now = func() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.now }
	f.srv = httptest.NewServer(h)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fixture) advance(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	f.mu.Unlock()
}

// browser is a client with a cookie jar that does not follow redirects.
func (f *fixture) browser(t *testing.T) *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// signIn signs c in with token and returns the CSRF token of its pages.
func (f *fixture) signIn(t *testing.T, c *http.Client, token string) string {
	t.Helper()
	resp, err := c.PostForm(f.srv.URL+"/signin", url.Values{"key": {token}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign in: %s", resp.Status)
	}
	_, body := get(t, c, f.srv.URL+"/runs")
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no CSRF token on a signed-in page:\n%s", body)
	}
	return m[1]
}

func get(t *testing.T, c *http.Client, u string) (*http.Response, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func post(t *testing.T, c *http.Client, u string, form url.Values, header ...string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// TestRoutesAndScopes lists every route of the console and the scope it
// needs: the strongest of the API's scopes of the RPCs it calls, read from
// the table the gRPC guard enforces. A new route fails here until it is
// listed.
func TestRoutesAndScopes(t *testing.T) {
	f := newFixture(t, 0)
	want := []string{
		"GET /static/ public",
		"GET /signin public",
		"POST /signin public",
		"POST /signout signed-in",
		"GET /{$} signed-in",
		"GET /connectors admin",
		"GET /connectors/events admin",
		"GET /connectors/new admin",
		"POST /connectors admin",
		"GET /connectors/{id} admin",
		"GET /connectors/{id}/edit admin",
		"POST /connectors/{id}/edit admin",
		"POST /connectors/{id}/activate admin",
		"POST /connectors/{id}/deactivate admin",
		"POST /connectors/{id}/check admin",
		"POST /connectors/{id}/refresh admin",
		"GET /connectors/{id}/delete admin",
		"POST /connectors/{id}/delete admin",
		"GET /connectors/{id}/tools/{tool} admin",
		"POST /connectors/{id}/tools/{tool} admin",
		"POST /connectors/{id}/tools/{tool}/call admin",
		"GET /runs query",
		"GET /runs/{id} query",
		"POST /runs/{id}/resume query",
		"GET /sessions call",
		"POST /sessions/close call",
		"GET /authorizations query",
		"POST /authorizations/revoke query",
		"GET /keys admin",
		"POST /keys admin",
		"POST /keys/{id}/revoke admin",
		"GET /replicas admin",
	}
	var got []string
	for _, r := range f.h.Routes() {
		scope := string(r.Scope)
		switch {
		case r.Public:
			scope = "public"
		case scope == "":
			scope = "signed-in"
		}
		got = append(got, r.Method+" "+r.Pattern+" "+scope)
		for _, m := range append(r.RPCs, r.Optional...) {
			if server.ScopeOf(m) == "" {
				t.Errorf("route %s %s calls %s, which the API's guard does not know", r.Method, r.Pattern, m)
			}
		}
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("routes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestRoutesRefuseWeakerKeys calls every route that needs a scope with a
// key that lacks it (refused with a page that says what is needed) and
// with one that has it (let through to the API).
func TestRoutesRefuseWeakerKeys(t *testing.T) {
	f := newFixture(t, 1)
	tokens := map[auth.Scope]string{auth.ScopeAdmin: adminToken, auth.ScopeQuery: queryToken, auth.ScopeCall: callToken}
	weaker := map[auth.Scope]string{auth.ScopeAdmin: queryToken, auth.ScopeQuery: callToken}
	csrf := map[string]string{}
	clients := map[string]*http.Client{}
	for _, tok := range tokens {
		clients[tok] = f.browser(t)
		csrf[tok] = f.signIn(t, clients[tok], tok)
	}
	path := strings.NewReplacer("{id}", "x", "{tool}", "t", "{$}", "")
	for _, r := range f.h.Routes() {
		if r.Public || r.Scope == "" || r.Pattern == "/connectors/events" {
			continue
		}
		call := func(tok string) (*http.Response, string) {
			if r.Method == http.MethodGet {
				return get(t, clients[tok], f.srv.URL+path.Replace(r.Pattern))
			}
			return post(t, clients[tok], f.srv.URL+path.Replace(r.Pattern), url.Values{"csrf": {csrf[tok]}})
		}
		if tok, ok := weaker[r.Scope]; ok {
			resp, body := call(tok)
			if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "needs an API key with scope "+string(r.Scope)) {
				t.Errorf("%s %s with a weaker key: %s, want 403 naming scope %s", r.Method, r.Pattern, resp.Status, r.Scope)
			}
		}
		if resp, body := call(tokens[r.Scope]); strings.Contains(body, "needs an API key with scope") {
			t.Errorf("%s %s with a %s key: %s, refused for its scope", r.Method, r.Pattern, r.Scope, resp.Status)
		}
	}
}

func TestSignIn(t *testing.T) {
	f := newFixture(t, 0)
	c := f.browser(t)

	resp, _ := get(t, c, f.srv.URL+"/connectors?x=1")
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || loc != "/signin?next=%2Fconnectors%3Fx%3D1" {
		t.Errorf("signed out: %s to %q; want the sign-in page, then back", resp.Status, loc)
	}
	resp, body := post(t, c, f.srv.URL+"/signin", url.Values{"key": {"csk_nope"}})
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "That API key is not known") {
		t.Errorf("unknown key: %s\n%s", resp.Status, body)
	}
	resp, _ = post(t, c, f.srv.URL+"/signin", url.Values{"key": {adminToken}}, "Origin", "https://evil.example")
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("a sign-in posted from another site: %s; want 403", resp.Status)
	}
	resp, _ = post(t, c, f.srv.URL+"/signin", url.Values{"key": {adminToken}, "next": {"//evil.example/"}})
	if loc := resp.Header.Get("Location"); loc != "/" {
		t.Errorf("sign-in with next=//evil.example/ goes to %q; want /", loc)
	}
	var cookie *http.Cookie
	for _, ck := range resp.Cookies() {
		if ck.Name == cookieName {
			cookie = ck
		}
	}
	if cookie == nil || !cookie.Secure || !cookie.HttpOnly || cookie.SameSite != http.SameSiteStrictMode || cookie.MaxAge != 2*3600 {
		t.Fatalf("session cookie = %+v; want Secure, HttpOnly, SameSite=Strict, for the session's TTL and an hour", cookie)
	}
	if strings.Contains(cookie.Value, adminToken) {
		t.Error("the cookie holds the key's token in the clear")
	}
	if resp, _ := get(t, c, f.srv.URL+"/connectors"); resp.StatusCode != http.StatusOK {
		t.Errorf("signed in: %s", resp.Status)
	}

	// Signed out, the cookie is gone.
	_, body = get(t, c, f.srv.URL+"/connectors")
	csrf := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(body)[1]
	post(t, c, f.srv.URL+"/signout", url.Values{"csrf": {csrf}})
	if resp, _ := get(t, c, f.srv.URL+"/connectors"); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("after sign-out: %s; want the sign-in page", resp.Status)
	}
}

func TestExpiredAndRevoked(t *testing.T) {
	f := newFixture(t, 0)
	c := f.browser(t)
	f.signIn(t, c, adminToken)
	f.advance(time.Hour + time.Second)
	resp, _ := get(t, c, f.srv.URL+"/connectors")
	loc := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusSeeOther || !strings.Contains(loc, "why=the+sign-in+has+expired") {
		t.Fatalf("an expired sign-in: %s to %q", resp.Status, loc)
	}
	if _, body := get(t, c, f.srv.URL+loc); !strings.Contains(body, "The sign-in has expired. Sign in again.") {
		t.Errorf("the sign-in page after expiry does not say why:\n%s", body)
	}

	// A forged cookie is not one the console sealed.
	c = f.browser(t)
	u, _ := url.Parse(f.srv.URL)
	c.Jar.SetCookies(u, []*http.Cookie{{Name: cookieName, Value: "AAAA" + strings.Repeat("B", 60)}})
	if resp, _ := get(t, c, f.srv.URL+"/runs"); !strings.Contains(resp.Header.Get("Location"), "not+one+this+service+sealed") {
		t.Errorf("a forged cookie: %s to %q", resp.Status, resp.Header.Get("Location"))
	}

	// A key revoked after sign-in ends the sign-in on the next request.
	c = f.browser(t)
	f.signIn(t, c, queryToken)
	f.keys.mu.Lock()
	f.keys.revoked[queryToken] = true
	f.keys.mu.Unlock()
	if resp, _ := get(t, c, f.srv.URL+"/runs"); !strings.Contains(resp.Header.Get("Location"), "API+key+query+is+revoked") {
		t.Errorf("a revoked key: %s to %q", resp.Status, resp.Header.Get("Location"))
	}
}

func TestForgedForms(t *testing.T) {
	f := newFixture(t, 0)
	c := f.browser(t)
	csrf := f.signIn(t, c, adminToken)
	other := f.browser(t)
	otherCSRF := f.signIn(t, other, adminToken)
	if csrf == otherCSRF {
		t.Fatal("two sign-ins share a CSRF token")
	}
	for _, tc := range []struct {
		name   string
		form   url.Values
		header []string
		want   string
	}{
		{"no token", url.Values{}, nil, "CSRF token is missing or wrong"},
		{"another sign-in's token", url.Values{"csrf": {otherCSRF}}, nil, "CSRF token is missing or wrong"},
		{"from another site", url.Values{"csrf": {csrf}}, []string{"Origin", "https://evil.example"}, "sent from https://evil.example"},
		{"cross-site fetch", url.Values{"csrf": {csrf}}, []string{"Sec-Fetch-Site", "cross-site"}, "sent from another site"},
	} {
		resp, body := post(t, c, f.srv.URL+"/keys", tc.form, tc.header...)
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, tc.want) {
			t.Errorf("%s: %s, want 403 saying %q\n%s", tc.name, resp.Status, tc.want, body)
		}
	}
}

// TestFlashNotFromTheURL shows a form's message on the page it lands on,
// once, and never words a link carries.
func TestFlashNotFromTheURL(t *testing.T) {
	f := newFixture(t, 0)
	c := f.browser(t)
	f.signIn(t, c, adminToken)
	if _, body := get(t, c, f.srv.URL+"/connectors?done=Your+key+leaked"); strings.Contains(body, "leaked") {
		t.Error("a message in the URL is shown on the page")
	}
	// The fake API refuses the forms that leave a message: leave one the
	// way their handlers do, and read it twice.
	rec := httptest.NewRecorder()
	done(rec, httptest.NewRequest(http.MethodPost, "/x", nil), "/connectors", "Saved.")
	u, _ := url.Parse(f.srv.URL)
	c.Jar.SetCookies(u, rec.Result().Cookies())
	if _, body := get(t, c, f.srv.URL+"/connectors"); !strings.Contains(body, `<p class="flash" role="status">Saved.</p>`) {
		t.Errorf("the message is not shown:\n%s", body)
	}
	if _, body := get(t, c, f.srv.URL+"/connectors"); strings.Contains(body, "Saved.") {
		t.Error("the message is shown twice")
	}
}

// TestPageWeight keeps pages light on a slow connection: the connectors
// page with 200 connectors, and the stylesheet and script, under 100 KB.
func TestPageWeight(t *testing.T) {
	f := newFixture(t, 200)
	c := f.browser(t)
	f.signIn(t, c, adminToken)
	for _, p := range []string{"/connectors", "/static/console.css", "/static/console.js", "/signin"} {
		resp, body := get(t, c, f.srv.URL+p)
		t.Logf("%s: %d bytes", p, len(body))
		if resp.StatusCode != http.StatusOK || len(body) > 100_000 {
			t.Errorf("%s: %s, %d bytes; want 200 and under 100 KB", p, resp.Status, len(body))
		}
	}
}

// TestLiveList reads the connectors' rows as server-sent events.
func TestLiveList(t *testing.T) {
	f := newFixture(t, 2)
	c := f.browser(t)
	f.signIn(t, c, adminToken)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, f.srv.URL+"/connectors/events", nil)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	buf := make([]byte, 64<<10)
	var got strings.Builder
	for !strings.Contains(got.String(), "connector-001") {
		n, err := resp.Body.Read(buf)
		got.Write(buf[:n])
		if err != nil {
			t.Fatalf("%v after %q", err, got.String())
		}
	}
	if !strings.Contains(got.String(), "event: rows\ndata: <tr data-connector=\"connector-000\">") {
		t.Errorf("events = %q", got.String())
	}
	// A revoked key ends the stream.
	f.keys.mu.Lock()
	f.keys.revoked[adminToken] = true
	f.keys.mu.Unlock()
	rest, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(rest), "event: signedout") {
		t.Errorf("after revocation the stream ended with %q", rest)
	}
}

// TestAPIErrorsShown shows the API's message on an error page.
func TestAPIErrorsShown(t *testing.T) {
	f := newFixtureAPI(t, errAPI{})
	c := f.browser(t)
	f.signIn(t, c, adminToken)
	resp, body := get(t, c, f.srv.URL+"/connectors/nope")
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(body, "Connector nope of workspace acme not found") {
		t.Errorf("%s\n%s", resp.Status, body)
	}
}

type errAPI struct{ fakeAPI }

func (errAPI) GetConnector(context.Context, *connectorv1.GetConnectorRequest) (*connectorv1.GetConnectorResponse, error) {
	return nil, status.Error(codes.NotFound, "connector nope of workspace acme not found")
}
