package server

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/timestamppb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/authorizations"
	"github.com/connector-svc/connector-svc/internal/connectors"
	"github.com/connector-svc/connector-svc/internal/oauth"
	"github.com/connector-svc/connector-svc/internal/store"
)

// Authorizer is the OAuth client side the authorizations use case drives
// (authorizations.Authorizer).
type Authorizer = authorizations.Authorizer

// GrantFilter selects the grants Authorizer.ListGrants returns.
type GrantFilter = authorizations.GrantFilter

// ManagerAuthorizer is the Authorizer of an oauth.Manager
// (authorizations.ManagerAuthorizer).
type ManagerAuthorizer = authorizations.ManagerAuthorizer

// NewAuthorizer returns m as the server's Authorizer.
func NewAuthorizer(m *oauth.Manager) ManagerAuthorizer { return authorizations.NewAuthorizer(m) }

// GrantCursor is the key grants are listed in order of
// (authorizations.GrantCursor).
func GrantCursor(g oauth.Grant) string { return authorizations.GrantCursor(g) }

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
	DefaultOAuthWindow = authorizations.DefaultWindow
)

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
	st, err := s.authz.Begin(ctx, authorizations.BeginRequest{WorkspaceID: req.GetWorkspaceId(), ConnectorID: req.GetConnectorId(),
		UserID: req.GetUserId(), ReturnTo: req.GetReturnTo(), Scopes: req.GetScopes()})
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &connectorv1.StartAuthorizationResponse{AuthorizationUrl: st.URL, Scopes: st.Scopes,
		ExpireTime: timestamppb.New(st.ExpiresAt)}, nil
}

// CompleteAuthorization implements connector.v1.ConnectorService. A key of
// another workspace may not complete (and so use up) the state.
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
	c := authorizations.CompleteRequest{State: req.GetState(), Code: req.GetCode(), Iss: req.GetIss(), Error: req.GetError()}
	if key, ok := auth.KeyFrom(ctx); ok && s.cfg.Auth.Guarded() {
		c.Key = &authorizations.Key{ID: key.ID, WorkspaceID: key.WorkspaceID}
	}
	done, err := s.authz.Complete(ctx, c)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &connectorv1.CompleteAuthorizationResponse{Authorization: grantToProto(done.Grant), ReturnTo: done.ReturnTo}, nil
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
	grants, err := s.authz.List(ctx, authorizations.ListRequest{WorkspaceID: req.GetWorkspaceId(), ConnectorID: req.GetConnectorId(),
		UserID: req.GetUserId(), After: after, Limit: size + 1})
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
// client credentials connector's own token (no user_id); the user's
// connection closes on every replica (authorizations.Service.Revoke).
func (s *Server) RevokeAuthorization(ctx context.Context, req *connectorv1.RevokeAuthorizationRequest) (*connectorv1.RevokeAuthorizationResponse, error) {
	var ch checker
	ch.ref(req.GetWorkspaceId(), req.GetConnectorId())
	if req.GetUserId() != "" {
		ch.userIDForm(req.GetUserId())
	}
	if err := ch.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	atServer, err := s.authz.Revoke(ctx, authorizations.RevokeRequest{WorkspaceID: req.GetWorkspaceId(),
		ConnectorID: req.GetConnectorId(), UserID: req.GetUserId()})
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &connectorv1.RevokeAuthorizationResponse{RevokedAtServer: atServer}, nil
}

// authorizationNeeded is what a call of row's connector as userID gets
// when its user must authorize first (required): an
// *authorizations.RequiredError, with the URL a new authorization starts
// with, which toStatus makes FAILED_PRECONDITION AUTHORIZATION_REQUIRED
// with an AuthorizationRequired. runID is the paused run's, if any.
func (s *Server) authorizationNeeded(ctx context.Context, row *store.Connector, userID string, required *oauth.RequiredError, runID string) error {
	return s.authz.Needed(ctx, row, userID, required, runID)
}

func authorizationToProto(a *authorizations.Authorization) *connectorv1.AuthorizationRequired {
	return &connectorv1.AuthorizationRequired{RunId: a.RunID, ConnectorId: a.ConnectorID, UserId: a.UserID,
		AuthorizationUrl: a.URL, Scopes: a.Scopes, Reason: a.Reason, ExpireTime: timestamppb.New(a.ExpiresAt)}
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

// The messages, metadata and details of the authorizations use case's
// errors, as errorTable maps them.

// requiredMessage is the message of an *authorizations.RequiredError.
func requiredMessage(err error) string {
	a := requiredOf(err)
	if a.RunID != "" {
		return fmt.Sprintf("user %q must authorize connector %q first (%s): send them to the authorization_url in the details, "+
			"then resume run %s", a.UserID, a.ConnectorID, a.Reason, a.RunID)
	}
	return fmt.Sprintf("user %q must authorize connector %q first (%s): send them to the authorization_url in the details, "+
		"then call again", a.UserID, a.ConnectorID, a.Reason)
}

// requiredMetadata is the ErrorInfo metadata of an
// *authorizations.RequiredError: where to send the user, and why.
func requiredMetadata(err error) map[string]string {
	a := requiredOf(err)
	return map[string]string{"authorization_url": a.URL, "reason": a.Reason}
}

// requiredDetail is the AuthorizationRequired an
// *authorizations.RequiredError carries.
func requiredDetail(err error) protoadapt.MessageV1 { return authorizationToProto(requiredOf(err)) }

func requiredOf(err error) *authorizations.Authorization {
	var e *authorizations.RequiredError
	errors.As(err, &e)
	return e.Authorization
}

// refusedMetadata is the ErrorInfo metadata of an
// *authorizations.RefusedError: the server's error code, and the
// return_to where the chat backend sends the user back with the news.
func refusedMetadata(err error) map[string]string {
	var e *authorizations.RefusedError
	errors.As(err, &e)
	return map[string]string{"error": e.Code, "return_to": e.ReturnTo}
}

// authServerMetadata is the ErrorInfo metadata of an *oauth.AuthServerError
// without a return_to: the server's error code.
func authServerMetadata(err error) map[string]string {
	var e *oauth.AuthServerError
	errors.As(err, &e)
	return map[string]string{"error": e.Code}
}

// notOAuthUserMessage is the message of an
// *authorizations.NotOAuthUserError, in the API's auth mode names.
func notOAuthUserMessage(err error) string {
	var e *authorizations.NotOAuthUserError
	errors.As(err, &e)
	if e.Revoking {
		return fmt.Sprintf("connector %q uses %s: it uses no OAuth, so there is no authorization to revoke",
			e.ConnectorID, authModeName(e.Mode))
	}
	return fmt.Sprintf("connector %q uses %s: only AUTH_MODE_OAUTH_USER connectors are authorized by their users",
		e.ConnectorID, authModeName(e.Mode))
}

// userRequiredMessage is the user_id violation of an
// *authorizations.UserRequiredError.
func userRequiredMessage(err error) string {
	var e *authorizations.UserRequiredError
	errors.As(err, &e)
	return fmt.Sprintf("required: connector %q is AUTH_MODE_OAUTH_USER, and each of its users has an authorization of their own",
		e.ConnectorID)
}

// asRequired returns the *oauth.RequiredError err wraps, if any.
func asRequired(err error) (*oauth.RequiredError, bool) {
	var re *oauth.RequiredError
	ok := errors.As(err, &re)
	return re, ok
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
