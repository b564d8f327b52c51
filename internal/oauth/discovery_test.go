package oauth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/connector-svc/connector-svc/internal/egress"
	"github.com/connector-svc/connector-svc/internal/oauthtest"
)

// The whole flow works over each place the specification lets a server
// put its metadata.
func TestDiscoveryShapes(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts oauthtest.Options
	}{
		{name: "path-inserted PRM from the challenge", opts: oauthtest.Options{}},
		{name: "path-inserted PRM without challenge metadata", opts: oauthtest.Options{NoChallengeMetadata: true}},
		{name: "root PRM", opts: oauthtest.Options{PRMAt: "root", NoChallengeMetadata: true}},
		{name: "header-only PRM", opts: oauthtest.Options{PRMAt: "header-only"}},
		{name: "issuer with a path", opts: oauthtest.Options{IssuerPath: "/tenant1"}},
		{name: "OpenID metadata only", opts: oauthtest.Options{OIDCOnly: true}},
		{name: "OpenID metadata only, issuer with a path", opts: oauthtest.Options{OIDCOnly: true, IssuerPath: "/realms/x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			e := newEnv(t)
			var mu sync.Mutex
			var paths []string
			tc.opts.Observe = func(endpoint string, r *http.Request) {
				mu.Lock()
				paths = append(paths, endpoint+" "+r.Method+" "+r.URL.Path)
				mu.Unlock()
			}
			as := oauthtest.Start(t, tc.opts)
			m := e.manager(nil)
			c := e.connector("ws", "files", as.MCPURL, ModeUser)
			e.authorize(ctx, m, as, c, "alice")
			e.mustWhoami(ctx, m, c, "alice")
			mu.Lock()
			defer mu.Unlock()
			for _, p := range paths {
				if strings.HasPrefix(p, " ") && !strings.Contains(p, "/.well-known/") {
					t.Errorf("asked for an endpoint that does not exist: %s", p)
				}
			}
			if c := as.Counts(); c.PRMFetches != 1 || c.MetadataFetches != 1 {
				t.Errorf("counts %+v: want the PRM and the metadata fetched once (discovery is reused)", c)
			}
		})
	}
}

// A server that publishes no protected resource metadata cannot be
// authorized: the error lists what was tried, and no authorization
// server endpoint is guessed.
func TestDiscoveryNoPRM(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	var mu sync.Mutex
	var asked []string
	as := oauthtest.Start(t, oauthtest.Options{PRMAt: "header-only", NoChallengeMetadata: true,
		Observe: func(endpoint string, r *http.Request) {
			mu.Lock()
			asked = append(asked, endpoint)
			mu.Unlock()
		}})
	m := e.manager(nil)
	c := e.connector("ws", "files", as.MCPURL, ModeUser)
	_, err := m.Start(ctx, c, "alice", "", nil)
	var de *DiscoveryError
	if !errors.As(err, &de) {
		t.Fatalf("Start: %v, want a DiscoveryError", err)
	}
	origin := strings.TrimSuffix(as.MCPURL, "/mcp")
	want := []string{
		origin + "/.well-known/oauth-protected-resource/mcp: HTTP 404",
		origin + "/.well-known/oauth-protected-resource: HTTP 404",
	}
	if !slices.Equal(de.Tried, want) {
		t.Errorf("tried %q, want %q", de.Tried, want)
	}
	if !strings.Contains(err.Error(), "no usable protected resource metadata") {
		t.Errorf("error %q", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, a := range asked {
		if a != "mcp" && a != "" {
			t.Errorf("asked the %s endpoint", a)
		}
	}
}

// A challenge naming the well-known URL itself: it is asked, and listed
// in the error, once.
func TestDiscoveryTriesEachURLOnce(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	var mu sync.Mutex
	asked := map[string]int{}
	var rs *httptest.Server
	rs = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		asked[r.URL.Path]++
		mu.Unlock()
		if r.URL.Path == "/mcp" {
			w.Header().Set("WWW-Authenticate", `Bearer resource_metadata="`+rs.URL+`/.well-known/oauth-protected-resource/mcp"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		http.NotFound(w, r)
	}))
	defer rs.Close()
	m := e.manager(nil)
	c := e.connector("ws", "files", rs.URL+"/mcp", ModeUser)
	_, err := m.Start(ctx, c, "alice", "", nil)
	var de *DiscoveryError
	if !errors.As(err, &de) {
		t.Fatalf("Start: %v, want a DiscoveryError", err)
	}
	want := []string{
		rs.URL + "/.well-known/oauth-protected-resource/mcp: HTTP 404",
		rs.URL + "/.well-known/oauth-protected-resource: HTTP 404",
	}
	if !slices.Equal(de.Tried, want) {
		t.Errorf("tried %q, want %q", de.Tried, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if n := asked["/.well-known/oauth-protected-resource/mcp"]; n != 1 {
		t.Errorf("the path-inserted URL was asked %d times, want once", n)
	}
}

// An authorization server that does not list S256 is refused.
func TestDiscoveryNoS256(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	as := oauthtest.Start(t, oauthtest.Options{NoS256: true})
	m := e.manager(nil)
	c := e.connector("ws", "files", as.MCPURL, ModeUser)
	_, err := m.Start(ctx, c, "alice", "", nil)
	var de *DiscoveryError
	if !errors.As(err, &de) || !strings.Contains(err.Error(), "S256") || !strings.Contains(err.Error(), as.Issuer) {
		t.Fatalf("Start: %v, want a DiscoveryError naming S256 and the issuer", err)
	}
	if c := as.Counts(); c.Authorizations != 0 || c.Registrations != 0 {
		t.Errorf("counts %+v", c)
	}
}

// fakeRS is a protected resource of the test's own making: its MCP
// endpoint answers 401 with challenge, and it serves docs by path.
func fakeRS(t *testing.T, challenge func(origin string) string, docs func(origin string) map[string]any) *httptest.Server {
	t.Helper()
	var srv *httptest.Server
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/mcp" {
			w.Header().Set("WWW-Authenticate", challenge(srv.URL))
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if doc, ok := docs(srv.URL)[r.URL.Path]; ok {
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(doc)
			return
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// Metadata URLs that point at the cloud metadata service are refused by
// the egress policy, with an error naming the URL.
func TestDiscoveryEgress(t *testing.T) {
	ctx := context.Background()
	const imds = "http://169.254.169.254/latest/meta-data/iam"
	for _, tc := range []struct {
		name      string
		challenge func(string) string
		docs      func(string) map[string]any
	}{{
		name:      "resource_metadata",
		challenge: func(string) string { return fmt.Sprintf(`Bearer resource_metadata="%s"`, imds) },
		docs:      func(string) map[string]any { return nil },
	}, {
		name:      "authorization server",
		challenge: func(string) string { return `Bearer scope="x"` },
		docs: func(origin string) map[string]any {
			return map[string]any{"/.well-known/oauth-protected-resource/mcp": map[string]any{
				"resource": origin + "/mcp", "authorization_servers": []string{"http://169.254.169.254"},
			}}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			rs := fakeRS(t, tc.challenge, tc.docs)
			m := e.manager(nil)
			c := e.connector("ws", "evil", rs.URL+"/mcp", ModeUser)
			_, err := m.Start(ctx, c, "alice", "", nil)
			var de *DiscoveryError
			if !errors.As(err, &de) || !errors.Is(err, egress.ErrDenied) || !strings.Contains(err.Error(), "169.254.169.254") {
				t.Fatalf("Start: %v, want a DiscoveryError wrapping the egress refusal", err)
			}
		})
	}
	// Loopback is not refused by default: the URL is tried (and nothing
	// answers there).
	e := newEnv(t)
	rs := fakeRS(t, func(string) string { return `Bearer resource_metadata="http://127.0.0.1:1/prm"` }, func(string) map[string]any { return nil })
	m := e.manager(nil)
	c := e.connector("ws", "x", rs.URL+"/mcp", ModeUser)
	_, err := m.Start(ctx, c, "alice", "", nil)
	if errors.Is(err, egress.ErrDenied) || !strings.Contains(err.Error(), "http://127.0.0.1:1/prm: ") {
		t.Errorf("loopback metadata URL: %v; want it tried, not refused", err)
	}
}

// Protected resource metadata about another resource is not used; an
// issuer that does not match its metadata is not used.
func TestDiscoveryBindings(t *testing.T) {
	ctx := context.Background()
	t.Run("challenge PRM names another resource", func(t *testing.T) {
		e := newEnv(t)
		rs := fakeRS(t, func(o string) string { return fmt.Sprintf(`Bearer resource_metadata="%s/prm"`, o) },
			func(o string) map[string]any {
				return map[string]any{"/prm": map[string]any{"resource": "https://victim.example/mcp", "authorization_servers": []string{o}}}
			})
		m := e.manager(nil)
		_, err := m.Start(ctx, e.connector("ws", "x", rs.URL+"/mcp", ModeUser), "alice", "", nil)
		var de *DiscoveryError
		if !errors.As(err, &de) || len(de.Tried) != 3 || !strings.Contains(de.Tried[0], "victim.example") {
			t.Fatalf("Start: %v, want a DiscoveryError saying the PRM names another resource", err)
		}
	})
	t.Run("challenge PRM names the origin only", func(t *testing.T) {
		e := newEnv(t)
		rs := fakeRS(t, func(o string) string { return fmt.Sprintf(`Bearer resource_metadata="%s/prm"`, o) },
			func(o string) map[string]any {
				return map[string]any{"/prm": map[string]any{"resource": o, "authorization_servers": []string{o}}}
			})
		m := e.manager(nil)
		_, err := m.Start(ctx, e.connector("ws", "x", rs.URL+"/mcp", ModeUser), "alice", "", nil)
		var de *DiscoveryError
		if !errors.As(err, &de) || !strings.Contains(de.Tried[0], "is not "+rs.URL+"/mcp") {
			t.Fatalf("Start: %v; a challenge's PRM must name the resource exactly", err)
		}
	})
	t.Run("well-known PRM names the origin", func(t *testing.T) {
		e := newEnv(t)
		var issuer string
		rs := fakeRS(t, func(string) string { return `Bearer` },
			func(o string) map[string]any {
				issuer = o + "/as"
				return map[string]any{
					"/.well-known/oauth-protected-resource/mcp": map[string]any{"resource": o, "authorization_servers": []string{issuer}},
					"/.well-known/oauth-authorization-server/as": map[string]any{
						"issuer": o + "/other", "authorization_endpoint": o + "/authorize", "token_endpoint": o + "/token",
						"code_challenge_methods_supported": []string{"S256"},
					},
					"/.well-known/openid-configuration/as": map[string]any{
						"issuer": issuer, "authorization_endpoint": o + "/authorize", "token_endpoint": o + "/token",
						"code_challenge_methods_supported": []string{"S256"},
					},
				}
			})
		m := e.manager(nil)
		c := e.connector("ws", "x", rs.URL+"/mcp", ModeUser)
		d, err := m.discover(ctx, c)
		if err != nil {
			t.Fatalf("discover: %v", err)
		}
		if d.resource != rs.URL || d.server.Issuer != issuer || d.server.TokenEndpoint != rs.URL+"/token" {
			t.Errorf("discovered resource %q, issuer %q, token endpoint %q", d.resource, d.server.Issuer, d.server.TokenEndpoint)
		}
		// No registration endpoint, no document: nothing to register with.
		_, err = m.Start(ctx, c, "alice", "", nil)
		var de *DiscoveryError
		if !errors.As(err, &de) || !strings.Contains(err.Error(), "no dynamic client registration") {
			t.Errorf("Start without any way to register: %v", err)
		}
	})
	t.Run("the server answers without a challenge", func(t *testing.T) {
		e := newEnv(t)
		open := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/mcp" {
				http.NotFound(w, r)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"jsonrpc":"2.0","id":0,"result":{}}`))
		}))
		defer open.Close()
		m := e.manager(nil)
		_, err := m.Start(ctx, e.connector("ws", "x", open.URL+"/mcp?api_key=querysecret123", ModeUser), "alice", "", nil)
		var de *DiscoveryError
		if !errors.As(err, &de) || !strings.Contains(err.Error(), "HTTP 200, not 401") {
			t.Fatalf("Start: %v", err)
		}
		if strings.Contains(err.Error(), "querysecret123") {
			t.Errorf("the error shows the URL's query value: %v", err)
		}
	})
	t.Run("the server is down", func(t *testing.T) {
		e := newEnv(t)
		m := e.manager(nil)
		_, err := m.Start(ctx, e.connector("ws", "x", "http://127.0.0.1:1/mcp", ModeUser), "alice", "", nil)
		var de *DiscoveryError
		if err == nil || errors.As(err, &de) {
			t.Fatalf("Start: %v; want a plain error (it may pass), not a DiscoveryError", err)
		}
	})
}

func TestNewChecksConfig(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.RedirectURL = "http://svc.example/cb" }, "OAUTH_REDIRECT_URL"},
		{func(c *Config) { c.RedirectURL = "" }, "OAUTH_REDIRECT_URL"},
		{func(c *Config) { c.RedirectURL = "https://svc.example/cb#x" }, "OAUTH_REDIRECT_URL"},
		{func(c *Config) { c.ClientMetadataURL = "http://svc.example/client.json" }, "OAUTH_CLIENT_METADATA_URL"},
		{func(c *Config) { c.ReturnToAllowed = []string{""} }, "OAUTH_RETURN_TO_ALLOWED"},
		{func(c *Config) { c.ReturnToAllowed = []string{"chat.example.com"} }, "not an absolute http(s) URL"},
		{func(c *Config) { c.ReturnToAllowed = []string{"ftp://chat.example.com/"} }, "not an absolute http(s) URL"},
		{func(c *Config) { c.ReturnToAllowed = []string{"https://u@chat.example.com/"} }, "user information"},
		{func(c *Config) { c.ReturnToAllowed = []string{"https://chat.example.com/?x=1"} }, "a query"},
		{func(c *Config) { c.ReturnToAllowed = []string{"https://chat.example.com/#"} }, "a fragment"},
		{func(c *Config) { c.ReturnToAllowed = []string{"https://chat.example.com/ x"} }, "a space"},
	} {
		cfg := Config{DB: e.db, Box: e.box, RedirectURL: "https://svc.example/cb"}
		tc.mod(&cfg)
		if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want an error naming %s", cfg, err, tc.want)
		}
	}
	for _, ok := range []string{"https://svc.example/cb", "http://localhost:8080/cb", "http://127.0.0.1/cb", "http://[::1]:9/cb"} {
		if _, err := New(Config{DB: e.db, RedirectURL: ok}); err != nil {
			t.Errorf("New(RedirectURL %s): %v", ok, err)
		}
	}
	m, _ := New(Config{DB: e.db, RedirectURL: "https://svc.example/cb", ClientMetadataURL: "https://svc.example/oauth/client.json"})
	doc, ok := m.ClientMetadata()
	var got map[string]any
	if !ok || json.Unmarshal(doc, &got) != nil || got["client_id"] != "https://svc.example/oauth/client.json" ||
		got["token_endpoint_auth_method"] != "none" || got["application_type"] != "web" || got["client_name"] != "connector-svc" {
		t.Errorf("ClientMetadata = %s", doc)
	}
}

// TestPublicServerCannotNameInternalHosts: metadata URLs named by a server
// on a public address may not point into the service's own network; a
// server on that network may name its neighbours.
func TestPublicServerCannotNameInternalHosts(t *testing.T) {
	ctx := context.Background()
	for host, want := range map[string]bool{"127.0.0.1": true, "::1": true, "localhost": true, "10.1.2.3": true,
		"192.168.0.9": true, "169.254.169.254": true, "fd00::1": true, "0.0.0.0": true, "93.184.216.34": false, "2606:4700::1111": false} {
		if got := internalHost(ctx, host); got != want {
			t.Errorf("internalHost(%s) = %v, want %v", host, got, want)
		}
	}
	if err := checkNamedHost(ctx, true, "its resource_metadata", "http://127.0.0.1:9/prm"); err == nil ||
		!strings.Contains(err.Error(), "own network") {
		t.Errorf("a public server naming loopback: %v, want refused", err)
	}
	if err := checkNamedHost(ctx, true, "its authorization server", "http://10.0.0.5"); err == nil {
		t.Error("a public server naming a private address was not refused")
	}
	if err := checkNamedHost(ctx, false, "its resource_metadata", "http://127.0.0.1:9/prm"); err != nil {
		t.Errorf("a loopback server naming loopback: %v, want allowed", err)
	}
	if err := checkNamedHost(ctx, true, "its authorization server", "https://93.184.216.34/"); err != nil {
		t.Errorf("a public server naming a public address: %v, want allowed", err)
	}
}
