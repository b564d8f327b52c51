// Package connectors is the use case of managing connectors: create,
// update, activate, deactivate and delete. Every change is written to the
// store and then applied to this replica's live state (live.Apply), so that
// no front door can write a row and forget its connection; the other
// replicas follow through the store's change notifications. It owns the
// rules of what a connector may be, for every front door alike: the checks
// of its settings (Check, on the front-door-neutral Spec, with the API's
// field paths and messages), the merge of an update into the stored
// connector (write-only secrets sent back redacted keep the stored ones),
// the sealing of its secrets, and the operator's rules (the stdio command
// allow-list, the egress policy of HTTP URLs). It knows nothing of gRPC:
// a front door converts its request to a Spec, checks the request's own
// fields, and maps the typed errors of errors.go to its own.
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

// NewConnector is a connector to create.
type NewConnector struct {
	WorkspaceID string
	Spec        *Spec
	Active      bool
}

// CheckNew is Check of a connector to create, named by its id if it has
// no name (Create names it so).
func CheckNew(sp *Spec) []Violation {
	if sp.Name == "" {
		sp.Name = sp.ConnectorID
	}
	return Check(sp)
}

// Create stores a new connector, with its secrets sealed, and applies it.
// Returns *InvalidError (CheckNew's violations, or a REDACTED query value
// with nothing to keep), *CommandNotAllowedError, *EgressDeniedError,
// secret.ErrNoKey (secrets without SECRET_KEY) or the store's error
// (store.ErrConflict for a taken connector id).
func (s *Service) Create(ctx context.Context, n NewConnector) (*store.Connector, error) {
	sp := n.Spec
	if bad := CheckNew(sp); len(bad) > 0 {
		return nil, &InvalidError{Violations: bad}
	}
	c := &store.Connector{WorkspaceID: n.WorkspaceID, ExternalID: sp.ConnectorID, Name: sp.Name, Description: sp.Description,
		Transport: sp.Transport.Value, Config: config(sp), Active: n.Active}
	if err := s.AllowCommand(c.Transport, c.Config.Command); err != nil {
		return nil, err
	}
	secrets, err := secretsOf(sp, nil)
	if err != nil {
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

// Update is a change of a connector: the settings of Spec that Paths name
// (of UpdatePaths) replace the stored ones.
type Update struct {
	WorkspaceID, ConnectorID string
	Spec                     *Spec
	Paths                    []string
}

// Update merges u into its connector's row, checks the result as a whole
// and writes it, then applies it; nothing is written if the result is
// invalid. A new HTTP URL is checked against the egress policy before the
// row is locked: no lookup holds it. Returns *InvalidError,
// *CommandNotAllowedError, *EgressDeniedError, the secrets' errors or the
// store's.
func (s *Service) Update(ctx context.Context, u Update) (*store.Connector, error) {
	if u.Spec == nil {
		u.Spec = &Spec{}
	}
	if (slices.Contains(u.Paths, "http") || slices.Contains(u.Paths, "http.url")) && u.Spec.HTTP != nil {
		if err := s.CheckURL(ctx, u.Spec.HTTP.URL); err != nil {
			return nil, err
		}
	}
	updated, err := s.d.Store.UpdateConnector(ctx, u.WorkspaceID, u.ConnectorID, func(stored *store.Connector) error {
		return s.change(stored, u)
	})
	if err != nil {
		return nil, err
	}
	s.d.Logger.InfoContext(ctx, "connector updated", append(live.ConnectorAttrs(updated), slog.Any("paths", u.Paths))...)
	s.d.Live.Apply(ctx, updated)
	return updated, nil
}

// command is the command a stdio connection runs.
func (sp *Spec) command() string {
	if sp.Stdio == nil {
		return ""
	}
	return sp.Stdio.Command
}

// change merges u into stored, the row locked for the update.
func (s *Service) change(stored *store.Connector, u Update) error {
	sp := specOf(stored)
	m, err := merge(sp, u.Spec, u.Paths)
	if err != nil {
		return err
	}
	if bad := Check(sp); len(bad) > 0 {
		return &InvalidError{Violations: bad}
	}
	if err := s.AllowCommand(sp.Transport.Value, sp.command()); err != nil {
		return err
	}
	sealed, err := s.resealed(stored, sp, m)
	if err != nil {
		return err
	}
	stored.Name, stored.Description = sp.Name, sp.Description
	stored.Transport = sp.Transport.Value
	stored.Config = config(sp)
	stored.SealedSecrets = sealed
	return nil
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
