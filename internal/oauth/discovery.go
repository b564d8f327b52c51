package oauth

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/mark3labs/mcp-go/client/transport"

	"github.com/connector-svc/connector-svc/internal/egress"
	"github.com/connector-svc/connector-svc/internal/secret"
)

// protectedResource is RFC 9728 protected resource metadata.
type protectedResource struct {
	Resource             string   `json:"resource"`
	AuthorizationServers []string `json:"authorization_servers"`
	ScopesSupported      []string `json:"scopes_supported,omitempty"`
}

// serverMetadata is RFC 8414 authorization server metadata (or OpenID
// provider metadata), with what the MCP specification adds.
type serverMetadata struct {
	transport.AuthServerMetadata
	// The server accepts an https URL of a client ID metadata document as
	// client_id.
	ClientIDMetadataDocumentSupported bool `json:"client_id_metadata_document_supported,omitempty"`
	// The server puts iss on its authorization responses (RFC 9207).
	AuthorizationResponseIssParameterSupported bool `json:"authorization_response_iss_parameter_supported,omitempty"`
}

func (s *serverMetadata) supportsS256() bool {
	return slices.Contains(s.CodeChallengeMethodsSupported, "S256")
}

// discovered is what discovery found for one connector URL.
type discovered struct {
	// resource is what tokens are asked for (RFC 8707): the protected
	// resource metadata's resource, which binds to the connector's URL,
	// else the connector's canonical URL.
	resource        string
	challengeScopes []string // the 401 challenge's scope
	prm             protectedResource
	server          *serverMetadata
	at              time.Time
}

// serverEntry is an authorization server's metadata as fetched.
type serverEntry struct {
	meta *serverMetadata
	at   time.Time
}

// discover finds the authorization server of c's MCP server as the MCP
// specification says, reusing what it found for a few minutes. A failure
// that is the server's (no metadata, no S256, a refused address) is a
// *DiscoveryError; one that may pass (the server unreachable) is not.
func (m *Manager) discover(ctx context.Context, c Connector) (*discovered, error) {
	m.mu.Lock()
	d := m.discoveries[c.URL]
	m.mu.Unlock()
	if d == nil || time.Since(d.at) >= discoveryTTL {
		v, err := m.shared(ctx, "discover\x00"+c.URL, func() (any, error) {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 4*requestTimeout)
			defer cancel()
			return m.discoverNow(ctx, c.URL)
		})
		if err != nil {
			return nil, err
		}
		d = v.(*discovered)
	}
	if c.Mode == ModeUser && !d.server.supportsS256() {
		return nil, &DiscoveryError{Reason: fmt.Sprintf("the authorization server %s does not support PKCE with S256 "+
			"(code_challenge_methods_supported: %q), which the MCP specification requires", d.server.Issuer, d.server.CodeChallengeMethodsSupported)}
	}
	return d, nil
}

// forgetServer drops what discovery found of the authorization server
// issuer (its metadata, and the connector URLs found to use it), so the
// next use discovers again.
func (m *Manager) forgetServer(issuer string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, d := range m.discoveries {
		if d.server.Issuer == issuer {
			delete(m.discoveries, k)
		}
	}
	for _, insecure := range []bool{false, true} {
		delete(m.servers, fmt.Sprintf("%s\x00%t", issuer, insecure))
	}
}

func (m *Manager) discoverNow(ctx context.Context, rawURL string) (*discovered, error) {
	mcpURL, err := url.Parse(rawURL)
	if err != nil || mcpURL.Host == "" || (mcpURL.Scheme != "https" && mcpURL.Scheme != "http") {
		return nil, &DiscoveryError{Reason: fmt.Sprintf("the connector's URL %q is not an absolute http(s) URL", secret.RedactText(rawURL))}
	}
	canonical := canonicalURL(mcpURL)
	insecure := mcpURL.Scheme == "http"

	ch, probeStatus, err := m.probe(ctx, rawURL)
	if err != nil {
		return nil, err
	}
	// A server on a public address may not send the service into its own
	// network: the metadata URLs it names must be public too.
	public := !internalHost(ctx, mcpURL.Hostname())
	var tried []string
	var prm *protectedResource
	for _, cand := range prmCandidates(mcpURL, ch.resourceMetadata) {
		if err := checkNamedHost(ctx, public, "its resource_metadata", cand.url); err != nil && cand.fromHeader {
			return nil, &DiscoveryError{Reason: err.Error(), Tried: append(tried, cand.url+": refused")}
		}
		p, why, err := m.fetchPRM(ctx, cand.url, canonical, cand.fromHeader, insecure)
		if err != nil { // refused by the egress policy: stop there
			return nil, &DiscoveryError{Reason: "a protected resource metadata URL is refused: " + err.Error(),
				Tried: append(tried, cand.url+": refused"), Err: err}
		}
		if p != nil {
			prm = p
			break
		}
		tried = append(tried, cand.url+": "+why)
	}
	if prm == nil {
		reason := "no usable protected resource metadata (RFC 9728) for " + secret.RedactText(canonical)
		if probeStatus != http.StatusUnauthorized {
			reason += fmt.Sprintf("; the server answered an unauthenticated request with HTTP %d, not 401", probeStatus)
		}
		return nil, &DiscoveryError{Reason: reason, Tried: tried}
	}
	resource := canonical
	if prm.Resource != "" {
		resource = prm.Resource
	}
	if err := checkNamedHost(ctx, public, "its authorization server", prm.AuthorizationServers[0]); err != nil {
		return nil, &DiscoveryError{Reason: err.Error(), Tried: tried}
	}
	server, err := m.serverMetadata(ctx, prm.AuthorizationServers[0], insecure)
	if err != nil {
		return nil, err
	}
	d := &discovered{resource: resource, challengeScopes: ch.scope, prm: *prm, server: server, at: time.Now()}
	m.mu.Lock()
	m.discoveries[rawURL] = d
	m.mu.Unlock()
	return d, nil
}

// probeBody is an MCP initialize request, which a protected server
// answers with 401 and its challenge.
const probeBody = `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18",` +
	`"capabilities":{},"clientInfo":{"name":"connector-svc","version":"authorization-probe"}}}`

// probe sends an unauthenticated initialize to the MCP server and returns
// its Bearer challenge (if it answered 401 with one) and its status. Not
// reaching the server at all is an error that is not a DiscoveryError,
// except when the egress policy refuses it.
func (m *Manager) probe(ctx context.Context, rawURL string) (bearer, int, error) {
	if _, err := m.checkURL(ctx, "the connector's URL", rawURL, true); err != nil {
		if errors.Is(err, egress.ErrDenied) {
			return bearer{}, 0, &DiscoveryError{Reason: err.Error(), Err: err}
		}
		return bearer{}, 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, rawURL, strings.NewReader(probeBody))
	if err != nil {
		return bearer{}, 0, fmt.Errorf("probe %s: %w", secret.RedactText(rawURL), err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := m.hc.Do(req)
	if err != nil {
		// *url.Error names the URL, query values and all.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return bearer{}, 0, fmt.Errorf("probe %s for its authorization: %w", secret.RedactText(rawURL), err)
	}
	drain(resp)
	if resp.StatusCode != http.StatusUnauthorized {
		return bearer{}, resp.StatusCode, nil
	}
	return bearerChallenge(resp.Header), resp.StatusCode, nil
}

type prmCandidate struct {
	url        string
	fromHeader bool
}

// prmCandidates are the URLs of u's protected resource metadata, in the
// order RFC 9728 and the MCP specification give: the challenge's
// resource_metadata, then the well-known URL with u's path inserted, then
// the root one.
//
// A challenge naming one of the well-known URLs does not make it asked
// twice: it is asked first, and checked as the well-known URL it is.
func prmCandidates(u *url.URL, fromHeader string) []prmCandidate {
	root := u.Scheme + "://" + u.Host + "/.well-known/oauth-protected-resource"
	var wellKnown []prmCandidate
	if p := strings.TrimSuffix(u.EscapedPath(), "/"); p != "" {
		wellKnown = append(wellKnown, prmCandidate{url: root + p})
	}
	wellKnown = append(wellKnown, prmCandidate{url: root})
	if fromHeader == "" {
		return wellKnown
	}
	out := []prmCandidate{{url: fromHeader, fromHeader: true}}
	for _, c := range wellKnown {
		if c.url == fromHeader {
			out[0].fromHeader = false
		} else {
			out = append(out, c)
		}
	}
	return out
}

// fetchPRM fetches and checks one protected resource metadata candidate:
// a usable document, or why not (why); err only when the egress policy
// refuses the URL, which ends discovery.
func (m *Manager) fetchPRM(ctx context.Context, rawURL, canonical string, fromHeader, insecure bool) (prm *protectedResource, why string, err error) {
	if _, err := m.checkURL(ctx, "protected resource metadata", rawURL, insecure); err != nil {
		if errors.Is(err, egress.ErrDenied) {
			return nil, "", err
		}
		return nil, err.Error(), nil
	}
	var p protectedResource
	status, err := m.getJSON(ctx, rawURL, &p)
	switch {
	case err != nil && status == 0:
		return nil, fetchFailure(err), nil
	case err != nil:
		return nil, err.Error(), nil
	case status != http.StatusOK:
		return nil, fmt.Sprintf("HTTP %d", status), nil
	}
	// RFC 9728 §3.3: the document must be about the resource addressed. A
	// URL the server's challenge named may be anywhere, so its document
	// must name the resource exactly; a well-known URL is the resource's
	// own, and its document may name the resource or a prefix of it.
	if fromHeader {
		if p.Resource == "" || !sameResource(p.Resource, canonical) {
			return nil, fmt.Sprintf("its resource %q is not %s", p.Resource, canonical), nil
		}
	} else if p.Resource != "" && !resourceCovers(p.Resource, canonical) {
		return nil, fmt.Sprintf("its resource %q is not %s nor a prefix of it", p.Resource, canonical), nil
	}
	if len(p.AuthorizationServers) == 0 || p.AuthorizationServers[0] == "" {
		return nil, "it names no authorization_servers", nil
	}
	return &p, "", nil
}

// fetchFailure says why a request got no answer, without the URL (which
// the caller names).
func fetchFailure(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timed out"
	}
	return err.Error()
}

// serverMetadata returns the metadata of the authorization server issuer,
// fetched from the URLs RFC 8414 and OpenID Connect Discovery give, in
// the MCP specification's order, and reused for a few minutes. The
// document's issuer must be issuer exactly.
func (m *Manager) serverMetadata(ctx context.Context, issuer string, insecure bool) (*serverMetadata, error) {
	key := fmt.Sprintf("%s\x00%t", issuer, insecure)
	m.mu.Lock()
	e := m.servers[key]
	m.mu.Unlock()
	if e != nil && time.Since(e.at) < discoveryTTL {
		return e.meta, nil
	}
	v, err := m.shared(ctx, "server\x00"+key, func() (any, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*requestTimeout)
		defer cancel()
		return m.fetchServerMetadata(ctx, issuer, insecure)
	})
	if err != nil {
		return nil, err
	}
	return v.(*serverMetadata), nil
}

func (m *Manager) fetchServerMetadata(ctx context.Context, issuer string, insecure bool) (*serverMetadata, error) {
	candidates, err := serverMetadataURLs(issuer)
	if err != nil {
		return nil, &DiscoveryError{Reason: err.Error()}
	}
	var tried []string
	for _, cand := range candidates {
		if _, err := m.checkURL(ctx, "authorization server metadata", cand, insecure); err != nil {
			if errors.Is(err, egress.ErrDenied) {
				return nil, &DiscoveryError{Reason: "the authorization server's metadata URL is refused: " + err.Error(),
					Tried: append(tried, cand+": refused"), Err: err}
			}
			tried = append(tried, cand+": "+err.Error())
			continue
		}
		var s serverMetadata
		status, err := m.getJSON(ctx, cand, &s)
		switch {
		case err != nil && status == 0:
			tried = append(tried, cand+": "+fetchFailure(err))
			continue
		case err != nil:
			tried = append(tried, cand+": "+err.Error())
			continue
		case status != http.StatusOK:
			tried = append(tried, fmt.Sprintf("%s: HTTP %d", cand, status))
			continue
		case s.Issuer != issuer:
			tried = append(tried, fmt.Sprintf("%s: its issuer %q is not %q", cand, s.Issuer, issuer))
			continue
		}
		if err := m.checkServerURLs(&s, insecure); err != nil {
			return nil, &DiscoveryError{Reason: fmt.Sprintf("the metadata of authorization server %s: %v", issuer, err), Tried: append(tried, cand)}
		}
		m.mu.Lock()
		m.servers[fmt.Sprintf("%s\x00%t", issuer, insecure)] = &serverEntry{meta: &s, at: time.Now()}
		m.mu.Unlock()
		return &s, nil
	}
	return nil, &DiscoveryError{Reason: "no authorization server metadata (RFC 8414 or OpenID) for issuer " + issuer, Tried: tried}
}

// checkServerURLs refuses metadata whose endpoints are not http(s) URLs
// (plain http only where the connector's URL is), or lack the
// authorization or token endpoint.
func (m *Manager) checkServerURLs(s *serverMetadata, insecure bool) error {
	if s.AuthorizationEndpoint == "" || s.TokenEndpoint == "" {
		return errors.New("it names no authorization_endpoint or no token_endpoint")
	}
	for name, v := range map[string]string{
		"authorization_endpoint": s.AuthorizationEndpoint, "token_endpoint": s.TokenEndpoint,
		"registration_endpoint": s.RegistrationEndpoint, "revocation_endpoint": s.RevocationEndpoint,
	} {
		if v == "" {
			continue
		}
		u, err := url.Parse(v)
		if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
			return fmt.Errorf("its %s %q is not an absolute http(s) URL", name, v)
		}
		if u.Scheme == "http" && !insecure && !isLoopbackName(u.Hostname()) {
			return fmt.Errorf("its %s %s is plain http while the connector's URL is https", name, v)
		}
	}
	return nil
}

// serverMetadataURLs are the metadata URLs of issuer in the MCP
// specification's order: with a path, RFC 8414 path insertion, then OpenID
// path insertion, then OpenID path appending; without, the two well-known
// URLs at the root.
func serverMetadataURLs(issuer string) ([]string, error) {
	u, err := url.Parse(issuer)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("the authorization server %q is not an http(s) URL without query or fragment", issuer)
	}
	origin := u.Scheme + "://" + u.Host
	p := strings.TrimSuffix(u.EscapedPath(), "/")
	if p == "" {
		return []string{
			origin + "/.well-known/oauth-authorization-server",
			origin + "/.well-known/openid-configuration",
		}, nil
	}
	return []string{
		origin + "/.well-known/oauth-authorization-server" + p,
		origin + "/.well-known/openid-configuration" + p,
		origin + p + "/.well-known/openid-configuration",
	}, nil
}

// canonicalURL is u as a resource identifier (RFC 8707, and the MCP
// specification's canonical server URI): scheme and host lowercased, the
// default port dropped, no query (a connector URL's query may hold a key)
// and no fragment.
func canonicalURL(u *url.URL) string {
	scheme := strings.ToLower(u.Scheme)
	host := strings.ToLower(u.Hostname())
	port := u.Port()
	if (scheme == "https" && port == "443") || (scheme == "http" && port == "80") {
		port = ""
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	if port != "" {
		host += ":" + port
	}
	p := u.EscapedPath()
	if p == "/" {
		p = ""
	}
	return scheme + "://" + host + p
}

// canonical parses raw and returns its canonicalURL, or raw itself if it
// does not parse.
func canonical(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return raw
	}
	return canonicalURL(u)
}

// sameResource compares two resource identifiers as canonical URLs, a
// final slash ignored.
func sameResource(a, b string) bool {
	return strings.TrimSuffix(canonical(a), "/") == strings.TrimSuffix(canonical(b), "/")
}

// resourceCovers says whether the resource identifier prefix names
// resource or a path above it, on a segment boundary: https://h/a covers
// https://h/a/b but not https://h/ab. A prefix with a query or fragment
// covers nothing but itself.
func resourceCovers(prefix, resource string) bool {
	if sameResource(prefix, resource) {
		return true
	}
	u, err := url.Parse(prefix)
	if err != nil || u.RawQuery != "" || u.Fragment != "" {
		return false
	}
	p := strings.TrimSuffix(canonical(prefix), "/")
	return strings.HasPrefix(canonical(resource), p+"/")
}

// origin is the scheme, host and port of u, the port made explicit.
func origin(u *url.URL) string {
	scheme := strings.ToLower(u.Scheme)
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[scheme]
	}
	return scheme + "://" + net.JoinHostPort(strings.ToLower(u.Hostname()), port)
}

// internalHost reports whether host is, or resolves to, an address of the
// service's own machine or network: loopback, private (RFC 1918, RFC
// 4193), link-local or unspecified. A name that does not resolve is not.
func internalHost(ctx context.Context, host string) bool {
	addrs := []netip.Addr{}
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = append(addrs, a)
	} else if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	} else {
		ctx, cancel := context.WithTimeout(ctx, requestTimeout)
		defer cancel()
		addrs, _ = net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	}
	for _, a := range addrs {
		a = a.Unmap()
		if a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsUnspecified() {
			return true
		}
	}
	return false
}

// checkNamedHost refuses a URL that a server on a public address names
// (public) when it points into the service's own network: an attacker's
// MCP server must not use the service to reach what only it can.
func checkNamedHost(ctx context.Context, public bool, what, raw string) error {
	if !public {
		return nil
	}
	u, err := url.Parse(raw)
	if err != nil || !internalHost(ctx, u.Hostname()) {
		return nil // other checks refuse what does not parse
	}
	return fmt.Errorf("%s %s is on this service's own network (loopback, private or link-local) while the MCP server is not: refused",
		what, secret.RedactText(raw))
}
