package server

import (
	"fmt"
	"maps"
	"math"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/durationpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/store"
)

// invalidError is a bad request: one violation per field, each naming the
// field by its JSON path in the request.
type invalidError struct {
	violations []violation
}

type violation struct {
	field, problem string
}

func (e *invalidError) Error() string {
	parts := make([]string, len(e.violations))
	for i, v := range e.violations {
		parts[i] = v.field + ": " + v.problem
	}
	return "invalid request: " + strings.Join(parts, "; ")
}

// checker collects violations; err returns nil when there are none.
type checker struct {
	violations []violation
}

func (c *checker) add(field, format string, args ...any) {
	c.violations = append(c.violations, violation{field, fmt.Sprintf(format, args...)})
}

func (c *checker) err() error {
	if len(c.violations) == 0 {
		return nil
	}
	return &invalidError{violations: c.violations}
}

const (
	maxIDLen          = 128
	maxNameLen        = 200
	maxDescriptionLen = 4000
	maxTimeout        = time.Hour

	maxNarrowToolsAbove = 100000
)

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

// id checks a workspace or connector id.
func (c *checker) id(field, v string) {
	switch {
	case v == "":
		c.add(field, "required")
	case len(v) > maxIDLen:
		c.add(field, "longer than %d characters", maxIDLen)
	case !validID(v):
		c.add(field, "must start with a letter or digit and contain only letters, digits, '.', '_' and '-'")
	}
}

// ref checks the workspace_id and connector_id of a request.
func (c *checker) ref(workspaceID, connectorID string) {
	c.id("workspace_id", workspaceID)
	c.id("connector_id", connectorID)
}

// toolRef checks the workspace_id, connector_id and tool_name of a request.
func (c *checker) toolRef(workspaceID, connectorID, tool string) {
	c.ref(workspaceID, connectorID)
	if tool == "" {
		c.add("tool_name", "required")
	}
}

// connectorRef checks a request that names only a connector.
func connectorRef(workspaceID, connectorID string) error {
	var c checker
	c.ref(workspaceID, connectorID)
	return c.err()
}

// connector checks a whole connector as it will be stored. Header and env
// names come from both the write-only maps and the names already stored.
func (c *checker) connector(p *connectorv1.Connector) {
	c.id("connector.connector_id", p.GetConnectorId())
	if len(p.GetName()) > maxNameLen {
		c.add("connector.name", "longer than %d characters", maxNameLen)
	}
	if len(p.GetDescription()) > maxDescriptionLen {
		c.add("connector.description", "longer than %d characters", maxDescriptionLen)
	}
	c.connection(p)
	c.timeout("connector.connect_timeout", p.GetConnectTimeout())
	c.timeout("connector.call_timeout", p.GetCallTimeout())
	if _, ok := connectorv1.SessionMode_name[int32(p.GetSessionMode())]; !ok {
		c.add("connector.session_mode", "unknown value %d", p.GetSessionMode())
	}
	c.protocolPreference(p)
	c.auth(p)
	c.askBack(p)
	if pol := p.GetApprovalPolicy(); approvalPolicies[pol] == "" {
		c.add("connector.approval_policy", "unknown value %d: use APPROVAL_POLICY_NONE, APPROVAL_POLICY_DESTRUCTIVE or APPROVAL_POLICY_ALL", pol)
	}
	if len(p.GetModel()) > maxNameLen {
		c.add("connector.model", "longer than %d characters", maxNameLen)
	}
	if n := p.GetNarrowToolsAbove(); n < 0 || n > maxNarrowToolsAbove {
		c.add("connector.narrow_tools_above", "must be between 0 and %d (0 uses the service's default)", maxNarrowToolsAbove)
	}
	if rl := p.GetRateLimit(); rl != nil {
		if rps := rl.GetRequestsPerSecond(); rps < 0 || math.IsNaN(rps) || math.IsInf(rps, 0) {
			c.add("connector.rate_limit.requests_per_second", "must be a finite number >= 0")
		}
		if rl.GetBurst() < 0 {
			c.add("connector.rate_limit.burst", "must be >= 0")
		}
	}
}

// protocolPreference checks the protocol generation a connector asks for.
// A per_session connector over streamable HTTP tells its caller sessions
// apart by MCP session, which the sessionless generation does not have.
func (c *checker) protocolPreference(p *connectorv1.Connector) {
	pref := p.GetProtocolPreference()
	if _, ok := protocolPreferences[pref]; !ok {
		c.add("connector.protocol_preference", "unknown value %d: use PROTOCOL_PREFERENCE_AUTO, PROTOCOL_PREFERENCE_CLASSIC "+
			"or PROTOCOL_PREFERENCE_SESSIONLESS", pref)
		return
	}
	if pref == connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_SESSIONLESS &&
		p.GetSessionMode() == connectorv1.SessionMode_SESSION_MODE_PER_SESSION &&
		p.GetTransport() == connectorv1.Transport_TRANSPORT_STREAMABLE_HTTP {
		c.add("connector.protocol_preference", "PROTOCOL_PREFERENCE_SESSIONLESS has no MCP sessions, and a "+
			"SESSION_MODE_PER_SESSION connector over streamable HTTP gives each caller session its own MCP session: "+
			"use PROTOCOL_PREFERENCE_AUTO or PROTOCOL_PREFERENCE_CLASSIC")
	}
}

// Bounds of a connector's sampling limits.
const (
	maxSamplingTokens   = 1_000_000
	maxSamplingRequests = 100_000
)

// askBack checks what a connector's servers may ask of it. Elicitation
// goes to the one user a connection belongs to, so it needs connections
// that belong to one: a shared connection would declare it to nobody.
func (c *checker) askBack(p *connectorv1.Connector) {
	if p.GetElicitation() && p.GetSessionMode() != connectorv1.SessionMode_SESSION_MODE_PER_SESSION &&
		p.GetAuth().GetMode() != connectorv1.AuthMode_AUTH_MODE_OAUTH_USER {
		c.add("connector.elicitation", "servers ask the user of a connection, and this connector's one shared "+
			"connection has none: set session_mode to SESSION_MODE_PER_SESSION or auth.mode to AUTH_MODE_OAUTH_USER")
	}
	sc := p.GetSampling()
	if sc == nil {
		return
	}
	if _, ok := samplingPolicies[sc.GetPolicy()]; !ok {
		c.add("connector.sampling.policy", "unknown value %d: use SAMPLING_POLICY_AUTO or SAMPLING_POLICY_APPROVE", sc.GetPolicy())
	}
	limit := func(name string, v int32, most int) {
		if v < 0 || int(v) > most {
			c.add("connector.sampling."+name, "must be between 0 and %d (0 uses the service's default)", most)
		}
	}
	limit("max_tokens_per_request", sc.GetMaxTokensPerRequest(), maxSamplingTokens)
	limit("max_requests_per_run", sc.GetMaxRequestsPerRun(), maxSamplingRequests)
	limit("max_tokens_per_run", sc.GetMaxTokensPerRun(), maxSamplingTokens)
	limit("max_requests_per_minute", sc.GetMaxRequestsPerMinute(), maxSamplingRequests)
	limit("max_tokens_per_minute", sc.GetMaxTokensPerMinute(), maxSamplingTokens)
}

// Bounds of a connector's auth settings and of a user id.
const (
	maxClientIDLen     = 512
	maxClientSecretLen = 4096
	maxScopes          = 64
	maxScopeLen        = 256
	maxUserIDLen       = 256
)

// auth checks a connector's OAuth settings against its connection: OAuth
// is for HTTP servers; a client credentials client needs its id and
// secret; an oauth_user connector opens a connection per user already,
// and the token goes in the Authorization header, which no static header
// may then take.
func (c *checker) auth(p *connectorv1.Connector) {
	a := p.GetAuth()
	mode, ok := authModes[a.GetMode()]
	if !ok {
		c.add("connector.auth.mode", "unknown value %d: use AUTH_MODE_NONE, AUTH_MODE_OAUTH_CLIENT_CREDENTIALS or AUTH_MODE_OAUTH_USER", a.GetMode())
		return
	}
	if len(a.GetClientId()) > maxClientIDLen {
		c.add("connector.auth.client_id", "longer than %d characters", maxClientIDLen)
	}
	if s := a.GetClientSecret(); len(s) > maxClientSecretLen || strings.ContainsAny(s, "\r\n\x00") {
		// Never echo the value: it is a secret.
		c.add("connector.auth.client_secret", "longer than %d characters, or contains a line break or NUL byte", maxClientSecretLen)
	}
	c.scopes("connector.auth.scopes", a.GetScopes())
	if mode == store.AuthNone {
		// Nothing would use them: refused rather than stored unused (a
		// client secret sealed for nothing).
		if a.GetClientId() != "" {
			c.add("connector.auth.client_id", "%s", noOAuth("a client id"))
		}
		if a.GetClientSecret() != "" || a.GetHasClientSecret() {
			c.add("connector.auth.client_secret", "%s", noOAuth("a client secret"))
		}
		if len(a.GetScopes()) > 0 {
			c.add("connector.auth.scopes", "%s", noOAuth("scopes"))
		}
		return
	}
	if p.GetTransport() == connectorv1.Transport_TRANSPORT_STDIO {
		c.add("connector.auth.mode", "%s needs an HTTP transport (TRANSPORT_SSE or TRANSPORT_STREAMABLE_HTTP): "+
			"a stdio server takes its credentials from connector.stdio.env", a.GetMode())
	}
	if mode == store.AuthClientCredentials {
		if a.GetClientId() == "" {
			c.add("connector.auth.client_id", "required for AUTH_MODE_OAUTH_CLIENT_CREDENTIALS")
		}
		if a.GetClientSecret() == "" && !a.GetHasClientSecret() {
			c.add("connector.auth.client_secret", "required for AUTH_MODE_OAUTH_CLIENT_CREDENTIALS")
		}
	}
	if mode == store.AuthUser && p.GetSessionMode() == connectorv1.SessionMode_SESSION_MODE_PER_SESSION {
		c.add("connector.session_mode", "SESSION_MODE_PER_SESSION cannot go with AUTH_MODE_OAUTH_USER: "+
			"oauth_user already opens one connection per user; use SESSION_MODE_SHARED")
	}
	h := p.GetHttp()
	for _, name := range append(slices.Collect(maps.Keys(h.GetHeaders())), h.GetHeaderNames()...) {
		if strings.EqualFold(name, "Authorization") {
			c.add("connector.http.headers", "an Authorization header cannot go with %s: the service sends the OAuth token in it; "+
				"remove the header", a.GetMode())
			break
		}
	}
}

// noOAuth is why a connector of auth mode none may not have what.
func noOAuth(what string) string {
	return "AUTH_MODE_NONE uses no OAuth, so " + what + " would go unused: set auth.mode to AUTH_MODE_OAUTH_CLIENT_CREDENTIALS " +
		"or AUTH_MODE_OAUTH_USER, or leave it empty (to clear it on update, name the field in update_mask with no value, " +
		"or replace the whole auth)"
}

// scopes checks OAuth scopes: each an RFC 6749 scope-token (printable
// ASCII but for space, '"' and backslash) of at most maxScopeLen
// characters, none twice (a repeated scope is refused, not merged), at
// most maxScopes of them.
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

// userID checks the user_id of a call or query of an oauth_user connector:
// required, and of the form userIDForm checks.
func (c *checker) userID(connectorID, v string) {
	if v == "" {
		c.add("user_id", "required: connector %q is AUTH_MODE_OAUTH_USER, and its calls run with the token of the end user they are for", connectorID)
		return
	}
	c.userIDForm(v)
}

// userIDForm checks the form of a user_id, which the service stores and
// routes on as it is: valid UTF-8, at most maxUserIDLen characters (not
// bytes), no control characters.
func (c *checker) userIDForm(v string) {
	switch {
	case !utf8.ValidString(v):
		c.add("user_id", "not valid UTF-8")
	case utf8.RuneCountInString(v) > maxUserIDLen:
		c.add("user_id", "longer than %d characters", maxUserIDLen)
	case strings.ContainsFunc(v, unicode.IsControl):
		c.add("user_id", "contains a control character")
	}
}

func (c *checker) connection(p *connectorv1.Connector) {
	switch p.GetTransport() {
	case connectorv1.Transport_TRANSPORT_STDIO:
		if p.GetHttp() != nil {
			c.add("connector.http", "not used by TRANSPORT_STDIO; set connector.stdio")
		}
		if p.GetStdio() == nil {
			c.add("connector.stdio", "required for TRANSPORT_STDIO")
			return
		}
		c.stdio(p.GetStdio())
	case connectorv1.Transport_TRANSPORT_SSE, connectorv1.Transport_TRANSPORT_STREAMABLE_HTTP:
		if p.GetStdio() != nil {
			c.add("connector.stdio", "not used by %s; set connector.http", p.GetTransport())
		}
		if p.GetHttp() == nil {
			c.add("connector.http", "required for %s", p.GetTransport())
			return
		}
		c.http(p.GetHttp())
	case connectorv1.Transport_TRANSPORT_UNSPECIFIED:
		c.add("connector.transport", "required: one of TRANSPORT_STDIO, TRANSPORT_SSE, TRANSPORT_STREAMABLE_HTTP")
	default:
		c.add("connector.transport", "unknown value %d: use TRANSPORT_STDIO, TRANSPORT_SSE or TRANSPORT_STREAMABLE_HTTP", p.GetTransport())
	}
}

func (c *checker) stdio(s *connectorv1.StdioConfig) {
	switch cmd := s.GetCommand(); {
	case cmd == "":
		c.add("connector.stdio.command", "required for TRANSPORT_STDIO")
	case strings.ContainsAny(cmd, " \t\n\x00"):
		c.add("connector.stdio.command", "must be a program name or path without spaces; put arguments in connector.stdio.args")
	}
	for i, a := range s.GetArgs() {
		if strings.ContainsRune(a, 0) {
			c.add(fmt.Sprintf("connector.stdio.args[%d]", i), "contains a NUL byte")
		}
	}
	for _, k := range slices.Sorted(maps.Keys(s.GetEnv())) {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			c.add("connector.stdio.env", "key %q is not a valid environment variable name", k)
		}
		if strings.ContainsRune(s.GetEnv()[k], 0) {
			c.add("connector.stdio.env["+k+"]", "value contains a NUL byte")
		}
	}
}

func (c *checker) http(h *connectorv1.HttpConfig) {
	u, err := url.Parse(h.GetUrl())
	switch {
	case h.GetUrl() == "":
		c.add("connector.http.url", "required")
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "":
		c.add("connector.http.url", "must be an absolute http:// or https:// URL")
	case u.User != nil:
		c.add("connector.http.url", "must not carry credentials; put them in connector.http.headers")
	case !validQuery(u.RawQuery):
		// Never echo the query: its values are secrets.
		c.add("connector.http.url", "the query string must be name=value pairs joined by '&', percent-encoded")
	}
	for _, name := range slices.Sorted(maps.Keys(h.GetHeaders())) {
		if !validHeaderName(name) {
			c.add("connector.http.headers", "%q is not a valid HTTP header name", name)
		}
		// Never echo the value: it is a secret.
		if strings.ContainsAny(h.GetHeaders()[name], "\r\n\x00") {
			c.add("connector.http.headers["+name+"]", "value contains a line break or NUL byte")
		}
	}
}

func (c *checker) timeout(field string, d *durationpb.Duration) {
	if d == nil {
		return
	}
	if err := d.CheckValid(); err != nil {
		c.add(field, "not a valid duration")
		return
	}
	switch v := d.AsDuration(); {
	case v < 0:
		c.add(field, "must not be negative")
	case v > maxTimeout:
		c.add(field, "must be at most %s", maxTimeout)
	}
}

// validQuery reports whether a raw query string holds only characters a
// query may hold unescaped (RFC 3986 §3.4) and parses as name=value pairs.
// So its values can be told apart from the text around them wherever Go
// quotes a URL, as in an HTTP client error.
func validQuery(q string) bool {
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
