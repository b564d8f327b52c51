// Package authorizations is the use case of end users' OAuth authorizations
// of oauth_user connectors: starting one for a user (at a caller's request,
// or when a call or a run meets the user's missing or too narrow token),
// the cap on step-ups (authorizations for more scopes) within the OAuth
// window, whether a user holds a usable token, completing an authorization
// (only by a caller of its workspace, a refusal sending the user back
// where the caller asked), listing grants, and revoking them: a revoked
// user's connection closes on every replica, before and after the tokens
// go, so that no call runs on with them. It drives an Authorizer (the
// oauth.Manager) and knows nothing of gRPC: it takes request structs and
// returns oauth's results and its own typed errors, which a front door
// maps. Without an Authorizer (no OAuth configured) every use but List
// answers ErrNotConfigured, and List lists none.
package authorizations

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/oauth"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/store"
)

// DefaultWindow is how long an authorization started stays valid when
// Deps.Window is not set, and the window step-ups are counted in.
const DefaultWindow = 10 * time.Minute

// Connectors are the connector rows the use case reads. *store.DB
// implements it.
type Connectors interface {
	GetConnector(ctx context.Context, workspaceID, externalID string) (*store.Connector, error)
}

var _ Connectors = (*store.DB)(nil)

// SessionCloser closes a session of a connector on every replica that
// holds it (sessions.Service); closing a user's connection
// (registry.UserSession) also has every replica forget the user's token.
type SessionCloser interface {
	Close(ctx context.Context, workspaceID, connectorID, sessionID string) ([]registry.SessionInfo, error)
}

// Deps are a Service's collaborators.
type Deps struct {
	// OAuth runs the authorizations; nil: OAuth is not configured.
	OAuth      Authorizer
	Connectors Connectors
	// Box opens the connectors' client secrets; nil: no SECRET_KEY.
	Box      *secret.Box
	Sessions SessionCloser
	// Window is how long an authorization started stays valid
	// (OAUTH_STATE_TTL), within which a user's step-ups of one connector
	// are capped at MaxStepUps; 0 means DefaultWindow.
	Window time.Duration
	Logger *slog.Logger
}

// Service runs users' authorizations. Safe for concurrent use.
type Service struct {
	d     Deps
	steps stepUps
}

// New returns a Service.
func New(d Deps) *Service {
	if d.Window <= 0 {
		d.Window = DefaultWindow
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	return &Service{d: d}
}

// Authorization is where to send a user who must authorize a connector.
type Authorization struct {
	ConnectorID string // as callers know it
	UserID      string
	RunID       string // the paused run, if any
	URL         string
	Scopes      []string
	Reason      string // oauth.ReasonNoToken, oauth.ReasonInsufficientScope, ...
	ExpiresAt   time.Time
}

// BeginRequest asks for an authorization of a connector by one of its
// users, for the connector's scopes and Scopes, whose completion sends the
// user back to ReturnTo ("": nowhere).
type BeginRequest struct {
	WorkspaceID, ConnectorID, UserID string
	ReturnTo                         string
	Scopes                           []string
}

// Begin starts the authorization req asks for. Errors: ErrNotConfigured,
// the store's for an unknown connector, *NotOAuthUserError, and the
// Authorizer's (oauth.ErrReturnToNotAllowed, *oauth.DiscoveryError, ...).
func (s *Service) Begin(ctx context.Context, req BeginRequest) (*oauth.Started, error) {
	if s.d.OAuth == nil {
		return nil, ErrNotConfigured
	}
	row, err := s.d.Connectors.GetConnector(ctx, req.WorkspaceID, req.ConnectorID)
	if err != nil {
		return nil, err
	}
	if mode := row.Config.AuthMode(); mode != store.AuthUser {
		return nil, &NotOAuthUserError{ConnectorID: row.ExternalID, Mode: mode}
	}
	oc, err := live.OAuthConnectorOf(s.d.Box, row)
	if err != nil {
		return nil, err
	}
	return s.d.OAuth.Start(ctx, oc, req.UserID, req.ReturnTo, req.Scopes)
}

// Start starts an authorization of row's connector for userID and says
// where to send them (queries.Authorizations). A step-up (reason
// oauth.ReasonInsufficientScope) asks for scopes on top of those held, at
// most MaxStepUps a window (then *StepUpLimitError); "" stands for
// oauth.ReasonNoToken.
func (s *Service) Start(ctx context.Context, row *store.Connector, userID, reason string, scopes []string) (*Authorization, error) {
	if s.d.OAuth == nil {
		return nil, ErrNotConfigured
	}
	var extra []string
	if reason == oauth.ReasonInsufficientScope {
		if !s.steps.take(row.ID, userID, s.d.Window) {
			return nil, &StepUpLimitError{Scopes: scopes, Window: s.d.Window}
		}
		extra = scopes
	}
	oc, err := live.OAuthConnectorOf(s.d.Box, row)
	if err != nil {
		return nil, err
	}
	st, err := s.d.OAuth.Start(ctx, oc, userID, "", extra)
	if err != nil {
		return nil, err
	}
	if reason == "" {
		reason = oauth.ReasonNoToken
	}
	return &Authorization{ConnectorID: row.ExternalID, UserID: userID, URL: st.URL, Scopes: st.Scopes, Reason: reason,
		ExpiresAt: st.ExpiresAt}, nil
}

// Required reports what userID must do before a call or a run of row's
// connector can use their token (queries.Authorizations): nil when they
// hold a usable one, an *oauth.RequiredError (NO_TOKEN) when they must
// authorize.
func (s *Service) Required(ctx context.Context, row *store.Connector, userID string) (*oauth.RequiredError, error) {
	if s.d.OAuth == nil {
		return nil, ErrNotConfigured
	}
	oc, err := live.OAuthConnectorOf(s.d.Box, row)
	if err != nil {
		return nil, err
	}
	ok, err := s.d.OAuth.Usable(ctx, oc, userID)
	if err != nil {
		return nil, fmt.Errorf("check user %q's authorization: %w", userID, err)
	}
	if ok {
		return nil, nil
	}
	return &oauth.RequiredError{ConnectorID: row.ID, UserID: userID, Reason: oauth.ReasonNoToken}, nil
}

// Needed is the error a call of row's connector as userID gets when the
// connection was refused for want of a token (required): for an
// oauth_user connector a new authorization starts (a step-up when the
// server asked for more scopes) and the error is a *RequiredError saying
// where to send the user; runID names the paused run, if any. A connector
// of its own identity gets an *OwnAuthorizationError, which no user can
// mend. Start's errors pass on.
func (s *Service) Needed(ctx context.Context, row *store.Connector, userID string, required *oauth.RequiredError, runID string) error {
	if row.Config.AuthMode() != store.AuthUser {
		return &OwnAuthorizationError{Required: required}
	}
	a, err := s.Start(ctx, row, userID, required.Reason, required.Scopes)
	if err != nil {
		return err
	}
	a.RunID = runID
	return &RequiredError{Authorization: a}
}
