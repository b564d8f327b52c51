package oauth

import (
	"context"
	"encoding/hex"
	"fmt"
	"strconv"

	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/store"
)

// Seal contexts bind each sealed value to its row and column, so a value
// copied to another row or column does not open there.

func clientSecretContext(issuer, redirectURI string) string {
	return "oauth-client:" + issuer + " " + redirectURI // a space is in neither URL
}

func pendingContext(stateHash []byte, what string) string {
	return "oauth-pending:" + what + ":" + hex.EncodeToString(stateHash)
}

func tokenContext(what string, connectorID int64, userID string) string {
	return "oauth-token:" + what + ":" + strconv.FormatInt(connectorID, 10) + ":" + userID
}

// sealContext is the context v was sealed with.
func sealContext(v store.OAuthSealed) (string, error) {
	switch v.Kind {
	case store.SealedOAuthClientSecret:
		return clientSecretContext(v.Issuer, v.RedirectURI), nil
	case store.SealedPendingVerifier:
		return pendingContext(v.StateHash, "verifier"), nil
	case store.SealedPendingClientSecret:
		return pendingContext(v.StateHash, "client-secret"), nil
	case store.SealedAccessToken:
		return tokenContext("access", v.ConnectorID, v.UserID), nil
	case store.SealedRefreshToken:
		return tokenContext("refresh", v.ConnectorID, v.UserID), nil
	}
	return "", fmt.Errorf("unknown kind of sealed OAuth value %q", v.Kind)
}

// SealStore is what Reseal and CheckKey need of the database: every sealed
// OAuth value, one at a time or all in one transaction. *store.DB
// implements it.
type SealStore interface {
	AnyOAuthSealed(ctx context.Context) (store.OAuthSealed, error)
	ResealOAuth(ctx context.Context, fn func(store.OAuthSealed) ([]byte, error)) (int, error)
}

// Reseal seals every OAuth secret in db (registrations' client secrets,
// pending verifiers, tokens) again under box's first key, in one
// transaction, so that the keys after it can be retired. Returns how many
// values were resealed; on an error nothing changes.
func Reseal(ctx context.Context, db SealStore, box *secret.Box) (int, error) {
	return db.ResealOAuth(ctx, func(v store.OAuthSealed) ([]byte, error) {
		sc, err := sealContext(v)
		if err != nil {
			return nil, err
		}
		plain, err := box.OpenBytes(v.Sealed, sc)
		if err != nil {
			return nil, fmt.Errorf("OAuth %s (%s): %w", v.Kind, describe(v), err)
		}
		return box.SealBytes(plain, sc)
	})
}

// CheckKey opens one stored token with box, so that start-up fails on a
// SECRET_KEY that cannot open them rather than every user's calls later.
func CheckKey(ctx context.Context, db SealStore, box *secret.Box) error {
	v, err := db.AnyOAuthSealed(ctx)
	if err != nil || v.Sealed == nil {
		return err
	}
	sc, err := sealContext(v)
	if err != nil {
		return err
	}
	if _, err := box.OpenBytes(v.Sealed, sc); err != nil {
		return fmt.Errorf("stored OAuth tokens (%s): %w", describe(v), err)
	}
	return nil
}

func describe(v store.OAuthSealed) string {
	switch v.Kind {
	case store.SealedOAuthClientSecret:
		return "registration at " + v.Issuer
	case store.SealedPendingVerifier, store.SealedPendingClientSecret:
		return "an authorization in progress"
	}
	return fmt.Sprintf("connector row %d, user %q", v.ConnectorID, v.UserID)
}
