package oauth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// The token requests are written by hand rather than with
// golang.org/x/oauth2: a refresh must send resource and scope, which
// oauth2.TokenSource cannot; every request must authenticate as the
// registration says (none, client_secret_post, client_secret_basic)
// without x/oauth2 guessing; and every error must leave out what was sent
// (x/oauth2's RetrieveError keeps the whole response body). One function
// for all four grants reads more simply than three libraries' calls and
// one by hand.

// client is how the service authenticates to an authorization server.
type client struct {
	ID         string
	Secret     string
	AuthMethod string // none, client_secret_post or client_secret_basic
}

// Token endpoint auth methods (RFC 7591 §2).
const (
	authNone   = "none"
	authPost   = "client_secret_post"
	authBasic  = "client_secret_basic"
	grantCode  = "authorization_code"
	grantRenew = "refresh_token"
	grantCC    = "client_credentials"
)

// tokenResponse is a token endpoint's successful answer (RFC 6749 §5.1).
type tokenResponse struct {
	AccessToken  string      `json:"access_token"`
	TokenType    string      `json:"token_type"`
	RefreshToken string      `json:"refresh_token"`
	ExpiresIn    json.Number `json:"expires_in"`
	Scope        string      `json:"scope"`
}

// expiresAt is when the access token expires, or zero if the server did
// not say.
func (t *tokenResponse) expiresAt(now time.Time) time.Time {
	n, err := strconv.ParseFloat(string(t.ExpiresIn), 64)
	if err != nil || n <= 0 {
		return time.Time{}
	}
	return now.Add(time.Duration(n * float64(time.Second)))
}

// errorResponse is an authorization server's error answer (RFC 6749 §5.2).
type errorResponse struct {
	Error            string `json:"error"`
	ErrorDescription string `json:"error_description"`
}

// tokenRequest posts form to the token endpoint as cl and returns the
// tokens. A refusal with an OAuth error is an *AuthServerError; a server
// that does not answer, or answers 5xx without one, is another error (it
// may pass). Nothing sent appears in an error.
func (m *Manager) tokenRequest(ctx context.Context, endpoint string, cl *client, form url.Values, insecure bool) (*tokenResponse, error) {
	resp, err := m.postForm(ctx, "token endpoint", endpoint, cl, form, insecure)
	if err != nil {
		return nil, err
	}
	defer drain(resp)
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, fmt.Errorf("read the token endpoint's answer: %w", fetchErr(err))
	}
	if resp.StatusCode != http.StatusOK {
		return nil, m.refusal("token endpoint", endpoint, resp.StatusCode, body, cl, form)
	}
	var t tokenResponse
	if err := json.Unmarshal(body, &t); err != nil {
		return nil, fmt.Errorf("the token endpoint %s answered with something that is not a token response", endpoint)
	}
	if t.AccessToken == "" {
		return nil, fmt.Errorf("the token endpoint %s answered without an access_token", endpoint)
	}
	if t.TokenType != "" && !strings.EqualFold(t.TokenType, "bearer") {
		return nil, fmt.Errorf("the token endpoint %s issued a %q token; only Bearer tokens are supported", endpoint, printable(t.TokenType, 32))
	}
	return &t, nil
}

// revokeRequest revokes token at a revocation endpoint (RFC 7009) as cl.
func (m *Manager) revokeRequest(ctx context.Context, endpoint string, cl *client, token, hint string, insecure bool) error {
	form := url.Values{"token": {token}, "token_type_hint": {hint}}
	resp, err := m.postForm(ctx, "revocation endpoint", endpoint, cl, form, insecure)
	if err != nil {
		return err
	}
	defer drain(resp)
	if resp.StatusCode == http.StatusOK {
		return nil
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	return m.refusal("revocation endpoint", endpoint, resp.StatusCode, body, cl, form)
}

// postForm posts form to endpoint, authenticated as cl.
func (m *Manager) postForm(ctx context.Context, what, endpoint string, cl *client, form url.Values, insecure bool) (*http.Response, error) {
	if _, err := m.checkURL(ctx, "the "+what, endpoint, insecure); err != nil {
		return nil, err
	}
	body := url.Values{}
	for k, v := range form {
		body[k] = v
	}
	switch cl.AuthMethod {
	case authPost:
		body.Set("client_id", cl.ID)
		body.Set("client_secret", cl.Secret)
	case authBasic:
	default:
		body.Set("client_id", cl.ID)
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(body.Encode()))
	if err != nil {
		cancel()
		return nil, fmt.Errorf("the %s %s: %w", what, endpoint, err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	if cl.AuthMethod == authBasic {
		// RFC 6749 §2.3.1: both form-encoded before Basic encoding.
		req.SetBasicAuth(url.QueryEscape(cl.ID), url.QueryEscape(cl.Secret))
	}
	resp, err := m.hc.Do(req)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("the %s %s: %w", what, endpoint, fetchErr(err))
	}
	resp.Body = &cancelBody{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// cancelBody cancels its request's context once closed.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// fetchErr is err without the *url.Error around it, which would repeat
// the URL (the caller names it).
func fetchErr(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// refusal turns an endpoint's non-200 answer into an error: an
// *AuthServerError when it is an OAuth error (scrubbed of every value
// sent), else a plain one naming the status.
func (m *Manager) refusal(what, endpoint string, status int, body []byte, cl *client, form url.Values) error {
	var e errorResponse
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		sent := []string{cl.Secret}
		for _, k := range []string{"code", "code_verifier", "refresh_token", "token", "client_secret"} {
			sent = append(sent, form.Get(k))
		}
		return newAuthServerError(e.Error, e.ErrorDescription, status, sent...)
	}
	if status == http.StatusUnauthorized {
		return newAuthServerError("invalid_client", "the "+what+" refused the client's authentication", status)
	}
	return fmt.Errorf("the %s %s answered HTTP %d", what, endpoint, status)
}

// permanent says whether err is the authorization server's refusal of a
// grant (rather than a failure that may pass): an OAuth error with a 4xx
// status.
func permanent(err error) bool {
	var ase *AuthServerError
	return errors.As(err, &ase) && ase.Status >= 400 && ase.Status < 500
}
