package oauth

import (
	"context"
	"time"

	"github.com/connector-svc/connector-svc/internal/store"
)

// Store is what a Manager keeps in the database: users' tokens, dynamic
// client registrations and authorizations in progress. *store.DB
// implements it.
type Store interface {
	OAuthToken(ctx context.Context, connectorID int64, userID string) (*store.OAuthToken, error)
	PutOAuthToken(ctx context.Context, t *store.OAuthToken) (*store.OAuthToken, error)
	LockOAuthToken(ctx context.Context, connectorID int64, userID string,
		fn func(cur *store.OAuthToken) (*store.OAuthToken, error)) (*store.OAuthToken, error)
	ListOAuthTokens(ctx context.Context, f store.OAuthTokenFilter) ([]*store.OAuthToken, error)
	DeleteOAuthToken(ctx context.Context, connectorID int64, userID string) (bool, error)
	DeleteOAuthTokens(ctx context.Context, connectorID int64) (int64, error)
	OAuthClient(ctx context.Context, issuer, redirectURI string) (*store.OAuthClient, error)
	AddOAuthClient(ctx context.Context, c *store.OAuthClient) (stored *store.OAuthClient, inserted bool, err error)
	DeleteOAuthClient(ctx context.Context, issuer, redirectURI, clientID string) (bool, error)
	DeleteOAuthClients(ctx context.Context, issuer string) (int64, error)
	CreateOAuthPending(ctx context.Context, p *store.OAuthPending) error
	ConsumeOAuthPending(ctx context.Context, stateHash []byte) (*store.OAuthPending, error)
	OAuthPendingWorkspace(ctx context.Context, stateHash []byte) (string, error)
	DeleteStaleOAuthPending(ctx context.Context, keep time.Duration) (int64, error)
}

var _ Store = (*store.DB)(nil)
