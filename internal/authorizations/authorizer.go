package authorizations

import (
	"context"
	"strconv"
	"strings"

	"github.com/connector-svc/connector-svc/internal/oauth"
)

// Authorizer is the OAuth client side the use case drives (oauth.Manager,
// through ManagerAuthorizer): it starts and completes users'
// authorizations, says whether a user holds a usable token, lists and
// revokes grants. An interface so that tests can stand in for an
// authorization server.
type Authorizer interface {
	Start(ctx context.Context, c oauth.Connector, userID, returnTo string, extraScopes []string) (*oauth.Started, error)
	// PendingWorkspace is the workspace of the authorization state
	// started, without completing it (oauth.ErrStateInvalid if it is
	// unknown, used or expired), so that a caller of another workspace
	// cannot use it up.
	PendingWorkspace(ctx context.Context, state string) (string, error)
	// Complete completes the authorization state started. When the user
	// or the server refused (errParam), it returns the *oauth.AuthServerError
	// and, with it, the Completed whose ReturnTo the user goes back to.
	Complete(ctx context.Context, state, code, iss, errParam string) (*oauth.Completed, error)
	Usable(ctx context.Context, c oauth.Connector, userID string) (bool, error)
	// ListGrants lists a workspace's grants, of one connector (0: any) and
	// one user ("": any), after the cursor after (a GrantCursor of the
	// last grant of the previous page), at most limit.
	ListGrants(ctx context.Context, f GrantFilter) ([]oauth.Grant, error)
	Revoke(ctx context.Context, c oauth.Connector, userID string) (atServer bool, err error)
	RevokeAll(ctx context.Context, c oauth.Connector) error
	// Forget drops what this process keeps of userID's token of connector
	// connectorID, so that its next request reads it again: every replica
	// does when a user's authorization is revoked.
	Forget(connectorID int64, userID string)
}

// GrantFilter selects the grants Authorizer.ListGrants returns.
type GrantFilter struct {
	WorkspaceID string
	ConnectorID int64  // 0: any
	UserID      string // "": any
	After       string // a GrantCursor; "": from the start
	Limit       int
}

// GrantCursor is the key grants are listed in order of (connector, then
// user): a page starts after the last one's.
func GrantCursor(g oauth.Grant) string { return strconv.FormatInt(g.ConnectorID, 10) + ":" + g.UserID }

// ManagerAuthorizer is the Authorizer of an oauth.Manager; it is also the
// live.Transporter the registry's Config.Authorize takes (live.Authorize),
// so one Manager both runs the authorizations and puts their tokens on the
// requests.
type ManagerAuthorizer struct{ *oauth.Manager }

// NewAuthorizer returns m as an Authorizer.
func NewAuthorizer(m *oauth.Manager) ManagerAuthorizer { return ManagerAuthorizer{m} }

// ListGrants implements Authorizer; a cursor that is no GrantCursor is
// ErrBadCursor.
func (a ManagerAuthorizer) ListGrants(ctx context.Context, f GrantFilter) ([]oauth.Grant, error) {
	lf := oauth.ListFilter{WorkspaceID: f.WorkspaceID, ConnectorID: f.ConnectorID, UserID: f.UserID, Limit: f.Limit}
	if f.After != "" {
		id, user, _ := strings.Cut(f.After, ":")
		n, err := strconv.ParseInt(id, 10, 64)
		if err != nil {
			return nil, ErrBadCursor
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
