package oauth

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/connector-svc/connector-svc/internal/oauthtest"
)

// recorder is an HTTP server that records the Authorization header of
// every request it gets and answers 404.
type recorder struct {
	*httptest.Server
	mu    sync.Mutex
	auths []string
}

func newRecorder(t *testing.T) *recorder {
	r := &recorder{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.auths = append(r.auths, req.Header.Get("Authorization"))
		r.mu.Unlock()
		http.NotFound(w, req)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *recorder) requests() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.auths...)
}

// A token is sent only to the resource it was granted for: when the
// connector's URL changes, its users must authorize again, and nothing
// goes to the new server meanwhile, cached token or not.
func TestTokenBoundToResource(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	as := oauthtest.Start(t, oauthtest.Options{})
	m := e.manager(nil)
	c := e.connector("ws", "files", as.MCPURL, ModeUser)
	e.authorize(ctx, m, as, c, "alice")
	e.mustWhoami(ctx, m, c, "alice") // the token is cached now
	access, refresh := e.tokens(c, "alice")

	logger := newRecorder(t)
	moved := c
	moved.URL = logger.URL + "/mcp"
	_, err := e.call(ctx, m, moved, "alice", "whoami")
	required(t, err, ReasonNoToken)
	if got := logger.requests(); len(got) != 0 {
		t.Errorf("the new server got %d requests (Authorization %q), want none", len(got), got)
	}
	if ok, err := m.Usable(ctx, moved, "alice"); ok || err != nil {
		t.Errorf("Usable at the new URL = %t, %v; want false", ok, err)
	}

	// The same origin, a path the resource does not cover.
	sibling := c
	sibling.URL = as.MCPURL + "x"
	if ok, _ := m.Usable(ctx, sibling, "alice"); ok {
		t.Errorf("Usable at %s with a token for %s", sibling.URL, as.MCPURL)
	}
	before := as.Counts().MCPRequests
	_, err = e.call(ctx, m, sibling, "alice", "whoami")
	required(t, err, ReasonNoToken)
	if n := as.Counts().MCPRequests - before; n != 0 {
		t.Errorf("%d requests went to %s, want none", n, sibling.URL)
	}
	// A path below it is covered.
	below := c
	below.URL = as.MCPURL + "/v2"
	if ok, _ := m.Usable(ctx, below, "alice"); !ok {
		t.Errorf("Usable at %s false with a token for %s", below.URL, as.MCPURL)
	}

	// Back at its own URL, it works again; a new authorization at the new
	// URL replaces it.
	e.mustWhoami(ctx, m, c, "alice")
	e.assertNowhere(access, refresh)
}

// A client credentials connector whose URL changes gets a token for the
// new server; the old one is never sent there.
func TestClientCredentialsTokenBoundToResource(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	as := oauthtest.Start(t, oauthtest.Options{})
	var mu sync.Mutex
	var auths []string
	as2 := oauthtest.Start(t, oauthtest.Options{Observe: func(endpoint string, r *http.Request) {
		if endpoint == "mcp" {
			mu.Lock()
			auths = append(auths, r.Header.Get("Authorization"))
			mu.Unlock()
		}
	}})
	const secretValue = "cc-secret-canary-44e1a0"
	as.RegisterClient("svc-client", secretValue)
	as2.RegisterClient("svc-client", secretValue)
	m := e.manager(nil)
	c := e.connector("ws", "machine", as.MCPURL, ModeClientCredentials)
	c.ClientID, c.ClientSecret = "svc-client", secretValue
	if text, err := e.call(ctx, m, c, "", "whoami"); err != nil || text != "user=svc-client scopes=mcp:tools" {
		t.Fatalf("whoami = %q, %v", text, err)
	}
	old, _ := e.tokens(c, "")

	c.URL = as2.MCPURL
	if text, err := e.call(ctx, m, c, "", "whoami"); err != nil || text != "user=svc-client scopes=mcp:tools" {
		t.Fatalf("whoami at the new URL = %q, %v", text, err)
	}
	if n := as2.Counts().ClientCredentials; n != 1 {
		t.Errorf("%d client credentials grants at the new server, want 1", n)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, a := range auths {
		if strings.Contains(a, old) {
			t.Error("the token granted for the old URL was sent to the new server")
		}
	}
	row, _ := e.db.OAuthToken(ctx, c.ID, "")
	if row.Issuer != as2.Issuer || row.Resource != as2.MCPURL {
		t.Errorf("the stored token is for %s at %s, want %s at %s", row.Resource, row.Issuer, as2.MCPURL, as2.Issuer)
	}
}

// When discovery finds the server now names another authorization server,
// the tokens of the old one are not used.
func TestTokenBoundToIssuer(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	as := oauthtest.Start(t, oauthtest.Options{})
	as2 := oauthtest.Start(t, oauthtest.Options{})
	m1 := e.manager(nil)
	c := e.connector("ws", "files", as.MCPURL, ModeUser)
	e.authorize(ctx, m1, as, c, "alice")
	e.mustWhoami(ctx, m1, c, "alice")

	// The server's protected resource metadata names as2 from now on.
	var moved atomic.Bool
	hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if moved.Load() && r.URL.String() == as.PRMURL() {
			doc, _ := json.Marshal(map[string]any{"resource": as.MCPURL, "authorization_servers": []string{as2.Issuer}})
			return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}},
				Body: io.NopCloser(bytes.NewReader(doc)), Request: r}, nil
		}
		return http.DefaultTransport.RoundTrip(r)
	})}
	moved.Store(true)
	m2 := e.manager(func(c *Config) { c.HTTPClient = hc })
	st, err := m2.Start(ctx, c, "bob", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(st.URL, as2.Issuer+"/") {
		t.Fatalf("bob is sent to %s, want %s", st.URL, as2.Issuer)
	}
	before := as.Counts().MCPRequests
	_, err = e.whoami(ctx, m2, c, "alice")
	required(t, err, ReasonNoToken)
	if n := as.Counts().MCPRequests - before; n != 0 {
		t.Errorf("%d requests sent with a token of the old authorization server, want none", n)
	}
	if ok, _ := m2.Usable(ctx, c, "alice"); ok {
		t.Error("Usable true with a token of the old authorization server")
	}
}
