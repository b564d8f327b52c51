// Package connectors is the use case of managing connectors: create,
// update, activate, deactivate and delete. Every change is written to the
// store and then applied to this replica's live state (live.Apply), so that
// no front door can write a row and forget its connection; the other
// replicas follow through the store's change notifications. It also holds
// the operator's rules about what a connector may be: the stdio command
// allow-list and the egress policy of HTTP URLs. It knows nothing of gRPC:
// a front door validates and converts its request, and maps the typed
// errors of errors.go to its own.
package connectors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"time"

	"github.com/connector-svc/connector-svc/internal/egress"
	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/oauth"
	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/store"
)

// Store is what the use case writes connectors with.
type Store interface {
	CreateConnector(ctx context.Context, c *store.Connector) (*store.Connector, error)
	GetConnector(ctx context.Context, workspaceID, externalID string) (*store.Connector, error)
	UpdateConnector(ctx context.Context, workspaceID, externalID string, fn func(*store.Connector) error) (*store.Connector, error)
	SetConnectorActive(ctx context.Context, workspaceID, externalID string, active bool) (*store.Connector, error)
	DeleteConnector(ctx context.Context, workspaceID, externalID string) (int64, error)
}

// TokenRevoker revokes every token of an OAuth connector at its
// authorization server and deletes them (oauth.Manager.RevokeAll).
type TokenRevoker interface {
	RevokeAll(ctx context.Context, c oauth.Connector) error
}

// Deps are a Service's collaborators and the operator's rules.
type Deps struct {
	Store Store
	Live  *live.Connectors
	// Box seals connectors' secrets; nil: no SECRET_KEY, and a connector
	// with secrets is refused (secret.ErrNoKey).
	Box *secret.Box
	// Egress refuses HTTP URLs whose host is, or resolves to, a denied
	// address; nil means the default policy.
	Egress *egress.Policy
	// AllowedCommands are the only commands a stdio connector may run.
	AllowedCommands []string
	// Revoker revokes a deleted OAuth connector's tokens; nil: OAuth is
	// not configured.
	Revoker TokenRevoker
	Logger  *slog.Logger
}

// Service manages connectors. Safe for concurrent use.
type Service struct{ d Deps }

// New returns a Service over d.
func New(d Deps) *Service {
	if d.Egress == nil {
		d.Egress = egress.New(egress.Config{})
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	return &Service{d: d}
}

// Create stores c, which must be valid, with secrets sealed, and applies
// it. Returns *CommandNotAllowedError, *EgressDeniedError,
// secret.ErrNoKey (secrets without SECRET_KEY) or the store's error
// (store.ErrConflict for a taken connector id).
func (s *Service) Create(ctx context.Context, c *store.Connector, secrets secret.Values) (*store.Connector, error) {
	if err := s.AllowCommand(c.Transport, c.Config.Command); err != nil {
		return nil, err
	}
	if err := s.CheckURL(ctx, c.Config.URL); err != nil {
		return nil, err
	}
	sealed, err := s.d.Box.Seal(secrets, live.SealContext(c.WorkspaceID, c.ExternalID))
	if err != nil {
		return nil, err
	}
	c.SealedSecrets = sealed
	created, err := s.d.Store.CreateConnector(ctx, c)
	if err != nil {
		return nil, err
	}
	s.d.Logger.InfoContext(ctx, "connector created", live.ConnectorAttrs(created)...)
	s.d.Live.Apply(ctx, created)
	return created, nil
}

// Update is a change of a connector.
type Update struct {
	WorkspaceID, ConnectorID string
	// URL, if not empty, is a new HTTP URL the change sets: it is checked
	// against the egress policy before the row is locked.
	URL string
	// Change changes the stored row in place, within the row's
	// transaction; its error aborts the update and is Update's.
	Change func(stored *store.Connector) error
	// Paths name what changed, for the log.
	Paths []string
}

// Update applies u to its connector's row and then to its live copy.
func (s *Service) Update(ctx context.Context, u Update) (*store.Connector, error) {
	if err := s.CheckURL(ctx, u.URL); err != nil {
		return nil, err
	}
	updated, err := s.d.Store.UpdateConnector(ctx, u.WorkspaceID, u.ConnectorID, u.Change)
	if err != nil {
		return nil, err
	}
	s.d.Logger.InfoContext(ctx, "connector updated", append(live.ConnectorAttrs(updated), slog.Any("paths", u.Paths))...)
	s.d.Live.Apply(ctx, updated)
	return updated, nil
}

// SetActive sets a connector's desired state and applies it.
func (s *Service) SetActive(ctx context.Context, workspaceID, connectorID string, active bool) (*store.Connector, error) {
	c, err := s.d.Store.SetConnectorActive(ctx, workspaceID, connectorID, active)
	if err != nil {
		return nil, err
	}
	s.d.Logger.InfoContext(ctx, "connector desired state set", append(live.ConnectorAttrs(c), slog.Bool("active", active))...)
	s.d.Live.Apply(ctx, c)
	return c, nil
}

// revokeAllTimeout bounds how long a deletion waits for an authorization
// server to revoke the connector's tokens.
const revokeAllTimeout = 10 * time.Second

// Delete deletes a connector; its connection closes. An OAuth connector's
// tokens are revoked at the authorization server (within
// revokeAllTimeout: one that is down or slow delays the deletion that
// long, and never stops it) and deleted before the row goes, while it
// still says how.
func (s *Service) Delete(ctx context.Context, workspaceID, connectorID string) error {
	if row, err := s.d.Store.GetConnector(ctx, workspaceID, connectorID); err == nil {
		s.revokeAll(ctx, row)
	}
	id, err := s.d.Store.DeleteConnector(ctx, workspaceID, connectorID)
	if err != nil {
		return err
	}
	s.d.Live.Deleted(id)
	s.d.Logger.InfoContext(ctx, "connector deleted", slog.String("workspace_id", workspaceID), slog.String("connector_id", connectorID))
	return nil
}

func (s *Service) revokeAll(ctx context.Context, row *store.Connector) {
	if s.d.Revoker == nil || row.Config.AuthMode() == store.AuthNone {
		return
	}
	oc, err := live.OAuthConnectorOf(s.d.Box, row)
	if err == nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), revokeAllTimeout)
		err = s.d.Revoker.RevokeAll(rctx, oc)
		cancel()
	}
	if err != nil {
		s.d.Logger.WarnContext(ctx, "revoke the tokens of a deleted connector; it is deleted all the same",
			append(live.ConnectorAttrs(row), slog.String("error", err.Error()))...)
	}
}

// AllowCommand refuses a stdio command that is not on the allow-list
// (*CommandNotAllowedError).
func (s *Service) AllowCommand(transport, command string) error {
	if transport != store.TransportStdio || slices.Contains(s.d.AllowedCommands, command) {
		return nil
	}
	return &CommandNotAllowedError{Command: command}
}

// egressLookupTimeout bounds the name lookup of a create or update.
const egressLookupTimeout = 5 * time.Second

// CheckURL refuses an HTTP connector URL whose host is, or resolves to, an
// address the egress policy denies (*EgressDeniedError). A host that does
// not resolve now passes (its server may not exist yet): every dial is
// checked again, and a refused one shows in the connector's health. An
// empty URL, or one that does not parse, passes too, for validation to
// report.
func (s *Service) CheckURL(ctx context.Context, rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil || u.Hostname() == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, egressLookupTimeout)
	defer cancel()
	err = s.d.Egress.CheckHost(ctx, u.Hostname())
	var denied *egress.DeniedError
	switch {
	case errors.As(err, &denied):
		hint := ""
		if denied.Rule.Default {
			hint = "; an operator can open the range with EGRESS_ALLOW_CIDRS"
		}
		return &EgressDeniedError{fmt.Errorf("connector.http.url: %w%s", err, hint)}
	case err != nil:
		s.d.Logger.DebugContext(ctx, "egress check: the host does not resolve now; its dials will be checked",
			slog.String("host", u.Hostname()), slog.String("error", err.Error()))
	}
	return nil
}
