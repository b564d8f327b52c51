-- A query run may pause because an MCP server asked its user for input in
-- the middle of a tool call: awaiting_input. A durable pause (the call
-- ended, and is retried with the answers) expires like a run awaiting
-- approval; a live one (the call is still open on the replica that runs
-- it, held_by, whose heartbeat_at it touches) expires at the input's
-- deadline, and fails when its replica stops. Connectors count the inputs
-- their servers asked and the sampling requests their model answered.

ALTER TABLE query_runs DROP CONSTRAINT query_runs_status_check;
ALTER TABLE query_runs ADD CONSTRAINT query_runs_status_check CHECK (status IN
    ('completed', 'budget_exhausted', 'planned', 'awaiting_approval', 'awaiting_authorization', 'awaiting_input',
     'running', 'expired', 'failed'));

DROP INDEX query_runs_awaiting;
CREATE INDEX query_runs_awaiting ON query_runs (expires_at)
    WHERE status IN ('awaiting_approval', 'awaiting_authorization', 'awaiting_input');

DROP INDEX query_runs_running;
CREATE INDEX query_runs_running ON query_runs (heartbeat_at) WHERE status IN ('running', 'awaiting_input');

ALTER TABLE connectors ADD COLUMN input_count    bigint NOT NULL DEFAULT 0,
                       ADD COLUMN sampling_count bigint NOT NULL DEFAULT 0;

---- create above / drop below ----

ALTER TABLE connectors DROP COLUMN sampling_count, DROP COLUMN input_count;
DROP INDEX query_runs_running;
CREATE INDEX query_runs_running ON query_runs (heartbeat_at) WHERE status = 'running';
DROP INDEX query_runs_awaiting;
CREATE INDEX query_runs_awaiting ON query_runs (expires_at) WHERE status IN ('awaiting_approval', 'awaiting_authorization');
UPDATE query_runs SET status = 'expired', state = NULL, finished_at = coalesce(finished_at, now())
    WHERE status = 'awaiting_input';
ALTER TABLE query_runs DROP CONSTRAINT query_runs_status_check;
ALTER TABLE query_runs ADD CONSTRAINT query_runs_status_check CHECK (status IN
    ('completed', 'budget_exhausted', 'planned', 'awaiting_approval', 'awaiting_authorization', 'running', 'expired',
     'failed'));
