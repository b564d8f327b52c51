package oauth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/connector-svc/connector-svc/internal/egress"
	"github.com/connector-svc/connector-svc/internal/secret"
)

// Config is a Manager's settings.
type Config struct {
	DB  Store
	Box *secret.Box
	// HTTPClient makes the metadata, registration, token and revocation
	// requests. Build its transport with the egress policy's DialContext
	// so that refused addresses fail at dial; nil builds one that way.
	// Its redirects are followed for metadata only (GET), each checked.
	HTTPClient *http.Client
	// Egress checks the host of every metadata, registration, token and
	// revocation URL before the request, for an error naming the URL; nil
	// means the default policy.
	Egress *egress.Policy
	// RedirectURL is the service's callback (OAUTH_REDIRECT_URL): https,
	// or http on localhost, 127.0.0.1 or ::1.
	RedirectURL string
	// ClientMetadataURL is where the service's client ID metadata document
	// is served (https; optional). Where an authorization server supports
	// such documents, it is the service's client_id there.
	ClientMetadataURL string
	// ClientName names the service to authorization servers and users;
	// default "connector-svc".
	ClientName string
	// StateTTL is how long a started authorization may complete; default 10m.
	StateTTL time.Duration
	// ReturnToAllowed are where the callback may send browsers back to:
	// absolute http(s) URLs without user information, query or fragment.
	// A return_to is allowed when its scheme, host (in any case) and port
	// are one's and its path is that one's or below it ("" and "/" allow
	// any path; /chat allows /chat and /chat/..., not /chatroom). An empty
	// return_to is always allowed; none other when this is empty.
	ReturnToAllowed []string
	// RefreshAhead is how long before expiry a token is refreshed (at
	// most half its lifetime); default 60s.
	RefreshAhead time.Duration
	Logger       *slog.Logger
}

// Defaults.
const (
	DefaultClientName   = "connector-svc"
	DefaultStateTTL     = 10 * time.Minute
	DefaultRefreshAhead = time.Minute
)

// Timings that are not settings.
const (
	// discoveryTTL is how long what discovery found is reused.
	discoveryTTL = 5 * time.Minute
	// requestTimeout bounds each request to an authorization server or
	// metadata URL.
	requestTimeout = 15 * time.Second
	// refreshTimeout bounds a refresh, which runs detached from the caller
	// that started it (others may wait on it).
	refreshTimeout = 30 * time.Second
	// tokenCacheTTL is how long a token read from Postgres is used without
	// reading it again.
	tokenCacheTTL = 5 * time.Second
	// refreshRetryPause is how long a token that could not be refreshed
	// ahead of its expiry (the server did not answer) is used as it is
	// before the next try.
	refreshRetryPause = 5 * time.Second
	// revokeAllTimeout bounds RevokeAll's requests to the server.
	revokeAllTimeout = 20 * time.Second
	// staleKeep is how long expired pending authorizations are kept.
	staleKeep = time.Hour
	// maxBody bounds what is read of a metadata or token response.
	maxBody = 1 << 20
)

// Manager runs authorizations and keeps tokens. Safe for concurrent use;
// any number of Managers (replicas) may share one database.
type Manager struct {
	cfg    Config
	db     Store
	box    *secret.Box
	hc     *http.Client
	egress *egress.Policy
	log    *slog.Logger
	// returnTo is cfg.ReturnToAllowed parsed.
	returnTo []returnPrefix

	flights singleflight.Group // discovery, registration and refresh, by key

	mu          sync.Mutex
	discoveries map[string]*discovered // by connector URL
	servers     map[string]*serverEntry
	tokens      map[tokenKey]*liveToken
	cacheSwept  time.Time // when remember last dropped stale tokens
	// forgets counts Forget's calls: a token read before one is not
	// cached after it (it may be one the call meant to drop).
	forgets uint64
	// refreshFailed is when a refresh ahead of expiry last failed for
	// want of an answer, by principal.
	refreshFailed map[tokenKey]time.Time

	lastSweep atomic.Int64 // unix seconds of the last sweep of stale pending rows
}

// New checks cfg and returns a Manager.
func New(cfg Config) (*Manager, error) {
	if cfg.DB == nil {
		return nil, errors.New("oauth: no database")
	}
	if err := checkRedirectURL(cfg.RedirectURL); err != nil {
		return nil, err
	}
	if cfg.ClientMetadataURL != "" {
		u, err := url.Parse(cfg.ClientMetadataURL)
		if err != nil || u.Scheme != "https" || u.Host == "" || u.Path == "" || u.Path == "/" || u.Fragment != "" {
			return nil, fmt.Errorf("OAUTH_CLIENT_METADATA_URL %q must be an https URL with a path (it is the client_id)", cfg.ClientMetadataURL)
		}
	}
	var returnTo []returnPrefix
	for _, raw := range cfg.ReturnToAllowed {
		p, err := parseReturnPrefix(raw)
		if err != nil {
			return nil, err
		}
		returnTo = append(returnTo, p)
	}
	if cfg.ClientName == "" {
		cfg.ClientName = DefaultClientName
	}
	if cfg.StateTTL <= 0 {
		cfg.StateTTL = DefaultStateTTL
	}
	if cfg.RefreshAhead <= 0 {
		cfg.RefreshAhead = DefaultRefreshAhead
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Egress == nil {
		cfg.Egress = egress.New(egress.Config{})
	}
	m := &Manager{
		cfg: cfg, db: cfg.DB, box: cfg.Box, egress: cfg.Egress, log: cfg.Logger, returnTo: returnTo,
		discoveries: map[string]*discovered{},
		servers:     map[string]*serverEntry{},
		tokens:      map[tokenKey]*liveToken{},

		refreshFailed: map[tokenKey]time.Time{},
	}
	m.hc = m.httpClient(cfg.HTTPClient)
	return m, nil
}

// shared runs fn once for all the callers of key at a time (each flight
// runs detached from its callers' contexts, with a timeout of its own), and
// returns its result; a caller whose ctx ends stops waiting.
func (m *Manager) shared(ctx context.Context, key string, fn func() (any, error)) (any, error) {
	select {
	case r := <-m.flights.DoChan(key, fn):
		return r.Val, r.Err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// checkRedirectURL applies the specification's rule for redirect URIs.
func checkRedirectURL(raw string) error {
	u, err := url.Parse(raw)
	if raw == "" || err != nil || u.Host == "" || u.Fragment != "" {
		return fmt.Errorf("OAUTH_REDIRECT_URL %q must be an absolute https URL (or http on localhost) without a fragment", raw)
	}
	switch {
	case u.Scheme == "https":
		return nil
	case u.Scheme == "http" && isLoopbackName(u.Hostname()):
		return nil
	}
	return fmt.Errorf("OAUTH_REDIRECT_URL %q must be https, or http on localhost, 127.0.0.1 or ::1", raw)
}

func isLoopbackName(host string) bool {
	return host == "localhost" || host == "127.0.0.1" || host == "::1"
}

// httpClient is base (or a new client whose dials the egress policy
// checks) with redirects limited: a POST is never redirected (it would
// carry a code or secret elsewhere), and a GET at most three times, each
// new host checked by the egress policy.
func (m *Manager) httpClient(base *http.Client) *http.Client {
	var hc http.Client
	if base != nil {
		hc = *base
	} else {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.DialContext = m.egress.DialContext(&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second})
		hc = http.Client{Transport: tr}
	}
	hc.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if req.Method != http.MethodGet || len(via) >= 3 {
			return http.ErrUseLastResponse
		}
		if via[0].URL.Scheme == "https" && req.URL.Scheme != "https" {
			return fmt.Errorf("refused a redirect from https to %s", req.URL.Redacted())
		}
		return m.egress.CheckHost(req.Context(), req.URL.Hostname())
	}
	return &hc
}

// checkURL refuses a URL to be requested: not absolute http(s); plain
// http when the connector's own URL is https (insecureOK false), except on
// loopback; or a host the egress policy refuses. what names the URL's
// role in errors.
func (m *Manager) checkURL(ctx context.Context, what, raw string, insecureOK bool) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return nil, fmt.Errorf("%s %q is not an absolute http(s) URL", what, secret.RedactText(raw))
	}
	if u.Scheme == "http" && !insecureOK && !isLoopbackName(u.Hostname()) {
		return nil, fmt.Errorf("%s %s is plain http while the connector's URL is https", what, secret.RedactText(raw))
	}
	if u.User != nil {
		return nil, fmt.Errorf("%s %s carries credentials in the URL", what, secret.RedactText(raw))
	}
	if err := m.egress.CheckHost(ctx, u.Hostname()); err != nil {
		if errors.Is(err, egress.ErrDenied) {
			return nil, fmt.Errorf("%s %s: %w", what, secret.RedactText(raw), err)
		}
		return nil, fmt.Errorf("%s %s: resolve %s: %w", what, secret.RedactText(raw), u.Hostname(), err)
	}
	return u, nil
}

// getJSON fetches a metadata document: it returns the HTTP status and,
// for a 200, decodes the body into v.
func (m *Manager) getJSON(ctx context.Context, u string, v any) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := m.hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, nil
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxBody)).Decode(v); err != nil {
		return resp.StatusCode, fmt.Errorf("not a JSON document: %w", err)
	}
	return resp.StatusCode, nil
}

// drain reads a little of what is left of resp's body, so the connection
// can be reused, and closes it.
func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
}

// insecureOK says whether plain http is accepted for the authorization
// endpoints of a connector whose MCP URL (or resource) is raw: only when
// that is plain http itself.
func insecureOK(raw string) bool { return strings.HasPrefix(strings.ToLower(raw), "http:") }

// ClientMetadata returns the client ID metadata document to serve at
// ClientMetadataURL, and false when that is not configured.
func (m *Manager) ClientMetadata() ([]byte, bool) {
	if m.cfg.ClientMetadataURL == "" {
		return nil, false
	}
	doc, err := json.Marshal(map[string]any{
		"client_id":                  m.cfg.ClientMetadataURL,
		"client_name":                m.cfg.ClientName,
		"redirect_uris":              []string{m.cfg.RedirectURL},
		"grant_types":                []string{"authorization_code", "refresh_token"},
		"response_types":             []string{"code"},
		"token_endpoint_auth_method": "none",
		"application_type":           "web",
	})
	if err != nil {
		return nil, false
	}
	return doc, true
}
