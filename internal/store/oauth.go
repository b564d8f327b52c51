package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// OAuth client kinds (oauth_clients.kind).
const (
	OAuthClientDCR  = "dcr"  // RFC 7591 dynamic client registration
	OAuthClientCIMD = "cimd" // a client ID metadata document
)

// OAuthClient is the service's registration with one authorization server,
// for one callback URL. The secret, if the server issued one, arrives and
// leaves sealed.
type OAuthClient struct {
	Issuer       string
	RedirectURI  string
	ClientID     string
	SealedSecret []byte
	// AuthMethod is the token endpoint auth method: none,
	// client_secret_post or client_secret_basic.
	AuthMethod string
	Kind       string
	CreatedAt  time.Time
}

// OAuthClient returns the registration for issuer and redirectURI, or
// ErrNotFound.
func (db *DB) OAuthClient(ctx context.Context, issuer, redirectURI string) (*OAuthClient, error) {
	var c OAuthClient
	err := db.pool.QueryRow(ctx, `
		SELECT issuer, redirect_uri, client_id, sealed_client_secret, token_endpoint_auth_method, kind, created_at
		FROM oauth_clients WHERE issuer = $1 AND redirect_uri = $2`, issuer, redirectURI).
		Scan(&c.Issuer, &c.RedirectURI, &c.ClientID, &c.SealedSecret, &c.AuthMethod, &c.Kind, &c.CreatedAt)
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("OAuth client of %q: %w", issuer, ErrNotFound)
		}
		return nil, fmt.Errorf("OAuth client of %q: %w", issuer, err)
	}
	return &c, nil
}

// AddOAuthClient stores c unless a registration for its issuer and
// redirect URI exists already, and returns the one that is stored: c's
// when inserted is true, else the one that was there first (a concurrent
// registration that won), which the caller must use instead of c.
func (db *DB) AddOAuthClient(ctx context.Context, c *OAuthClient) (stored *OAuthClient, inserted bool, err error) {
	tag, err := db.pool.Exec(ctx, `
		INSERT INTO oauth_clients (issuer, redirect_uri, client_id, sealed_client_secret, token_endpoint_auth_method, kind)
		VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (issuer, redirect_uri) DO NOTHING`,
		c.Issuer, c.RedirectURI, c.ClientID, c.SealedSecret, c.AuthMethod, c.Kind)
	if err != nil {
		return nil, false, fmt.Errorf("store OAuth client of %q: %w", c.Issuer, err)
	}
	stored, err = db.OAuthClient(ctx, c.Issuer, c.RedirectURI)
	if err != nil {
		return nil, false, err
	}
	return stored, tag.RowsAffected() == 1, nil
}

// DeleteOAuthClient deletes the registration for issuer and redirectURI if
// it is still clientID's: the authorization server no longer knows that
// client, and a registration another replica made since then stays.
// Returns whether one was deleted.
func (db *DB) DeleteOAuthClient(ctx context.Context, issuer, redirectURI, clientID string) (bool, error) {
	tag, err := db.pool.Exec(ctx, `DELETE FROM oauth_clients WHERE issuer = $1 AND redirect_uri = $2 AND client_id = $3`,
		issuer, redirectURI, clientID)
	if err != nil {
		return false, fmt.Errorf("delete OAuth client of %q: %w", issuer, err)
	}
	return tag.RowsAffected() == 1, nil
}

// DeleteOAuthClients deletes every registration at issuer, whatever its
// redirect URI; returns how many.
func (db *DB) DeleteOAuthClients(ctx context.Context, issuer string) (int64, error) {
	tag, err := db.pool.Exec(ctx, `DELETE FROM oauth_clients WHERE issuer = $1`, issuer)
	if err != nil {
		return 0, fmt.Errorf("delete OAuth clients of %q: %w", issuer, err)
	}
	return tag.RowsAffected(), nil
}

// OAuthPending is an authorization in progress: what the callback needs
// to finish it. The state itself is never stored, only its hash.
type OAuthPending struct {
	StateHash          []byte
	WorkspaceID        string
	ConnectorID        int64
	UserID             string
	SealedVerifier     []byte
	Issuer             string
	ClientID           string
	SealedClientSecret []byte // a pre-registered client's secret; nil otherwise
	AuthMethod         string
	Resource           string
	Scopes             []string
	RedirectURI        string
	ReturnTo           string
	CreatedAt          time.Time
	ExpiresAt          time.Time
	UsedAt             *time.Time
}

const pendingColumns = `state_hash, workspace_id, connector_id, user_id, sealed_verifier, issuer, client_id,
	sealed_client_secret, token_endpoint_auth_method, resource, scopes, redirect_uri, return_to,
	created_at, expires_at, used_at`

func scanPending(row pgx.Row) (*OAuthPending, error) {
	var p OAuthPending
	err := row.Scan(&p.StateHash, &p.WorkspaceID, &p.ConnectorID, &p.UserID, &p.SealedVerifier, &p.Issuer, &p.ClientID,
		&p.SealedClientSecret, &p.AuthMethod, &p.Resource, &p.Scopes, &p.RedirectURI, &p.ReturnTo,
		&p.CreatedAt, &p.ExpiresAt, &p.UsedAt)
	if err != nil {
		return nil, err
	}
	return &p, nil
}

// CreateOAuthPending stores an authorization in progress; p.ExpiresAt
// says until when it may complete. Returns ErrConnectorNotFound if the
// connector is gone.
func (db *DB) CreateOAuthPending(ctx context.Context, p *OAuthPending) error {
	_, err := db.pool.Exec(ctx, `
		INSERT INTO oauth_pending (state_hash, workspace_id, connector_id, user_id, sealed_verifier, issuer, client_id,
			sealed_client_secret, token_endpoint_auth_method, resource, scopes, redirect_uri, return_to, expires_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)`,
		p.StateHash, p.WorkspaceID, p.ConnectorID, p.UserID, p.SealedVerifier, p.Issuer, p.ClientID,
		p.SealedClientSecret, p.AuthMethod, p.Resource, nonNil(p.Scopes), p.RedirectURI, p.ReturnTo, p.ExpiresAt)
	if isCode(err, "23503") { // foreign_key_violation: the connector was deleted
		return fmt.Errorf("store pending authorization: %w", ErrConnectorNotFound)
	}
	if err != nil {
		return fmt.Errorf("store pending authorization: %w", translate(err, ErrNotFound))
	}
	return nil
}

// ConsumeOAuthPending marks the authorization with that state hash used
// and returns it, once: a state that is unknown, used already or expired
// returns ErrNotFound.
func (db *DB) ConsumeOAuthPending(ctx context.Context, stateHash []byte) (*OAuthPending, error) {
	p, err := scanPending(db.pool.QueryRow(ctx, `
		UPDATE oauth_pending SET used_at = now()
		WHERE state_hash = $1 AND used_at IS NULL AND expires_at > now()
		RETURNING `+pendingColumns, stateHash))
	if err != nil {
		return nil, fmt.Errorf("consume pending authorization: %w", translate(err, ErrNotFound))
	}
	return p, nil
}

// OAuthPendingWorkspace returns the workspace of the authorization with
// that state hash without consuming it: ErrNotFound if it is unknown, used
// already or expired.
func (db *DB) OAuthPendingWorkspace(ctx context.Context, stateHash []byte) (string, error) {
	var ws string
	err := db.pool.QueryRow(ctx, `SELECT workspace_id FROM oauth_pending
		WHERE state_hash = $1 AND used_at IS NULL AND expires_at > now()`, stateHash).Scan(&ws)
	if err != nil {
		return "", fmt.Errorf("pending authorization: %w", translate(err, ErrNotFound))
	}
	return ws, nil
}

// DeleteStaleOAuthPending forgets authorizations in progress that expired
// more than keep ago (kept that long so a late callback is told its state
// expired rather than unknown, though both read the same). Returns how many.
func (db *DB) DeleteStaleOAuthPending(ctx context.Context, keep time.Duration) (int64, error) {
	tag, err := db.pool.Exec(ctx, `DELETE FROM oauth_pending WHERE expires_at < now() - $1::interval`, keep)
	if err != nil {
		return 0, fmt.Errorf("delete stale pending authorizations: %w", err)
	}
	return tag.RowsAffected(), nil
}

// OAuthToken is one standing authorization: a user's (UserID "" for a
// client credentials connector's own) tokens for one connector, sealed.
type OAuthToken struct {
	ConnectorID int64
	UserID      string
	WorkspaceID string
	// ConnectorExternalID is read from the connector; ignored on writes.
	ConnectorExternalID string
	Issuer              string
	Resource            string
	ClientID            string
	SealedAccess        []byte
	SealedRefresh       []byte // nil when the server issued none
	TokenType           string
	Scopes              []string
	ExpiresAt           *time.Time // nil if the server did not say
	NeedsReauth         bool
	ReauthReason        string
	CreatedAt           time.Time
	UpdatedAt           time.Time
}

const tokenColumns = `t.connector_id, t.user_id, t.workspace_id, c.external_id, t.issuer, t.resource, t.client_id,
	t.sealed_access_token, t.sealed_refresh_token, t.token_type, t.scopes, t.expires_at,
	t.needs_reauth, t.reauth_reason, t.created_at, t.updated_at`

func scanToken(row pgx.Row) (*OAuthToken, error) {
	var t OAuthToken
	err := row.Scan(&t.ConnectorID, &t.UserID, &t.WorkspaceID, &t.ConnectorExternalID, &t.Issuer, &t.Resource, &t.ClientID,
		&t.SealedAccess, &t.SealedRefresh, &t.TokenType, &t.Scopes, &t.ExpiresAt,
		&t.NeedsReauth, &t.ReauthReason, &t.CreatedAt, &t.UpdatedAt)
	if err != nil {
		return nil, err
	}
	return &t, nil
}

// OAuthToken returns the tokens of connector id and user, or ErrNotFound.
func (db *DB) OAuthToken(ctx context.Context, connectorID int64, userID string) (*OAuthToken, error) {
	t, err := getToken(ctx, db.pool, connectorID, userID, false)
	if err != nil {
		return nil, fmt.Errorf("OAuth token: %w", err)
	}
	return t, nil
}

func getToken(ctx context.Context, q querier, connectorID int64, userID string, lock bool) (*OAuthToken, error) {
	sql := `SELECT ` + tokenColumns + ` FROM oauth_tokens t JOIN connectors c ON c.id = t.connector_id
		WHERE t.connector_id = $1 AND t.user_id = $2`
	if lock {
		sql += ` FOR UPDATE OF t`
	}
	t, err := scanToken(q.QueryRow(ctx, sql, connectorID, userID))
	return t, translate(err, ErrNotFound)
}

// PutOAuthToken stores a new authorization's tokens, replacing any the
// user had for the connector: needs_reauth is cleared and created_at and
// updated_at are now. Returns ErrConnectorNotFound if the connector is gone.
func (db *DB) PutOAuthToken(ctx context.Context, t *OAuthToken) (*OAuthToken, error) {
	var out *OAuthToken
	err := db.InTx(ctx, func(tx pgx.Tx) error {
		if err := upsertToken(ctx, tx, t, true); err != nil {
			return err
		}
		var err error
		out, err = getToken(ctx, tx, t.ConnectorID, t.UserID, false)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("store OAuth token: %w", err)
	}
	return out, nil
}

func upsertToken(ctx context.Context, tx pgx.Tx, t *OAuthToken, fresh bool) error {
	// A fresh authorization starts its life anew; a refresh keeps it.
	onConflictCreated := "oauth_tokens.created_at"
	if fresh {
		onConflictCreated = "now()"
	}
	_, err := tx.Exec(ctx, `
		INSERT INTO oauth_tokens (connector_id, user_id, workspace_id, issuer, resource, client_id,
			sealed_access_token, sealed_refresh_token, token_type, scopes, expires_at, needs_reauth, reauth_reason)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
		ON CONFLICT (connector_id, user_id) DO UPDATE SET
			workspace_id = excluded.workspace_id, issuer = excluded.issuer, resource = excluded.resource,
			client_id = excluded.client_id, sealed_access_token = excluded.sealed_access_token,
			sealed_refresh_token = excluded.sealed_refresh_token, token_type = excluded.token_type,
			scopes = excluded.scopes, expires_at = excluded.expires_at, needs_reauth = excluded.needs_reauth,
			reauth_reason = excluded.reauth_reason, created_at = `+onConflictCreated+`, updated_at = now()`,
		t.ConnectorID, t.UserID, t.WorkspaceID, t.Issuer, t.Resource, t.ClientID,
		t.SealedAccess, t.SealedRefresh, cmpOr(t.TokenType, "Bearer"), nonNil(t.Scopes), t.ExpiresAt,
		t.NeedsReauth, t.ReauthReason)
	if isCode(err, "23503") {
		return ErrConnectorNotFound
	}
	return err
}

// LockOAuthToken runs fn on the tokens of connector id and user (nil if
// there are none) while holding them, in a transaction, so that no other
// replica's LockOAuthToken of the same row runs meanwhile, even when the
// row does not exist yet (a transaction-scoped advisory lock on the pair
// is taken first, then the row itself FOR UPDATE). If fn returns a token,
// it is stored (updated_at is now; created_at is kept) and committed even
// when fn also returns an error, which is then returned as is: that is how
// a refused refresh records that the user must authorize again. Returns
// what is stored when it is done (nil if nothing).
func (db *DB) LockOAuthToken(ctx context.Context, connectorID int64, userID string,
	fn func(cur *OAuthToken) (*OAuthToken, error)) (*OAuthToken, error) {
	var out *OAuthToken
	var fnErr error
	err := db.InTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('oauth_tokens/' || $1::bigint || '/' || $2::text, 0))`,
			connectorID, userID); err != nil {
			return err
		}
		cur, err := getToken(ctx, tx, connectorID, userID, true)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return err
		}
		var next *OAuthToken
		next, fnErr = fn(cur)
		out = cur
		if next == nil {
			return nil
		}
		next.ConnectorID, next.UserID = connectorID, userID
		if err := upsertToken(ctx, tx, next, false); err != nil {
			return err
		}
		out, err = getToken(ctx, tx, connectorID, userID, false)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("update OAuth token: %w", err)
	}
	return out, fnErr
}

// DeleteOAuthToken deletes the tokens of connector id and user; false if
// there were none.
func (db *DB) DeleteOAuthToken(ctx context.Context, connectorID int64, userID string) (bool, error) {
	tag, err := db.pool.Exec(ctx, `DELETE FROM oauth_tokens WHERE connector_id = $1 AND user_id = $2`, connectorID, userID)
	if err != nil {
		return false, fmt.Errorf("delete OAuth token: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// DeleteOAuthTokens deletes every token of connector id; returns how many.
func (db *DB) DeleteOAuthTokens(ctx context.Context, connectorID int64) (int64, error) {
	tag, err := db.pool.Exec(ctx, `DELETE FROM oauth_tokens WHERE connector_id = $1`, connectorID)
	if err != nil {
		return 0, fmt.Errorf("delete OAuth tokens: %w", err)
	}
	return tag.RowsAffected(), nil
}

// OAuthTokenFilter selects tokens for ListOAuthTokens.
type OAuthTokenFilter struct {
	WorkspaceID string // "" any (internal use only)
	ConnectorID int64  // 0 any
	UserID      string // "" any
	// After is the last row of the previous page: rows come in
	// (connector, user) order, after it.
	AfterConnectorID int64
	AfterUserID      string
	Limit            int // 0 or less: no limit
}

// ListOAuthTokens returns the tokens f selects, in (connector, user) order.
func (db *DB) ListOAuthTokens(ctx context.Context, f OAuthTokenFilter) ([]*OAuthToken, error) {
	limit := any(nil)
	if f.Limit > 0 {
		limit = f.Limit
	}
	rows, err := db.pool.Query(ctx, `SELECT `+tokenColumns+` FROM oauth_tokens t JOIN connectors c ON c.id = t.connector_id
		WHERE ($1 = '' OR t.workspace_id = $1) AND ($2 = 0 OR t.connector_id = $2) AND ($3 = '' OR t.user_id = $3)
			AND (t.connector_id, t.user_id) > ($4, $5)
		ORDER BY t.connector_id, t.user_id LIMIT $6`,
		f.WorkspaceID, f.ConnectorID, f.UserID, f.AfterConnectorID, f.AfterUserID, limit)
	if err != nil {
		return nil, fmt.Errorf("list OAuth tokens: %w", err)
	}
	ts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (*OAuthToken, error) { return scanToken(row) })
	if err != nil {
		return nil, fmt.Errorf("list OAuth tokens: %w", err)
	}
	return ts, nil
}

// Kinds of OAuthSealed values.
const (
	SealedOAuthClientSecret   = "client_secret"         // oauth_clients
	SealedPendingVerifier     = "pending_verifier"      // oauth_pending
	SealedPendingClientSecret = "pending_client_secret" // oauth_pending
	SealedAccessToken         = "access_token"          // oauth_tokens
	SealedRefreshToken        = "refresh_token"         // oauth_tokens
)

// OAuthSealed is one sealed value of the OAuth tables with the row it
// belongs to, from which its seal context is made.
type OAuthSealed struct {
	Kind                string
	Issuer, RedirectURI string // client secrets
	StateHash           []byte // pending
	ConnectorID         int64  // tokens
	UserID              string // tokens
	Sealed              []byte
}

// ResealOAuth passes every sealed value of the OAuth tables to fn and
// stores what fn returns, in one transaction that locks the rows, as
// ResealSecrets does for connectors. If fn returns an error nothing is
// written and the error is returned as is. Returns how many values were
// resealed.
func (db *DB) ResealOAuth(ctx context.Context, fn func(OAuthSealed) ([]byte, error)) (int, error) {
	n := 0
	reseal := func(v OAuthSealed) ([]byte, error) {
		if v.Sealed == nil {
			return nil, nil
		}
		n++
		return fn(v)
	}
	err := db.InTx(ctx, func(tx pgx.Tx) error {
		for _, table := range []func(context.Context, pgx.Tx, func(OAuthSealed) ([]byte, error)) error{
			resealClients, resealPending, resealTokens,
		} {
			if err := table(ctx, tx, reseal); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// resealClients reseals the client secrets of dynamic registrations.
func resealClients(ctx context.Context, tx pgx.Tx, reseal func(OAuthSealed) ([]byte, error)) error {
	type clientRow struct {
		Issuer, RedirectURI string
		Secret              []byte
	}
	rows, _ := tx.Query(ctx, `SELECT issuer, redirect_uri, sealed_client_secret FROM oauth_clients
		WHERE sealed_client_secret IS NOT NULL ORDER BY issuer, redirect_uri FOR UPDATE`)
	clients, err := pgx.CollectRows(rows, pgx.RowToStructByPos[clientRow])
	if err != nil {
		return fmt.Errorf("reseal OAuth clients: %w", err)
	}
	for _, c := range clients {
		s, err := reseal(OAuthSealed{Kind: SealedOAuthClientSecret, Issuer: c.Issuer, RedirectURI: c.RedirectURI, Sealed: c.Secret})
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE oauth_clients SET sealed_client_secret = $3 WHERE issuer = $1 AND redirect_uri = $2`,
			c.Issuer, c.RedirectURI, s); err != nil {
			return fmt.Errorf("reseal OAuth client: %w", err)
		}
	}
	return nil
}

// resealPending reseals the verifiers and client secrets of authorizations
// in progress.
func resealPending(ctx context.Context, tx pgx.Tx, reseal func(OAuthSealed) ([]byte, error)) error {
	type pendingRow struct {
		StateHash, Verifier, Secret []byte
	}
	rows, _ := tx.Query(ctx, `SELECT state_hash, sealed_verifier, sealed_client_secret FROM oauth_pending
		WHERE used_at IS NULL ORDER BY state_hash FOR UPDATE`)
	pending, err := pgx.CollectRows(rows, pgx.RowToStructByPos[pendingRow])
	if err != nil {
		return fmt.Errorf("reseal pending authorizations: %w", err)
	}
	for _, p := range pending {
		v, err := reseal(OAuthSealed{Kind: SealedPendingVerifier, StateHash: p.StateHash, Sealed: p.Verifier})
		if err != nil {
			return err
		}
		s, err := reseal(OAuthSealed{Kind: SealedPendingClientSecret, StateHash: p.StateHash, Sealed: p.Secret})
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE oauth_pending SET sealed_verifier = $2, sealed_client_secret = $3 WHERE state_hash = $1`,
			p.StateHash, v, s); err != nil {
			return fmt.Errorf("reseal pending authorization: %w", err)
		}
	}
	return nil
}

// resealTokens reseals users' access and refresh tokens.
func resealTokens(ctx context.Context, tx pgx.Tx, reseal func(OAuthSealed) ([]byte, error)) error {
	type tokenRow struct {
		ConnectorID     int64
		UserID          string
		Access, Refresh []byte
	}
	rows, _ := tx.Query(ctx, `SELECT connector_id, user_id, sealed_access_token, sealed_refresh_token FROM oauth_tokens
		ORDER BY connector_id, user_id FOR UPDATE`)
	tokens, err := pgx.CollectRows(rows, pgx.RowToStructByPos[tokenRow])
	if err != nil {
		return fmt.Errorf("reseal OAuth tokens: %w", err)
	}
	for _, t := range tokens {
		a, err := reseal(OAuthSealed{Kind: SealedAccessToken, ConnectorID: t.ConnectorID, UserID: t.UserID, Sealed: t.Access})
		if err != nil {
			return err
		}
		r, err := reseal(OAuthSealed{Kind: SealedRefreshToken, ConnectorID: t.ConnectorID, UserID: t.UserID, Sealed: t.Refresh})
		if err != nil {
			return err
		}
		// updated_at stays: the tokens did not change.
		if _, err := tx.Exec(ctx, `UPDATE oauth_tokens SET sealed_access_token = $3, sealed_refresh_token = $4
			WHERE connector_id = $1 AND user_id = $2`, t.ConnectorID, t.UserID, a, r); err != nil {
			return fmt.Errorf("reseal OAuth token: %w", err)
		}
	}
	return nil
}

// AnyOAuthSealed returns one sealed value of the OAuth tables, or a zero
// OAuthSealed if there is none. Start-up uses it to check SECRET_KEY.
func (db *DB) AnyOAuthSealed(ctx context.Context) (OAuthSealed, error) {
	var v OAuthSealed
	err := db.pool.QueryRow(ctx, `SELECT connector_id, user_id, sealed_access_token FROM oauth_tokens
		ORDER BY connector_id, user_id LIMIT 1`).Scan(&v.ConnectorID, &v.UserID, &v.Sealed)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return OAuthSealed{}, nil
	case err != nil:
		return OAuthSealed{}, fmt.Errorf("look for sealed OAuth tokens: %w", err)
	}
	v.Kind = SealedAccessToken
	return v, nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
