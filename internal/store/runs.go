package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

var (
	// ErrRunNotFound is ErrNotFound for a query run.
	ErrRunNotFound = fmt.Errorf("query run %w", ErrNotFound)
	// ErrRunNotPending means a run is not awaiting approval (any more): it
	// finished, expired, or another resume claimed it first.
	ErrRunNotPending = errors.New("the query run is not awaiting approval, authorization or input")
)

// Run statuses.
const (
	RunCompleted        = "completed"
	RunBudgetExhausted  = "budget_exhausted"
	RunPlanned          = "planned"
	RunAwaitingApproval = "awaiting_approval"
	// RunAwaitingAuthorization: the run's user must authorize the
	// connector (OAuth) before it goes on.
	RunAwaitingAuthorization = "awaiting_authorization"
	// RunAwaitingInput: an MCP server asked the run's user for input in
	// the middle of a tool call. Held by a replica (HeldBy), the pause is
	// live: the call is open there. Otherwise it is durable, and any
	// replica resumes it as an approval.
	RunAwaitingInput = "awaiting_input"
	RunRunning       = "running" // a resumed run, until it ends or pauses again
	RunExpired       = "expired"
	RunFailed        = "failed"
)

// Run is one query run: a row of query_runs.
type Run struct {
	ID          string
	WorkspaceID string
	// ConnectorID is the connector's row; 0 once the connector is deleted.
	ConnectorID         int64
	ConnectorExternalID string
	SessionID           string
	// UserID is the end user an oauth_user connector's run is for; empty
	// otherwise.
	UserID         string
	Query, Context string
	MaxTools       int
	Status         string
	Answer         string
	Error          string
	// Trace is the run's trace as the service writes it (JSON).
	Trace json.RawMessage
	// State is what the agent needs to resume a paused run (JSON); nil
	// for a run that does not wait.
	State                          json.RawMessage
	PromptTokens, CompletionTokens int64
	Duration                       time.Duration
	// Version counts the row's writes; a resume claims the version it read.
	Version    int
	CreatedAt  time.Time
	UpdatedAt  time.Time
	ExpiresAt  *time.Time // while awaiting approval, authorization or input
	FinishedAt *time.Time
	// HeldBy is the replica that runs the run, while it runs there: one
	// paused live for input is written so, with a heartbeat; empty
	// otherwise.
	HeldBy string
}

const runColumns = `id, workspace_id, coalesce(connector_id, 0), connector_external_id, session_id, user_id, query, context,
	max_tools, status, answer, error, trace, state, prompt_tokens, completion_tokens, duration_ms, version,
	created_at, updated_at, expires_at, finished_at, coalesce(held_by, '')`

// listColumns are runColumns without the resume state, which a listing
// does not show: it is not read at all.
var listColumns = strings.Replace(runColumns, " state,", " NULL::jsonb,", 1)

func scanRun(row pgx.Row) (*Run, error) {
	var r Run
	var ms int64
	err := row.Scan(&r.ID, &r.WorkspaceID, &r.ConnectorID, &r.ConnectorExternalID, &r.SessionID, &r.UserID, &r.Query, &r.Context,
		&r.MaxTools, &r.Status, &r.Answer, &r.Error, &r.Trace, &r.State, &r.PromptTokens, &r.CompletionTokens, &ms,
		&r.Version, &r.CreatedAt, &r.UpdatedAt, &r.ExpiresAt, &r.FinishedAt, &r.HeldBy)
	r.Duration = time.Duration(ms) * time.Millisecond
	return &r, err
}

// SaveRuns writes runs, each as it is now: a new run is inserted, a known
// one replaced (its version goes up). A run whose connector is gone keeps
// only the connector's external id.
func (db *DB) SaveRuns(ctx context.Context, runs []*Run) error {
	return db.saveRuns(ctx, runs, false)
}

// SaveRunsAsyncCommit is SaveRuns with an asynchronous commit
// (synchronous_commit off): it returns without waiting for the write-ahead
// log to reach the disk, which costs a query a disk flush, yet the rows
// are visible to every reader once it returns. Only a crash of Postgres
// itself within a fraction of a second could lose them.
func (db *DB) SaveRunsAsyncCommit(ctx context.Context, runs []*Run) error {
	return db.saveRuns(ctx, runs, true)
}

func (db *DB) saveRuns(ctx context.Context, runs []*Run, asyncCommit bool) error {
	batch := &pgx.Batch{}
	if asyncCommit {
		// One round trip. If a statement fails, the transaction stays open
		// and aborted: the pool destroys a connection released so.
		batch.Queue(`BEGIN`)
		batch.Queue(`SET LOCAL synchronous_commit = off`)
	}
	for _, r := range runs {
		trace := r.Trace
		if len(trace) == 0 {
			trace = json.RawMessage(`{}`)
		}
		batch.Queue(`
			INSERT INTO query_runs (id, workspace_id, connector_id, connector_external_id, session_id, query, context,
				max_tools, status, answer, error, trace, state, prompt_tokens, completion_tokens, duration_ms,
				created_at, expires_at, finished_at, user_id, held_by, heartbeat_at)
			VALUES ($1, $2, (SELECT id FROM connectors WHERE id = $3), $4, $5, $6, $7, $8, $9, $10, $11, $12, $13,
				$14, $15, $16, $17, $18, $19, $20, nullif($21, ''), CASE WHEN $21 = '' THEN NULL ELSE now() END)
			ON CONFLICT (id) DO UPDATE SET
				status = excluded.status, answer = excluded.answer, error = excluded.error, trace = excluded.trace,
				state = excluded.state, prompt_tokens = excluded.prompt_tokens,
				completion_tokens = excluded.completion_tokens, duration_ms = excluded.duration_ms,
				expires_at = excluded.expires_at, finished_at = excluded.finished_at,
				held_by = coalesce(excluded.held_by, CASE WHEN excluded.status = 'running' THEN query_runs.held_by END),
				heartbeat_at = coalesce(excluded.heartbeat_at, CASE WHEN excluded.status = 'running' THEN query_runs.heartbeat_at END),
				version = query_runs.version + 1, updated_at = now()
			WHERE query_runs.finished_at IS NULL OR excluded.finished_at IS NOT NULL`,
			r.ID, r.WorkspaceID, r.ConnectorID, r.ConnectorExternalID, r.SessionID, r.Query, r.Context,
			r.MaxTools, r.Status, r.Answer, r.Error, trace, nullJSON(r.State), r.PromptTokens, r.CompletionTokens,
			r.Duration.Milliseconds(), r.CreatedAt, r.ExpiresAt, r.FinishedAt, r.UserID, r.HeldBy)
	}
	if asyncCommit {
		batch.Queue(`COMMIT`)
	}
	if err := db.pool.SendBatch(ctx, batch).Close(); err != nil {
		return fmt.Errorf("save %d query runs: %w", len(runs), err)
	}
	return nil
}

func nullJSON(b json.RawMessage) any {
	if len(b) == 0 {
		return nil
	}
	return b
}

// GetRun returns a workspace's run. Returns ErrRunNotFound.
//
// A run held by a replica (resumed and running there, or paused live for
// input in its memory) whose holder's row has expired (it died, and the
// others saw its connections close, or its TTL passed: internal/cluster) is
// failed as it is read, as the leader's sweep would fail it once its
// heartbeat is missed: its caller learns within seconds that it is lost.
// A holder that stopped fails its runs itself, and the leader fails those
// of the expired replicas it deletes (ExpireDeadReplicas).
func (db *DB) GetRun(ctx context.Context, workspaceID, id string) (*Run, error) {
	r, err := scanRun(db.pool.QueryRow(ctx, `
		WITH lost AS (
			UPDATE query_runs SET `+failHeldRun+`
			WHERE workspace_id = $1 AND id = $2 AND status IN ('running', 'awaiting_input') AND held_by IS NOT NULL
				AND (expires_at IS NULL OR expires_at > now())
				AND EXISTS (SELECT 1 FROM replicas WHERE replicas.id = query_runs.held_by AND replicas.expires_at <= now())
			RETURNING `+runColumns+`
		)
		SELECT * FROM lost
		UNION ALL
		SELECT `+runColumns+` FROM query_runs WHERE workspace_id = $1 AND id = $2 AND NOT EXISTS (SELECT 1 FROM lost)`,
		workspaceID, id))
	if err != nil {
		return nil, fmt.Errorf("get query run %q: %w", id, translate(err, ErrRunNotFound))
	}
	return r, nil
}

// failHeldRun is the SET clause that fails a run whose holding replica is
// gone (GetRun, ExpireDeadReplicas), as the sweep does (ExpireRuns).
const failHeldRun = `status = 'failed',
	error = CASE WHEN status = 'running' THEN 'the replica running the resumed run stopped during it'
		ELSE 'the replica holding the tool call that waited for input stopped during it' END,
	state = NULL, finished_at = now(), updated_at = now(), version = version + 1`

// ClaimRun marks a paused run running for the one resume that read it at
// version, with trace, the run's trace with the decisions made, if it is
// still awaiting approval, authorization or (durably: no replica holds
// it) input at that version and has not expired. Returns
// ErrRunNotPending otherwise: a concurrent resume claimed it first, or it
// finished or expired meanwhile.
// The claim records replica as the run's holder, with a first heartbeat.
func (db *DB) ClaimRun(ctx context.Context, workspaceID, id string, version int, trace json.RawMessage, replica string) (*Run, error) {
	r, err := scanRun(db.pool.QueryRow(ctx, `
		UPDATE query_runs SET status = 'running', trace = $4, version = version + 1, updated_at = now(),
			held_by = $5, heartbeat_at = now()
		WHERE workspace_id = $1 AND id = $2 AND version = $3
			AND (status IN ('awaiting_approval', 'awaiting_authorization') OR status = 'awaiting_input' AND held_by IS NULL)
			AND expires_at > now()
		RETURNING `+runColumns, workspaceID, id, version, trace, replica))
	if err != nil {
		return nil, fmt.Errorf("claim query run %q: %w", id, translate(err, ErrRunNotPending))
	}
	return r, nil
}

// RunFilter selects the runs ListRuns returns.
type RunFilter struct {
	WorkspaceID         string
	ConnectorExternalID string    // "" for every connector
	Status              string    // "" for every status
	Since, Until        time.Time // created in [Since, Until); zero means unbounded
	Before              string    // list after this run id in the order (the page token)
	Limit               int
}

// ListRuns returns a workspace's runs, newest first (run ids sort by
// creation time), without their resume state. A paused run past its
// expiry counts as expired, whether or not ExpireRuns has marked it yet.
func (db *DB) ListRuns(ctx context.Context, f RunFilter) ([]*Run, error) {
	q := `SELECT ` + listColumns + ` FROM query_runs WHERE workspace_id = $1
		AND ($2 = '' OR connector_external_id = $2)
		AND ($3 = '' OR CASE WHEN status IN ('awaiting_approval', 'awaiting_authorization', 'awaiting_input') AND expires_at <= now()
			THEN 'expired' ELSE status END = $3)
		AND ($4::timestamptz IS NULL OR created_at >= $4)
		AND ($5::timestamptz IS NULL OR created_at < $5)
		AND ($6 = '' OR id < $6)
		ORDER BY id DESC LIMIT $7`
	rows, err := db.pool.Query(ctx, q, f.WorkspaceID, f.ConnectorExternalID, f.Status, timeOrNil(f.Since),
		timeOrNil(f.Until), f.Before, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("list query runs: %w", err)
	}
	runs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (*Run, error) { return scanRun(row) })
	if err != nil {
		return nil, fmt.Errorf("list query runs: %w", err)
	}
	return runs, nil
}

func timeOrNil(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}

// ExpireRuns ends the paused runs whose time to be approved (or
// authorized, or answered) ran out: they
// become expired, and their resume state is dropped. A resumed run, or
// one paused live for input, whose holder's heartbeat is older than
// staleAfter was left by a replica that stopped during it: it fails.
// Returns how many runs ended.
func (db *DB) ExpireRuns(ctx context.Context, staleAfter time.Duration) (int64, error) {
	tag, err := db.pool.Exec(ctx, `
		UPDATE query_runs SET
			status = CASE WHEN status = 'running' THEN 'failed'
				WHEN status = 'awaiting_input' AND held_by IS NOT NULL AND expires_at > now() THEN 'failed'
				ELSE 'expired' END,
			error = CASE WHEN status = 'running' THEN 'the replica running the resumed run stopped during it'
				WHEN status = 'awaiting_input' AND held_by IS NOT NULL AND expires_at > now()
				THEN 'the replica holding the tool call that waited for input stopped during it'
				ELSE error END,
			state = NULL, finished_at = now(), updated_at = now(), version = version + 1
		WHERE status IN ('awaiting_approval', 'awaiting_authorization', 'awaiting_input') AND expires_at <= now()
			OR status IN ('running', 'awaiting_input') AND held_by IS NOT NULL
				AND coalesce(heartbeat_at, updated_at) < now() - $1::interval
			OR status = 'running' AND coalesce(heartbeat_at, updated_at) < now() - $1::interval`, staleAfter)
	if err != nil {
		return 0, fmt.Errorf("expire query runs: %w", err)
	}
	return tag.RowsAffected(), nil
}

// TouchRuns records a heartbeat of the running runs ids that replica
// holds (those paused live for input included). Returns how many it
// touched.
func (db *DB) TouchRuns(ctx context.Context, replica string, ids []string) (int64, error) {
	tag, err := db.pool.Exec(ctx, `UPDATE query_runs SET heartbeat_at = now()
		WHERE id = ANY($2) AND held_by = $1 AND status IN ('running', 'awaiting_input')`, replica, ids)
	if err != nil {
		return 0, fmt.Errorf("touch query runs: %w", err)
	}
	return tag.RowsAffected(), nil
}

// PurgeRuns deletes the runs that finished before t. Returns how many.
func (db *DB) PurgeRuns(ctx context.Context, t time.Time) (int64, error) {
	tag, err := db.pool.Exec(ctx, `DELETE FROM query_runs WHERE finished_at < $1`, t)
	if err != nil {
		return 0, fmt.Errorf("purge query runs: %w", err)
	}
	return tag.RowsAffected(), nil
}
