package store

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Tool is one row of the tools table.
type Tool struct {
	ConnectorID int64
	Name        string
	Description string
	// InputSchema is the tool's JSON schema, as the server sent it.
	InputSchema json.RawMessage
	Annotations ToolAnnotations
	Enabled     bool
	// RequiresApproval overrides the connector's approval policy for the
	// tool: nil follows the policy, true always asks a person, false never.
	RequiresApproval *bool
	// Listed is false once the server stops listing the tool: the row
	// keeps the operator flags for when it comes back.
	Listed   bool
	SyncedAt time.Time
}

// ToolAnnotations are the MCP tool hints; nil means the server gave none.
type ToolAnnotations struct {
	Title           string `json:"title,omitempty"`
	ReadOnlyHint    *bool  `json:"readOnlyHint,omitempty"`
	DestructiveHint *bool  `json:"destructiveHint,omitempty"`
	IdempotentHint  *bool  `json:"idempotentHint,omitempty"`
	OpenWorldHint   *bool  `json:"openWorldHint,omitempty"`
}

// ToolSpec is a tool as a server lists it: what a sync writes.
type ToolSpec struct {
	Name        string
	Description string
	InputSchema json.RawMessage
	Annotations ToolAnnotations
}

// SyncResult says what a SyncTools changed, each list sorted by name, and
// which listed tools are disabled after it.
type SyncResult struct {
	Added, Removed, Changed []string
	Disabled                []string
	// Approval holds the listed tools whose approval is overridden, and
	// how; nil when none is.
	Approval map[string]bool
}

const toolColumns = `t.connector_id, t.name, t.description, t.input_schema, t.annotations,
	t.enabled, t.requires_approval, t.listed, t.synced_at`

func scanTool(row pgx.Row) (*Tool, error) {
	var t Tool
	err := row.Scan(&t.ConnectorID, &t.Name, &t.Description, &t.InputSchema, &t.Annotations,
		&t.Enabled, &t.RequiresApproval, &t.Listed, &t.SyncedAt)
	if err != nil {
		return nil, err
	}
	return &t, nil
}

// ListTools returns up to limit listed tools of a workspace's connector
// whose names sort after the name after, in name order. Returns
// ErrConnectorNotFound if there is no such connector.
func (db *DB) ListTools(ctx context.Context, workspaceID, externalID, after string, limit int) ([]*Tool, error) {
	id, err := connectorID(ctx, db.pool, workspaceID, externalID)
	if err != nil {
		return nil, fmt.Errorf("list tools of %q: %w", externalID, err)
	}
	tools, err := queryTools(ctx, db.pool, `
		SELECT `+toolColumns+` FROM tools t
		WHERE t.connector_id = $1 AND t.listed AND t.name > $2
		ORDER BY t.name
		LIMIT $3`, id, after, limit)
	if err != nil {
		return nil, fmt.Errorf("list tools of %q: %w", externalID, err)
	}
	return tools, nil
}

// ConnectorTools returns the listed tools of the connector with row id id,
// in name order.
func (db *DB) ConnectorTools(ctx context.Context, id int64) ([]*Tool, error) {
	tools, err := queryTools(ctx, db.pool, `SELECT `+toolColumns+` FROM tools t WHERE t.connector_id = $1 AND t.listed ORDER BY t.name`, id)
	if err != nil {
		return nil, fmt.Errorf("tools of connector %d: %w", id, err)
	}
	return tools, nil
}

func queryTools(ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) ([]*Tool, error) {
	rows, err := pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (*Tool, error) { return scanTool(row) })
}

// ToolFlags are the operator flags an UpdateToolFlags changes: a nil
// Enabled is left as it is, and the approval override only with
// SetApproval (RequiresApproval nil then clears it: the policy decides).
type ToolFlags struct {
	Enabled          *bool
	SetApproval      bool
	RequiresApproval *bool
}

// UpdateToolFlags sets the operator flags of one tool. A tool the server no longer lists may be updated too (its Listed is
// false): an operator can disable a flapping tool before it comes back.
// Returns ErrConnectorNotFound, or ErrToolNotFound if the tool was never
// listed.
func (db *DB) UpdateToolFlags(ctx context.Context, workspaceID, externalID, name string, f ToolFlags) (*Tool, error) {
	var tool *Tool
	err := db.InTx(ctx, func(tx pgx.Tx) error {
		id, err := connectorID(ctx, tx, workspaceID, externalID)
		if err != nil {
			return err
		}
		tool, err = scanTool(tx.QueryRow(ctx, `
			UPDATE tools t
			SET enabled = coalesce($3, t.enabled),
				requires_approval = CASE WHEN $4 THEN $5 ELSE t.requires_approval END
			WHERE t.connector_id = $1 AND t.name = $2
			RETURNING `+toolColumns, id, name, f.Enabled, f.SetApproval, f.RequiresApproval))
		return translate(err, ErrToolNotFound)
	})
	if err != nil {
		return nil, fmt.Errorf("update tool %q of %q: %w", name, externalID, err)
	}
	return tool, nil
}

// SyncTools makes a connector's catalog match specs, the server's current
// tool list: new tools are inserted (enabled unless the connector's
// DisableNewTools is set), known tools get the server's description, schema
// and annotations while keeping their operator flags, and tools the server no
// longer lists are marked not listed, flags kept. A tool listed again is
// reported Added and keeps the flags it had. Returns ErrConnectorNotFound if
// the connector is gone. With a fence, the sync writes only while the
// fence holds (ErrNotOwner otherwise): the replica that read the tools
// still owns the connector.
func (db *DB) SyncTools(ctx context.Context, connectorID int64, specs []ToolSpec, fence *Fence) (SyncResult, error) {
	var res SyncResult
	err := db.InTx(ctx, func(tx pgx.Tx) error {
		if fence != nil {
			if err := db.CheckFence(ctx, tx, connectorID, *fence); err != nil {
				return err
			}
		}
		var cfg Config
		err := tx.QueryRow(ctx, `SELECT config FROM connectors WHERE id = $1 FOR UPDATE`, connectorID).Scan(&cfg)
		if err != nil {
			return translate(err, ErrConnectorNotFound)
		}
		old, err := toolSpecs(ctx, tx, connectorID)
		if err != nil {
			return err
		}
		res = diffTools(old, specs)

		batch := &pgx.Batch{}
		names := make([]string, 0, len(specs))
		for _, s := range specs {
			names = append(names, s.Name)
			batch.Queue(`
				INSERT INTO tools (connector_id, name, description, input_schema, annotations, enabled)
				VALUES ($1, $2, $3, $4, $5, $6)
				ON CONFLICT (connector_id, name) DO UPDATE
				SET description = excluded.description, input_schema = excluded.input_schema,
					annotations = excluded.annotations, listed = true, synced_at = now()`,
				connectorID, s.Name, s.Description, schemaOrEmpty(s.InputSchema), s.Annotations, !cfg.DisableNewTools)
		}
		batch.Queue(`UPDATE tools SET listed = false WHERE connector_id = $1 AND listed AND NOT (name = ANY($2))`, connectorID, names)
		if err := tx.SendBatch(ctx, batch).Close(); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT name FROM tools WHERE connector_id = $1 AND listed AND NOT enabled ORDER BY name`, connectorID)
		if err != nil {
			return err
		}
		disabled, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		if len(disabled) > 0 {
			res.Disabled = disabled
		}
		res.Approval, err = approvalOverrides(ctx, tx, connectorID)
		return err
	})
	if err != nil {
		return SyncResult{}, fmt.Errorf("sync tools of connector %d: %w", connectorID, err)
	}
	return res, nil
}

// toolSpecs returns the listed tools of a connector by name.
func toolSpecs(ctx context.Context, tx pgx.Tx, connectorID int64) (map[string]ToolSpec, error) {
	rows, err := tx.Query(ctx, `SELECT name, description, input_schema, annotations FROM tools WHERE connector_id = $1 AND listed`, connectorID)
	if err != nil {
		return nil, err
	}
	specs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ToolSpec, error) {
		var s ToolSpec
		err := row.Scan(&s.Name, &s.Description, &s.InputSchema, &s.Annotations)
		return s, err
	})
	if err != nil {
		return nil, err
	}
	m := make(map[string]ToolSpec, len(specs))
	for _, s := range specs {
		m[s.Name] = s
	}
	return m, nil
}

// diffTools compares the stored catalog with the server's list. Schemas are
// compared as JSON values, since jsonb does not keep the server's spacing or
// key order.
func diffTools(old map[string]ToolSpec, specs []ToolSpec) SyncResult {
	var res SyncResult
	seen := make(map[string]bool, len(specs))
	for _, s := range specs {
		seen[s.Name] = true
		o, ok := old[s.Name]
		switch {
		case !ok:
			res.Added = append(res.Added, s.Name)
		case o.Description != s.Description || !reflect.DeepEqual(o.Annotations, s.Annotations) ||
			!sameJSON(o.InputSchema, schemaOrEmpty(s.InputSchema)):
			res.Changed = append(res.Changed, s.Name)
		}
	}
	for name := range old {
		if !seen[name] {
			res.Removed = append(res.Removed, name)
		}
	}
	slices.Sort(res.Added)
	slices.Sort(res.Changed)
	slices.Sort(res.Removed)
	return res
}

func schemaOrEmpty(s json.RawMessage) json.RawMessage {
	if len(s) == 0 {
		return json.RawMessage(`{}`)
	}
	return s
}

func sameJSON(a, b json.RawMessage) bool {
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return string(a) == string(b)
	}
	return reflect.DeepEqual(va, vb)
}

// GetTool returns one listed tool of a workspace's connector. Returns
// ErrConnectorNotFound, or ErrToolNotFound if the server does not list it.
func (db *DB) GetTool(ctx context.Context, workspaceID, externalID, name string) (*Tool, error) {
	id, err := connectorID(ctx, db.pool, workspaceID, externalID)
	if err != nil {
		return nil, fmt.Errorf("get tool %q of %q: %w", name, externalID, err)
	}
	t, err := scanTool(db.pool.QueryRow(ctx, `SELECT `+toolColumns+` FROM tools t WHERE t.connector_id = $1 AND t.name = $2 AND t.listed`, id, name))
	if err != nil {
		return nil, fmt.Errorf("get tool %q of %q: %w", name, externalID, translate(err, ErrToolNotFound))
	}
	return t, nil
}

// approvalOverrides returns the listed tools of a connector whose approval
// is overridden, and how; nil when none is.
func approvalOverrides(ctx context.Context, tx pgx.Tx, connectorID int64) (map[string]bool, error) {
	rows, err := tx.Query(ctx, `SELECT name, requires_approval FROM tools
		WHERE connector_id = $1 AND listed AND requires_approval IS NOT NULL`, connectorID)
	if err != nil {
		return nil, err
	}
	var out map[string]bool
	var name string
	var v bool
	_, err = pgx.ForEachRow(rows, []any{&name, &v}, func() error {
		if out == nil {
			out = map[string]bool{}
		}
		out[name] = v
		return nil
	})
	return out, err
}
