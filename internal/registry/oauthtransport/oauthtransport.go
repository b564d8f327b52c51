// Package oauthtransport is the HTTP side of OAuth connectors, without the
// OAuth: the client whose requests go through whatever puts a token on
// them (the registry's Config.Authorize), with the errors that transport
// makes itself told apart from the network's (AuthError), and the
// unauthenticated probe that tells whether a server asks for OAuth as the
// MCP specification says. The tokens, and whose they are, are its
// caller's.
package oauthtransport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/telemetry"
)

// errNotConfigured is what an OAuth connector's requests fail with when
// there is nothing to authorize them.
var errNotConfigured = errors.New("OAuth is not configured on this service: the connector's requests cannot be authorized")

// AuthError is an error of the authorizing transport itself (no token
// for the user, a refresh refused, the authorization server down), not of
// the connection under it: the connection is fine, and no reconnect
// mends it. It wraps what the transport returned (errors.As finds an
// *oauth.RequiredError through it).
type AuthError struct{ Err error }

func (e *AuthError) Error() string { return e.Err.Error() }
func (e *AuthError) Unwrap() error { return e.Err }

// IsAuthError reports whether err is, or wraps, an AuthError.
func IsAuthError(err error) bool {
	var ae *AuthError
	return errors.As(err, &ae)
}

// Client is an HTTP client over base whose requests go through
// authorize(base): the transport that puts the token on them. Errors its
// RoundTrip makes itself (not base's) are AuthErrors. A nil authorize
// fails every request: OAuth is not configured.
func Client(base http.RoundTripper, authorize func(base http.RoundTripper) http.RoundTripper) *http.Client {
	var rt http.RoundTripper = refuseTripper{}
	if authorize != nil {
		rt = authorize(baseTripper{base})
	}
	return &http.Client{Transport: telemetry.Traceparent(authTripper{rt})}
}

// baseError marks an error of the transport under the authorizing one:
// the network's, which a reconnect may mend.
type baseError struct{ err error }

func (e *baseError) Error() string { return e.err.Error() }
func (e *baseError) Unwrap() error { return e.err }

// baseTripper marks its errors as baseErrors.
type baseTripper struct{ next http.RoundTripper }

func (t baseTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		return resp, &baseError{err}
	}
	return resp, nil
}

// authTripper turns the errors of an authorizing transport that did not
// come from the network under it into AuthErrors.
type authTripper struct{ next http.RoundTripper }

func (t authTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	var be *baseError
	if err != nil && !errors.As(err, &be) {
		return resp, &AuthError{Err: err}
	}
	return resp, err
}

// refuseTripper fails every request: OAuth is not configured.
type refuseTripper struct{}

func (refuseTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
	return nil, errNotConfigured
}

// Target is the server a Probe asks.
type Target struct {
	URL     string
	Headers map[string]string // sent as they are
	// SSE says the server speaks legacy SSE: the probe is its GET; else
	// it is a streamable-HTTP initialize.
	SSE bool
	// Client names the client in the initialize.
	Client mcp.Implementation
}

// Probe asks t's server over hc, without a token, whether it is there: an
// MCP server that wants OAuth answers 401 with a Bearer challenge, and one
// that does not answers. Anything else says what is wrong. A server that
// wants no token may have opened an MCP session for the probe: its id is
// returned, for the caller to end.
func Probe(ctx context.Context, hc *http.Client, t Target) (mcpSessionID string, err error) {
	var req *http.Request
	if t.SSE {
		req, err = http.NewRequestWithContext(ctx, http.MethodGet, t.URL, nil)
		if err == nil {
			req.Header.Set("Accept", "text/event-stream")
		}
	} else {
		body := fmt.Sprintf(`{"jsonrpc":"2.0","id":"probe","method":"initialize","params":{"protocolVersion":%q,`+
			`"capabilities":{},"clientInfo":{"name":%q,"version":%q}}}`, mcp.LATEST_LEGACY_PROTOCOL_VERSION,
			t.Client.Name, t.Client.Version)
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, t.URL, strings.NewReader(body))
		if err == nil {
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
		}
	}
	if err != nil {
		return "", fmt.Errorf("unauthenticated probe: %w", err)
	}
	for k, v := range t.Headers {
		req.Header.Set(k, v)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", fmt.Errorf("unauthenticated probe: %w", err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusUnauthorized && bearerChallenge(resp.Header.Values("WWW-Authenticate")):
		return "", nil
	case resp.StatusCode == http.StatusUnauthorized:
		return "", errors.New("unauthenticated probe: the server answered 401 without a Bearer challenge " +
			"(WWW-Authenticate): it does not ask for OAuth as the MCP specification says")
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return resp.Header.Get("Mcp-Session-Id"), nil
	}
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
	return "", fmt.Errorf("unauthenticated probe: the server answered HTTP %d: %s", resp.StatusCode,
		strings.TrimSpace(string(bytes.ToValidUTF8(snippet, nil))))
}

// bearerChallenge reports whether a WWW-Authenticate header names the
// Bearer scheme.
func bearerChallenge(values []string) bool {
	for _, v := range values {
		for _, part := range strings.Split(v, ",") {
			if f := strings.Fields(part); len(f) > 0 && strings.EqualFold(f[0], "Bearer") {
				return true
			}
		}
	}
	return false
}
