package connectors

import (
	"slices"
	"strings"

	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/store"
)

// UpdatePaths are the paths an update may name, each a setting of Spec by
// its name in the API.
var UpdatePaths = []string{
	"name", "description", "transport", "stdio", "stdio.command", "stdio.args", "stdio.env",
	"http", "http.url", "http.headers", "connect_timeout", "call_timeout", "session_mode",
	"model", "rate_limit", "disable_new_tools", "narrow_tools_above", "protocol_preference",
	"approval_policy", "auth", "auth.mode", "auth.client_id", "auth.client_secret", "auth.scopes",
	"elicitation", "sampling", "sampling.enabled", "sampling.policy", "sampling.max_tokens_per_request",
	"sampling.max_requests_per_run", "sampling.max_tokens_per_run", "sampling.max_requests_per_minute",
	"sampling.max_tokens_per_minute",
}

// merged is what merging an update's paths changed besides the settings.
type merged struct {
	// secretsReplaced: the header and env values were replaced (a new
	// connection, or new headers or env, replaces all of them).
	secretsReplaced bool
	// clientSecret: the OAuth client secret was set (a new auth sets it
	// too).
	clientSecret bool
}

// merge copies the settings of src that paths name into dst. The URL's
// query values follow dst's URL (see resealed). A path under a connection
// dst does not have is a violation of update_mask; paths not in
// UpdatePaths are ignored (the front door refuses them first).
func merge(dst, src *Spec, paths []string) (merged, error) {
	var c checker
	var m merged
	for _, path := range paths {
		if !slices.Contains(UpdatePaths, path) {
			continue
		}
		top, _, _ := strings.Cut(path, ".")
		switch top {
		case "stdio", "http":
			m.secretsReplaced = mergeConnection(&c, dst, src, path) || m.secretsReplaced
		case "auth":
			m.clientSecret = mergeAuth(dst, src, path) || m.clientSecret
		case "sampling":
			mergeSampling(dst, src, path)
		default:
			if set := settings[path]; set != nil {
				set(dst, src)
			}
		}
	}
	return m, c.err()
}

// settings copy the top-level settings that hold no secret, by path.
var settings = map[string]func(dst, src *Spec){
	"name":                func(d, s *Spec) { d.Name = s.Name },
	"description":         func(d, s *Spec) { d.Description = s.Description },
	"transport":           func(d, s *Spec) { d.Transport = s.Transport },
	"connect_timeout":     func(d, s *Spec) { d.ConnectTimeout = s.ConnectTimeout },
	"call_timeout":        func(d, s *Spec) { d.CallTimeout = s.CallTimeout },
	"session_mode":        func(d, s *Spec) { d.SessionMode = s.SessionMode },
	"protocol_preference": func(d, s *Spec) { d.ProtocolPreference = s.ProtocolPreference },
	"approval_policy":     func(d, s *Spec) { d.ApprovalPolicy = s.ApprovalPolicy },
	"model":               func(d, s *Spec) { d.Model = s.Model },
	"rate_limit":          func(d, s *Spec) { d.RateLimit = s.RateLimit },
	"disable_new_tools":   func(d, s *Spec) { d.DisableNewTools = s.DisableNewTools },
	"narrow_tools_above":  func(d, s *Spec) { d.NarrowToolsAbove = s.NarrowToolsAbove },
	"elicitation":         func(d, s *Spec) { d.Elicitation = s.Elicitation },
}

// mergeConnection copies a connection, or a part of dst's, and reports
// whether that replaced the header and env values. A new connection
// replaces the other kind: a connector has one.
func mergeConnection(c *checker, dst, src *Spec, path string) (secretsReplaced bool) {
	needs := func(has bool, whole string) bool {
		if !has {
			c.add("update_mask", "path %q: the connector has no %s config; use path %q to replace the connection", path, whole, whole)
		}
		return has
	}
	switch path {
	case "stdio":
		dst.Stdio, dst.HTTP = nil, nil
		if s := src.Stdio; s != nil {
			dst.Stdio = &Stdio{Command: s.Command, Args: s.Args, Env: s.Env}
		}
		return true
	case "http":
		dst.Stdio, dst.HTTP = nil, nil
		if h := src.HTTP; h != nil {
			dst.HTTP = &HTTP{URL: h.URL, Headers: h.Headers}
		}
		return true
	case "stdio.command", "stdio.args", "stdio.env":
		if !needs(dst.Stdio != nil, "stdio") {
			return false
		}
		var s Stdio
		if src.Stdio != nil {
			s = *src.Stdio
		}
		switch path {
		case "stdio.command":
			dst.Stdio.Command = s.Command
		case "stdio.args":
			dst.Stdio.Args = s.Args
		default:
			dst.Stdio.Env, dst.Stdio.EnvKeys = s.Env, nil
			return true
		}
	case "http.url", "http.headers":
		if !needs(dst.HTTP != nil, "http") {
			return false
		}
		var h HTTP
		if src.HTTP != nil {
			h = *src.HTTP
		}
		if path == "http.url" {
			dst.HTTP.URL = h.URL
			return false
		}
		dst.HTTP.Headers, dst.HTTP.HeaderNames = h.Headers, nil
		return true
	}
	return false
}

// mergeAuth copies the auth, or a part of dst's, and reports whether that
// set the client secret.
func mergeAuth(dst, src *Spec, path string) (clientSecret bool) {
	a := mergePart(&dst.Auth, src.Auth, path == "auth")
	switch path {
	case "auth":
		if dst.Auth != nil {
			dst.Auth.HasClientSecret = false
		}
		return true
	case "auth.mode":
		dst.Auth.Mode = a.Mode
	case "auth.client_id":
		dst.Auth.ClientID = a.ClientID
	case "auth.client_secret":
		dst.Auth.ClientSecret, dst.Auth.HasClientSecret = a.ClientSecret, false
		return true
	case "auth.scopes":
		dst.Auth.Scopes = a.Scopes
	}
	return false
}

// samplingSettings copy the sampling settings, by path.
var samplingSettings = map[string]func(dst, src *Sampling){
	"sampling.enabled":                 func(d, s *Sampling) { d.Enabled = s.Enabled },
	"sampling.policy":                  func(d, s *Sampling) { d.Policy = s.Policy },
	"sampling.max_tokens_per_request":  func(d, s *Sampling) { d.MaxTokensPerRequest = s.MaxTokensPerRequest },
	"sampling.max_requests_per_run":    func(d, s *Sampling) { d.MaxRequestsPerRun = s.MaxRequestsPerRun },
	"sampling.max_tokens_per_run":      func(d, s *Sampling) { d.MaxTokensPerRun = s.MaxTokensPerRun },
	"sampling.max_requests_per_minute": func(d, s *Sampling) { d.MaxRequestsPerMinute = s.MaxRequestsPerMinute },
	"sampling.max_tokens_per_minute":   func(d, s *Sampling) { d.MaxTokensPerMinute = s.MaxTokensPerMinute },
}

// mergeSampling copies the sampling settings, or one of dst's.
func mergeSampling(dst, src *Spec, path string) {
	v := mergePart(&dst.Sampling, src.Sampling, path == "sampling")
	if set := samplingSettings[path]; set != nil {
		set(dst.Sampling, &v)
	}
}

// mergePart is a copy of *src (the zero T if src is nil), from which a
// part of *dst is set. If whole, *dst becomes a copy of src (nil if src
// is); else *dst is made if it is nil, for the part to go in.
func mergePart[T any](dst **T, src *T, whole bool) T {
	var v T
	if src != nil {
		v = *src
	}
	switch {
	case whole && src == nil:
		*dst = nil
	case whole:
		c := v
		*dst = &c
	case *dst == nil:
		*dst = new(T)
	}
	return v
}

// secretsOf is the write-only values of sp: its header and env values,
// its client secret, and its URL's query values. A query value that is
// literally REDACTED, as responses show it, keeps the value of the same
// parameter in stored; with none to keep, the URL is invalid. A query
// without any value needs no sealing and gives none.
func secretsOf(sp *Spec, stored []secret.Param) (secret.Values, error) {
	var vals secret.Values
	if h := sp.HTTP; h != nil {
		_, vals.Query = secret.SplitURL(h.URL)
		vals.Headers = h.Headers
	}
	if err := keepRedacted(vals.Query, stored); err != nil {
		return secret.Values{}, err
	}
	if !slices.ContainsFunc(vals.Query, func(q secret.Param) bool { return q.Value != "" }) {
		vals.Query = nil
	}
	if sp.Stdio != nil {
		vals.Env = sp.Stdio.Env
	}
	if sp.Auth != nil {
		vals.ClientSecret = sp.Auth.ClientSecret
	}
	return vals, nil
}

// keepRedacted gives the n-th parameter of query of a name whose value is
// REDACTED the value of the n-th parameter of that name in stored, so
// repeated names keep their values in order.
func keepRedacted(query, stored []secret.Param) error {
	var c checker
	seen := map[string]int{}
	for i, q := range query {
		n := seen[q.Name]
		seen[q.Name]++
		if q.Value != secret.Redacted {
			continue
		}
		old := nth(stored, q.Name, n)
		if old == nil {
			c.add("connector.http.url", "query parameter %q is %s, the placeholder responses show: give its value "+
				"(only a parameter the connector already has keeps its value this way)", q.Name, secret.Redacted)
			continue
		}
		query[i].Value = old.Value
	}
	return c.err()
}

// nth returns the n-th parameter named name in query, counting from 0, or
// nil.
func nth(query []secret.Param, name string, n int) *secret.Param {
	for i := range query {
		if query[i].Name != name {
			continue
		}
		if n == 0 {
			return &query[i]
		}
		n--
	}
	return nil
}

// resealed returns the sealed secrets of sp, the stored connector with an
// update merged in. Header and env values are sp's if the update replaced
// them and the stored ones otherwise; query values are those of sp's URL,
// a REDACTED value keeping the stored one; the OAuth client secret is
// sp's if the update set it, else the stored one while sp keeps an OAuth
// mode. If nothing secret changed, the stored bytes are kept as they are.
func (s *Service) resealed(stored *store.Connector, sp *Spec, m merged) ([]byte, error) {
	binding := live.SealContext(stored.WorkspaceID, stored.ExternalID)
	old, err := s.d.Box.Open(stored.SealedSecrets, binding)
	if err != nil {
		return nil, err
	}
	storedQuery := old.Query
	if len(storedQuery) == 0 {
		// A connector stored before query values were sealed has them in
		// its URL.
		_, storedQuery = secret.SplitURL(stored.Config.URL)
	}
	vals, err := secretsOf(sp, storedQuery)
	if err != nil {
		return nil, err
	}
	if !m.clientSecret {
		vals.ClientSecret = old.ClientSecret
	}
	if sp.Auth.authMode() == store.AuthNone {
		vals.ClientSecret = "" // no OAuth, no client
	}
	if !m.secretsReplaced {
		if slices.Equal(vals.Query, old.Query) && vals.ClientSecret == old.ClientSecret {
			return stored.SealedSecrets, nil
		}
		vals.Headers, vals.Env = old.Headers, old.Env
	}
	return s.d.Box.Seal(vals, binding)
}
