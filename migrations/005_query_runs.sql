-- Approval of tool calls, and every query run kept.
--
-- tools.requires_approval becomes an override of the connector's approval
-- policy (config.approval_policy): NULL follows the policy, true always
-- asks, false never does. Before this migration nothing honoured the flag,
-- and false only meant "not flagged": it becomes NULL, so the policy
-- decides; true stays an explicit "always ask".
--
-- query_runs keeps one row per query run: what was asked, what ran, the
-- decisions people made, and, while a run waits for a decision, the
-- transcript the agent needs to go on (state). No secret goes in a row:
-- connector headers and env values never reach the agent.

ALTER TABLE tools ALTER COLUMN requires_approval DROP NOT NULL,
                  ALTER COLUMN requires_approval DROP DEFAULT;
UPDATE tools SET requires_approval = NULL WHERE NOT requires_approval;

CREATE TABLE query_runs (
    id                    text        PRIMARY KEY,
    workspace_id          text        NOT NULL,
    -- The connector's row; NULL once the connector is deleted (the run is
    -- kept for audit, with the connector's id as callers knew it).
    connector_id          bigint      REFERENCES connectors (id) ON DELETE SET NULL,
    connector_external_id text        NOT NULL,
    session_id            text        NOT NULL DEFAULT '',
    query                 text        NOT NULL,
    context               text        NOT NULL DEFAULT '',
    max_tools             integer     NOT NULL,
    status                text        NOT NULL CHECK (status IN
        ('completed', 'budget_exhausted', 'planned', 'awaiting_approval', 'running', 'expired', 'failed')),
    answer                text        NOT NULL DEFAULT '',
    error                 text        NOT NULL DEFAULT '',
    -- The run's trace: plan, steps with their calls and decisions, tools
    -- used and pending calls (JSON written by the service).
    trace                 jsonb       NOT NULL DEFAULT '{}',
    -- What the agent needs to resume a paused run; NULL otherwise.
    state                 jsonb,
    prompt_tokens         bigint      NOT NULL DEFAULT 0,
    completion_tokens     bigint      NOT NULL DEFAULT 0,
    duration_ms           bigint      NOT NULL DEFAULT 0,
    -- Bumped by every write; a resume claims the run at the version it read.
    version               integer     NOT NULL DEFAULT 1,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    expires_at            timestamptz,
    finished_at           timestamptz
);

CREATE INDEX query_runs_by_workspace ON query_runs (workspace_id, created_at DESC, id DESC);
CREATE INDEX query_runs_by_connector ON query_runs (workspace_id, connector_external_id, created_at DESC, id DESC);
CREATE INDEX query_runs_awaiting ON query_runs (expires_at) WHERE status = 'awaiting_approval';
CREATE INDEX query_runs_finished ON query_runs (finished_at) WHERE finished_at IS NOT NULL;

---- create above / drop below ----

DROP TABLE query_runs;
UPDATE tools SET requires_approval = false WHERE requires_approval IS NULL;
ALTER TABLE tools ALTER COLUMN requires_approval SET DEFAULT false,
                  ALTER COLUMN requires_approval SET NOT NULL;
