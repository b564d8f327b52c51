-- A resumed run is held by the replica that runs it: held_by names it, and
-- it touches heartbeat_at while the run goes on. A run whose heartbeat
-- stopped (its replica died) is failed by the leader's sweep, and never
-- runs twice: only the claim that set held_by runs it.

ALTER TABLE query_runs ADD COLUMN held_by      text,
                       ADD COLUMN heartbeat_at timestamptz;

CREATE INDEX query_runs_running ON query_runs (heartbeat_at) WHERE status = 'running';

---- create above / drop below ----

DROP INDEX query_runs_running;
ALTER TABLE query_runs DROP COLUMN heartbeat_at, DROP COLUMN held_by;
