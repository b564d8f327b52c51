package oauth

import (
	"errors"
	"fmt"
	"strings"
)

var (
	// ErrStateInvalid means a callback's state is unknown, was used
	// already or expired: the user must start again.
	ErrStateInvalid = errors.New("the authorization state is unknown, used already or expired: start the authorization again")
	// ErrIssuerMismatch means a callback's iss parameter is not the
	// authorization server the flow was started with, or is missing where
	// that server promised to send it (RFC 9207): a mix-up attack, or a
	// misconfigured server.
	ErrIssuerMismatch = errors.New("the authorization response's issuer (iss) does not match the authorization server")
	// ErrReturnToNotAllowed means a return_to is not an absolute http(s)
	// URL under one of the allowed prefixes (OAUTH_RETURN_TO_ALLOWED). The
	// errors Start returns wrap it with what exactly is wrong.
	ErrReturnToNotAllowed = errors.New("return_to is not allowed (OAUTH_RETURN_TO_ALLOWED)")
	// ErrNoGrant means the user has no standing authorization of the
	// connector.
	ErrNoGrant = errors.New("no authorization of this connector by this user")
)

// ScopesHeldError means the server refused a token for insufficient_scope
// naming only scopes the token holds (or none): a step-up would ask for
// what the user granted already, and the server would refuse the new
// token the same way, so no authorization is started.
type ScopesHeldError struct{ Scopes []string }

func (e *ScopesHeldError) Error() string {
	if len(e.Scopes) == 0 {
		return "the MCP server refused the token for insufficient scope without naming a scope: authorizing again would not help"
	}
	return fmt.Sprintf("the MCP server refused the token for insufficient scope, naming only scopes it holds (%s): "+
		"authorizing again would not help; the server's scope configuration is at fault", strings.Join(e.Scopes, " "))
}

// DiscoveryError means the connector's server cannot be authorized as the
// MCP specification asks: no usable protected resource metadata or
// authorization server metadata, no PKCE S256, no way to register, or a
// metadata URL the egress policy refuses. Reason says which; Tried lists
// the URLs requested and what each answered.
type DiscoveryError struct {
	Reason string
	Tried  []string
	Err    error // the underlying error, if one caused it (an *egress.DeniedError)
}

func (e *DiscoveryError) Error() string {
	var b strings.Builder
	b.WriteString("OAuth discovery: ")
	b.WriteString(e.Reason)
	if len(e.Tried) > 0 {
		b.WriteString(" (tried: ")
		b.WriteString(strings.Join(e.Tried, "; "))
		b.WriteString(")")
	}
	return b.String()
}

// Unwrap returns the underlying error.
func (e *DiscoveryError) Unwrap() error { return e.Err }

// AuthServerError is a refusal by the authorization server: an error
// redirect (access_denied when the user declined) or a token endpoint's
// error answer (invalid_grant, invalid_client...). Description is the
// server's error_description, with any value the service sent it (a code,
// a token, a secret) cut out.
type AuthServerError struct {
	Code        string
	Description string
	Status      int // the token endpoint's HTTP status; 0 for a redirect
}

func (e *AuthServerError) Error() string {
	msg := "the authorization server refused with OAuth error " + e.Code
	if e.Status != 0 {
		msg += fmt.Sprintf(" (HTTP %d)", e.Status)
	}
	if e.Description != "" {
		msg += ": " + e.Description
	}
	return msg
}

// returnToError is a return_to Start refuses: why is what is wrong with
// it. It is ErrReturnToNotAllowed.
type returnToError struct{ why string }

func (e *returnToError) Error() string { return e.why }
func (e *returnToError) Unwrap() error { return ErrReturnToNotAllowed }

// maxDescription bounds how much of a server's error_description an error
// carries.
const maxDescription = 300

// newAuthServerError builds an AuthServerError from a server's answer,
// scrubbing every one of sent (values the service sent: codes, tokens,
// secrets, verifiers) from the description and keeping it short and
// printable.
func newAuthServerError(code, description string, status int, sent ...string) *AuthServerError {
	for _, s := range sent {
		if len(s) >= 4 {
			description = strings.ReplaceAll(description, s, "[redacted]")
			code = strings.ReplaceAll(code, s, "[redacted]")
		}
	}
	return &AuthServerError{Code: printable(code, 64), Description: printable(description, maxDescription), Status: status}
}

// printable keeps at most n printable ASCII characters of s.
func printable(s string, n int) string {
	var b strings.Builder
	for _, r := range s {
		if b.Len() >= n {
			b.WriteString("…")
			break
		}
		if r >= 0x20 && r < 0x7f {
			b.WriteRune(r)
		}
	}
	return b.String()
}
