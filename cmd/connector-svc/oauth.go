package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/connector-svc/connector-svc/internal/egress"
	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/oauth"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/tlsfiles"
)

// oauthConfig is where end users' browsers come back to after they
// authorize the service on an MCP server's authorization server.
type oauthConfig struct {
	// RedirectURL is the callback's public URL, registered with every
	// authorization server: https, or http on a loopback host.
	RedirectURL string
	// CallbackAddr is the address of the listener that serves the
	// callback (and the client metadata document), and nothing else; ""
	// serves none: the chat backend receives the redirect itself and
	// calls CompleteAuthorization.
	CallbackAddr string
	// CallbackTLSCertFile and CallbackTLSKeyFile make the listener serve
	// HTTPS itself; without them it serves HTTP behind a proxy that
	// terminates TLS.
	CallbackTLSCertFile, CallbackTLSKeyFile string
	// ClientMetadataURL is the https URL of the service's client ID
	// metadata document, used as its client_id where an authorization
	// server supports that; "" registers dynamically instead.
	ClientMetadataURL string
	// ReturnToAllowed are the prefixes a StartAuthorization return_to
	// must start with.
	ReturnToAllowed []string
	// StateTTL bounds how long an authorization URL is good for.
	StateTTL time.Duration
	// CallbackRate and CallbackBurst limit the callback's requests per
	// client address.
	CallbackRate  float64
	CallbackBurst int
	// TrustedProxies are the addresses of proxies in front of the
	// callback listener whose X-Forwarded-For names the client address
	// the rate limit counts; others' is ignored.
	TrustedProxies []netip.Prefix
}

func oauthFlags(fs *flag.FlagSet, cfg *oauthConfig, stateTTL, returnTo, proxies *string) {
	fs.StringVar(&cfg.RedirectURL, "oauth-redirect-url", "",
		"public URL of the OAuth callback that end users' browsers return to, e.g. https://connectors.example.com/oauth/callback; "+
			"empty disables oauth_user authorization (OAUTH_REDIRECT_URL)")
	fs.StringVar(&cfg.CallbackAddr, "oauth-callback-addr", "",
		"address of the public listener that serves only the OAuth callback (at OAUTH_REDIRECT_URL's path) and the client "+
			"metadata document; empty serves none, and the backend calls CompleteAuthorization (OAUTH_CALLBACK_ADDR)")
	fs.StringVar(&cfg.CallbackTLSCertFile, "oauth-callback-tls-cert-file", "",
		"certificate for HTTPS on OAUTH_CALLBACK_ADDR; empty serves HTTP for a proxy that terminates TLS (OAUTH_CALLBACK_TLS_CERT_FILE)")
	fs.StringVar(&cfg.CallbackTLSKeyFile, "oauth-callback-tls-key-file", "", "key of OAUTH_CALLBACK_TLS_CERT_FILE (OAUTH_CALLBACK_TLS_KEY_FILE)")
	fs.StringVar(&cfg.ClientMetadataURL, "oauth-client-metadata-url", "",
		"https URL where the service's OAuth client metadata document is served (from OAUTH_CALLBACK_ADDR, at this URL's path), "+
			"used as its client_id by authorization servers that support it; empty registers dynamically (OAUTH_CLIENT_METADATA_URL)")
	fs.StringVar(returnTo, "oauth-return-to-allowed", "",
		"comma-separated URL prefixes a StartAuthorization return_to must start with (OAUTH_RETURN_TO_ALLOWED)")
	fs.StringVar(stateTTL, "oauth-state-ttl", "10m", "how long an authorization URL can be used (OAUTH_STATE_TTL)")
	fs.Float64Var(&cfg.CallbackRate, "oauth-callback-rate", 5, "callback requests per second allowed from one client address (OAUTH_CALLBACK_RATE)")
	fs.IntVar(&cfg.CallbackBurst, "oauth-callback-burst", 20, "burst of callback requests allowed from one client address (OAUTH_CALLBACK_BURST)")
	fs.StringVar(proxies, "oauth-callback-trusted-proxies", "",
		"comma-separated CIDRs of the proxies in front of OAUTH_CALLBACK_ADDR whose X-Forwarded-For names the client address the rate limit counts (OAUTH_CALLBACK_TRUSTED_PROXIES)")
}

// read checks the OAuth settings.
func (cfg *oauthConfig) read(stateTTL, returnTo, proxies string) error {
	var err error
	if cfg.TrustedProxies, err = egress.ParsePrefixes(proxies); err != nil {
		return fmt.Errorf("OAUTH_CALLBACK_TRUSTED_PROXIES: %w", err)
	}
	if cfg.StateTTL, err = positiveDuration("OAUTH_STATE_TTL", stateTTL); err != nil {
		return err
	}
	if cfg.StateTTL > 24*time.Hour {
		return fmt.Errorf("OAUTH_STATE_TTL %v: want at most 24h; an authorization URL is meant to be used at once", cfg.StateTTL)
	}
	cfg.ReturnToAllowed = splitList(returnTo)
	for _, p := range cfg.ReturnToAllowed {
		if u, err := url.Parse(p); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return fmt.Errorf("OAUTH_RETURN_TO_ALLOWED %q: want absolute http(s) URL prefixes such as https://chat.example.com/", p)
		}
	}
	if cfg.RedirectURL != "" {
		if err := checkRedirectURL("OAUTH_REDIRECT_URL", cfg.RedirectURL); err != nil {
			return err
		}
	}
	if cfg.ClientMetadataURL != "" {
		u, err := url.Parse(cfg.ClientMetadataURL)
		if err != nil || u.Scheme != "https" || u.Host == "" || u.Path == "" || u.Path == "/" {
			return fmt.Errorf("OAUTH_CLIENT_METADATA_URL %q: want an https URL with a path, e.g. https://connectors.example.com/oauth/client.json "+
				"(authorization servers fetch it and use it as the client_id)", cfg.ClientMetadataURL)
		}
		if cfg.RedirectURL == "" {
			return errors.New("OAUTH_CLIENT_METADATA_URL needs OAUTH_REDIRECT_URL: the document lists it")
		}
	}
	switch {
	case cfg.CallbackAddr != "" && cfg.RedirectURL == "":
		return errors.New("OAUTH_CALLBACK_ADDR needs OAUTH_REDIRECT_URL: the public URL browsers reach the callback at")
	case cfg.CallbackAddr != "":
		if _, _, err := net.SplitHostPort(cfg.CallbackAddr); err != nil {
			return fmt.Errorf("OAUTH_CALLBACK_ADDR %q: want host:port: %w", cfg.CallbackAddr, err)
		}
	}
	if (cfg.CallbackTLSCertFile == "") != (cfg.CallbackTLSKeyFile == "") {
		return errors.New("set both OAUTH_CALLBACK_TLS_CERT_FILE and OAUTH_CALLBACK_TLS_KEY_FILE, or neither")
	}
	if cfg.CallbackTLSCertFile != "" && cfg.CallbackAddr == "" {
		return errors.New("OAUTH_CALLBACK_TLS_CERT_FILE needs OAUTH_CALLBACK_ADDR: it is that listener's certificate")
	}
	if cfg.CallbackRate <= 0 || cfg.CallbackBurst <= 0 {
		return fmt.Errorf("OAUTH_CALLBACK_RATE %v, OAUTH_CALLBACK_BURST %d: want positive numbers", cfg.CallbackRate, cfg.CallbackBurst)
	}
	return nil
}

// checkRedirectURL applies the MCP authorization rule for redirect URIs:
// https, or http on a loopback host, with no fragment.
func checkRedirectURL(name, raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.Fragment != "" || u.RawQuery != "" {
		return fmt.Errorf("%s %q: want an absolute URL without query or fragment, e.g. https://connectors.example.com/oauth/callback", name, raw)
	}
	switch host := u.Hostname(); {
	case u.Scheme == "https":
	case u.Scheme == "http" && (host == "localhost" || net.ParseIP(host) != nil && net.ParseIP(host).IsLoopback()):
	default:
		return fmt.Errorf("%s %q: authorization servers accept only https redirect URLs, or http on localhost", name, raw)
	}
	return nil
}

// completer finishes an authorization; *oauth.Manager is one.
type completer interface {
	Complete(ctx context.Context, state, code, iss, errParam string) (*oauth.Completed, error)
	ClientMetadata() ([]byte, bool)
}

// callbackServer is the public listener end users' browsers reach: the
// callback at the redirect URL's path, the client metadata document at
// its URL's path, and nothing else. Requests are limited per client
// address, and every answer is no-store and leaks no referrer.
type callbackServer struct {
	mgr          completer
	callbackPath string
	metadataPath string
	logger       *slog.Logger

	rate    rate.Limit
	burst   int
	proxies []netip.Prefix
	mu      sync.Mutex
	peers   map[string]*peerLimit
}

type peerLimit struct {
	lim  *rate.Limiter
	seen time.Time
}

func newCallbackServer(cfg oauthConfig, mgr completer, logger *slog.Logger) *callbackServer {
	s := &callbackServer{mgr: mgr, logger: logger, rate: rate.Limit(cfg.CallbackRate), burst: cfg.CallbackBurst,
		proxies: cfg.TrustedProxies, peers: map[string]*peerLimit{}}
	if u, err := url.Parse(cfg.RedirectURL); err == nil {
		s.callbackPath = u.EscapedPath()
	}
	if u, err := url.Parse(cfg.ClientMetadataURL); err == nil && cfg.ClientMetadataURL != "" {
		s.metadataPath = u.EscapedPath()
	}
	return s
}

func (s *callbackServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "default-src 'none'")
	if !s.allow(r) {
		h.Set("Retry-After", "1")
		page(w, http.StatusTooManyRequests, "Too many requests. Try again in a moment.")
		return
	}
	switch path := r.URL.EscapedPath(); {
	case path == s.callbackPath:
		// Only a browser's GET finishes an authorization: a HEAD (a link
		// preview, a prefetch) would use up the code.
		if r.Method != http.MethodGet {
			h.Set("Allow", "GET")
			page(w, http.StatusMethodNotAllowed, "Method not allowed.")
			return
		}
		s.callback(w, r)
	case s.metadataPath != "" && path == s.metadataPath:
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			page(w, http.StatusMethodNotAllowed, "Method not allowed.")
			return
		}
		doc, ok := s.mgr.ClientMetadata()
		if !ok {
			http.NotFound(w, r)
			return
		}
		h.Set("Content-Type", "application/json")
		h.Set("Cache-Control", "public, max-age=300") // authorization servers may cache it
		_, _ = w.Write(doc)
	default:
		page(w, http.StatusNotFound, "Not found.")
	}
}

// callback finishes the authorization the redirect carries and sends the
// browser on to where it was started from. What went wrong is shown in
// fixed words: nothing of the request is echoed.
func (s *callbackServer) callback(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	done, err := s.mgr.Complete(r.Context(), q.Get("state"), q.Get("code"), q.Get("iss"), q.Get("error"))
	var refused *oauth.AuthServerError
	if errors.As(err, &refused) && done != nil && done.ReturnTo != "" {
		// The user (or the server) said no: the chat learns it where it
		// waits, with the OAuth error code.
		s.logger.InfoContext(r.Context(), "oauth authorization refused", slog.String("error", err.Error()))
		http.Redirect(w, r, withParam(done.ReturnTo, "error", refused.Code), http.StatusSeeOther)
		return
	}
	if err != nil {
		status, text := http.StatusBadRequest, "This authorization link is not valid: it was used already, it expired, or it was not made here. Start again from the chat."
		var ase *oauth.AuthServerError
		switch {
		case errors.Is(err, oauth.ErrIssuerMismatch):
			text = "The answer did not come from the expected authorization server. Start again from the chat."
		case errors.As(err, &ase) && ase.Status < 500: // the redirect's error (no status) or a 4xx of the token endpoint
			status, text = http.StatusForbidden, "The authorization server did not grant access. Start again from the chat if you meant to allow it."
		case !errors.Is(err, oauth.ErrStateInvalid):
			status, text = http.StatusBadGateway, "The authorization could not be completed. Try again from the chat."
		}
		s.logger.WarnContext(r.Context(), "oauth callback refused", slog.Int("status", status), slog.String("error", err.Error()))
		page(w, status, text)
		return
	}
	s.logger.InfoContext(r.Context(), "user authorized connector", slog.String("workspace_id", done.Grant.WorkspaceID),
		slog.String("connector_id", done.Grant.ConnectorExternalID), slog.String("user_id", done.Grant.UserID),
		slog.Any("scopes", done.Grant.Scopes))
	if done.ReturnTo != "" {
		http.Redirect(w, r, done.ReturnTo, http.StatusSeeOther)
		return
	}
	page(w, http.StatusOK, "Authorized. You can close this window and go back to the chat.")
}

// allow takes a token from the client address's bucket. Buckets unused
// for a minute are dropped when the map grows.
func (s *callbackServer) allow(r *http.Request) bool {
	host := s.clientAddr(r)
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.peers[host]
	if p == nil {
		if len(s.peers) >= 10000 {
			for k, v := range s.peers {
				if now.Sub(v.seen) > time.Minute {
					delete(s.peers, k)
				}
			}
		}
		p = &peerLimit{lim: rate.NewLimiter(s.rate, s.burst)}
		s.peers[host] = p
	}
	p.seen = now
	return p.lim.AllowN(now, 1)
}

// clientAddr is the address the rate limit counts: the peer's, or, when
// the peer is a trusted proxy, the last address in X-Forwarded-For that is
// not a trusted proxy (what earlier hops wrote may be forged).
func (s *callbackServer) clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	if !s.trusted(host) {
		return host
	}
	hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
	for i := len(hops) - 1; i >= 0; i-- {
		hop := strings.TrimSpace(hops[i])
		if _, err := netip.ParseAddr(hop); err != nil {
			break
		}
		if !s.trusted(hop) {
			return hop
		}
	}
	return host
}

func (s *callbackServer) trusted(addr string) bool {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return false
	}
	a = a.Unmap()
	for _, p := range s.proxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// withParam adds name=value to the query of rawURL.
func withParam(rawURL, name, value string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return rawURL
	}
	q := u.Query()
	q.Set(name, value)
	u.RawQuery = q.Encode()
	return u.String()
}

func page(w http.ResponseWriter, status int, text string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(text + "\n"))
}

// serveCallback runs the callback listener until ctx is done, then lets
// requests in flight finish for up to 5 s; those still open are cut, with
// a warning.
func serveCallback(ctx context.Context, cfg oauthConfig, lis net.Listener, h http.Handler, logger *slog.Logger) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10,
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
	if cfg.CallbackTLSCertFile != "" {
		certs, err := tlsfiles.New(tlsfiles.Files{CertFile: cfg.CallbackTLSCertFile, KeyFile: cfg.CallbackTLSKeyFile},
			tlsfiles.DefaultCheckInterval, logger)
		if err != nil {
			return fmt.Errorf("OAUTH_CALLBACK_TLS_CERT_FILE: %w", err)
		}
		lis = tls.NewListener(lis, certs.ServerConfig())
	}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			logger.Warn("oauth callback listener: requests still in flight were cut at shutdown", slog.String("error", err.Error()))
			_ = srv.Close()
		}
	}()
	if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("oauth callback listener: %w", err)
	}
	return nil
}

// newOAuth builds what keeps connectors' OAuth tokens. Without
// OAUTH_REDIRECT_URL it serves client credentials connectors only: no user
// can be sent to authorize, and the authorization RPCs answer
// OAUTH_NOT_CONFIGURED.
func newOAuth(cfg oauthConfig, db *store.DB, box *secret.Box, policy *egress.Policy, logger *slog.Logger) (*oauth.Manager, error) {
	if cfg.RedirectURL == "" {
		cfg.RedirectURL = "http://localhost/oauth/callback" // never sent: no flow starts
	}
	m, err := oauth.New(oauth.Config{DB: db, Box: box, Egress: policy, RedirectURL: cfg.RedirectURL,
		ClientMetadataURL: cfg.ClientMetadataURL, StateTTL: cfg.StateTTL, ReturnToAllowed: cfg.ReturnToAllowed, Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("oauth: %w", err)
	}
	return m, nil
}

// authorizeHook is the registry's way to the manager's transports.
func authorizeHook(m *oauth.Manager) func(base http.RoundTripper, spec registry.Spec, user string) http.RoundTripper {
	return live.Authorize(m)
}

func callbackAddr(lis net.Listener) string {
	if lis == nil {
		return ""
	}
	return lis.Addr().String()
}

// runOAuth is the oauth command, `oauth forget-registration <issuer>`
// (parseOAuth): it deletes the stored registrations of the service with
// that authorization server (for every callback URL), for a server that
// forgot them (an in-memory one that restarted): its consent page then
// answers invalid_client, which the service never sees. The next
// authorization registers again.
func runOAuth(ctx context.Context, cfg config, db *store.DB, box *secret.Box, issuer string, stdout io.Writer) error {
	m, err := newOAuth(cfg.OAuth, db, box, egress.New(egress.Config{Allow: cfg.EgressAllow, Deny: cfg.EgressDeny}),
		slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	n, err := m.ForgetRegistration(ctx, issuer)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "forgot %d registration(s) with %s\n", n, issuer)
	return err
}
