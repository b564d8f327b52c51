package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrAPIKeyNotFound is ErrNotFound for an API key.
var ErrAPIKeyNotFound = fmt.Errorf("API key %w", ErrNotFound)

// APIKey is one row of the api_keys table. The token itself is never
// stored: only its SHA-256 and its last characters.
type APIKey struct {
	ID          string
	WorkspaceID string
	TokenSHA256 []byte
	// TokenHint is the token's last characters, for listings.
	TokenHint string
	Scopes    []string
	Name      string
	CreatedAt time.Time
	// RevokedAt is nil while the key is valid.
	RevokedAt *time.Time
}

// apiKeyColumns is what scanAPIKey reads.
const apiKeyColumns = `id, workspace_id, token_sha256, token_hint, scopes, name, created_at, revoked_at`

func scanAPIKey(row pgx.Row) (*APIKey, error) {
	var k APIKey
	err := row.Scan(&k.ID, &k.WorkspaceID, &k.TokenSHA256, &k.TokenHint, &k.Scopes, &k.Name, &k.CreatedAt, &k.RevokedAt)
	if err != nil {
		return nil, err
	}
	return &k, nil
}

// CreateAPIKey inserts k and returns the stored row; k's CreatedAt and
// RevokedAt are ignored. Returns ErrConflict if the id or the token hash is
// taken.
func (db *DB) CreateAPIKey(ctx context.Context, k *APIKey) (*APIKey, error) {
	got, err := scanAPIKey(db.pool.QueryRow(ctx, `
		INSERT INTO api_keys (id, workspace_id, token_sha256, token_hint, scopes, name)
		VALUES ($1, $2, $3, $4, $5, $6)
		RETURNING `+apiKeyColumns,
		k.ID, k.WorkspaceID, k.TokenSHA256, k.TokenHint, k.Scopes, k.Name))
	if err != nil {
		return nil, fmt.Errorf("create API key: %w", translate(err, ErrAPIKeyNotFound))
	}
	return got, nil
}

// APIKeyByHash returns the key whose token has this SHA-256, revoked or
// not. Returns ErrAPIKeyNotFound if there is none.
func (db *DB) APIKeyByHash(ctx context.Context, tokenSHA256 []byte) (*APIKey, error) {
	k, err := scanAPIKey(db.pool.QueryRow(ctx, `
		SELECT `+apiKeyColumns+` FROM api_keys WHERE token_sha256 = $1`, tokenSHA256))
	if err != nil {
		return nil, fmt.Errorf("look up API key: %w", translate(err, ErrAPIKeyNotFound))
	}
	return k, nil
}

// ListAPIKeys returns up to limit keys of a workspace, revoked ones
// included, whose ids sort after the id after, in id order.
func (db *DB) ListAPIKeys(ctx context.Context, workspaceID, after string, limit int) ([]*APIKey, error) {
	rows, err := db.pool.Query(ctx, `
		SELECT `+apiKeyColumns+` FROM api_keys
		WHERE workspace_id = $1 AND id > $2
		ORDER BY id
		LIMIT $3`,
		workspaceID, after, limit)
	if err != nil {
		return nil, fmt.Errorf("list API keys: %w", err)
	}
	ks, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (*APIKey, error) { return scanAPIKey(row) })
	if err != nil {
		return nil, fmt.Errorf("list API keys: %w", err)
	}
	return ks, nil
}

// RevokeAPIKey marks a key revoked and returns it; revoking a revoked key
// keeps its first revocation time. workspaceID, when not empty, must be the
// key's workspace. Returns ErrAPIKeyNotFound if there is no such key (in
// that workspace).
func (db *DB) RevokeAPIKey(ctx context.Context, id, workspaceID string) (*APIKey, error) {
	k, err := scanAPIKey(db.pool.QueryRow(ctx, `
		UPDATE api_keys SET revoked_at = coalesce(revoked_at, now())
		WHERE id = $1 AND ($2 = '' OR workspace_id = $2)
		RETURNING `+apiKeyColumns,
		id, workspaceID))
	if err != nil {
		return nil, fmt.Errorf("revoke API key %q: %w", id, translate(err, ErrAPIKeyNotFound))
	}
	return k, nil
}

// AnyAPIKeys reports whether any API key was ever created, revoked ones
// included.
func (db *DB) AnyAPIKeys(ctx context.Context) (bool, error) {
	var exists bool
	if err := db.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM api_keys)`).Scan(&exists); err != nil {
		return false, fmt.Errorf("look for API keys: %w", err)
	}
	return exists, nil
}

// APIKeysChannel is the channel migration 003's trigger notifies.
const APIKeysChannel = "api_keys"
