package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Transport values stored in connectors.transport.
const (
	TransportStdio          = "stdio"
	TransportSSE            = "sse"
	TransportStreamableHTTP = "streamable_http"
)

// HealthUnknown is the health state of a connector never checked.
const HealthUnknown = "unknown"

// Connector is one row of the connectors table.
type Connector struct {
	ID          int64
	WorkspaceID string
	ExternalID  string
	Name        string
	Description string
	Transport   string
	Config      Config
	// SealedSecrets is the encrypted header or env values; nil when none.
	SealedSecrets []byte
	Active        bool
	Health        Health
	Counters      Counters
	// ToolCount is the number of tools the server lists.
	ToolCount int
	// ConfigVersion counts the changes of what a replica's live copy of
	// the connector is built from: its settings, secrets, active flag, and
	// its tools' catalog and flags (migration 006's triggers bump it).
	ConfigVersion int64
	CreatedAt     time.Time
	UpdatedAt     time.Time
}

// Config is the non-secret configuration, stored as jsonb.
type Config struct {
	URL            string   `json:"url,omitempty"`
	HeaderNames    []string `json:"header_names,omitempty"`
	Command        string   `json:"command,omitempty"`
	Args           []string `json:"args,omitempty"`
	EnvKeys        []string `json:"env_keys,omitempty"`
	ConnectTimeout Duration `json:"connect_timeout,omitempty"`
	CallTimeout    Duration `json:"call_timeout,omitempty"`
	SessionMode    string   `json:"session_mode,omitempty"`
	// ProtocolPreference is the protocol generation to open with: "auto"
	// (or empty), "classic" or "sessionless".
	ProtocolPreference string     `json:"protocol_preference,omitempty"`
	Model              string     `json:"model,omitempty"`
	RateLimit          *RateLimit `json:"rate_limit,omitempty"`
	// DisableNewTools makes tools found by a later sync start disabled.
	DisableNewTools bool `json:"disable_new_tools,omitempty"`
	// NarrowToolsAbove overrides the agent's narrowing threshold; 0 keeps it.
	NarrowToolsAbove int `json:"narrow_tools_above,omitempty"`
	// ApprovalPolicy says which tool calls wait for a person: "none" (or
	// empty, as for connectors made before there was a policy),
	// "destructive" or "all". A tool's RequiresApproval overrides it.
	ApprovalPolicy string `json:"approval_policy,omitempty"`
	// Auth is how the service authenticates to an HTTP connector's server;
	// nil means static headers only (AuthNone).
	Auth *AuthConfig `json:"auth,omitempty"`
	// Elicitation lets the connector's servers ask its user for input
	// (declared on per-user and per-session connections only).
	Elicitation bool `json:"elicitation,omitempty"`
	// Sampling lets its servers ask its model for completions; nil: off.
	Sampling *SamplingConfig `json:"sampling,omitempty"`
}

// Sampling policies stored in SamplingConfig.Policy.
const (
	SamplingAuto    = "auto"
	SamplingApprove = "approve"
)

// SamplingConfig is a connector's sampling settings; a limit's 0 means the
// service's default.
type SamplingConfig struct {
	Enabled              bool   `json:"enabled,omitempty"`
	Policy               string `json:"policy,omitempty"` // SamplingAuto (or empty) or SamplingApprove
	MaxTokensPerRequest  int    `json:"max_tokens_per_request,omitempty"`
	MaxRequestsPerRun    int    `json:"max_requests_per_run,omitempty"`
	MaxTokensPerRun      int    `json:"max_tokens_per_run,omitempty"`
	MaxRequestsPerMinute int    `json:"max_requests_per_minute,omitempty"`
	MaxTokensPerMinute   int    `json:"max_tokens_per_minute,omitempty"`
}

// SamplingOn says the connector's servers may sample.
func (c Config) SamplingOn() bool { return c.Sampling != nil && c.Sampling.Enabled }

// Auth modes stored in AuthConfig.Mode.
const (
	AuthNone              = "none"
	AuthClientCredentials = "oauth_client_credentials"
	AuthUser              = "oauth_user"
)

// AuthConfig is a connector's OAuth settings, but for the client secret,
// which is sealed with the other secrets (secret.Values.ClientSecret).
type AuthConfig struct {
	Mode     string   `json:"mode,omitempty"` // AuthNone (or empty), AuthClientCredentials or AuthUser
	ClientID string   `json:"client_id,omitempty"`
	Scopes   []string `json:"scopes,omitempty"`
	// HasClientSecret says a client secret is sealed, so that responses
	// can say so without opening the secrets.
	HasClientSecret bool `json:"has_client_secret,omitempty"`
}

// AuthMode is the connector's auth mode: AuthNone when none is set.
func (c Config) AuthMode() string {
	if c.Auth == nil || c.Auth.Mode == "" {
		return AuthNone
	}
	return c.Auth.Mode
}

// RateLimit is a token bucket for queries.
type RateLimit struct {
	RequestsPerSecond float64 `json:"requests_per_second"`
	Burst             int     `json:"burst"`
}

// Duration is a time.Duration stored as a string such as "30s", so the jsonb
// reads well in psql.
type Duration time.Duration

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	*d = Duration(v)
	return err
}

// Health is the last known health of a connector's connection.
type Health struct {
	State           string
	LastError       string
	Latency         time.Duration
	CheckedAt       *time.Time
	ProtocolVersion string
}

// Counters are a connector's usage counters.
type Counters struct {
	Calls, Errors, Reconnects, Reinitializations int64
	Queries, QueryErrors                         int64
	PromptTokens, CompletionTokens               int64
	// Inputs are the inputs its servers asked of users; Samplings, the
	// sampling requests its model answered for them.
	Inputs, Samplings int64
	LastUsedAt        *time.Time
}

// connectorColumns is what scanConnector reads; the table is aliased c.
const connectorColumns = `c.id, c.workspace_id, c.external_id, c.name, c.description, c.transport,
	c.config, c.sealed_secrets, c.active,
	c.health_state, c.last_error, c.latency_ms, c.checked_at, c.protocol_version,
	c.call_count, c.error_count, c.reconnect_count, c.reinitialize_count,
	c.query_count, c.query_error_count, c.prompt_tokens, c.completion_tokens, c.last_used_at,
	c.input_count, c.sampling_count,
	(SELECT count(*) FROM tools t WHERE t.connector_id = c.id AND t.listed),
	c.config_version, c.created_at, c.updated_at`

func scanConnector(row pgx.Row) (*Connector, error) {
	var c Connector
	var latencyMS int
	err := row.Scan(&c.ID, &c.WorkspaceID, &c.ExternalID, &c.Name, &c.Description, &c.Transport,
		&c.Config, &c.SealedSecrets, &c.Active,
		&c.Health.State, &c.Health.LastError, &latencyMS, &c.Health.CheckedAt, &c.Health.ProtocolVersion,
		&c.Counters.Calls, &c.Counters.Errors, &c.Counters.Reconnects, &c.Counters.Reinitializations,
		&c.Counters.Queries, &c.Counters.QueryErrors, &c.Counters.PromptTokens, &c.Counters.CompletionTokens,
		&c.Counters.LastUsedAt, &c.Counters.Inputs, &c.Counters.Samplings,
		&c.ToolCount, &c.ConfigVersion, &c.CreatedAt, &c.UpdatedAt)
	if err != nil {
		return nil, err
	}
	c.Health.Latency = time.Duration(latencyMS) * time.Millisecond
	return &c, nil
}

// CreateConnector inserts c and returns the stored row. ID, health, counters
// and times of c are ignored. Returns ErrConflict if the workspace already
// has a connector with c.ExternalID.
func (db *DB) CreateConnector(ctx context.Context, c *Connector) (*Connector, error) {
	row := db.pool.QueryRow(ctx, `
		INSERT INTO connectors AS c
			(workspace_id, external_id, name, description, transport, config, sealed_secrets, active)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
		RETURNING `+connectorColumns,
		c.WorkspaceID, c.ExternalID, c.Name, c.Description, c.Transport, c.Config, c.SealedSecrets, c.Active)
	got, err := scanConnector(row)
	if err != nil {
		return nil, fmt.Errorf("create connector %q: %w", c.ExternalID, translate(err, ErrConnectorNotFound))
	}
	return got, nil
}

// GetConnector returns a workspace's connector. Returns ErrConnectorNotFound
// if there is none with that id in that workspace.
func (db *DB) GetConnector(ctx context.Context, workspaceID, externalID string) (*Connector, error) {
	row := db.pool.QueryRow(ctx, `
		SELECT `+connectorColumns+` FROM connectors c
		WHERE c.workspace_id = $1 AND c.external_id = $2`,
		workspaceID, externalID)
	c, err := scanConnector(row)
	if err != nil {
		return nil, fmt.Errorf("get connector %q: %w", externalID, translate(err, connectorNotFound(workspaceID, externalID)))
	}
	return c, nil
}

// ListConnectors returns up to limit connectors of a workspace whose ids sort
// after the id after, in id order.
func (db *DB) ListConnectors(ctx context.Context, workspaceID, after string, limit int) ([]*Connector, error) {
	rows, err := db.pool.Query(ctx, `
		SELECT `+connectorColumns+` FROM connectors c
		WHERE c.workspace_id = $1 AND c.external_id > $2
		ORDER BY c.external_id
		LIMIT $3`,
		workspaceID, after, limit)
	if err != nil {
		return nil, fmt.Errorf("list connectors: %w", err)
	}
	cs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (*Connector, error) { return scanConnector(row) })
	if err != nil {
		return nil, fmt.Errorf("list connectors: %w", err)
	}
	return cs, nil
}

// UpdateConnector locks a workspace's connector, passes a copy to fn, and
// stores the name, description, transport, config and sealed secrets fn left
// in it, all in one transaction. If fn returns an error nothing is written
// and the error is returned as is. Returns ErrConnectorNotFound if there is no
// such connector.
func (db *DB) UpdateConnector(ctx context.Context, workspaceID, externalID string, fn func(*Connector) error) (*Connector, error) {
	var updated *Connector
	err := db.InTx(ctx, func(tx pgx.Tx) error {
		c, err := scanConnector(tx.QueryRow(ctx, `
			SELECT `+connectorColumns+` FROM connectors c
			WHERE c.workspace_id = $1 AND c.external_id = $2
			FOR UPDATE`,
			workspaceID, externalID))
		if err != nil {
			return fmt.Errorf("update connector %q: %w", externalID, translate(err, connectorNotFound(workspaceID, externalID)))
		}
		if err := fn(c); err != nil {
			return err
		}
		updated, err = scanConnector(tx.QueryRow(ctx, `
			UPDATE connectors c
			SET name = $2, description = $3, transport = $4, config = $5, sealed_secrets = $6, updated_at = now()
			WHERE c.id = $1
			RETURNING `+connectorColumns,
			c.ID, c.Name, c.Description, c.Transport, c.Config, c.SealedSecrets))
		if err != nil {
			return fmt.Errorf("update connector %q: %w", externalID, translate(err, connectorNotFound(workspaceID, externalID)))
		}
		return nil
	})
	return updated, err
}

// SetConnectorActive sets a connector's desired state and returns the row.
// Returns ErrConnectorNotFound if there is no such connector.
func (db *DB) SetConnectorActive(ctx context.Context, workspaceID, externalID string, active bool) (*Connector, error) {
	row := db.pool.QueryRow(ctx, `
		UPDATE connectors c SET active = $3, updated_at = now()
		WHERE c.workspace_id = $1 AND c.external_id = $2
		RETURNING `+connectorColumns,
		workspaceID, externalID, active)
	c, err := scanConnector(row)
	if err != nil {
		return nil, fmt.Errorf("set connector %q active=%t: %w", externalID, active, translate(err, connectorNotFound(workspaceID, externalID)))
	}
	return c, nil
}

// DeleteConnector deletes a connector and its tools and returns the deleted
// row's id. Returns ErrConnectorNotFound if there is no such connector.
//
// Its runs are kept, with its external id; those paused for approval or
// authorization end as failed, since they can no longer go on.
func (db *DB) DeleteConnector(ctx context.Context, workspaceID, externalID string) (int64, error) {
	var id int64
	err := db.InTx(ctx, func(tx pgx.Tx) error {
		// The ownership row goes first: an owner's fenced write locks it
		// before the connector's row, and a delete that took the
		// connector's row first would deadlock with it.
		err := tx.QueryRow(ctx, `
			WITH c AS (SELECT id FROM connectors WHERE workspace_id = $1 AND external_id = $2),
			owner AS (DELETE FROM connector_owners WHERE connector_id = (SELECT id FROM c))
			SELECT id FROM c`,
			workspaceID, externalID).Scan(&id)
		if err != nil {
			return translate(err, connectorNotFound(workspaceID, externalID))
		}
		err = tx.QueryRow(ctx, `DELETE FROM connectors WHERE id = $1 RETURNING id`, id).Scan(&id)
		if err != nil {
			return translate(err, connectorNotFound(workspaceID, externalID))
		}
		_, err = tx.Exec(ctx, `
			UPDATE query_runs SET status = 'failed', error = 'the connector was deleted while the run waited for ' ||
					CASE status WHEN 'awaiting_approval' THEN 'approval' ELSE 'authorization' END,
				state = NULL, finished_at = now(), updated_at = now(), version = version + 1
			WHERE workspace_id = $1 AND connector_external_id = $2 AND connector_id IS NULL
				AND status IN ('awaiting_approval', 'awaiting_authorization')`,
			workspaceID, externalID)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("delete connector %q: %w", externalID, err)
	}
	return id, nil
}

// AnySealedSecrets returns the sealed secrets of one connector that has
// any, or nil if none has. Start-up uses it to check SECRET_KEY.
func (db *DB) AnySealedSecrets(ctx context.Context) (workspaceID, externalID string, sealed []byte, err error) {
	err = db.pool.QueryRow(ctx, `
		SELECT workspace_id, external_id, sealed_secrets FROM connectors
		WHERE sealed_secrets IS NOT NULL ORDER BY id LIMIT 1`).Scan(&workspaceID, &externalID, &sealed)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", "", nil, fmt.Errorf("look for sealed secrets: %w", err)
	}
	return workspaceID, externalID, sealed, nil
}

// ResealSecrets passes the sealed secrets of every connector that has any
// to fn and stores what fn returns, in one transaction that locks those
// rows, so a concurrent update waits. updated_at is left alone. If fn
// returns an error nothing is written and the error is returned as is.
// Returns how many connectors were resealed.
func (db *DB) ResealSecrets(ctx context.Context, fn func(workspaceID, externalID string, sealed []byte) ([]byte, error)) (int, error) {
	type sealedRow struct {
		ID                      int64
		WorkspaceID, ExternalID string
		Sealed                  []byte
	}
	var n int
	err := db.InTx(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `
			SELECT id, workspace_id, external_id, sealed_secrets FROM connectors
			WHERE sealed_secrets IS NOT NULL ORDER BY id FOR UPDATE`)
		if err != nil {
			return fmt.Errorf("reseal secrets: %w", err)
		}
		sealed, err := pgx.CollectRows(rows, pgx.RowToStructByPos[sealedRow])
		if err != nil {
			return fmt.Errorf("reseal secrets: %w", err)
		}
		for _, r := range sealed {
			resealed, err := fn(r.WorkspaceID, r.ExternalID, r.Sealed)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `UPDATE connectors SET sealed_secrets = $2 WHERE id = $1`, r.ID, resealed); err != nil {
				return fmt.Errorf("reseal secrets of connector %q: %w", r.ExternalID, err)
			}
		}
		n = len(sealed)
		return nil
	})
	return n, err
}

// querier is what both the pool and a transaction offer.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// connectorID resolves a workspace's connector id to its row id. Returns
// ErrConnectorNotFound if there is none.
func connectorID(ctx context.Context, q querier, workspaceID, externalID string) (int64, error) {
	var id int64
	err := q.QueryRow(ctx, `SELECT id FROM connectors WHERE workspace_id = $1 AND external_id = $2`,
		workspaceID, externalID).Scan(&id)
	return id, translate(err, ErrConnectorNotFound)
}

// ActiveConnectors returns every active connector, for the registry to
// connect at start-up.
func (db *DB) ActiveConnectors(ctx context.Context) ([]*Connector, error) {
	rows, err := db.pool.Query(ctx, `SELECT `+connectorColumns+` FROM connectors c WHERE c.active ORDER BY c.id`)
	if err != nil {
		return nil, fmt.Errorf("active connectors: %w", err)
	}
	cs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (*Connector, error) { return scanConnector(row) })
	if err != nil {
		return nil, fmt.Errorf("active connectors: %w", err)
	}
	return cs, nil
}

// SaveHealth records a connector's connection health. It leaves updated_at
// alone: health is not a configuration change. A deleted connector is not
// an error.
func (db *DB) SaveHealth(ctx context.Context, id int64, h Health) error {
	_, err := db.pool.Exec(ctx, `
		UPDATE connectors SET health_state = $2, last_error = $3, latency_ms = $4, checked_at = $5, protocol_version = $6
		WHERE id = $1`,
		id, h.State, h.LastError, h.Latency.Milliseconds(), h.CheckedAt, h.ProtocolVersion)
	if err != nil {
		return fmt.Errorf("save health of connector %d: %w", id, err)
	}
	return nil
}

// AddCounters adds d's counts to a connector's counters and moves
// last_used_at forward to d.LastUsedAt if that is later.
func (db *DB) AddCounters(ctx context.Context, id int64, d Counters) error {
	_, err := db.pool.Exec(ctx, `
		UPDATE connectors SET
			call_count = call_count + $2, error_count = error_count + $3,
			reconnect_count = reconnect_count + $4, reinitialize_count = reinitialize_count + $5,
			query_count = query_count + $6, query_error_count = query_error_count + $7,
			prompt_tokens = prompt_tokens + $8, completion_tokens = completion_tokens + $9,
			last_used_at = greatest(last_used_at, $10),
			input_count = input_count + $11, sampling_count = sampling_count + $12
		WHERE id = $1`,
		id, d.Calls, d.Errors, d.Reconnects, d.Reinitializations, d.Queries, d.QueryErrors,
		d.PromptTokens, d.CompletionTokens, d.LastUsedAt, d.Inputs, d.Samplings)
	if err != nil {
		return fmt.Errorf("add counters of connector %d: %w", id, err)
	}
	return nil
}
