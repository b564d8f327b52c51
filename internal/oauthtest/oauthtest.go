// Package oauthtest gives tests a real OAuth 2.1 authorization server in
// front of a real MCP server that requires its bearer tokens, so that the
// service's OAuth client is tested against the protocol and not against a
// mock of it.
//
// The authorization server is github.com/ory/fosite (the OAuth 2.0 server
// library behind Ory Hydra) over its in-memory store, with HMAC tokens:
// authorization code with PKCE (enforced, S256 only), refresh token
// rotation (a refresh token works once; presenting a used one revokes the
// whole grant, as RFC 6819 recommends; a refresh also ends the grant's
// previous access token unless Options.KeepAccessOnRefresh), a replayed
// code revoking what it gave, client credentials and RFC 7009 revocation
// are fosite's. What fosite does not do is done thinly here
// around it: RFC 8414 / OpenID authorization server metadata, RFC 9728
// protected resource metadata, RFC 7591 dynamic client registration, client
// ID metadata documents, the RFC 8707 resource parameter (tokens are bound
// to the MCP server's URL) and the RFC 9207 iss parameter.
//
// The MCP server is an mcp-go streamable-HTTP server on its own listener
// (its own origin), with a middleware that checks every request's bearer
// token and answers 401/403 with the WWW-Authenticate challenges of the
// MCP authorization spec. Its tools: whoami, which says whose token it
// was called with, and admin_action, which needs scope admin.
//
// The end user is whoever Authorize is told: it plays the user's browser
// at the consent page, logged in through the UserHeader header, and
// consents to every scope asked.
package oauthtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ory/fosite"
	"github.com/ory/fosite/compose"
	"github.com/ory/fosite/handler/oauth2"
	"github.com/ory/fosite/storage"
)

// UserHeader is the request header that logs the end user in at the
// authorization endpoint: its value is the subject the tokens are issued
// to. Authorize sets it; a request without it gets 401 login required.
const UserHeader = "X-Oauthtest-User"

// WrongIssuer is the iss the authorization endpoint puts in its redirect
// with Options.WrongIss.
const WrongIssuer = "https://issuer.invalid"

// Options shape the servers; the zero value is a well-behaved pair with
// every feature on.
type Options struct {
	AccessTTL time.Duration // lifetime of access tokens; default 1h
	NoRefresh bool          // issue no refresh tokens
	// KeepAccessOnRefresh keeps a grant's access token valid when its
	// refresh token is used. By default a refresh ends it at once, as Ory
	// Hydra does: a client must use the new access token from then on.
	KeepAccessOnRefresh bool

	// PRMAt says where the protected resource metadata is served:
	// "path" (default) at /.well-known/oauth-protected-resource/mcp,
	// "root" at /.well-known/oauth-protected-resource only, "header-only"
	// only at /prm-x, the URL the 401 challenge names.
	PRMAt string
	// NoChallengeMetadata leaves resource_metadata out of the challenges.
	NoChallengeMetadata bool
	// NoS256 leaves code_challenge_methods_supported out of the metadata
	// (the server still requires S256: a client must refuse it first).
	NoS256 bool
	// IssuerPath is a path the issuer has, e.g. "/tenant1"; its RFC 8414
	// metadata is then at /.well-known/oauth-authorization-server/tenant1.
	IssuerPath string
	// OIDCOnly serves the metadata only at the OpenID configuration URL
	// ({issuer}/.well-known/openid-configuration), not at RFC 8414's.
	OIDCOnly bool
	// CIMD advertises client_id_metadata_document_supported and takes
	// https client_ids as the URL of their metadata document, fetched with
	// CIMDClient; the document's client_id must equal its URL and the
	// redirect_uri asked must be one of its redirect_uris.
	CIMD       bool
	CIMDClient *http.Client
	NoDCR      bool // no registration_endpoint
	// NoIssParam neither adds iss to the authorization response nor
	// advertises authorization_response_iss_parameter_supported.
	NoIssParam bool
	// WrongIss puts WrongIssuer as iss in the authorization response.
	WrongIss     bool
	NoRevocation bool     // no revocation_endpoint
	Scopes       []string // scopes_supported; default mcp:tools, admin
	// ChallengeScope is the scope of the 401 challenge, and what an
	// authorization request without scope is granted; default mcp:tools.
	ChallengeScope string
	// StepUpScope is the scope of the 403 insufficient_scope challenge
	// admin_action answers a token without admin; default ChallengeScope
	// and admin. A scope the token holds makes a server that asks for what
	// it has already.
	StepUpScope string

	// Observe, if set, sees every request either server gets before it is
	// handled, with the name of its endpoint: "metadata", "prm",
	// "authorize", "token", "register", "revoke", "mcp" or "" for any
	// other path (a 404).
	Observe func(endpoint string, r *http.Request)
}

// Counts are what the servers have done so far.
type Counts struct {
	Authorizations     int64 // codes issued at the authorization endpoint
	AuthorizeRefusals  int64 // authorization requests refused (error page or error redirect)
	TokenCodeExchanges int64 // codes exchanged for tokens
	Refreshes          int64 // successful refresh_token grants
	ClientCredentials  int64 // successful client_credentials grants
	TokenErrors        int64 // token requests refused
	Registrations      int64 // clients registered through DCR
	Revocations        int64 // successful revocation requests
	CIMDFetches        int64 // client ID metadata documents fetched
	MetadataFetches    int64 // authorization server metadata documents served
	PRMFetches         int64 // protected resource metadata documents served
	MCPRequests        int64 // requests to the MCP endpoint, any method, authorized or not
	Unauthorized401    int64 // MCP requests answered 401
	Forbidden403       int64 // MCP requests answered 403 insufficient_scope
}

type counters struct {
	authorizations, authorizeRefusals, codeExchanges, refreshes, clientCredentials,
	tokenErrors, registrations, revocations, cimdFetches, metadataFetches,
	prmFetches, mcpRequests, unauthorized, forbidden atomic.Int64
}

// Server is a running authorization server and the MCP server it guards.
type Server struct {
	// Issuer is the authorization server's issuer, exactly as its metadata
	// says: http://127.0.0.1:PORT plus Options.IssuerPath.
	Issuer string
	// MCPURL is the MCP endpoint, http://127.0.0.1:PORT2/mcp, on a
	// listener of its own; it is the resource tokens are bound to.
	MCPURL string

	opts     Options
	asOrigin string
	rsOrigin string
	scopes   fosite.Arguments

	config   *fosite.Config
	provider fosite.OAuth2Provider
	strategy *oauth2.HMACSHAStrategy
	store    *store

	counts counters

	// mu serialises fosite's work (its memory store is not safe for every
	// concurrent use) and guards what follows.
	mu            sync.Mutex
	clients       map[string]*clientRecord
	issued        []string        // access token signatures, in issue order
	expired       map[string]bool // access token signatures ExpireTokens ended
	refreshGrants map[string]string
	registrations []RegistrationRequest
	lastToken     url.Values
}

// Start serves an authorization server and an MCP server on two httptest
// listeners until the test ends.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	if opts.AccessTTL <= 0 {
		opts.AccessTTL = time.Hour
	}
	if len(opts.Scopes) == 0 {
		opts.Scopes = []string{"mcp:tools", "admin"}
	}
	if opts.ChallengeScope == "" {
		opts.ChallengeScope = "mcp:tools"
	}
	switch opts.PRMAt {
	case "":
		opts.PRMAt = "path"
	case "path", "root", "header-only":
	default:
		t.Fatalf("oauthtest: unknown PRMAt %q", opts.PRMAt)
	}
	if opts.IssuerPath != "" && (!strings.HasPrefix(opts.IssuerPath, "/") || strings.HasSuffix(opts.IssuerPath, "/")) {
		t.Fatalf("oauthtest: IssuerPath %q must start with / and not end with one", opts.IssuerPath)
	}

	s := &Server{
		opts:          opts,
		scopes:        fosite.Arguments(opts.Scopes),
		clients:       map[string]*clientRecord{},
		expired:       map[string]bool{},
		refreshGrants: map[string]string{},
	}

	// Both listen from here on, and serve once everything is set.
	as := httptest.NewUnstartedServer(http.HandlerFunc(s.serveAS))
	rs := httptest.NewUnstartedServer(nil)
	s.asOrigin = "http://" + as.Listener.Addr().String()
	s.Issuer = s.asOrigin + opts.IssuerPath
	s.rsOrigin = "http://" + rs.Listener.Addr().String()
	s.MCPURL = s.rsOrigin + "/mcp"

	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		t.Fatal(err)
	}
	s.config = &fosite.Config{
		AccessTokenLifespan:            opts.AccessTTL,
		RefreshTokenLifespan:           24 * time.Hour,
		AuthorizeCodeLifespan:          10 * time.Minute,
		GlobalSecret:                   secret,
		EnforcePKCE:                    true,
		EnablePKCEPlainChallengeMethod: false,
		// Every scope may be asked for; what is granted is decided here
		// (the asked ones that are in scopes_supported).
		ScopeStrategy:      func([]string, string) bool { return true },
		RefreshTokenScopes: []string{}, // refresh tokens without an offline scope
		HashCost:           4,          // bcrypt's minimum: client secrets of tests
		TokenURL:           s.endpoint("/token"),
	}
	s.store = &store{MemoryStore: storage.NewMemoryStore(), s: s}
	s.strategy = compose.NewOAuth2HMACStrategy(s.config)
	s.provider = compose.Compose(s.config, s.store, &compose.CommonStrategy{CoreStrategy: s.strategy},
		compose.OAuth2AuthorizeExplicitFactory,
		compose.OAuth2RefreshTokenGrantFactory,
		compose.OAuth2ClientCredentialsGrantFactory,
		compose.OAuth2TokenRevocationFactory,
		compose.OAuth2TokenIntrospectionFactory,
		compose.OAuth2PKCEFactory,
	)

	rs.Config.Handler = s.resourceHandler()
	as.Start()
	rs.Start()
	t.Cleanup(func() {
		rs.CloseClientConnections()
		rs.Close()
		as.CloseClientConnections()
		as.Close()
	})
	return s
}

// endpoint is the URL of one of the authorization server's endpoints, all
// under the issuer.
func (s *Server) endpoint(path string) string { return s.Issuer + path }

// Counts says what the servers have done so far.
func (s *Server) Counts() Counts {
	c := &s.counts
	return Counts{
		Authorizations:     c.authorizations.Load(),
		AuthorizeRefusals:  c.authorizeRefusals.Load(),
		TokenCodeExchanges: c.codeExchanges.Load(),
		Refreshes:          c.refreshes.Load(),
		ClientCredentials:  c.clientCredentials.Load(),
		TokenErrors:        c.tokenErrors.Load(),
		Registrations:      c.registrations.Load(),
		Revocations:        c.revocations.Load(),
		CIMDFetches:        c.cimdFetches.Load(),
		MetadataFetches:    c.metadataFetches.Load(),
		PRMFetches:         c.prmFetches.Load(),
		MCPRequests:        c.mcpRequests.Load(),
		Unauthorized401:    c.unauthorized.Load(),
		Forbidden403:       c.forbidden.Load(),
	}
}

// ExpireTokens makes every access token issued so far invalid at the MCP
// server (its next use gets 401 invalid_token); refresh tokens keep
// working.
func (s *Server) ExpireTokens() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sig := range s.issued {
		s.expired[sig] = true
	}
}

// RevokeRefreshTokens ends the refresh tokens of user's grants: the next
// refresh with any of them gets invalid_grant.
func (s *Server) RevokeRefreshTokens(user string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for grant, subject := range s.refreshGrants {
		if subject == user {
			_ = s.store.MemoryStore.RevokeRefreshToken(context.Background(), grant)
		}
	}
}

// LastTokenRequest is the form of the last request to the token endpoint,
// with the values of client_secret, code, code_verifier and refresh_token
// replaced by "<set>"; nil before the first.
func (s *Server) LastTokenRequest() url.Values {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lastToken == nil {
		return nil
	}
	out := url.Values{}
	for k, v := range s.lastToken {
		out[k] = append([]string(nil), v...)
	}
	return out
}

// Registrations are the bodies of the dynamic client registration requests
// received so far, in order.
func (s *Server) Registrations() []RegistrationRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]RegistrationRequest(nil), s.registrations...)
}

// Authorize plays the browser of user at authorizationURL: it asks the
// authorization endpoint logged in as user, consents to every scope asked,
// and returns where the authorization server redirects to (the client's
// redirect_uri with code, state and iss) without following it. If the
// server refuses, the error says why; for a refusal by error redirect the
// redirect is returned too.
func (s *Server) Authorize(ctx context.Context, authorizationURL, user string) (*url.URL, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, authorizationURL, nil)
	if err != nil {
		return nil, fmt.Errorf("authorization URL: %w", err)
	}
	if user != "" {
		req.Header.Set(UserHeader, user)
	}
	hc := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 300 || resp.StatusCode > 399 {
		return nil, fmt.Errorf("the authorization server refused with %s: %s", resp.Status, bytes.TrimSpace(body))
	}
	loc, err := resp.Location()
	if err != nil {
		return nil, fmt.Errorf("the authorization server's redirect: %w", err)
	}
	if e := loc.Query().Get("error"); e != "" {
		return loc, fmt.Errorf("the authorization server refused: %s: %s", e, loc.Query().Get("error_description"))
	}
	return loc, nil
}

// observe counts nothing: it hands r to Options.Observe.
func (s *Server) observe(endpoint string, r *http.Request) {
	if s.opts.Observe != nil {
		s.opts.Observe(endpoint, r)
	}
}

// randomID is n random bytes in hex.
func randomID(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
