package server

import (
	"context"
	"log/slog"
	"maps"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/authorizations"
	"github.com/connector-svc/connector-svc/internal/oauth"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/store"
)

// TestAuthorizationErrorRows maps the authorizations use case's errors to
// the statuses the authorization RPCs, calls and resumes answer: codes,
// reasons, messages, ErrorInfo metadata and the AuthorizationRequired
// detail.
func TestAuthorizationErrorRows(t *testing.T) {
	s := &Server{logger: slog.New(slog.DiscardHandler)}
	exp := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	a := &authorizations.Authorization{ConnectorID: "p", UserID: "alice", URL: "https://as.test/authorize?state=s",
		Scopes: []string{"mcp:tools"}, Reason: oauth.ReasonNoToken, ExpiresAt: exp}
	inRun := *a
	inRun.RunID = "run-1"
	for _, tt := range []struct {
		err      error
		code     codes.Code
		reason   string
		msg      string
		metadata map[string]string
		field    string
		detail   *connectorv1.AuthorizationRequired
	}{
		{authorizations.ErrNotConfigured, codes.FailedPrecondition, ReasonOAuthNotConfigured,
			"OAuth is not configured on this service: the operator must set OAUTH_REDIRECT_URL", nil, "", nil},
		{&authorizations.RequiredError{Authorization: a}, codes.FailedPrecondition, ReasonAuthorizationRequired,
			`user "alice" must authorize connector "p" first (NO_TOKEN): send them to the authorization_url in the details, then call again`,
			map[string]string{"authorization_url": a.URL, "reason": oauth.ReasonNoToken}, "", authorizationToProto(a)},
		{&authorizations.RequiredError{Authorization: &inRun}, codes.FailedPrecondition, ReasonAuthorizationRequired,
			`user "alice" must authorize connector "p" first (NO_TOKEN): send them to the authorization_url in the details, then resume run run-1`,
			map[string]string{"authorization_url": a.URL, "reason": oauth.ReasonNoToken}, "", authorizationToProto(&inRun)},
		{&authorizations.OwnAuthorizationError{Required: &oauth.RequiredError{Reason: oauth.ReasonNoToken}}, codes.FailedPrecondition,
			ReasonAuthorizationFailed, "the connector's own authorization failed (the user has not authorized this connector): " +
				"check its auth.client_id and auth.client_secret", nil, "", nil},
		{&authorizations.StepUpLimitError{Scopes: []string{"a", "b"}, Window: 10 * time.Minute}, codes.PermissionDenied, ReasonStepUpLimit,
			"the MCP server keeps asking for more scopes (now a b): 3 authorizations within 10m0s, the first and 2 for more scopes; " +
				"the connector's auth.scopes may need them from the start", nil, "", nil},
		{&registry.AuthError{Err: &oauth.ScopesHeldError{Scopes: []string{"a"}}}, codes.PermissionDenied, ReasonStepUpLimit,
			(&oauth.ScopesHeldError{Scopes: []string{"a"}}).Error(), nil, "", nil},
		{&authorizations.RefusedError{Code: "access_denied", ReturnTo: "https://chat.test/back",
			Err: &oauth.AuthServerError{Code: "access_denied"}}, codes.FailedPrecondition, ReasonAuthorizationFailed,
			(&oauth.AuthServerError{Code: "access_denied"}).Error(),
			map[string]string{"error": "access_denied", "return_to": "https://chat.test/back"}, "", nil},
		{&oauth.AuthServerError{Code: "access_denied"}, codes.FailedPrecondition, ReasonAuthorizationFailed,
			(&oauth.AuthServerError{Code: "access_denied"}).Error(), map[string]string{"error": "access_denied"}, "", nil},
		{&authorizations.WrongWorkspaceError{KeyID: "k1", KeyWorkspaceID: "other"}, codes.PermissionDenied, auth.ReasonWrongWorkspace,
			`API key k1 is for workspace "other", not the authorization's`, nil, "", nil},
		{&authorizations.NotOAuthUserError{ConnectorID: "m", Mode: store.AuthClientCredentials}, codes.FailedPrecondition, ReasonNotOAuthUser,
			`connector "m" uses AUTH_MODE_OAUTH_CLIENT_CREDENTIALS: only AUTH_MODE_OAUTH_USER connectors are authorized by their users`, nil, "", nil},
		{&authorizations.NotOAuthUserError{ConnectorID: "n", Mode: store.AuthNone, Revoking: true}, codes.FailedPrecondition, ReasonNotOAuthUser,
			`connector "n" uses AUTH_MODE_NONE: it uses no OAuth, so there is no authorization to revoke`, nil, "", nil},
		{&authorizations.UserRequiredError{ConnectorID: "p"}, codes.InvalidArgument, ReasonInvalidArgument,
			`invalid request: user_id: required: connector "p" is AUTH_MODE_OAUTH_USER, and each of its users has an authorization of their own`,
			nil, "user_id", nil},
		{authorizations.ErrBadCursor, codes.InvalidArgument, ReasonInvalidArgument,
			"invalid request: page_token: not a token from a previous response", nil, "page_token", nil},
	} {
		st := status.Convert(s.toStatus(context.Background(), tt.err))
		var info *errdetails.ErrorInfo
		var field string
		var detail *connectorv1.AuthorizationRequired
		for _, d := range st.Details() {
			switch d := d.(type) {
			case *errdetails.ErrorInfo:
				info = d
			case *errdetails.BadRequest:
				field = d.GetFieldViolations()[0].GetField()
			case *connectorv1.AuthorizationRequired:
				detail = d
			}
		}
		if st.Code() != tt.code || info.GetReason() != tt.reason || st.Message() != tt.msg || info.GetDomain() != errorDomain {
			t.Errorf("toStatus(%T) = %v %s %q; want %v %s %q", tt.err, st.Code(), info.GetReason(), st.Message(), tt.code, tt.reason, tt.msg)
		}
		if !maps.Equal(info.GetMetadata(), tt.metadata) || field != tt.field {
			t.Errorf("toStatus(%T): metadata %v, field %q; want %v, %q", tt.err, info.GetMetadata(), field, tt.metadata, tt.field)
		}
		if (detail == nil) != (tt.detail == nil) || detail.GetRunId() != tt.detail.GetRunId() ||
			detail.GetAuthorizationUrl() != tt.detail.GetAuthorizationUrl() || !detail.GetExpireTime().AsTime().Equal(exp) && tt.detail != nil {
			t.Errorf("toStatus(%T): AuthorizationRequired %v; want %v", tt.err, detail, tt.detail)
		}
	}
}
