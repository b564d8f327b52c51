package oauth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/client/transport"

	"github.com/connector-svc/connector-svc/internal/store"
)

// Start begins userID's authorization of connector c (ModeUser): it finds
// the authorization server, registers the service there if needed, and
// returns the URL to send the user's browser to. The scopes asked for are
// the connector's (else the server's challenge's, else its metadata's),
// extraScopes, and those the user granted already (a step-up keeps them).
// returnTo, where the callback sends the browser afterwards, must be empty
// or an absolute http(s) URL under an allowed prefix (Config.
// ReturnToAllowed); an error that is ErrReturnToNotAllowed says what is
// wrong with it.
func (m *Manager) Start(ctx context.Context, c Connector, userID, returnTo string, extraScopes []string) (*Started, error) {
	if c.Mode != ModeUser {
		return nil, fmt.Errorf("the connector's auth mode is %q: only %s connectors are authorized by their users", c.Mode, ModeUser)
	}
	if userID == "" {
		return nil, errors.New("a user_id is required to authorize")
	}
	if err := checkReturnTo(returnTo, m.returnTo); err != nil {
		return nil, err
	}
	m.sweep(ctx)
	d, err := m.discover(ctx, c)
	if err != nil {
		return nil, err
	}
	insecure := insecureOK(c.URL)
	cl, err := m.clientFor(ctx, c, d.server, insecure)
	if err != nil {
		return nil, err
	}

	scopes, err := m.scopesFor(ctx, c, userID, d, extraScopes)
	if err != nil {
		return nil, err
	}
	verifier, err := transport.GenerateCodeVerifier()
	if err != nil {
		return nil, fmt.Errorf("PKCE verifier: %w", err)
	}
	stateBytes := make([]byte, 32)
	if _, err := rand.Read(stateBytes); err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	state := base64.RawURLEncoding.EncodeToString(stateBytes)
	hash := stateHash(state)
	authURL, err := m.authorizeURL(d, cl.ID, state, verifier, scopes)
	if err != nil {
		return nil, err
	}

	sealedVerifier, err := m.box.SealBytes([]byte(verifier), pendingContext(hash, "verifier"))
	if err != nil {
		return nil, fmt.Errorf("seal the PKCE verifier: %w", err)
	}
	var sealedSecret []byte
	if c.ClientID != "" && cl.Secret != "" {
		if sealedSecret, err = m.box.SealBytes([]byte(cl.Secret), pendingContext(hash, "client-secret")); err != nil {
			return nil, fmt.Errorf("seal the client secret: %w", err)
		}
	}
	expires := time.Now().Add(m.cfg.StateTTL)
	err = m.db.CreateOAuthPending(ctx, &store.OAuthPending{
		StateHash: hash, WorkspaceID: c.WorkspaceID, ConnectorID: c.ID, UserID: userID,
		SealedVerifier: sealedVerifier, Issuer: d.server.Issuer, ClientID: cl.ID, SealedClientSecret: sealedSecret,
		AuthMethod: cl.AuthMethod, Resource: d.resource, Scopes: scopes, RedirectURI: m.cfg.RedirectURL,
		ReturnTo: returnTo, ExpiresAt: expires,
	})
	if err != nil {
		return nil, err
	}
	return &Started{URL: authURL, Scopes: scopes, ExpiresAt: expires}, nil
}

// scopesFor is what userID's authorization of c asks for: the connector's
// scopes, else the server's challenge's, else its metadata's; then
// extraScopes, and those the user granted already on the same server (a
// step-up keeps them).
func (m *Manager) scopesFor(ctx context.Context, c Connector, userID string, d *discovered, extraScopes []string) ([]string, error) {
	scopes := c.Scopes
	switch {
	case len(scopes) > 0:
	case len(d.challengeScopes) > 0:
		scopes = d.challengeScopes
	default:
		scopes = d.prm.ScopesSupported
	}
	scopes = union(scopes, extraScopes)
	if t, err := m.db.OAuthToken(ctx, c.ID, userID); err == nil {
		if resourceCovers(t.Resource, c.URL) && t.Issuer == d.server.Issuer {
			scopes = union(scopes, t.Scopes) // not another server's
		}
	} else if !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	return scopes, nil
}

// authorizeURL is the authorization endpoint's URL with the code request's
// parameters: PKCE (S256), state, scopes and the resource.
func (m *Manager) authorizeURL(d *discovered, clientID, state, verifier string, scopes []string) (string, error) {
	authURL, err := url.Parse(d.server.AuthorizationEndpoint)
	if err != nil {
		return "", fmt.Errorf("authorization endpoint: %w", err)
	}
	q := authURL.Query()
	q.Set("response_type", "code")
	q.Set("client_id", clientID)
	q.Set("redirect_uri", m.cfg.RedirectURL)
	q.Set("state", state)
	q.Set("code_challenge", transport.GenerateCodeChallenge(verifier))
	q.Set("code_challenge_method", "S256")
	if len(scopes) > 0 {
		q.Set("scope", strings.Join(scopes, " "))
	}
	q.Set("resource", d.resource)
	authURL.RawQuery = q.Encode()
	return authURL.String(), nil
}

// sweep deletes long-expired pending authorizations, at most once a minute.
func (m *Manager) sweep(ctx context.Context) {
	now := time.Now().Unix()
	last := m.lastSweep.Load()
	if now-last < 60 || !m.lastSweep.CompareAndSwap(last, now) {
		return
	}
	if _, err := m.db.DeleteStaleOAuthPending(ctx, staleKeep); err != nil {
		m.log.WarnContext(ctx, "could not delete expired pending authorizations", slog.Any("error", err))
	}
}

func stateHash(state string) []byte {
	h := sha256.Sum256([]byte(state))
	return h[:]
}

// Complete finishes an authorization from the parameters of the
// authorization server's redirect: the state must be one Start issued,
// unused and unexpired (ErrStateInvalid); iss must be the server's issuer,
// and is required where the server says it sends one (ErrIssuerMismatch).
// The code is exchanged for tokens, which are stored for the user,
// replacing any they had.
//
// An error parameter (errParam: the user declined, access_denied, or the
// server refused) spends the state and returns the server's refusal, an
// *AuthServerError, together with a Completed whose ReturnTo is the one
// given to Start and whose Grant is zero: the callback sends the browser
// back there with error=<code>, so the application learns of it. Every
// other error comes with a nil Completed.
//
// A code exchange the server refuses with invalid_client or
// unauthorized_client, made as the service's dynamic registration, means
// the server no longer knows it: the registration is deleted and the
// user's next authorization registers again.
func (m *Manager) Complete(ctx context.Context, state, code, iss, errParam string) (*Completed, error) {
	if state == "" {
		return nil, ErrStateInvalid
	}
	p, err := m.db.ConsumeOAuthPending(ctx, stateHash(state))
	if errors.Is(err, store.ErrNotFound) {
		return nil, ErrStateInvalid
	}
	if err != nil {
		return nil, err
	}
	if errParam != "" {
		return &Completed{ReturnTo: p.ReturnTo}, newAuthServerError(errParam, "", 0, code, state)
	}
	insecure := insecureOK(p.Resource)
	s, err := m.serverMetadata(ctx, p.Issuer, insecure)
	if err != nil {
		return nil, err
	}
	switch {
	case iss != "" && iss != p.Issuer:
		return nil, fmt.Errorf("%w: it is %q, the authorization started at %q", ErrIssuerMismatch, iss, p.Issuer)
	case iss == "" && s.AuthorizationResponseIssParameterSupported:
		return nil, fmt.Errorf("%w: the response has none, though %s says it sends one", ErrIssuerMismatch, p.Issuer)
	}
	if code == "" {
		return nil, newAuthServerError("invalid_request", "the authorization response carries no code", 0)
	}
	verifier, err := m.box.OpenBytes(p.SealedVerifier, pendingContext(p.StateHash, "verifier"))
	if err != nil {
		return nil, fmt.Errorf("open the PKCE verifier: %w", err)
	}
	secret, err := m.box.OpenBytes(p.SealedClientSecret, pendingContext(p.StateHash, "client-secret"))
	if err != nil {
		return nil, fmt.Errorf("open the client secret: %w", err)
	}
	cl := &client{ID: p.ClientID, Secret: string(secret), AuthMethod: p.AuthMethod}
	if cl.Secret == "" && cl.AuthMethod != authNone {
		// A registration's secret is stored with the registration.
		stored, err := m.storedClient(ctx, p.Issuer)
		if err != nil || stored.ID != cl.ID {
			return nil, fmt.Errorf("the client %q the authorization was started with is no longer registered at %s", cl.ID, p.Issuer)
		}
		cl = stored
	}
	form := url.Values{
		"grant_type":    {grantCode},
		"code":          {code},
		"redirect_uri":  {p.RedirectURI},
		"code_verifier": {string(verifier)},
		"resource":      {p.Resource},
	}
	tr, err := m.tokenRequest(ctx, s.TokenEndpoint, cl, form, insecure)
	if err != nil {
		m.clientRefused(ctx, p.Issuer, cl, err)
		return nil, err
	}
	scopes := p.Scopes
	if tr.Scope != "" {
		scopes = strings.Fields(tr.Scope)
	}
	row, err := m.sealTokens(p.ConnectorID, p.UserID, tr, nil)
	if err != nil {
		return nil, err
	}
	row.WorkspaceID, row.Issuer, row.Resource, row.ClientID, row.Scopes = p.WorkspaceID, p.Issuer, p.Resource, cl.ID, scopes
	stored, err := m.db.PutOAuthToken(ctx, row)
	if err != nil {
		return nil, err
	}
	m.forgetToken(p.ConnectorID, p.UserID)
	m.log.InfoContext(ctx, "user authorized a connector", slog.Int64("connector_row", p.ConnectorID),
		slog.String("user_id", p.UserID), slog.String("issuer", p.Issuer), slog.String("scopes", strings.Join(scopes, " ")))
	return &Completed{Grant: grantOf(stored), ReturnTo: p.ReturnTo}, nil
}

// PendingWorkspace returns the workspace of the authorization in progress
// that state names, without spending the state: ErrStateInvalid if it is
// unknown, used already or expired. A callback checks with it that the
// caller may complete the authorization before Complete spends it.
func (m *Manager) PendingWorkspace(ctx context.Context, state string) (string, error) {
	if state == "" {
		return "", ErrStateInvalid
	}
	ws, err := m.db.OAuthPendingWorkspace(ctx, stateHash(state))
	if errors.Is(err, store.ErrNotFound) {
		return "", ErrStateInvalid
	}
	return ws, err
}

// sealTokens makes a token row from a token response, sealed for
// connector id and user; the refresh token of prev is kept when the
// response brings none.
func (m *Manager) sealTokens(connectorID int64, userID string, tr *tokenResponse, prevRefresh []byte) (*store.OAuthToken, error) {
	access, err := m.box.SealBytes([]byte(tr.AccessToken), tokenContext("access", connectorID, userID))
	if err != nil {
		return nil, fmt.Errorf("seal the access token: %w", err)
	}
	refresh := prevRefresh
	if tr.RefreshToken != "" {
		if refresh, err = m.box.SealBytes([]byte(tr.RefreshToken), tokenContext("refresh", connectorID, userID)); err != nil {
			return nil, fmt.Errorf("seal the refresh token: %w", err)
		}
	}
	t := &store.OAuthToken{ConnectorID: connectorID, UserID: userID, SealedAccess: access, SealedRefresh: refresh, TokenType: "Bearer"}
	if exp := tr.expiresAt(time.Now()); !exp.IsZero() {
		t.ExpiresAt = &exp
	}
	return t, nil
}

func grantOf(t *store.OAuthToken) Grant {
	g := Grant{
		ConnectorID: t.ConnectorID, WorkspaceID: t.WorkspaceID, ConnectorExternalID: t.ConnectorExternalID,
		UserID: t.UserID, Scopes: t.Scopes, Refreshable: t.SealedRefresh != nil, Issuer: t.Issuer,
		CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt,
	}
	if t.ExpiresAt != nil {
		g.ExpiresAt = *t.ExpiresAt
	}
	return g
}

// Usable says whether userID (empty for a client credentials connector's
// own identity) can call connector c now: a token that the server has not
// refused, that is unexpired or can be refreshed, and that was granted for
// c as it is now (its URL, and the authorization server discovery last
// found for it). A client credentials connector with a client is always
// usable: the service gets its tokens.
func (m *Manager) Usable(ctx context.Context, c Connector, userID string) (bool, error) {
	if c.Mode == ModeNone {
		return true, nil
	}
	if c.Mode == ModeClientCredentials && c.ClientID != "" {
		return true, nil
	}
	t, err := m.db.OAuthToken(ctx, c.ID, userID)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if t.NeedsReauth || m.unbound(c, t.Issuer, t.Resource) != "" {
		return false, nil
	}
	return t.ExpiresAt == nil || t.ExpiresAt.After(time.Now()) || t.SealedRefresh != nil, nil
}

// Cursor is where a page of List ends: the next page starts after it.
type Cursor struct {
	ConnectorID int64
	UserID      string
}

// Cursor is g's position in List's order.
func (g Grant) Cursor() Cursor { return Cursor{ConnectorID: g.ConnectorID, UserID: g.UserID} }

// ListFilter selects standing authorizations.
type ListFilter struct {
	WorkspaceID string // required
	ConnectorID int64  // 0: any
	UserID      string // "": any
	After       Cursor // the last of the previous page; zero: from the start
	Limit       int    // 0 or less: 100
}

// List returns the standing authorizations f selects, in (connector,
// user) order. Never tokens.
func (m *Manager) List(ctx context.Context, f ListFilter) ([]Grant, error) {
	if f.WorkspaceID == "" {
		return nil, errors.New("list authorizations: a workspace is required")
	}
	if f.Limit <= 0 {
		f.Limit = 100
	}
	ts, err := m.db.ListOAuthTokens(ctx, store.OAuthTokenFilter{
		WorkspaceID: f.WorkspaceID, ConnectorID: f.ConnectorID, UserID: f.UserID,
		AfterConnectorID: f.After.ConnectorID, AfterUserID: f.After.UserID, Limit: f.Limit,
	})
	if err != nil {
		return nil, err
	}
	out := make([]Grant, len(ts))
	for i, t := range ts {
		out[i] = grantOf(t)
	}
	return out, nil
}

// Revoke ends userID's authorization of c: its refresh token and then its
// access token are revoked at the authorization server where it offers
// revocation (RFC 7009), and then deleted here whatever the server said.
// atServer is true when the server confirmed. ErrNoGrant if there is none.
func (m *Manager) Revoke(ctx context.Context, c Connector, userID string) (atServer bool, err error) {
	t, err := m.db.OAuthToken(ctx, c.ID, userID)
	if errors.Is(err, store.ErrNotFound) {
		return false, ErrNoGrant
	}
	if err != nil {
		return false, err
	}
	rctx, cancel := context.WithTimeout(ctx, 2*requestTimeout)
	atServer = m.revokeAtServer(rctx, c, t)
	cancel()
	if _, err := m.db.DeleteOAuthToken(ctx, c.ID, userID); err != nil {
		return atServer, err
	}
	m.forgetToken(c.ID, userID)
	return atServer, nil
}

// RevokeAll revokes every token of c at the authorization server (within
// a bounded time, a few at once) and deletes them, for the connector's
// deletion. Failures at the server are logged; only failing to delete is
// an error.
func (m *Manager) RevokeAll(ctx context.Context, c Connector) error {
	ts, err := m.db.ListOAuthTokens(ctx, store.OAuthTokenFilter{ConnectorID: c.ID})
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, revokeAllTimeout)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for _, t := range ts {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			m.revokeAtServer(rctx, c, t)
		}()
	}
	wg.Wait()
	cancel()
	if _, err := m.db.DeleteOAuthTokens(ctx, c.ID); err != nil {
		return err
	}
	for _, t := range ts {
		m.forgetToken(c.ID, t.UserID)
	}
	return nil
}

// revokeAtServer revokes t's refresh token, then its access token, where
// the server offers revocation; it reports whether the server confirmed
// every one, and logs what failed.
func (m *Manager) revokeAtServer(ctx context.Context, c Connector, t *store.OAuthToken) bool {
	log := m.log.With(slog.Int64("connector_row", t.ConnectorID), slog.String("user_id", t.UserID), slog.String("issuer", t.Issuer))
	fail := func(what string, err error) bool {
		log.WarnContext(ctx, "could not revoke OAuth tokens at the authorization server; deleting them here all the same",
			slog.String("step", what), slog.Any("error", err))
		return false
	}
	insecure := insecureOK(t.Resource)
	s, err := m.serverMetadata(ctx, t.Issuer, insecure)
	if err != nil {
		return fail("metadata", err)
	}
	if s.RevocationEndpoint == "" {
		return false
	}
	cl, err := m.clientByID(ctx, c, t.Issuer, t.ClientID, s)
	if err != nil {
		return fail("client", err)
	}
	for _, tok := range []struct {
		hint, what string
		sealed     []byte
	}{{"refresh_token", "refresh", t.SealedRefresh}, {"access_token", "access", t.SealedAccess}} {
		if tok.sealed == nil {
			continue
		}
		plain, err := m.box.OpenBytes(tok.sealed, tokenContext(tok.what, t.ConnectorID, t.UserID))
		if err != nil {
			return fail(tok.hint, err)
		}
		if err := m.revokeRequest(ctx, s.RevocationEndpoint, cl, string(plain), tok.hint, insecure); err != nil {
			m.clientRefused(ctx, t.Issuer, cl, err)
			return fail(tok.hint, err)
		}
	}
	return true
}

// union is a followed by those of b it lacks, without duplicates.
func union(a, b []string) []string {
	out := make([]string, 0, len(a)+len(b))
	for _, s := range slices.Concat(a, b) {
		if s != "" && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}
