package connectors

import (
	"fmt"
	"maps"
	"math"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/store"
)

// The bounds of a connector's settings.
const (
	MaxIDLen            = 128
	maxNameLen          = 200
	maxDescriptionLen   = 4000
	maxTimeout          = time.Hour
	maxNarrowToolsAbove = 100000
	maxSamplingTokens   = 1_000_000
	maxSamplingRequests = 100_000
	maxClientIDLen      = 512
	maxClientSecretLen  = 4096
	maxScopes           = 64
	maxScopeLen         = 256
)

// checker collects violations; err returns nil when there are none.
type checker struct{ violations []Violation }

func (c *checker) add(field, format string, args ...any) {
	c.violations = append(c.violations, Violation{Field: field, Problem: fmt.Sprintf(format, args...)})
}

func (c *checker) err() error {
	if len(c.violations) == 0 {
		return nil
	}
	return &InvalidError{Violations: c.violations}
}

// Check is every rule a connector's settings break, in the order a
// front door reports them; none: it may be stored (the operator's
// allow-list and egress policy aside). Fields are named by their paths in
// the API's request ("connector.http.url"). Messages never hold a secret
// value.
func Check(sp *Spec) []Violation {
	var c checker
	c.connector(sp)
	return c.violations
}

// IDProblem is why v is not a well-formed workspace or connector id, ""
// if it is one: 1 to MaxIDLen characters matching
// ^[A-Za-z0-9][A-Za-z0-9._-]*$.
func IDProblem(v string) string {
	switch {
	case v == "":
		return "required"
	case len(v) > MaxIDLen:
		return fmt.Sprintf("longer than %d characters", MaxIDLen)
	case !validID(v):
		return "must start with a letter or digit and contain only letters, digits, '.', '_' and '-'"
	}
	return ""
}

// validID reports whether v is a well-formed id: ^[A-Za-z0-9][A-Za-z0-9._-]*$.
// Every call checks two, so it is a loop rather than a regular expression.
func validID(v string) bool {
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case i > 0 && (c == '.' || c == '_' || c == '-'):
		default:
			return false
		}
	}
	return v != ""
}

func (c *checker) id(field, v string) {
	if p := IDProblem(v); p != "" {
		c.add(field, "%s", p)
	}
}

func (c *checker) connector(sp *Spec) {
	c.id("connector.connector_id", sp.ConnectorID)
	if len(sp.Name) > maxNameLen {
		c.add("connector.name", "longer than %d characters", maxNameLen)
	}
	if len(sp.Description) > maxDescriptionLen {
		c.add("connector.description", "longer than %d characters", maxDescriptionLen)
	}
	c.connection(sp)
	c.timeout("connector.connect_timeout", sp.ConnectTimeout)
	c.timeout("connector.call_timeout", sp.CallTimeout)
	if n := sp.SessionMode.Unknown; n != 0 {
		c.add("connector.session_mode", "unknown value %d", n)
	}
	c.protocolPreference(sp)
	c.auth(sp)
	c.askBack(sp)
	if n := sp.ApprovalPolicy.Unknown; n != 0 {
		c.add("connector.approval_policy", "unknown value %d: use APPROVAL_POLICY_NONE, APPROVAL_POLICY_DESTRUCTIVE or APPROVAL_POLICY_ALL", n)
	}
	if len(sp.Model) > maxNameLen {
		c.add("connector.model", "longer than %d characters", maxNameLen)
	}
	if n := sp.NarrowToolsAbove; n < 0 || n > maxNarrowToolsAbove {
		c.add("connector.narrow_tools_above", "must be between 0 and %d (0 uses the service's default)", maxNarrowToolsAbove)
	}
	if rl := sp.RateLimit; rl != nil {
		if rps := rl.RequestsPerSecond; rps < 0 || math.IsNaN(rps) || math.IsInf(rps, 0) {
			c.add("connector.rate_limit.requests_per_second", "must be a finite number >= 0")
		}
		if rl.Burst < 0 {
			c.add("connector.rate_limit.burst", "must be >= 0")
		}
	}
}

// perSession reports whether sp gives each caller session its own
// connection.
func (sp *Spec) perSession() bool { return sp.SessionMode.Value == registry.SessionPerSession }

// protocolPreference checks the protocol generation a connector asks for.
// A per_session connector over streamable HTTP tells its caller sessions
// apart by MCP session, which the sessionless generation does not have.
func (c *checker) protocolPreference(sp *Spec) {
	if n := sp.ProtocolPreference.Unknown; n != 0 {
		c.add("connector.protocol_preference", "unknown value %d: use PROTOCOL_PREFERENCE_AUTO, PROTOCOL_PREFERENCE_CLASSIC "+
			"or PROTOCOL_PREFERENCE_SESSIONLESS", n)
		return
	}
	if sp.ProtocolPreference.Value == registry.ProtocolSessionless && sp.perSession() &&
		sp.Transport.Value == store.TransportStreamableHTTP {
		c.add("connector.protocol_preference", "PROTOCOL_PREFERENCE_SESSIONLESS has no MCP sessions, and a "+
			"SESSION_MODE_PER_SESSION connector over streamable HTTP gives each caller session its own MCP session: "+
			"use PROTOCOL_PREFERENCE_AUTO or PROTOCOL_PREFERENCE_CLASSIC")
	}
}

// askBack checks what a connector's servers may ask of it. Elicitation
// goes to the one user a connection belongs to, so it needs connections
// that belong to one: a shared connection would declare it to nobody.
func (c *checker) askBack(sp *Spec) {
	if sp.Elicitation && !sp.perSession() && sp.Auth.authMode() != store.AuthUser {
		c.add("connector.elicitation", "servers ask the user of a connection, and this connector's one shared "+
			"connection has none: set session_mode to SESSION_MODE_PER_SESSION or auth.mode to AUTH_MODE_OAUTH_USER")
	}
	sc := sp.Sampling
	if sc == nil {
		return
	}
	if n := sc.Policy.Unknown; n != 0 {
		c.add("connector.sampling.policy", "unknown value %d: use SAMPLING_POLICY_AUTO or SAMPLING_POLICY_APPROVE", n)
	}
	limit := func(name string, v int, most int) {
		if v < 0 || v > most {
			c.add("connector.sampling."+name, "must be between 0 and %d (0 uses the service's default)", most)
		}
	}
	limit("max_tokens_per_request", sc.MaxTokensPerRequest, maxSamplingTokens)
	limit("max_requests_per_run", sc.MaxRequestsPerRun, maxSamplingRequests)
	limit("max_tokens_per_run", sc.MaxTokensPerRun, maxSamplingTokens)
	limit("max_requests_per_minute", sc.MaxRequestsPerMinute, maxSamplingRequests)
	limit("max_tokens_per_minute", sc.MaxTokensPerMinute, maxSamplingTokens)
}

// auth checks a connector's OAuth settings against its connection: OAuth
// is for HTTP servers; a client credentials client needs its id and
// secret; an oauth_user connector opens a connection per user already,
// and the token goes in the Authorization header, which no static header
// may then take.
func (c *checker) auth(sp *Spec) {
	a := sp.Auth
	if a == nil {
		a = &Auth{}
	}
	if n := a.Mode.Unknown; n != 0 {
		c.add("connector.auth.mode", "unknown value %d: use AUTH_MODE_NONE, AUTH_MODE_OAUTH_CLIENT_CREDENTIALS or AUTH_MODE_OAUTH_USER", n)
		return
	}
	mode := a.authMode()
	if len(a.ClientID) > maxClientIDLen {
		c.add("connector.auth.client_id", "longer than %d characters", maxClientIDLen)
	}
	if s := a.ClientSecret; len(s) > maxClientSecretLen || strings.ContainsAny(s, "\r\n\x00") {
		// Never echo the value: it is a secret.
		c.add("connector.auth.client_secret", "longer than %d characters, or contains a line break or NUL byte", maxClientSecretLen)
	}
	c.scopes("connector.auth.scopes", a.Scopes)
	if mode == store.AuthNone {
		c.noOAuth(a)
		return
	}
	name := authModeNames[mode]
	if sp.Transport.Value == store.TransportStdio {
		c.add("connector.auth.mode", "%s needs an HTTP transport (TRANSPORT_SSE or TRANSPORT_STREAMABLE_HTTP): "+
			"a stdio server takes its credentials from connector.stdio.env", name)
	}
	if mode == store.AuthClientCredentials {
		if a.ClientID == "" {
			c.add("connector.auth.client_id", "required for AUTH_MODE_OAUTH_CLIENT_CREDENTIALS")
		}
		if a.ClientSecret == "" && !a.HasClientSecret {
			c.add("connector.auth.client_secret", "required for AUTH_MODE_OAUTH_CLIENT_CREDENTIALS")
		}
	}
	if mode == store.AuthUser && sp.perSession() {
		c.add("connector.session_mode", "SESSION_MODE_PER_SESSION cannot go with AUTH_MODE_OAUTH_USER: "+
			"oauth_user already opens one connection per user; use SESSION_MODE_SHARED")
	}
	var headers []string
	if h := sp.HTTP; h != nil {
		headers = append(slices.Collect(maps.Keys(h.Headers)), h.HeaderNames...)
	}
	for _, name := range headers {
		if strings.EqualFold(name, "Authorization") {
			c.add("connector.http.headers", "an Authorization header cannot go with %s: the service sends the OAuth token in it; "+
				"remove the header", authModeNames[mode])
			break
		}
	}
}

// noOAuth refuses the OAuth settings of a connector of auth mode none:
// nothing would use them, and they are refused rather than stored unused
// (a client secret sealed for nothing).
func (c *checker) noOAuth(a *Auth) {
	unused := func(what string) string {
		return "AUTH_MODE_NONE uses no OAuth, so " + what + " would go unused: set auth.mode to AUTH_MODE_OAUTH_CLIENT_CREDENTIALS " +
			"or AUTH_MODE_OAUTH_USER, or leave it empty (to clear it on update, name the field in update_mask with no value, " +
			"or replace the whole auth)"
	}
	if a.ClientID != "" {
		c.add("connector.auth.client_id", "%s", unused("a client id"))
	}
	if a.ClientSecret != "" || a.HasClientSecret {
		c.add("connector.auth.client_secret", "%s", unused("a client secret"))
	}
	if len(a.Scopes) > 0 {
		c.add("connector.auth.scopes", "%s", unused("scopes"))
	}
}

// CheckScopes is what breaks the rules of OAuth scopes, named as field
// and field[i]: each an RFC 6749 scope-token (printable ASCII but for
// space, '"' and backslash) of at most maxScopeLen characters, none twice
// (a repeated scope is refused, not merged), at most maxScopes of them.
func CheckScopes(field string, scopes []string) []Violation {
	var c checker
	c.scopes(field, scopes)
	return c.violations
}

func (c *checker) scopes(field string, scopes []string) {
	if len(scopes) > maxScopes {
		c.add(field, "more than %d scopes", maxScopes)
	}
	for i, s := range scopes {
		at := fmt.Sprintf("%s[%d]", field, i)
		switch j := slices.Index(scopes, s); {
		case !validScope(s):
			c.add(at, "a scope is 1-%d printable ASCII characters other than space, '\"' and '\\' (RFC 6749 scope-token)", maxScopeLen)
		case j < i:
			c.add(at, "repeats %s[%d] (%q): name each scope once", field, j, s)
		}
	}
}

// validScope reports whether s is an RFC 6749 scope-token of at most
// maxScopeLen characters: 1*( %x21 / %x23-5B / %x5D-7E ).
func validScope(s string) bool {
	if s == "" || len(s) > maxScopeLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if b := s[i]; b < 0x21 || b > 0x7e || b == '"' || b == '\\' {
			return false
		}
	}
	return true
}

func (c *checker) connection(sp *Spec) {
	t := sp.Transport
	switch {
	case t.Unknown != 0:
		c.add("connector.transport", "unknown value %d: use TRANSPORT_STDIO, TRANSPORT_SSE or TRANSPORT_STREAMABLE_HTTP", t.Unknown)
	case t.Value == store.TransportStdio:
		if sp.HTTP != nil {
			c.add("connector.http", "not used by TRANSPORT_STDIO; set connector.stdio")
		}
		if sp.Stdio == nil {
			c.add("connector.stdio", "required for TRANSPORT_STDIO")
			return
		}
		c.stdio(sp.Stdio)
	case t.Value == store.TransportSSE, t.Value == store.TransportStreamableHTTP:
		if sp.Stdio != nil {
			c.add("connector.stdio", "not used by %s; set connector.http", transportNames[t.Value])
		}
		if sp.HTTP == nil {
			c.add("connector.http", "required for %s", transportNames[t.Value])
			return
		}
		c.http(sp.HTTP)
	default:
		c.add("connector.transport", "required: one of TRANSPORT_STDIO, TRANSPORT_SSE, TRANSPORT_STREAMABLE_HTTP")
	}
}

func (c *checker) stdio(s *Stdio) {
	switch cmd := s.Command; {
	case cmd == "":
		c.add("connector.stdio.command", "required for TRANSPORT_STDIO")
	case strings.ContainsAny(cmd, " \t\n\x00"):
		c.add("connector.stdio.command", "must be a program name or path without spaces; put arguments in connector.stdio.args")
	}
	for i, a := range s.Args {
		if strings.ContainsRune(a, 0) {
			c.add(fmt.Sprintf("connector.stdio.args[%d]", i), "contains a NUL byte")
		}
	}
	for _, k := range slices.Sorted(maps.Keys(s.Env)) {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			c.add("connector.stdio.env", "key %q is not a valid environment variable name", k)
		}
		if strings.ContainsRune(s.Env[k], 0) {
			c.add("connector.stdio.env["+k+"]", "value contains a NUL byte")
		}
	}
}

func (c *checker) http(h *HTTP) {
	u, err := url.Parse(h.URL)
	switch {
	case h.URL == "":
		c.add("connector.http.url", "required")
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "":
		c.add("connector.http.url", "must be an absolute http:// or https:// URL")
	case u.User != nil:
		c.add("connector.http.url", "must not carry credentials; put them in connector.http.headers")
	case !ValidQuery(u.RawQuery):
		// Never echo the query: its values are secrets.
		c.add("connector.http.url", "the query string must be name=value pairs joined by '&', percent-encoded")
	}
	for _, name := range slices.Sorted(maps.Keys(h.Headers)) {
		if !validHeaderName(name) {
			c.add("connector.http.headers", "%q is not a valid HTTP header name", name)
		}
		// Never echo the value: it is a secret.
		if strings.ContainsAny(h.Headers[name], "\r\n\x00") {
			c.add("connector.http.headers["+name+"]", "value contains a line break or NUL byte")
		}
	}
}

func (c *checker) timeout(field string, d Timeout) {
	switch {
	case d.Malformed:
		c.add(field, "not a valid duration")
	case d.D < 0:
		c.add(field, "must not be negative")
	case d.D > maxTimeout:
		c.add(field, "must be at most %s", maxTimeout)
	}
}

// ValidQuery reports whether a raw query string holds only characters a
// query may hold unescaped (RFC 3986 §3.4) and parses as name=value pairs.
// So its values can be told apart from the text around them wherever Go
// quotes a URL, as in an HTTP client error.
func ValidQuery(q string) bool {
	for _, r := range q {
		if !isURLChar(r) {
			return false
		}
	}
	_, err := url.ParseQuery(q)
	return err == nil
}

func isURLChar(r rune) bool {
	return r < 0x80 && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' ||
		strings.ContainsRune("-._~!$&'()*+,;=:@/?%", r))
}

// validHeaderName reports whether s is an HTTP token (RFC 9110 §5.6.2).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r > 0x7e || r <= 0x20 || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, r) {
			return false
		}
	}
	return true
}
