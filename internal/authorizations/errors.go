package authorizations

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/connector-svc/connector-svc/internal/oauth"
)

var (
	// ErrNotConfigured: the service has no OAuth client (no redirect URL),
	// so no user can be sent to authorize.
	ErrNotConfigured = errors.New("OAuth is not configured on this service: the operator must set OAUTH_REDIRECT_URL")
	// ErrBadCursor: a listing's cursor is not a GrantCursor.
	ErrBadCursor = errors.New("the grant cursor is not one of a previous listing")
)

// NotOAuthUserError: the connector's auth mode has no users' authorizations
// to start (any mode but oauth_user), or no authorization at all to revoke
// (Revoking: mode none).
type NotOAuthUserError struct {
	ConnectorID string // as callers know it
	Mode        string // store.AuthNone, store.AuthClientCredentials, ...
	Revoking    bool
}

func (e *NotOAuthUserError) Error() string {
	if e.Revoking {
		return fmt.Sprintf("connector %q uses no OAuth, so there is no authorization to revoke", e.ConnectorID)
	}
	return fmt.Sprintf("connector %q uses auth mode %s: only oauth_user connectors are authorized by their users", e.ConnectorID, e.Mode)
}

// UserRequiredError: a revocation of an oauth_user connector names no
// user, and each of its users has an authorization of their own.
type UserRequiredError struct{ ConnectorID string }

func (e *UserRequiredError) Error() string {
	return fmt.Sprintf("connector %q is oauth_user: the user whose authorization to revoke is required", e.ConnectorID)
}

// StepUpLimitError: the connector's server keeps asking a user for more
// scopes; MaxAuthorizations authorizations (the first and MaxStepUps
// step-ups) were started within Window.
type StepUpLimitError struct {
	Scopes []string // what it asks for now
	Window time.Duration
}

func (e *StepUpLimitError) Error() string {
	return fmt.Sprintf("the MCP server keeps asking for more scopes (now %s): %d authorizations within %s, the first and %d for more scopes; "+
		"the connector's auth.scopes may need them from the start", strings.Join(e.Scopes, " "), MaxAuthorizations, e.Window, MaxStepUps)
}

// OwnAuthorizationError: a connector that authorizes with its own identity
// (client credentials) was refused; no user can mend it.
type OwnAuthorizationError struct{ Required *oauth.RequiredError }

func (e *OwnAuthorizationError) Error() string {
	return "the connector's own authorization failed (" + e.Required.Error() + "): check its auth.client_id and auth.client_secret"
}

// RequiredError: a call's (or a paused run's) user must authorize the
// connector first; Authorization says where to send them.
type RequiredError struct{ Authorization *Authorization }

func (e *RequiredError) Error() string {
	a := e.Authorization
	if a.RunID != "" {
		return fmt.Sprintf("user %q must authorize connector %q first (%s), then resume run %s", a.UserID, a.ConnectorID, a.Reason, a.RunID)
	}
	return fmt.Sprintf("user %q must authorize connector %q first (%s)", a.UserID, a.ConnectorID, a.Reason)
}

// RefusedError: the user or the authorization server refused an
// authorization whose caller asked to have the user sent back to ReturnTo.
// Code is the server's error code; the text is Err's (the
// *oauth.AuthServerError's, scrubbed of what the service sent). It does
// not unwrap: the refusal with its return_to is one error, not the bare
// server error.
type RefusedError struct {
	Code     string
	ReturnTo string
	Err      error
}

func (e *RefusedError) Error() string { return e.Err.Error() }

// WrongWorkspaceError: the caller's API key is not of the workspace of the
// authorization it would complete.
type WrongWorkspaceError struct {
	KeyID          string
	KeyWorkspaceID string
}

func (e *WrongWorkspaceError) Error() string {
	return fmt.Sprintf("API key %s is for workspace %q, not the authorization's", e.KeyID, e.KeyWorkspaceID)
}
