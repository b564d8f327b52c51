package server

import (
	"context"
	"strconv"
	"strings"

	"github.com/connector-svc/connector-svc/internal/connectors"
	"github.com/connector-svc/connector-svc/internal/oauth"
)

// ManagerAuthorizer is the Authorizer of an oauth.Manager; it is also the
// live.Transporter the registry's Config.Authorize takes (live.Authorize),
// so one Manager both runs the authorizations and puts their tokens on the
// requests.
type ManagerAuthorizer struct{ *oauth.Manager }

// NewAuthorizer returns m as the server's Authorizer.
func NewAuthorizer(m *oauth.Manager) ManagerAuthorizer { return ManagerAuthorizer{m} }

// ListGrants implements Authorizer.
func (a ManagerAuthorizer) ListGrants(ctx context.Context, f GrantFilter) ([]oauth.Grant, error) {
	lf := oauth.ListFilter{WorkspaceID: f.WorkspaceID, ConnectorID: f.ConnectorID, UserID: f.UserID, Limit: f.Limit}
	if f.After != "" {
		id, user, _ := strings.Cut(f.After, ":")
		n, err := strconv.ParseInt(id, 10, 64)
		if err != nil {
			return nil, &invalidError{violations: []violation{{field: "page_token", problem: "not a token from a previous response"}}}
		}
		lf.After = oauth.Cursor{ConnectorID: n, UserID: user}
	}
	return a.List(ctx, lf)
}

// Forget implements Authorizer.
func (a ManagerAuthorizer) Forget(connectorID int64, userID string) {
	a.Manager.Forget(connectorID, userID)
}

// PendingWorkspace implements Authorizer.
func (a ManagerAuthorizer) PendingWorkspace(ctx context.Context, state string) (string, error) {
	return a.Manager.PendingWorkspace(ctx, state)
}

// revoker is a, as the connectors use case revokes a deleted connector's
// tokens with it; nil without OAuth.
func revoker(a Authorizer) connectors.TokenRevoker {
	if a == nil {
		return nil
	}
	return a
}

// forgetter is a's Forget, as the sessions use case has a user's token
// forgotten when their connection closes; nil without OAuth.
func forgetter(a Authorizer) func(connectorID int64, userID string) {
	if a == nil {
		return nil
	}
	return a.Forget
}
