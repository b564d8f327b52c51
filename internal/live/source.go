package live

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/store"
)

var _ registry.ConnectorSource = (*Source)(nil)

// Source lets the registry read connectors from the store (secrets opened
// in memory) and write back health, tool catalogs and counters.
type Source struct {
	db     SourceStore
	box    *secret.Box
	logger *slog.Logger
	// fences, when set, says what this replica's owned writes carry;
	// without it (a single replica outside a cluster) writes are not fenced.
	fences func(id int64) (store.Fence, bool)
}

// FenceWith makes the catalog syncs and health writes of connector id
// carry fences(id), and skips them when this replica does not own it. Call
// it before the registry runs.
func (s *Source) FenceWith(fences func(id int64) (store.Fence, bool)) { s.fences = fences }

// fence returns the fence of connector id's owned writes: nil without
// fences, and ok false when this replica does not own the connector.
func (s *Source) fence(id int64) (f *store.Fence, ok bool) {
	if s.fences == nil {
		return nil, true
	}
	got, ok := s.fences(id)
	return &got, ok
}

// NewSource returns the registry's view of db.
func NewSource(db SourceStore, box *secret.Box, logger *slog.Logger) *Source {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Source{db: db, box: box, logger: logger}
}

// ActiveConnectors implements registry.ConnectorSource. It returns none:
// Connectors.Load hands the registry every connector this replica holds,
// through the same Apply as every later change.
func (s *Source) ActiveConnectors(context.Context) ([]registry.Spec, error) { return nil, nil }

// Timeouts of a connector that sets none (the API fills them in; a row
// written by SQL may not).
const (
	DefaultConnectTimeout = 30 * time.Second
	DefaultCallTimeout    = 60 * time.Second
)

// Spec is what the registry needs to connect c, secrets included.
func (s *Source) Spec(c *store.Connector) (registry.Spec, error) {
	vals, err := s.box.Open(c.SealedSecrets, SealContext(c.WorkspaceID, c.ExternalID))
	if err != nil {
		return registry.Spec{}, fmt.Errorf("open secrets of %q: %w", c.ExternalID, err)
	}
	spec := registry.Spec{
		ID:             c.ID,
		WorkspaceID:    c.WorkspaceID,
		ConnectorID:    c.ExternalID,
		Transport:      c.Transport,
		URL:            secret.JoinURL(c.Config.URL, vals.Query),
		Headers:        vals.Headers,
		Command:        c.Config.Command,
		Args:           c.Config.Args,
		Env:            vals.Env,
		SessionMode:    cmp.Or(c.Config.SessionMode, registry.SessionShared),
		Protocol:       cmp.Or(c.Config.ProtocolPreference, registry.ProtocolAuto),
		ConnectTimeout: cmp.Or(time.Duration(c.Config.ConnectTimeout), DefaultConnectTimeout),
		CallTimeout:    cmp.Or(time.Duration(c.Config.CallTimeout), DefaultCallTimeout),
		Auth:           c.Config.AuthMode(),
		ClientSecret:   vals.ClientSecret,
		Elicitation:    c.Config.Elicitation,
		Sampling:       c.Config.SamplingOn(),
	}
	if a := c.Config.Auth; a != nil {
		spec.ClientID, spec.Scopes = a.ClientID, a.Scopes
	}
	return spec, nil
}

// SyncTools implements registry.ConnectorSource.
func (s *Source) SyncTools(ctx context.Context, id int64, tools []mcp.Tool) (registry.ToolChanges, error) {
	specs := make([]store.ToolSpec, 0, len(tools))
	for _, t := range tools {
		spec, err := ToolSpec(t)
		if err != nil {
			return registry.ToolChanges{}, err
		}
		specs = append(specs, spec)
	}
	fence, ok := s.fence(id)
	if !ok {
		return registry.ToolChanges{}, fmt.Errorf("sync the catalog of connector %d: %w", id, store.ErrNotOwner)
	}
	res, err := s.db.SyncTools(ctx, id, specs, fence)
	if err != nil {
		return registry.ToolChanges{}, err
	}
	return registry.ToolChanges{Added: res.Added, Removed: res.Removed, Changed: res.Changed, Disabled: res.Disabled,
		Approval: res.Approval}, nil
}

// ToolFlags implements registry.ConnectorSource.
func (s *Source) ToolFlags(ctx context.Context, id int64) (registry.ToolFlags, error) {
	tools, err := s.db.ConnectorTools(ctx, id)
	if err != nil {
		return registry.ToolFlags{}, err
	}
	row, err := s.db.ConnectorByID(ctx, id)
	if err != nil {
		return registry.ToolFlags{}, err
	}
	f := registry.ToolFlags{Enabled: make(map[string]bool, len(tools)), DisableNew: row.Config.DisableNewTools}
	for _, t := range tools {
		f.Enabled[t.Name] = t.Enabled
		if t.RequiresApproval != nil {
			if f.Approval == nil {
				f.Approval = map[string]bool{}
			}
			f.Approval[t.Name] = *t.RequiresApproval
		}
	}
	return f, nil
}

// ToolSpec reads a tool's schema and hints from its wire form, which also
// covers tools whose schema mcp-go keeps raw.
func ToolSpec(t mcp.Tool) (store.ToolSpec, error) {
	b, err := json.Marshal(t)
	if err != nil {
		return store.ToolSpec{}, fmt.Errorf("tool %q: %w", t.Name, err)
	}
	var wire struct {
		InputSchema json.RawMessage       `json:"inputSchema"`
		Annotations store.ToolAnnotations `json:"annotations"`
	}
	if err := json.Unmarshal(b, &wire); err != nil {
		return store.ToolSpec{}, fmt.Errorf("tool %q: %w", t.Name, err)
	}
	return store.ToolSpec{Name: t.Name, Description: t.Description, InputSchema: wire.InputSchema, Annotations: wire.Annotations}, nil
}

// SaveHealth implements registry.ConnectorSource. The last error is stored
// with the query values of any URL in it redacted.
func (s *Source) SaveHealth(ctx context.Context, id int64, h registry.Health) error {
	checked := h.CheckedAt
	sh := store.Health{State: string(h.State), LastError: h.LastError, Latency: h.Latency, CheckedAt: &checked, ProtocolVersion: h.ProtocolVersion}
	switch fence, ok := s.fence(id); {
	case !ok:
		return nil // the owner writes it
	case fence != nil:
		return s.db.SaveHealthFenced(ctx, id, *fence, sh)
	}
	return s.db.SaveHealth(ctx, id, sh)
}

// AddUsage implements registry.ConnectorSource.
func (s *Source) AddUsage(ctx context.Context, id int64, u registry.Usage) error {
	d := store.Counters{Calls: u.Calls, Errors: u.Errors, Reconnects: u.Reconnects, Reinitializations: u.Reinitializations}
	if !u.LastUsed.IsZero() {
		d.LastUsedAt = &u.LastUsed
	}
	return s.db.AddCounters(ctx, id, d)
}

// SealContext binds sealed secrets to their connector's row.
func SealContext(workspaceID, connectorID string) string {
	return "connector/" + workspaceID + "/" + connectorID
}

// ConnectorAttrs identify a connector in a log line; never secrets.
func ConnectorAttrs(c *store.Connector) []any {
	return []any{
		slog.String("workspace_id", c.WorkspaceID),
		slog.String("connector_id", c.ExternalID),
		slog.String("transport", c.Transport),
	}
}
