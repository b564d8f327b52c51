package registry

import (
	"net/url"
	"strings"
)

// redactor replaces a connector's secret values (header and env values,
// URL query values and password) with REDACTED in text that leaves the
// registry: errors, health, logs. Transports put URLs in their errors, and
// stdio servers may print their environment to stderr.
type redactor struct{ r *strings.Replacer }

// minSecret is the shortest value redacted; shorter ones would mangle
// ordinary words.
const minSecret = 4

func newRedactor(spec Spec) *redactor {
	var secrets []string
	for _, v := range spec.Headers {
		secrets = append(secrets, v)
		// "Bearer xyz" may appear without its scheme.
		if _, token, ok := strings.Cut(v, " "); ok {
			secrets = append(secrets, token)
		}
	}
	for _, v := range spec.Env {
		secrets = append(secrets, v)
	}
	if spec.ClientSecret != "" {
		secrets = append(secrets, spec.ClientSecret)
	}
	if u, err := url.Parse(spec.URL); err == nil {
		for _, vs := range u.Query() {
			for _, v := range vs {
				secrets = append(secrets, v, url.QueryEscape(v))
			}
		}
		if p, ok := u.User.Password(); ok {
			secrets = append(secrets, p, url.QueryEscape(p))
		}
	}
	var pairs []string
	for _, v := range secrets {
		if len(v) >= minSecret {
			pairs = append(pairs, v, "REDACTED")
		}
	}
	if len(pairs) == 0 {
		return &redactor{}
	}
	return &redactor{r: strings.NewReplacer(pairs...)}
}

// text returns s without secret values.
func (r *redactor) text(s string) string {
	if r.r == nil {
		return s
	}
	return r.r.Replace(s)
}

// err returns err with secret values taken out of its text, and what
// mcp-go repeats in it said once (see sayOnce); errors.Is and errors.As
// still see what it wraps. nil stays nil.
func (r *redactor) err(err error) error {
	if err == nil {
		return err
	}
	msg := err.Error()
	if clean := r.text(sayOnce(msg)); clean != msg {
		return &redactedError{msg: clean, err: err}
	}
	return err
}

type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }
