package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/oauth"
	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

// TestOAuthSettings reads the OAuth settings and refuses combinations that
// cannot work, naming the setting.
func TestOAuthSettings(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     map[string]string
		wantErr string
	}{
		{"none", nil, ""},
		{"https callback", map[string]string{"OAUTH_REDIRECT_URL": "https://c.example.com/oauth/callback", "OAUTH_CALLBACK_ADDR": ":8443"}, ""},
		{"localhost http", map[string]string{"OAUTH_REDIRECT_URL": "http://localhost:8080/cb"}, ""},
		{"plain http elsewhere", map[string]string{"OAUTH_REDIRECT_URL": "http://c.example.com/cb"}, "OAUTH_REDIRECT_URL"},
		{"redirect with query", map[string]string{"OAUTH_REDIRECT_URL": "https://c.example.com/cb?x=1"}, "OAUTH_REDIRECT_URL"},
		{"callback without redirect", map[string]string{"OAUTH_CALLBACK_ADDR": ":8443"}, "OAUTH_CALLBACK_ADDR needs OAUTH_REDIRECT_URL"},
		{"metadata not https", map[string]string{"OAUTH_REDIRECT_URL": "https://c.example.com/cb", "OAUTH_CLIENT_METADATA_URL": "http://c.example.com/client.json"}, "OAUTH_CLIENT_METADATA_URL"},
		{"metadata without path", map[string]string{"OAUTH_REDIRECT_URL": "https://c.example.com/cb", "OAUTH_CLIENT_METADATA_URL": "https://c.example.com"}, "OAUTH_CLIENT_METADATA_URL"},
		{"metadata without redirect", map[string]string{"OAUTH_CLIENT_METADATA_URL": "https://c.example.com/client.json"}, "needs OAUTH_REDIRECT_URL"},
		{"return_to not a URL", map[string]string{"OAUTH_RETURN_TO_ALLOWED": "chat.example.com"}, "OAUTH_RETURN_TO_ALLOWED"},
		{"state ttl too long", map[string]string{"OAUTH_STATE_TTL": "48h"}, "OAUTH_STATE_TTL"},
		{"half of tls", map[string]string{"OAUTH_REDIRECT_URL": "https://c.example.com/cb", "OAUTH_CALLBACK_ADDR": ":8443", "OAUTH_CALLBACK_TLS_CERT_FILE": "c.pem"}, "OAUTH_CALLBACK_TLS_KEY_FILE"},
		{"zero rate", map[string]string{"OAUTH_CALLBACK_RATE": "0"}, "OAUTH_CALLBACK_RATE"},
		{"trusted proxies", map[string]string{"OAUTH_CALLBACK_TRUSTED_PROXIES": "10.0.0.0/8,192.0.2.1"}, ""},
		{"bad trusted proxy", map[string]string{"OAUTH_CALLBACK_TRUSTED_PROXIES": "proxy.internal"}, "OAUTH_CALLBACK_TRUSTED_PROXIES"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _, err := parseConfig(nil, getenv(tc.env), io.Discard)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("parseConfig: %v", err)
				}
				if cfg.OAuth.StateTTL != 10*time.Minute {
					t.Errorf("StateTTL = %v, want the default 10m", cfg.OAuth.StateTTL)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("parseConfig: %v; want an error naming %q", err, tc.wantErr)
			}
		})
	}
}

// fakeCompleter finishes one known state once.
type fakeCompleter struct {
	state, returnTo string
	used            bool
}

func (f *fakeCompleter) Complete(_ context.Context, state, code, iss, errParam string) (*oauth.Completed, error) {
	switch {
	case errParam != "":
		return &oauth.Completed{ReturnTo: f.returnTo}, &oauth.AuthServerError{Code: errParam}
	case state != f.state || f.used:
		return nil, oauth.ErrStateInvalid
	case iss != "https://as.example.com":
		return nil, oauth.ErrIssuerMismatch
	}
	f.used = true
	return &oauth.Completed{Grant: oauth.Grant{UserID: "alice"}, ReturnTo: f.returnTo}, nil
}

func (f *fakeCompleter) ClientMetadata() ([]byte, bool) {
	return []byte(`{"client_id":"https://c.example.com/client.json"}`), true
}

// TestCallbackServer serves the callback and the metadata document only,
// redirects to return_to once, refuses a replayed state, a wrong issuer and
// a refusal without echoing the request, and limits each client address.
func TestCallbackServer(t *testing.T) {
	f := &fakeCompleter{state: "s1", returnTo: "https://chat.example.com/done"}
	cfg := oauthConfig{RedirectURL: "https://c.example.com/oauth/callback", ClientMetadataURL: "https://c.example.com/oauth/client.json",
		CallbackRate: 1000, CallbackBurst: 1000}
	srv := httptest.NewServer(newCallbackServer(cfg, f, slog.New(slog.DiscardHandler)))
	defer srv.Close()
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(path string) (*http.Response, string) {
		t.Helper()
		resp, err := client.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	resp, _ := get("/oauth/callback?state=s1&code=c&iss=https://as.example.com")
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "https://chat.example.com/done" {
		t.Fatalf("callback: %d to %q, want 303 to return_to", resp.StatusCode, resp.Header.Get("Location"))
	}
	if resp.Header.Get("Cache-Control") != "no-store" || resp.Header.Get("Referrer-Policy") != "no-referrer" {
		t.Errorf("callback headers: %v", resp.Header)
	}
	resp, body := get("/oauth/callback?state=s1&code=c&iss=https://as.example.com")
	if resp.StatusCode != http.StatusBadRequest || strings.Contains(body, "s1") {
		t.Errorf("replayed state: %d %q, want 400 that echoes nothing", resp.StatusCode, body)
	}
	f.used = false
	resp, body = get("/oauth/callback?state=s1&code=c&iss=https://evil.example.com")
	if resp.StatusCode != http.StatusBadRequest || strings.Contains(body, "evil") {
		t.Errorf("wrong issuer: %d %q", resp.StatusCode, body)
	}
	resp, _ = get("/oauth/callback?state=s1&error=access_denied")
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "https://chat.example.com/done?error=access_denied" {
		t.Errorf("refused: %d to %q, want 303 back to return_to with the error", resp.StatusCode, resp.Header.Get("Location"))
	}
	f.returnTo = ""
	resp, _ = get("/oauth/callback?state=s1&error=access_denied")
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("refused without return_to: %d, want 403", resp.StatusCode)
	}
	head, err := client.Head(srv.URL + "/oauth/callback?state=s1&code=c&iss=https://as.example.com")
	if err != nil {
		t.Fatal(err)
	}
	head.Body.Close()
	if head.StatusCode != http.StatusMethodNotAllowed || f.used {
		t.Errorf("HEAD on the callback: %d, used %v; want 405 and the code left for the browser's GET", head.StatusCode, f.used)
	}
	resp, body = get("/oauth/client.json")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "client_id") || resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("metadata document: %d %q", resp.StatusCode, body)
	}
	for _, path := range []string{"/", "/metrics", "/oauth/callback/x", "/healthz"} {
		if resp, _ := get(path); resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404: the listener serves nothing else", path, resp.StatusCode)
		}
	}
	post, err := client.Post(srv.URL+"/oauth/callback", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	post.Body.Close()
	if post.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d, want 405", post.StatusCode)
	}

	limited := httptest.NewServer(newCallbackServer(oauthConfig{RedirectURL: cfg.RedirectURL, CallbackRate: 0.001, CallbackBurst: 3}, f,
		slog.New(slog.DiscardHandler)))
	defer limited.Close()
	codes := map[int]int{}
	for range 6 {
		resp, err := client.Get(limited.URL + "/oauth/callback?state=nope")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		codes[resp.StatusCode]++
	}
	if codes[http.StatusTooManyRequests] != 3 || codes[http.StatusBadRequest] != 3 {
		t.Errorf("6 requests with a burst of 3: %v, want 3 answered and 3 refused with 429", codes)
	}
}

// TestCallbackRateLimitBehindProxy counts each client behind a trusted
// proxy on its own, and ignores X-Forwarded-For from anyone else.
func TestCallbackRateLimitBehindProxy(t *testing.T) {
	cfg := oauthConfig{RedirectURL: "https://c.example.com/cb", CallbackRate: 0.001, CallbackBurst: 1,
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
	s := newCallbackServer(cfg, &fakeCompleter{}, slog.New(slog.DiscardHandler))
	status := func(remote, xff string) int {
		r := httptest.NewRequest(http.MethodGet, "/cb?state=x", nil)
		r.RemoteAddr = remote
		if xff != "" {
			r.Header.Set("X-Forwarded-For", xff)
		}
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		return w.Code
	}
	for _, tc := range []struct {
		remote, xff string
		want        int
	}{
		{"10.0.0.1:5000", "203.0.113.1", http.StatusBadRequest},                    // alice through the proxy
		{"10.0.0.1:5000", "203.0.113.2", http.StatusBadRequest},                    // bob through the same proxy: his own bucket
		{"10.0.0.1:5000", "203.0.113.1", http.StatusTooManyRequests},               // alice again
		{"10.0.0.2:5000", "198.51.100.9, 203.0.113.1", http.StatusTooManyRequests}, // a forged first hop does not help
		{"192.0.2.7:5000", "203.0.113.3", http.StatusBadRequest},                   // not a proxy: its own address counts
		{"192.0.2.7:5000", "203.0.113.4", http.StatusTooManyRequests},              // whatever it claims
	} {
		if got := status(tc.remote, tc.xff); got != tc.want {
			t.Errorf("from %s for %q: %d, want %d", tc.remote, tc.xff, got, tc.want)
		}
	}
}

// TestOAuthForgetRegistration drops the stored registrations of one
// authorization server, and says what a mistyped command line should be.
func TestOAuthForgetRegistration(t *testing.T) {
	dbURL := storetest.NewURL(t)
	if err := run(testCtx(t), []string{"-database-url", dbURL, "migrate"}, getenv(nil), io.Discard); err != nil {
		t.Fatal(err)
	}
	db, err := store.Open(testCtx(t), dbURL, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, c := range []store.OAuthClient{
		{Issuer: "https://as.example.com", RedirectURI: "https://c.example.com/cb", ClientID: "one", AuthMethod: "none", Kind: "dcr"},
		{Issuer: "https://as.example.com", RedirectURI: "http://localhost:8081/oauth/callback", ClientID: "two", AuthMethod: "none", Kind: "dcr"},
		{Issuer: "https://other.example.com", RedirectURI: "https://c.example.com/cb", ClientID: "three", AuthMethod: "none", Kind: "dcr"},
	} {
		if _, _, err := db.AddOAuthClient(testCtx(t), &c); err != nil {
			t.Fatal(err)
		}
	}
	var out strings.Builder
	if err := run(testCtx(t), []string{"-database-url", dbURL, "oauth", "forget-registration", "https://as.example.com"}, getenv(nil), &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "forgot 2 registration(s) with https://as.example.com") {
		t.Errorf("output %q", out.String())
	}
	if c, err := db.OAuthClient(testCtx(t), "https://other.example.com", "https://c.example.com/cb"); err != nil || c == nil {
		t.Errorf("another server's registration: %v, %v; want it kept", c, err)
	}
	err = run(testCtx(t), []string{"-database-url", dbURL, "oauth", "forget"}, getenv(nil), io.Discard)
	var ue *usageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "forget-registration <issuer>") {
		t.Errorf("a mistyped oauth command: %v, want a usage error naming the form", err)
	}
}
