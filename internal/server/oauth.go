package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/oauth"
	"github.com/connector-svc/connector-svc/internal/queries"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/store"
)

// Authorizer is the OAuth client side the server drives (oauth.Manager,
// through ManagerAuthorizer): it starts and completes users'
// authorizations, says whether a user holds a usable token, lists and
// revokes grants. An interface so that the server's tests can stand in
// for an authorization server.
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
	// one user ("": any), after the cursor after (a Cursor of the last
	// grant of the previous page), at most limit.
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

// ReasonAuthorizationRequired is the ErrorInfo reason of a call whose user
// must authorize the connector first.
const ReasonAuthorizationRequired = "AUTHORIZATION_REQUIRED"

// Reasons of the authorization RPCs' failures.
const (
	ReasonOAuthNotConfigured   = "OAUTH_NOT_CONFIGURED"
	ReasonAuthorizationFailed  = "AUTHORIZATION_FAILED"
	ReasonAuthorizationInvalid = "AUTHORIZATION_INVALID"
	ReasonAuthorizationMissing = "AUTHORIZATION_NOT_FOUND"
	ReasonStepUpLimit          = "STEP_UP_LIMIT"
	ReasonOAuthDiscovery       = "OAUTH_DISCOVERY_FAILED"
	ReasonNotOAuthUser         = "CONNECTOR_NOT_OAUTH_USER"
)

// Bounds of the authorization RPCs.
const (
	maxReturnToLen     = 2048
	maxAuthParamLen    = 4096
	defaultGrantPage   = 100
	maxStepUps         = 3
	DefaultOAuthWindow = 10 * time.Minute
)

// errOAuthNotConfigured answers the authorization RPCs of a service
// without OAuth.
func errOAuthNotConfigured() error {
	return newStatus(codes.FailedPrecondition, ReasonOAuthNotConfigured,
		"OAuth is not configured on this service: the operator must set OAUTH_REDIRECT_URL")
}

// oauthConnector is what the oauth package needs of row's connector, its
// client secret opened.
func (s *Server) oauthConnector(row *store.Connector) (oauth.Connector, error) {
	return live.OAuthConnectorOf(s.box, row)
}

// stepUps counts the step-ups (authorizations started for more scopes)
// of each user of each connector within the OAuth window, so that a
// server that keeps asking for more scopes is stopped.
type stepUps struct {
	mu sync.Mutex
	at map[stepUpKey][]time.Time
}

type stepUpKey struct {
	connector int64
	user      string
}

// take counts one step-up of user on connector, and reports false past
// maxStepUps within window.
func (t *stepUps) take(connector int64, user string, window time.Duration) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.at == nil {
		t.at = map[stepUpKey][]time.Time{}
	}
	k := stepUpKey{connector, user}
	cut := time.Now().Add(-window)
	kept := t.at[k][:0]
	for _, at := range t.at[k] {
		if at.After(cut) {
			kept = append(kept, at)
		}
	}
	if len(kept) >= maxStepUps {
		t.at[k] = kept
		return false
	}
	t.at[k] = append(kept, time.Now())
	// Forget the users with none left, so the map does not grow.
	for other, ats := range t.at {
		if len(ats) == 0 || !ats[len(ats)-1].After(cut) {
			delete(t.at, other)
		}
	}
	return true
}

// authorizationNeeded is what a call of row's connector as userID gets
// when its user must authorize first (required): FAILED_PRECONDITION with
// an ErrorInfo AUTHORIZATION_REQUIRED (metadata: authorization_url,
// reason) and an AuthorizationRequired whose URL a new authorization
// starts with: for more scopes (a step-up) when the server asked for
// them, at most maxStepUps a window, then PERMISSION_DENIED. runID is the
// paused run's, if any.
func (s *Server) authorizationNeeded(ctx context.Context, row *store.Connector, userID string, required *oauth.RequiredError, runID string) error {
	if row.Config.AuthMode() != store.AuthUser {
		// The connector's own identity: no user can mend it.
		return newStatus(codes.FailedPrecondition, ReasonAuthorizationFailed,
			"the connector's own authorization failed ("+required.Error()+"): check its auth.client_id and auth.client_secret")
	}
	a, err := s.startFor(ctx, row, userID, required.Reason, required.Scopes)
	if err != nil {
		return err
	}
	a.RunID = runID
	return authorizationStatus(authorizationToProto(a))
}

// startFor starts an authorization of row's connector for userID and
// describes it. A step-up (reason INSUFFICIENT_SCOPE) asks for scopes on
// top of those held.
func (s *Server) startFor(ctx context.Context, row *store.Connector, userID, reason string, scopes []string) (*queries.Authorization, error) {
	if s.oauth == nil {
		return nil, errOAuthNotConfigured()
	}
	var extra []string
	if reason == oauth.ReasonInsufficientScope {
		if !s.steps.take(row.ID, userID, s.cfg.OAuthWindow) {
			return nil, newStatus(codes.PermissionDenied, ReasonStepUpLimit, fmt.Sprintf(
				"the MCP server keeps asking for more scopes (now %s): %d authorizations for more scopes within %s; "+
					"the connector's auth.scopes may need them from the start", strings.Join(scopes, " "), maxStepUps, s.cfg.OAuthWindow))
		}
		extra = scopes
	}
	oc, err := s.oauthConnector(row)
	if err != nil {
		return nil, err
	}
	st, err := s.oauth.Start(ctx, oc, userID, "", extra)
	if err != nil {
		return nil, err
	}
	if reason == "" {
		reason = oauth.ReasonNoToken
	}
	return &queries.Authorization{ConnectorID: row.ExternalID, UserID: userID, URL: st.URL, Scopes: st.Scopes, Reason: reason,
		ExpiresAt: st.ExpiresAt}, nil
}

func authorizationToProto(a *queries.Authorization) *connectorv1.AuthorizationRequired {
	return &connectorv1.AuthorizationRequired{RunId: a.RunID, ConnectorId: a.ConnectorID, UserId: a.UserID,
		AuthorizationUrl: a.URL, Scopes: a.Scopes, Reason: a.Reason, ExpireTime: timestamppb.New(a.ExpiresAt)}
}

// runAuthorizations are the server's authorizations as query runs use
// them (queries.Authorizations): its OAuth client and its step-up limits,
// shared with direct calls.
type runAuthorizations struct{ s *Server }

// Required implements queries.Authorizations.
func (a runAuthorizations) Required(ctx context.Context, row *store.Connector, userID string) (*oauth.RequiredError, error) {
	return a.s.usable(ctx, row, userID)
}

// Start implements queries.Authorizations.
func (a runAuthorizations) Start(ctx context.Context, row *store.Connector, userID, reason string, scopes []string) (*queries.Authorization, error) {
	return a.s.startFor(ctx, row, userID, reason, scopes)
}

// authorizationStatus is the FAILED_PRECONDITION a call gets while its
// user must authorize.
func authorizationStatus(ar *connectorv1.AuthorizationRequired) error {
	msg := fmt.Sprintf("user %q must authorize connector %q first (%s): send them to the authorization_url in the details, "+
		"then call again", ar.GetUserId(), ar.GetConnectorId(), ar.GetReason())
	if ar.GetRunId() != "" {
		msg = fmt.Sprintf("user %q must authorize connector %q first (%s): send them to the authorization_url in the details, "+
			"then resume run %s", ar.GetUserId(), ar.GetConnectorId(), ar.GetReason(), ar.GetRunId())
	}
	st := status.New(codes.FailedPrecondition, msg)
	withDetails, err := st.WithDetails(&errdetails.ErrorInfo{Reason: ReasonAuthorizationRequired, Domain: errorDomain,
		Metadata: map[string]string{"authorization_url": ar.GetAuthorizationUrl(), "reason": ar.GetReason()}}, ar)
	if err != nil {
		return st.Err()
	}
	return withDetails.Err()
}

// StartAuthorization implements connector.v1.ConnectorService.
func (s *Server) StartAuthorization(ctx context.Context, req *connectorv1.StartAuthorizationRequest) (*connectorv1.StartAuthorizationResponse, error) {
	var ch checker
	ch.ref(req.GetWorkspaceId(), req.GetConnectorId())
	ch.userID(req.GetConnectorId(), req.GetUserId())
	if len(req.GetReturnTo()) > maxReturnToLen {
		ch.add("return_to", "longer than %d characters", maxReturnToLen)
	}
	ch.scopes("scopes", req.GetScopes())
	if err := ch.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	if s.oauth == nil {
		return nil, errOAuthNotConfigured()
	}
	row, err := s.db.GetConnector(ctx, req.GetWorkspaceId(), req.GetConnectorId())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	if mode := row.Config.AuthMode(); mode != store.AuthUser {
		return nil, newStatus(codes.FailedPrecondition, ReasonNotOAuthUser, fmt.Sprintf(
			"connector %q uses %s: only AUTH_MODE_OAUTH_USER connectors are authorized by their users", row.ExternalID, authModeName(mode)))
	}
	oc, err := s.oauthConnector(row)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	st, err := s.oauth.Start(ctx, oc, req.GetUserId(), req.GetReturnTo(), req.GetScopes())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &connectorv1.StartAuthorizationResponse{AuthorizationUrl: st.URL, Scopes: st.Scopes,
		ExpireTime: timestamppb.New(st.ExpiresAt)}, nil
}

// CompleteAuthorization implements connector.v1.ConnectorService.
func (s *Server) CompleteAuthorization(ctx context.Context, req *connectorv1.CompleteAuthorizationRequest) (*connectorv1.CompleteAuthorizationResponse, error) {
	var ch checker
	if req.GetState() == "" {
		ch.add("state", "required: the state parameter of the redirect")
	}
	if req.GetCode() == "" && req.GetError() == "" {
		ch.add("code", "required: the code parameter of the redirect (or error, when the user refused)")
	}
	for field, v := range map[string]string{"state": req.GetState(), "code": req.GetCode(), "iss": req.GetIss(), "error": req.GetError()} {
		if len(v) > maxAuthParamLen {
			ch.add(field, "longer than %d characters", maxAuthParamLen)
		}
	}
	if err := ch.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	if s.oauth == nil {
		return nil, errOAuthNotConfigured()
	}
	// A key of another workspace may not complete (and so use up) the
	// state: checked before, and the state stays usable by its own.
	ws, err := s.oauth.PendingWorkspace(ctx, req.GetState())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	if err := s.checkAuthorizationWorkspace(ctx, ws); err != nil {
		return nil, err
	}
	done, err := s.oauth.Complete(ctx, req.GetState(), req.GetCode(), req.GetIss(), req.GetError())
	if err != nil {
		return nil, s.refusedStatus(ctx, err, done)
	}
	if err := s.checkAuthorizationWorkspace(ctx, done.Grant.WorkspaceID); err != nil {
		// Not reached while PendingWorkspace tells the state's workspace.
		// The authorization stands (it was the user's own); the caller
		// learns nothing of it.
		return nil, err
	}
	s.logger.InfoContext(ctx, "authorization completed", slog.String("workspace_id", done.Grant.WorkspaceID),
		slog.String("connector_id", done.Grant.ConnectorExternalID))
	return &connectorv1.CompleteAuthorizationResponse{Authorization: grantToProto(done.Grant), ReturnTo: done.ReturnTo}, nil
}

// checkAuthorizationWorkspace refuses a caller whose API key is not of
// workspaceID, the workspace of the authorization completed ("": not
// known yet, checked once completed).
func (s *Server) checkAuthorizationWorkspace(ctx context.Context, workspaceID string) error {
	key, ok := auth.KeyFrom(ctx)
	if !ok || !s.cfg.Auth.Guarded() || workspaceID == "" || key.WorkspaceID == workspaceID {
		return nil
	}
	return newStatus(codes.PermissionDenied, auth.ReasonWrongWorkspace,
		fmt.Sprintf("API key %s is for workspace %q, not the authorization's", key.ID, key.WorkspaceID))
}

// refusedStatus is the status of a CompleteAuthorization that failed with
// err: when the user or the server refused, the ErrorInfo's metadata
// has the return_to of the authorization (done's), where the chat
// backend sends the user back with the news.
func (s *Server) refusedStatus(ctx context.Context, err error, done *oauth.Completed) error {
	var refused *oauth.AuthServerError
	if done == nil || done.ReturnTo == "" || !errors.As(err, &refused) {
		return s.toStatus(ctx, err)
	}
	return newStatusWith(codes.FailedPrecondition, ReasonAuthorizationFailed, err.Error(),
		map[string]string{"error": refused.Code, "return_to": done.ReturnTo})
}

// ListAuthorizations implements connector.v1.ConnectorService.
func (s *Server) ListAuthorizations(ctx context.Context, req *connectorv1.ListAuthorizationsRequest) (*connectorv1.ListAuthorizationsResponse, error) {
	var ch checker
	ch.id("workspace_id", req.GetWorkspaceId())
	if req.GetConnectorId() != "" {
		ch.id("connector_id", req.GetConnectorId())
	}
	if req.GetUserId() != "" {
		ch.userIDForm(req.GetUserId())
	}
	// A page token goes with the filters of the listing it came from.
	filter := pageFilter(req.GetWorkspaceId(), req.GetConnectorId(), req.GetUserId())
	size, after := ch.filteredPage(req.GetPageSize(), req.GetPageToken(), defaultGrantPage, filter)
	if err := ch.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	if s.oauth == nil {
		return &connectorv1.ListAuthorizationsResponse{}, nil
	}
	f := GrantFilter{WorkspaceID: req.GetWorkspaceId(), UserID: req.GetUserId(), After: after, Limit: size + 1}
	if req.GetConnectorId() != "" {
		row, err := s.db.GetConnector(ctx, req.GetWorkspaceId(), req.GetConnectorId())
		if err != nil {
			return nil, s.toStatus(ctx, err)
		}
		f.ConnectorID = row.ID
	}
	grants, err := s.oauth.ListGrants(ctx, f)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	resp := &connectorv1.ListAuthorizationsResponse{}
	grants, resp.NextPageToken = nextFilteredPage(grants, size, filter, GrantCursor)
	for _, g := range grants {
		resp.Authorizations = append(resp.Authorizations, grantToProto(g))
	}
	return resp, nil
}

// RevokeAuthorization implements connector.v1.ConnectorService: a user's
// authorization of an oauth_user connector (user_id required), or a
// client credentials connector's own token (no user_id). The user's
// connection closes on whichever replica holds it first, while its token
// still authorizes the MCP session's end; then the tokens are revoked and
// deleted, and every replica forgets the user's token at once.
func (s *Server) RevokeAuthorization(ctx context.Context, req *connectorv1.RevokeAuthorizationRequest) (*connectorv1.RevokeAuthorizationResponse, error) {
	var ch checker
	ch.ref(req.GetWorkspaceId(), req.GetConnectorId())
	if req.GetUserId() != "" {
		ch.userIDForm(req.GetUserId())
	}
	if err := ch.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	if s.oauth == nil {
		return nil, errOAuthNotConfigured()
	}
	row, err := s.db.GetConnector(ctx, req.GetWorkspaceId(), req.GetConnectorId())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	user := req.GetUserId()
	switch row.Config.AuthMode() {
	case store.AuthNone:
		return nil, newStatus(codes.FailedPrecondition, ReasonNotOAuthUser, fmt.Sprintf(
			"connector %q uses AUTH_MODE_NONE: it uses no OAuth, so there is no authorization to revoke", row.ExternalID))
	case store.AuthUser:
		if user == "" {
			ch.add("user_id", "required: connector %q is AUTH_MODE_OAUTH_USER, and each of its users has an authorization of their own", row.ExternalID)
			return nil, s.toStatus(ctx, ch.err())
		}
		s.closeUserConnection(ctx, row, user)
	}
	oc, err := s.oauthConnector(row)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	atServer, err := s.oauth.Revoke(ctx, oc, user)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	if row.Config.AuthMode() == store.AuthUser {
		// Again, now that the tokens are gone: a call that came meanwhile
		// may have opened a connection, or read the token into a
		// replica's cache.
		s.closeUserConnection(ctx, row, user)
	}
	s.logger.InfoContext(ctx, "authorization revoked", append(live.ConnectorAttrs(row),
		slog.String("user_id", user), slog.Bool("at_server", atServer))...)
	return &connectorv1.RevokeAuthorizationResponse{RevokedAtServer: atServer}, nil
}

// closeUserConnection closes userID's connection to row's connector on
// every replica, each forgetting the user's token too (CloseSession), so
// that no call runs on with it.
func (s *Server) closeUserConnection(ctx context.Context, row *store.Connector, userID string) {
	closeReq := &connectorv1.CloseSessionRequest{WorkspaceId: row.WorkspaceID, ConnectorId: row.ExternalID,
		SessionId: registry.UserSession(userID)}
	if _, err := s.CloseSession(ctx, closeReq); err != nil {
		s.logger.WarnContext(ctx, "close a revoked user's connection", append(live.ConnectorAttrs(row),
			slog.String("error", status.Convert(err).Message()))...)
	}
}

func grantToProto(g oauth.Grant) *connectorv1.Authorization {
	p := &connectorv1.Authorization{WorkspaceId: g.WorkspaceID, ConnectorId: g.ConnectorExternalID, UserId: g.UserID,
		Scopes: g.Scopes, Refreshable: g.Refreshable, Issuer: g.Issuer,
		CreateTime: timestamppb.New(g.CreatedAt), UpdateTime: timestamppb.New(g.UpdatedAt)}
	if !g.ExpiresAt.IsZero() {
		p.ExpireTime = timestamppb.New(g.ExpiresAt)
	}
	return p
}

// asRequired returns the *oauth.RequiredError err wraps, if any.
func asRequired(err error) (*oauth.RequiredError, bool) {
	var re *oauth.RequiredError
	ok := errors.As(err, &re)
	return re, ok
}

// usable reports what user must do before a run of row's connector can
// call its tools: nil when they hold a usable token, a RequiredError
// (NO_TOKEN) when they must authorize.
func (s *Server) usable(ctx context.Context, row *store.Connector, user string) (*oauth.RequiredError, error) {
	if s.oauth == nil {
		return nil, errOAuthNotConfigured()
	}
	oc, err := s.oauthConnector(row)
	if err != nil {
		return nil, err
	}
	ok, err := s.oauth.Usable(ctx, oc, user)
	if err != nil {
		return nil, fmt.Errorf("check user %q's authorization: %w", user, err)
	}
	if ok {
		return nil, nil
	}
	return &oauth.RequiredError{ConnectorID: row.ID, UserID: user, Reason: oauth.ReasonNoToken}, nil
}
