package oauthtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/ory/fosite"
	"github.com/ory/fosite/storage"
)

// RegistrationRequest is the body of an RFC 7591 registration request; Raw
// has every member, these fields the usual ones.
type RegistrationRequest struct {
	RedirectURIs            []string       `json:"redirect_uris"`
	TokenEndpointAuthMethod string         `json:"token_endpoint_auth_method"`
	GrantTypes              []string       `json:"grant_types"`
	ResponseTypes           []string       `json:"response_types"`
	ApplicationType         string         `json:"application_type"`
	ClientName              string         `json:"client_name"`
	ClientURI               string         `json:"client_uri"`
	Scope                   string         `json:"scope"`
	SoftwareID              string         `json:"software_id"`
	SoftwareVersion         string         `json:"software_version"`
	Raw                     map[string]any `json:"-"`
}

// clientRecord is a client the authorization server knows.
type clientRecord struct {
	id           string
	hashedSecret []byte // nil: a public client
	authMethod   string // "" (pre-registered: basic or post), none, client_secret_basic, client_secret_post
	redirectURIs []string
	anyRedirect  bool // pre-registered: any https or loopback http redirect
	grants       []string
}

// client is rec as fosite sees it, for a request whose redirect_uri is
// redirect ("" if none or not an authorization request).
func (s *Server) client(rec *clientRecord, redirect string) fosite.Client {
	grants := rec.grants
	if s.opts.NoRefresh {
		grants = slices.DeleteFunc(slices.Clone(grants), func(g string) bool { return g == "refresh_token" })
	}
	redirects := slices.Clone(rec.redirectURIs)
	if rec.anyRedirect && redirect != "" && !slices.Contains(redirects, redirect) {
		if u, err := url.Parse(redirect); err == nil && u.Fragment == "" &&
			(u.Scheme == "https" || (u.Scheme == "http" && fosite.IsLocalhost(u))) {
			redirects = append(redirects, redirect)
		}
	}
	dc := &fosite.DefaultClient{
		ID:            rec.id,
		Secret:        rec.hashedSecret,
		RedirectURIs:  redirects,
		GrantTypes:    grants,
		ResponseTypes: []string{"code"},
		Scopes:        s.opts.Scopes,
		Audience:      []string{s.MCPURL},
		Public:        rec.hashedSecret == nil,
	}
	if rec.authMethod == "" {
		return dc
	}
	return &fosite.DefaultOpenIDConnectClient{DefaultClient: dc, TokenEndpointAuthMethod: rec.authMethod}
}

// RegisterClient pre-registers a client: confidential (client_secret_basic
// or client_secret_post) if secret is set, public otherwise; its grants
// are grants, by default authorization_code and refresh_token, plus
// client_credentials for a confidential client. It may use any https
// redirect_uri and any http one on localhost or a loopback address.
func (s *Server) RegisterClient(id, secret string, grants ...string) {
	if len(grants) == 0 {
		grants = []string{"authorization_code", "refresh_token"}
		if secret != "" {
			grants = append(grants, "client_credentials")
		}
	}
	rec := &clientRecord{id: id, anyRedirect: true, grants: grants}
	if secret != "" {
		rec.hashedSecret = s.hashSecret(secret)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clients[id] = rec
}

// ForgetClient makes the authorization server forget the client id, as
// one that keeps its registrations in memory does when it restarts: every
// request naming it from then on gets invalid_client. Tokens issued to it
// stay until they are refused for it.
func (s *Server) ForgetClient(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.clients, id)
}

func (s *Server) hashSecret(secret string) []byte {
	h, err := s.config.GetSecretsHasher(context.Background()).Hash(context.Background(), []byte(secret))
	if err != nil {
		panic(err)
	}
	return h
}

// store is fosite's memory store with the clients and the bookkeeping of
// this package. All its calls happen under Server.mu.
type store struct {
	*storage.MemoryStore
	s *Server
}

func (st *store) GetClient(ctx context.Context, id string) (fosite.Client, error) {
	s := st.s
	var redirect string
	if r, ok := ctx.Value(fosite.RequestContextKey).(*http.Request); ok && r.Form != nil {
		redirect = r.Form.Get("redirect_uri")
	}
	if rec, ok := s.clients[id]; ok {
		return s.client(rec, redirect), nil
	}
	if s.opts.CIMD && strings.HasPrefix(id, "https://") {
		rec, err := s.fetchClientMetadata(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", fosite.ErrNotFound, err)
		}
		s.clients[id] = rec
		return s.client(rec, redirect), nil
	}
	return nil, fosite.ErrNotFound
}

func (st *store) CreateAccessTokenSession(ctx context.Context, signature string, req fosite.Requester) error {
	st.s.issued = append(st.s.issued, signature)
	return st.MemoryStore.CreateAccessTokenSession(ctx, signature, req)
}

func (st *store) CreateRefreshTokenSession(ctx context.Context, signature, accessSignature string, req fosite.Requester) error {
	st.s.refreshGrants[req.GetID()] = req.GetSession().GetSubject()
	return st.MemoryStore.CreateRefreshTokenSession(ctx, signature, accessSignature, req)
}

func (st *store) RotateRefreshToken(ctx context.Context, grantID, refreshSignature string) error {
	if st.s.opts.KeepAccessOnRefresh {
		return st.MemoryStore.RevokeRefreshToken(ctx, grantID)
	}
	return st.MemoryStore.RotateRefreshToken(ctx, grantID, refreshSignature)
}

// fetchClientMetadata fetches the client ID metadata document at id.
func (s *Server) fetchClientMetadata(ctx context.Context, id string) (*clientRecord, error) {
	if s.opts.CIMDClient == nil {
		return nil, errors.New("no CIMDClient to fetch client metadata documents with")
	}
	s.counts.cimdFetches.Add(1)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, id, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := s.opts.CIMDClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetching the client metadata document: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("the client metadata document answered %s", resp.Status)
	}
	var doc struct {
		ClientID                string   `json:"client_id"`
		RedirectURIs            []string `json:"redirect_uris"`
		GrantTypes              []string `json:"grant_types"`
		TokenEndpointAuthMethod string   `json:"token_endpoint_auth_method"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&doc); err != nil {
		return nil, fmt.Errorf("the client metadata document: %w", err)
	}
	if doc.ClientID != id {
		return nil, fmt.Errorf("the client metadata document's client_id %q is not its URL", doc.ClientID)
	}
	if len(doc.RedirectURIs) == 0 {
		return nil, errors.New("the client metadata document has no redirect_uris")
	}
	if m := doc.TokenEndpointAuthMethod; m != "" && m != "none" {
		return nil, fmt.Errorf("the client metadata document asks token_endpoint_auth_method %q; only none is supported", m)
	}
	grants := doc.GrantTypes
	if len(grants) == 0 {
		grants = []string{"authorization_code", "refresh_token"}
	}
	return &clientRecord{id: id, authMethod: "none", redirectURIs: doc.RedirectURIs, grants: grants}, nil
}

// serveAS routes the authorization server's requests.
func (s *Server) serveAS(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	ip := s.opts.IssuerPath
	switch {
	case !s.opts.OIDCOnly && path == "/.well-known/oauth-authorization-server"+ip,
		s.opts.OIDCOnly && path == ip+"/.well-known/openid-configuration":
		s.observe("metadata", r)
		s.metadata(w, r)
	case path == ip+"/authorize":
		s.observe("authorize", r)
		s.authorize(w, r)
	case path == ip+"/token":
		s.observe("token", r)
		s.token(w, r)
	case path == ip+"/register" && !s.opts.NoDCR:
		s.observe("register", r)
		s.register(w, r)
	case path == ip+"/revoke" && !s.opts.NoRevocation:
		s.observe("revoke", r)
		s.revoke(w, r)
	default:
		s.observe("", r)
		http.NotFound(w, r)
	}
}

// metadata serves the authorization server metadata (RFC 8414, or OpenID
// Connect Discovery's document with OIDCOnly).
func (s *Server) metadata(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	grants := []string{"authorization_code", "client_credentials"}
	if !s.opts.NoRefresh {
		grants = append(grants, "refresh_token")
	}
	md := map[string]any{
		"issuer":                                s.Issuer,
		"authorization_endpoint":                s.endpoint("/authorize"),
		"token_endpoint":                        s.endpoint("/token"),
		"response_types_supported":              []string{"code"},
		"response_modes_supported":              []string{"query"},
		"grant_types_supported":                 grants,
		"token_endpoint_auth_methods_supported": []string{"none", "client_secret_basic", "client_secret_post"},
		"scopes_supported":                      s.opts.Scopes,
	}
	if !s.opts.NoDCR {
		md["registration_endpoint"] = s.endpoint("/register")
	}
	if !s.opts.NoRevocation {
		md["revocation_endpoint"] = s.endpoint("/revoke")
		md["revocation_endpoint_auth_methods_supported"] = []string{"none", "client_secret_basic", "client_secret_post"}
	}
	if !s.opts.NoS256 {
		md["code_challenge_methods_supported"] = []string{"S256"}
	}
	if !s.opts.NoIssParam {
		md["authorization_response_iss_parameter_supported"] = true
	}
	if s.opts.CIMD {
		md["client_id_metadata_document_supported"] = true
	}
	if s.opts.OIDCOnly {
		md["subject_types_supported"] = []string{"public"}
		md["id_token_signing_alg_values_supported"] = []string{"RS256"}
	}
	s.counts.metadataFetches.Add(1)
	writeJSON(w, http.StatusOK, md)
}

// issWriter adds iss to the query of the redirect an authorization
// response is (RFC 9207), success or error.
type issWriter struct {
	http.ResponseWriter
	iss string
}

func (w issWriter) WriteHeader(code int) {
	if code >= 300 && code < 400 && w.iss != "" {
		if u, err := url.Parse(w.Header().Get("Location")); err == nil && u.String() != "" {
			q := u.Query()
			q.Set("iss", w.iss)
			u.RawQuery = q.Encode()
			w.Header().Set("Location", u.String())
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

// authorize is the authorization endpoint: the user (UserHeader) consents
// to every scope asked that the server supports.
func (s *Server) authorize(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	iss := s.Issuer
	switch {
	case s.opts.NoIssParam:
		iss = ""
	case s.opts.WrongIss:
		iss = WrongIssuer
	}
	rw := issWriter{ResponseWriter: w, iss: iss}

	s.mu.Lock()
	defer s.mu.Unlock()
	ar, err := s.provider.NewAuthorizeRequest(ctx, r)
	if err != nil {
		s.counts.authorizeRefusals.Add(1)
		s.provider.WriteAuthorizeError(ctx, rw, ar, err)
		return
	}
	if res := ar.GetRequestForm()["resource"]; len(res) != 1 || res[0] != s.MCPURL {
		s.counts.authorizeRefusals.Add(1)
		s.provider.WriteAuthorizeError(ctx, rw, ar, errInvalidTarget(res, s.MCPURL))
		return
	}
	user := r.Header.Get(UserHeader)
	if user == "" {
		s.counts.authorizeRefusals.Add(1)
		http.Error(w, "login required: no "+UserHeader, http.StatusUnauthorized)
		return
	}
	for _, scope := range ar.GetRequestedScopes() {
		if s.scopes.Has(scope) {
			ar.GrantScope(scope)
		}
	}
	if len(ar.GetRequestedScopes()) == 0 {
		for _, scope := range strings.Fields(s.opts.ChallengeScope) {
			ar.GrantScope(scope)
		}
	}
	ar.GrantAudience(s.MCPURL)
	session := &fosite.DefaultSession{Subject: user, Username: user}
	resp, err := s.provider.NewAuthorizeResponse(ctx, ar, session)
	if err != nil {
		s.counts.authorizeRefusals.Add(1)
		s.provider.WriteAuthorizeError(ctx, rw, ar, err)
		return
	}
	s.counts.authorizations.Add(1)
	s.provider.WriteAuthorizeResponse(ctx, rw, ar, resp)
}

func errInvalidTarget(got []string, want string) error {
	desc := "The resource parameter is missing."
	if len(got) > 1 {
		desc = "More than one resource parameter was sent."
	} else if len(got) == 1 {
		desc = fmt.Sprintf("The resource %q is not served here; the resource is %q.", got[0], want)
	}
	return &fosite.RFC6749Error{ErrorField: "invalid_target", DescriptionField: desc, CodeField: http.StatusBadRequest}
}

// secretKeys are the token request's members whose values LastTokenRequest
// does not show.
var secretKeys = []string{"client_secret", "code", "code_verifier", "refresh_token", "client_assertion"}

// token is the token endpoint.
func (s *Server) token(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	if r.Method != http.MethodPost {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if err := r.ParseForm(); err != nil {
		http.Error(w, "bad form", http.StatusBadRequest)
		return
	}
	form := r.PostForm
	shown := url.Values{}
	for k, v := range form {
		shown[k] = append([]string(nil), v...)
	}
	for _, k := range secretKeys {
		if _, ok := shown[k]; ok {
			shown[k] = []string{"<set>"}
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastToken = shown

	fail := func(ar fosite.AccessRequester, err error) {
		s.counts.tokenErrors.Add(1)
		s.provider.WriteAccessError(ctx, w, ar, err)
	}
	grant := form.Get("grant_type")
	res := form["resource"]
	switch {
	case len(res) > 1 || (len(res) == 1 && res[0] != s.MCPURL):
		fail(fosite.NewAccessRequest(nil), errInvalidTarget(res, s.MCPURL))
		return
	case len(res) == 0 && (grant == "authorization_code" || grant == "client_credentials"):
		fail(fosite.NewAccessRequest(nil), errInvalidTarget(res, s.MCPURL))
		return
	}

	session := &fosite.DefaultSession{}
	ar, err := s.provider.NewAccessRequest(ctx, r, session)
	if err != nil {
		fail(ar, err)
		return
	}
	switch grant {
	case "client_credentials":
		session.Subject = ar.GetClient().GetID()
		session.Username = session.Subject
		asked := ar.GetRequestedScopes()
		if len(asked) == 0 {
			asked = fosite.Arguments(strings.Fields(s.opts.ChallengeScope))
		}
		for _, scope := range asked {
			if s.scopes.Has(scope) {
				ar.GrantScope(scope)
			}
		}
		ar.GrantAudience(s.MCPURL)
	case "refresh_token":
		if asked := strings.Fields(form.Get("scope")); len(asked) > 0 {
			granted := ar.GetGrantedScopes()
			for _, scope := range asked {
				if !granted.Has(scope) {
					fail(ar, fosite.ErrInvalidScope.WithHintf("The scope %q was not granted to this refresh token.", scope))
					return
				}
			}
			if req, ok := ar.(*fosite.AccessRequest); ok {
				req.GrantedScope = fosite.Arguments(asked)
			}
		}
	}
	resp, err := s.provider.NewAccessResponse(ctx, ar)
	if err != nil {
		fail(ar, err)
		return
	}
	switch grant {
	case "authorization_code":
		s.counts.codeExchanges.Add(1)
	case "refresh_token":
		s.counts.refreshes.Add(1)
	case "client_credentials":
		s.counts.clientCredentials.Add(1)
	}
	s.provider.WriteAccessResponse(ctx, w, ar, resp)
}

// register is the RFC 7591 registration endpoint.
func (s *Server) register(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		return
	}
	var req RegistrationRequest
	if err := json.Unmarshal(body, &req); err != nil {
		registrationError(w, "invalid_client_metadata", "the body is not a JSON object: "+err.Error())
		return
	}
	if err := json.Unmarshal(body, &req.Raw); err != nil {
		registrationError(w, "invalid_client_metadata", "the body is not a JSON object: "+err.Error())
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.registrations = append(s.registrations, req)

	if len(req.RedirectURIs) == 0 {
		registrationError(w, "invalid_redirect_uri", "redirect_uris is required")
		return
	}
	for _, ru := range req.RedirectURIs {
		u, err := url.Parse(ru)
		if err != nil || !u.IsAbs() || u.Fragment != "" || !fosite.IsRedirectURISecureStrict(r.Context(), u) {
			registrationError(w, "invalid_redirect_uri", fmt.Sprintf("redirect_uri %q is not an https URL or a loopback http one", ru))
			return
		}
	}
	method := req.TokenEndpointAuthMethod
	if method == "" {
		method = "client_secret_basic" // RFC 7591's default
	}
	switch method {
	case "none", "client_secret_basic", "client_secret_post":
	default:
		registrationError(w, "invalid_client_metadata", fmt.Sprintf("token_endpoint_auth_method %q is not supported", method))
		return
	}
	grants := req.GrantTypes
	if len(grants) == 0 {
		grants = []string{"authorization_code", "refresh_token"}
	}
	for _, g := range grants {
		if g != "authorization_code" && g != "refresh_token" {
			registrationError(w, "invalid_client_metadata", fmt.Sprintf("grant_type %q is not for registered clients here", g))
			return
		}
	}
	if rt := req.ResponseTypes; len(rt) > 0 && !(len(rt) == 1 && rt[0] == "code") {
		registrationError(w, "invalid_client_metadata", "response_types must be [code]")
		return
	}

	rec := &clientRecord{id: "dcr-" + randomID(12), authMethod: method, redirectURIs: req.RedirectURIs, grants: grants}
	out := map[string]any{
		"client_id":                  rec.id,
		"client_id_issued_at":        time.Now().Unix(),
		"redirect_uris":              rec.redirectURIs,
		"grant_types":                grants,
		"response_types":             []string{"code"},
		"token_endpoint_auth_method": method,
	}
	if method != "none" {
		secret := "dcr-secret-" + randomID(16)
		rec.hashedSecret = s.hashSecret(secret)
		out["client_secret"] = secret
		out["client_secret_expires_at"] = 0
	}
	for _, k := range []string{"client_name", "client_uri", "application_type", "scope", "software_id", "software_version"} {
		if v, ok := req.Raw[k]; ok {
			out[k] = v
		}
	}
	s.clients[rec.id] = rec
	s.counts.registrations.Add(1)
	writeJSON(w, http.StatusCreated, out)
}

func registrationError(w http.ResponseWriter, code, desc string) {
	writeJSON(w, http.StatusBadRequest, map[string]string{"error": code, "error_description": desc})
}

// revoke is the RFC 7009 revocation endpoint.
func (s *Server) revoke(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.provider.NewRevocationRequest(ctx, r)
	if err == nil {
		s.counts.revocations.Add(1)
	}
	s.provider.WriteRevocationResponse(ctx, w, err)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
