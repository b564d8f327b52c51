-- A query run of an oauth_user connector is run for one end user, kept in
-- user_id (a resume goes on as that user), and may pause until that user
-- has authorized the connector: awaiting_authorization, which expires
-- like a run awaiting approval.

ALTER TABLE query_runs ADD COLUMN user_id text NOT NULL DEFAULT '';

ALTER TABLE query_runs DROP CONSTRAINT query_runs_status_check;
ALTER TABLE query_runs ADD CONSTRAINT query_runs_status_check CHECK (status IN
    ('completed', 'budget_exhausted', 'planned', 'awaiting_approval', 'awaiting_authorization', 'running', 'expired',
     'failed'));

DROP INDEX query_runs_awaiting;
CREATE INDEX query_runs_awaiting ON query_runs (expires_at) WHERE status IN ('awaiting_approval', 'awaiting_authorization');

---- create above / drop below ----

DROP INDEX query_runs_awaiting;
CREATE INDEX query_runs_awaiting ON query_runs (expires_at) WHERE status = 'awaiting_approval';
UPDATE query_runs SET status = 'expired', state = NULL, finished_at = coalesce(finished_at, now())
    WHERE status = 'awaiting_authorization';
ALTER TABLE query_runs DROP CONSTRAINT query_runs_status_check;
ALTER TABLE query_runs ADD CONSTRAINT query_runs_status_check CHECK (status IN
    ('completed', 'budget_exhausted', 'planned', 'awaiting_approval', 'running', 'expired', 'failed'));
ALTER TABLE query_runs DROP COLUMN user_id;
