package oauth

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/store"
)

// tokenKey names one principal's tokens.
type tokenKey struct {
	connector int64
	user      string
}

// liveToken is a principal's token as this process holds it.
type liveToken struct {
	access      string
	sealed      []byte // the row's sealed access token: its version
	expiresAt   time.Time
	issuedAt    time.Time
	refreshable bool
	scopes      []string
	loaded      time.Time
	// What the token was granted for: it is sent nowhere else.
	issuer, resource string
}

// Transport returns a RoundTripper for the connection of one principal
// (userID; "" for a client credentials connector) to connector c. It puts
// that principal's bearer token on the requests to c's origin, and on no
// others, over any Authorization header there; refreshes the token before
// it expires and when the server refuses it (once per request); and
// fails requests that cannot carry a usable token with a *RequiredError
// (the user must authorize) without sending them. Other errors it returns
// may pass (the authorization server was unreachable). A connector
// without OAuth gets base itself.
func (m *Manager) Transport(base http.RoundTripper, c Connector, userID string) http.RoundTripper {
	if c.Mode != ModeUser && c.Mode != ModeClientCredentials {
		return base
	}
	if base == nil {
		base = http.DefaultTransport
	}
	t := &tokenTransport{m: m, base: base, c: c, user: userID}
	if u, err := url.Parse(c.URL); err == nil {
		t.origin = origin(u)
	}
	return t
}

type tokenTransport struct {
	m      *Manager
	base   http.RoundTripper
	c      Connector
	user   string
	origin string
	// read is set once a request of this transport's connection has read
	// the principal's token from Postgres. A connection starts on what
	// Postgres holds, never on a token cached for an earlier one: a user
	// whose authorization was revoked through another replica (which
	// closed their connection) must not be served again from this one's
	// cache.
	read atomic.Bool
}

func (t *tokenTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.origin == "" || origin(req.URL) != t.origin {
		return t.base.RoundTrip(req)
	}
	ctx := req.Context()
	tok, err := t.m.current(ctx, t.c, t.user, !t.read.Load())
	if err != nil {
		closeBody(req)
		return nil, err
	}
	t.read.Store(true)
	resp, err := t.send(req, req.Body, tok)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusUnauthorized {
		drain(resp)
		body, err := replayBody(req)
		if err != nil {
			return nil, err
		}
		fresh, err := t.m.refresh(ctx, t.c, t.user, tok.sealed)
		if err != nil {
			closeReader(body)
			return nil, err
		}
		if resp, err = t.send(req, body, fresh); err != nil {
			return nil, err
		}
		if resp.StatusCode == http.StatusUnauthorized {
			drain(resp)
			return nil, t.m.refused(ctx, t.c, t.user, fresh)
		}
		tok = fresh
	}
	if resp.StatusCode == http.StatusForbidden {
		if ch := bearerChallenge(resp.Header); ch.err == "insufficient_scope" {
			drain(resp)
			if !slices.ContainsFunc(ch.scope, func(s string) bool { return !slices.Contains(tok.scopes, s) }) {
				// Authorizing again would ask for what the token has:
				// the server would refuse the next token the same way.
				return nil, &ScopesHeldError{Scopes: ch.scope}
			}
			return nil, &RequiredError{ConnectorID: t.c.ID, UserID: t.user, Reason: ReasonInsufficientScope,
				Scopes: union(tok.scopes, ch.scope)}
		}
	}
	return resp, nil
}

// send sends a copy of req with body and tok's bearer token.
func (t *tokenTransport) send(req *http.Request, body io.ReadCloser, tok *liveToken) (*http.Response, error) {
	r := req.Clone(req.Context())
	r.Body = body
	r.Header.Set("Authorization", "Bearer "+tok.access)
	return t.base.RoundTrip(r)
}

// replayBody is a fresh copy of req's body for sending it again.
func replayBody(req *http.Request) (io.ReadCloser, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return req.Body, nil
	}
	if req.GetBody == nil {
		return nil, errors.New("the server refused the token, and the request cannot be sent again (its body cannot be replayed)")
	}
	return req.GetBody()
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

func closeReader(r io.ReadCloser) {
	if r != nil {
		_ = r.Close()
	}
}

// current returns the principal's token, read from Postgres at most every
// few seconds (always when reload), refreshed first when it expires soon.
// Client credentials connectors get one from the server when they have
// none, or when theirs is for another resource or issuer; a user with
// such a token has none (NO_TOKEN): they must authorize the connector
// where it is now.
func (m *Manager) current(ctx context.Context, c Connector, userID string, reload bool) (*liveToken, error) {
	key := tokenKey{c.ID, userID}
	m.mu.Lock()
	tok := m.tokens[key]
	gen := m.forgets
	m.mu.Unlock()
	if tok == nil || reload || time.Since(tok.loaded) > tokenCacheTTL {
		row, err := m.db.OAuthToken(ctx, c.ID, userID)
		switch {
		case errors.Is(err, store.ErrNotFound) && c.Mode == ModeClientCredentials:
			return m.refresh(ctx, c, userID, nil)
		case errors.Is(err, store.ErrNotFound):
			m.forgetToken(c.ID, userID)
			return nil, &RequiredError{ConnectorID: c.ID, UserID: userID, Reason: ReasonNoToken}
		case err != nil:
			return nil, err
		case row.NeedsReauth && c.Mode == ModeUser:
			m.forgetToken(c.ID, userID)
			return nil, &RequiredError{ConnectorID: c.ID, UserID: userID, Reason: ReasonReauthorize}
		}
		if tok, err = m.live(row); err != nil {
			return nil, err
		}
		m.remember(key, tok, gen)
	}
	if why := m.unbound(c, tok.issuer, tok.resource); why != "" {
		if c.Mode == ModeClientCredentials {
			return m.refresh(ctx, c, userID, tok.sealed)
		}
		m.log.DebugContext(ctx, "a user's token is not for the connector as it is now; they must authorize it again",
			slog.Int64("connector_row", c.ID), slog.String("user_id", userID), slog.String("reason", why))
		return nil, &RequiredError{ConnectorID: c.ID, UserID: userID, Reason: ReasonNoToken}
	}
	if !m.expiring(tok, time.Now()) {
		return tok, nil
	}
	if tok.refreshable || c.Mode == ModeClientCredentials {
		valid := time.Now().Before(tok.expiresAt)
		if valid && m.refreshFailedRecently(key) {
			return tok, nil
		}
		fresh, err := m.refresh(ctx, c, userID, tok.sealed)
		var re *RequiredError
		if err != nil && !errors.As(err, &re) && valid {
			// The authorization server could not be reached: the token
			// is good a little longer, and a request after a pause
			// tries again.
			m.mu.Lock()
			m.refreshFailed[key] = time.Now()
			m.mu.Unlock()
			return tok, nil
		}
		return fresh, err
	}
	if time.Now().Before(tok.expiresAt) {
		return tok, nil // good a little longer; then the user must authorize again
	}
	return nil, &RequiredError{ConnectorID: c.ID, UserID: userID, Reason: ReasonReauthorize}
}

// refreshFailedRecently says whether a refresh ahead of expiry of key
// failed in the last refreshRetryPause.
func (m *Manager) refreshFailedRecently(key tokenKey) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	at, ok := m.refreshFailed[key]
	if ok && time.Since(at) >= refreshRetryPause {
		delete(m.refreshFailed, key)
		ok = false
	}
	return ok
}

// expiring says whether tok should be refreshed now: it expires within
// RefreshAhead, or within half its lifetime for short-lived tokens.
func (m *Manager) expiring(tok *liveToken, now time.Time) bool {
	if tok.expiresAt.IsZero() {
		return false
	}
	ahead := m.cfg.RefreshAhead
	if life := tok.expiresAt.Sub(tok.issuedAt); life > 0 && life/2 < ahead {
		ahead = life / 2
	}
	return !now.Add(ahead).Before(tok.expiresAt)
}

// live opens a stored token.
func (m *Manager) live(row *store.OAuthToken) (*liveToken, error) {
	access, err := m.box.OpenBytes(row.SealedAccess, tokenContext("access", row.ConnectorID, row.UserID))
	if err != nil {
		return nil, fmt.Errorf("open the stored access token: %w", err)
	}
	tok := &liveToken{access: string(access), sealed: row.SealedAccess, issuedAt: row.UpdatedAt,
		refreshable: row.SealedRefresh != nil, scopes: row.Scopes, loaded: time.Now(),
		issuer: row.Issuer, resource: row.Resource}
	if row.ExpiresAt != nil {
		tok.expiresAt = *row.ExpiresAt
	}
	return tok, nil
}

// unbound says why a token issued by issuer for resource must not be sent
// to c as it is now, or "" if it may: the resource (RFC 8707) must be c's
// canonical URL or a path above it on the same origin, and the issuer
// the one discovery last found for c's URL, if it found one lately. A
// connector whose URL changed is not sent the tokens its users granted
// the old server.
func (m *Manager) unbound(c Connector, issuer, resource string) string {
	if !resourceCovers(resource, c.URL) {
		return fmt.Sprintf("the token was granted for %s, not the connector's URL %s", secret.RedactText(resource), secret.RedactText(canonical(c.URL)))
	}
	m.mu.Lock()
	d := m.discoveries[c.URL]
	m.mu.Unlock()
	if d != nil && time.Since(d.at) < discoveryTTL && d.server.Issuer != issuer {
		return fmt.Sprintf("the token was issued by %s, while the server's authorization server is now %s", issuer, d.server.Issuer)
	}
	return ""
}

// remember caches tok for key, unless Forget was called since gen (what
// m.forgets was before tok was read). Past cacheSweepSize entries it first
// drops those too old to be used (at most once per tokenCacheTTL), so the
// cache holds about the principals active in the last few seconds, not
// every one ever seen.
func (m *Manager) remember(key tokenKey, tok *liveToken, gen uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.forgets != gen {
		return
	}
	if len(m.tokens) >= cacheSweepSize && time.Since(m.cacheSwept) > tokenCacheTTL {
		m.cacheSwept = time.Now()
		for k, t := range m.tokens {
			if time.Since(t.loaded) > tokenCacheTTL {
				delete(m.tokens, k)
			}
		}
	}
	m.tokens[key] = tok
}

// cacheSweepSize is the token cache's size past which remember drops
// stale entries.
const cacheSweepSize = 1024

// Forget drops what this process holds of a principal's token (userID;
// "" for a client credentials connector's own): its next request reads
// Postgres again instead of using, for up to a few seconds, a token
// cached here. Revoke calls it on the replica that revokes; call it on
// every other replica when an authorization is revoked or deleted there.
func (m *Manager) Forget(connectorID int64, userID string) {
	key := tokenKey{connectorID, userID}
	m.mu.Lock()
	m.forgets++
	delete(m.tokens, key)
	delete(m.refreshFailed, key)
	m.mu.Unlock()
}

func (m *Manager) forgetToken(connectorID int64, userID string) { m.Forget(connectorID, userID) }

// refresh replaces the principal's token seen (its sealed form; nil for
// none) with a new one: by the refresh token grant for a user, by the
// client credentials grant for a client credentials connector. Callers in
// this process that replace the same token share one refresh; across
// replicas, the row is held while refreshing, and one that finds the
// token already replaced uses the new one. A refused refresh marks the
// user's row (they must authorize again) and returns a *RequiredError;
// an unreachable server returns another error and leaves the row be.
func (m *Manager) refresh(ctx context.Context, c Connector, userID string, seen []byte) (*liveToken, error) {
	m.mu.Lock()
	gen := m.forgets
	m.mu.Unlock()
	h := sha256.Sum256(seen)
	key := fmt.Sprintf("refresh\x00%d\x00%s\x00%x", c.ID, userID, h[:8])
	v, err := m.shared(ctx, key, func() (any, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), refreshTimeout)
		defer cancel()
		return m.refreshLocked(ctx, c, userID, seen)
	})
	if err != nil {
		return nil, err
	}
	tok := v.(*liveToken)
	if why := m.unbound(c, tok.issuer, tok.resource); why != "" {
		// Another replica stored a token meanwhile, for the connector
		// as it was there.
		if c.Mode == ModeClientCredentials {
			return nil, errors.New("the connector's token is not for it as it is now (" + why + "); try again")
		}
		return nil, &RequiredError{ConnectorID: c.ID, UserID: userID, Reason: ReasonNoToken}
	}
	m.remember(tokenKey{c.ID, userID}, tok, gen)
	return tok, nil
}

func (m *Manager) refreshLocked(ctx context.Context, c Connector, userID string, seen []byte) (*liveToken, error) {
	log := m.log.With(slog.Int64("connector_row", c.ID), slog.String("user_id", userID))
	// What the refresh needs from Postgres besides the row is read before
	// the row is locked: the lock holds a pool connection, and refreshes
	// of as many users as the pool has connections, each waiting for a
	// second one, would hold them all.
	var pre *refreshClient
	if c.Mode == ModeUser {
		pre = m.prepareRefresh(ctx, c, userID)
	}
	var refused *refreshClient // a client the server refused, dropped once the row is released
	defer func() {
		if refused != nil {
			m.clientRefused(ctx, refused.issuer, refused.cl, refused.err)
		}
	}()
	row, err := m.db.LockOAuthToken(ctx, c.ID, userID, func(cur *store.OAuthToken) (*store.OAuthToken, error) {
		if c.Mode == ModeClientCredentials {
			if cur != nil && !bytes.Equal(cur.SealedAccess, seen) {
				return nil, nil // another replica got one meanwhile
			}
			return m.clientCredentials(ctx, c, cur)
		}
		switch {
		case cur == nil:
			return nil, &RequiredError{ConnectorID: c.ID, UserID: userID, Reason: ReasonNoToken}
		case cur.NeedsReauth:
			return nil, &RequiredError{ConnectorID: c.ID, UserID: userID, Reason: ReasonReauthorize}
		case !bytes.Equal(cur.SealedAccess, seen):
			return nil, nil // refreshed (or authorized again) meanwhile
		}
		next, err := m.refreshGrant(ctx, c, cur, pre, &refused)
		if err == nil {
			log.DebugContext(ctx, "refreshed an OAuth token")
			return next, nil
		}
		var required *RequiredError
		if !errors.As(err, &required) {
			log.WarnContext(ctx, "could not refresh an OAuth token; will try again", slog.Any("error", err))
			return nil, err
		}
		reason := err.Error()
		var ase *AuthServerError
		if errors.As(err, &ase) {
			reason = ase.Error()
		}
		log.WarnContext(ctx, "the user must authorize again", slog.String("reason", reason))
		marked := *cur
		marked.NeedsReauth, marked.ReauthReason = true, reason
		return &marked, required
	})
	if row != nil && row.NeedsReauth {
		m.forgetToken(c.ID, userID)
	}
	if err != nil {
		return nil, err
	}
	if row == nil {
		return nil, &RequiredError{ConnectorID: c.ID, UserID: userID, Reason: ReasonNoToken}
	}
	if row.NeedsReauth && c.Mode == ModeUser {
		return nil, &RequiredError{ConnectorID: c.ID, UserID: userID, Reason: ReasonReauthorize}
	}
	return m.live(row)
}

// reauthError is a refused refresh: a *RequiredError that also carries
// why, for the row's reauth_reason.
type reauthError struct {
	*RequiredError
	why error
}

func (e *reauthError) Error() string { return e.why.Error() }
func (e *reauthError) Unwrap() []error {
	return []error{e.RequiredError, e.why}
}

// refreshGrant runs the refresh token grant for cur, asking for the same
// resource and scopes. A refusal by the server, or tokens that cannot be
// refreshed at all, is a *reauthError.
func (m *Manager) refreshGrant(ctx context.Context, c Connector, cur *store.OAuthToken, pre *refreshClient,
	refused **refreshClient) (*store.OAuthToken, error) {
	required := &RequiredError{ConnectorID: c.ID, UserID: cur.UserID, Reason: ReasonReauthorize}
	refreshToken, err := m.box.OpenBytes(cur.SealedRefresh, tokenContext("refresh", cur.ConnectorID, cur.UserID))
	if err != nil {
		return nil, fmt.Errorf("open the stored refresh token: %w", err)
	}
	if len(refreshToken) == 0 {
		return nil, &reauthError{required, errors.New("the server refused the access token and issued no refresh token")}
	}
	insecure := insecureOK(cur.Resource)
	var s *serverMetadata
	var cl *client
	if pre != nil && pre.issuer == cur.Issuer && pre.clientID == cur.ClientID {
		s, cl = pre.server, pre.cl
	} else { // the row changed since it was read: rare, read again
		if s, err = m.serverMetadata(ctx, cur.Issuer, insecure); err != nil {
			return nil, err // the server's metadata may come back: not the user's to fix
		}
		if cl, err = m.clientByID(ctx, c, cur.Issuer, cur.ClientID, s); err != nil {
			return nil, &reauthError{required, err}
		}
	}
	if pre != nil && pre.err != nil && pre.issuer == cur.Issuer && pre.clientID == cur.ClientID {
		return nil, pre.err
	}
	form := url.Values{"grant_type": {grantRenew}, "refresh_token": {string(refreshToken)}, "resource": {cur.Resource}}
	if len(cur.Scopes) > 0 {
		form.Set("scope", strings.Join(cur.Scopes, " "))
	}
	tr, err := m.tokenRequest(ctx, s.TokenEndpoint, cl, form, insecure)
	if permanent(err) {
		// The grant was the client's: one the server forgot takes it along.
		*refused = &refreshClient{issuer: cur.Issuer, cl: cl, err: err}
		return nil, &reauthError{required, err}
	}
	if err != nil {
		return nil, err
	}
	next, err := m.sealTokens(cur.ConnectorID, cur.UserID, tr, cur.SealedRefresh)
	if err != nil {
		return nil, err
	}
	next.WorkspaceID, next.Issuer, next.Resource, next.ClientID = cur.WorkspaceID, cur.Issuer, cur.Resource, cur.ClientID
	next.Scopes = cur.Scopes
	if tr.Scope != "" {
		next.Scopes = strings.Fields(tr.Scope)
	}
	return next, nil
}

// clientCredentials gets a client credentials connector its token (RFC
// 6749 §4.4) for its resource and scopes.
func (m *Manager) clientCredentials(ctx context.Context, c Connector, cur *store.OAuthToken) (*store.OAuthToken, error) {
	if c.ClientID == "" {
		return nil, errors.New("the connector has no client_id for the client credentials grant")
	}
	d, err := m.discover(ctx, c)
	if err != nil {
		return nil, err
	}
	insecure := insecureOK(c.URL)
	cl := preRegistered(c, d.server)
	scopes := c.Scopes
	if len(scopes) == 0 {
		scopes = d.challengeScopes
	}
	form := url.Values{"grant_type": {grantCC}, "resource": {d.resource}}
	if len(scopes) > 0 {
		form.Set("scope", strings.Join(scopes, " "))
	}
	tr, err := m.tokenRequest(ctx, d.server.TokenEndpoint, cl, form, insecure)
	if err != nil {
		return nil, err
	}
	next, err := m.sealTokens(c.ID, "", tr, nil)
	if err != nil {
		return nil, err
	}
	if tr.RefreshToken == "" {
		next.SealedRefresh = nil
	}
	next.WorkspaceID, next.Issuer, next.Resource, next.ClientID, next.Scopes = c.WorkspaceID, d.server.Issuer, d.resource, cl.ID, scopes
	if tr.Scope != "" {
		next.Scopes = strings.Fields(tr.Scope)
	}
	if cur != nil {
		m.log.DebugContext(ctx, "renewed a client credentials token", slog.Int64("connector_row", c.ID))
	}
	return next, nil
}

// refused handles a server that refuses a token just refreshed: a user
// must authorize again (the row is marked, unless it changed meanwhile);
// a client credentials connector's server refuses its own client.
func (m *Manager) refused(ctx context.Context, c Connector, userID string, tok *liveToken) error {
	m.forgetToken(c.ID, userID)
	if c.Mode == ModeClientCredentials {
		return errors.New("the server refuses the token the client credentials grant issued (HTTP 401 again after a new token)")
	}
	reason := "the server refuses the access token even after a refresh"
	_, err := m.db.LockOAuthToken(ctx, c.ID, userID, func(cur *store.OAuthToken) (*store.OAuthToken, error) {
		if cur == nil || !bytes.Equal(cur.SealedAccess, tok.sealed) {
			return nil, nil
		}
		marked := *cur
		marked.NeedsReauth, marked.ReauthReason = true, reason
		return &marked, nil
	})
	if err != nil {
		m.log.WarnContext(ctx, "could not record that the user must authorize again", slog.Any("error", err))
	} else {
		m.log.WarnContext(ctx, "the user must authorize again", slog.Int64("connector_row", c.ID), slog.String("user_id", userID),
			slog.String("reason", reason))
	}
	return &RequiredError{ConnectorID: c.ID, UserID: userID, Reason: ReasonReauthorize}
}

// refreshClient is what a refresh of a user's token needs besides the
// row: the authorization server's metadata and the client the tokens were
// issued to, read before the row is locked. err is why they cannot be had.
type refreshClient struct {
	issuer, clientID string
	server           *serverMetadata
	cl               *client
	err              error
}

// prepareRefresh reads the user's row without a lock and looks up its
// server and client; nil when there is no row (the locked read says why).
func (m *Manager) prepareRefresh(ctx context.Context, c Connector, userID string) *refreshClient {
	cur, err := m.db.OAuthToken(ctx, c.ID, userID)
	if err != nil {
		return nil
	}
	pre := &refreshClient{issuer: cur.Issuer, clientID: cur.ClientID}
	insecure := insecureOK(cur.Resource)
	if pre.server, pre.err = m.serverMetadata(ctx, cur.Issuer, insecure); pre.err != nil {
		return pre // the server's metadata may come back: not the user's to fix
	}
	if pre.cl, err = m.clientByID(ctx, c, cur.Issuer, cur.ClientID, pre.server); err != nil {
		pre.err = &reauthError{&RequiredError{ConnectorID: c.ID, UserID: userID, Reason: ReasonReauthorize}, err}
	}
	return pre
}
