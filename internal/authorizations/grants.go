package authorizations

import (
	"context"
	"errors"
	"log/slog"

	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/oauth"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/store"
)

// CompleteRequest is the redirect an authorization server sent the user's
// browser back with: State, and Code or (the user or the server refused)
// Error; Iss, the issuer, if the server sends it.
type CompleteRequest struct {
	State, Code, Iss, Error string
	// Key is the caller's API key when keys guard the service: only a key
	// of the authorization's workspace may complete it. nil: any caller.
	Key *Key
}

// Key is a caller's API key, by its id and workspace.
type Key struct{ ID, WorkspaceID string }

// Complete completes the authorization req's state started and returns
// its grant and where to send the user back. A caller of another
// workspace gets a *WrongWorkspaceError before the state is used, so that
// it stays usable by its own. A refusal whose authorization has a return
// address is a *RefusedError; other errors: ErrNotConfigured and the
// Authorizer's (oauth.ErrStateInvalid, oauth.ErrIssuerMismatch,
// *oauth.AuthServerError, ...).
func (s *Service) Complete(ctx context.Context, req CompleteRequest) (*oauth.Completed, error) {
	if s.d.OAuth == nil {
		return nil, ErrNotConfigured
	}
	ws, err := s.d.OAuth.PendingWorkspace(ctx, req.State)
	if err != nil {
		return nil, err
	}
	if err := req.Key.check(ws); err != nil {
		return nil, err
	}
	done, err := s.d.OAuth.Complete(ctx, req.State, req.Code, req.Iss, req.Error)
	if err != nil {
		return nil, refused(err, done)
	}
	if err := req.Key.check(done.Grant.WorkspaceID); err != nil {
		// Not reached while PendingWorkspace tells the state's workspace.
		// The authorization stands (it was the user's own); the caller
		// learns nothing of it.
		return nil, err
	}
	s.d.Logger.InfoContext(ctx, "authorization completed", slog.String("workspace_id", done.Grant.WorkspaceID),
		slog.String("connector_id", done.Grant.ConnectorExternalID))
	return done, nil
}

// check refuses a key not of workspaceID, the workspace of the
// authorization completed ("": not known yet, checked once completed).
func (k *Key) check(workspaceID string) error {
	if k == nil || workspaceID == "" || k.WorkspaceID == workspaceID {
		return nil
	}
	return &WrongWorkspaceError{KeyID: k.ID, KeyWorkspaceID: k.WorkspaceID}
}

// refused is err, the failure of a completion: when the user or the
// server refused and the authorization has a return address (done's), a
// *RefusedError that carries it, where the caller sends the user back with
// the news.
func refused(err error, done *oauth.Completed) error {
	var r *oauth.AuthServerError
	if done == nil || done.ReturnTo == "" || !errors.As(err, &r) {
		return err
	}
	return &RefusedError{Code: r.Code, ReturnTo: done.ReturnTo, Err: err}
}

// ListRequest selects a workspace's grants: of one connector ("": any) and
// one user ("": any), after the GrantCursor After ("": from the start), at
// most Limit.
type ListRequest struct {
	WorkspaceID, ConnectorID, UserID string
	After                            string
	Limit                            int
}

// List lists the grants req selects, in GrantCursor order; none without
// OAuth. Errors: the store's for an unknown connector, ErrBadCursor, the
// Authorizer's.
func (s *Service) List(ctx context.Context, req ListRequest) ([]oauth.Grant, error) {
	if s.d.OAuth == nil {
		return nil, nil
	}
	f := GrantFilter{WorkspaceID: req.WorkspaceID, UserID: req.UserID, After: req.After, Limit: req.Limit}
	if req.ConnectorID != "" {
		row, err := s.d.Connectors.GetConnector(ctx, req.WorkspaceID, req.ConnectorID)
		if err != nil {
			return nil, err
		}
		f.ConnectorID = row.ID
	}
	return s.d.OAuth.ListGrants(ctx, f)
}

// RevokeRequest names an authorization to revoke: a user's of an
// oauth_user connector (UserID required), or a client credentials
// connector's own (no UserID).
type RevokeRequest struct{ WorkspaceID, ConnectorID, UserID string }

// Revoke revokes the authorization req names and reports whether the
// authorization server took the revocation. The user's connection closes
// on whichever replica holds it first, while its token still authorizes
// the MCP session's end; then the tokens are revoked and deleted, and the
// connection is closed again, every replica forgetting the user's token.
// Errors: ErrNotConfigured, the store's for an unknown connector,
// *NotOAuthUserError (mode none), *UserRequiredError, the Authorizer's
// (oauth.ErrNoGrant, ...).
func (s *Service) Revoke(ctx context.Context, req RevokeRequest) (atServer bool, err error) {
	if s.d.OAuth == nil {
		return false, ErrNotConfigured
	}
	row, err := s.d.Connectors.GetConnector(ctx, req.WorkspaceID, req.ConnectorID)
	if err != nil {
		return false, err
	}
	user := req.UserID
	switch row.Config.AuthMode() {
	case store.AuthNone:
		return false, &NotOAuthUserError{ConnectorID: row.ExternalID, Mode: store.AuthNone, Revoking: true}
	case store.AuthUser:
		if user == "" {
			return false, &UserRequiredError{ConnectorID: row.ExternalID}
		}
		s.closeUserConnection(ctx, row, user)
	}
	oc, err := live.OAuthConnectorOf(s.d.Box, row)
	if err != nil {
		return false, err
	}
	if atServer, err = s.d.OAuth.Revoke(ctx, oc, user); err != nil {
		return false, err
	}
	if row.Config.AuthMode() == store.AuthUser {
		// Again, now that the tokens are gone: a call that came meanwhile
		// may have opened a connection, or read the token into a
		// replica's cache.
		s.closeUserConnection(ctx, row, user)
	}
	s.d.Logger.InfoContext(ctx, "authorization revoked", append(live.ConnectorAttrs(row),
		slog.String("user_id", user), slog.Bool("at_server", atServer))...)
	return atServer, nil
}

// closeUserConnection closes userID's connection to row's connector on
// every replica, each forgetting the user's token too, so that no call
// runs on with it. A failure is logged: the revocation goes on.
func (s *Service) closeUserConnection(ctx context.Context, row *store.Connector, userID string) {
	if s.d.Sessions == nil {
		return
	}
	if _, err := s.d.Sessions.Close(ctx, row.WorkspaceID, row.ExternalID, registry.UserSession(userID)); err != nil {
		s.d.Logger.WarnContext(ctx, "close a revoked user's connection", append(live.ConnectorAttrs(row),
			slog.String("error", err.Error()))...)
	}
}
