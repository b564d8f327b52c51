-- A replica's death is seen as soon as Postgres sees its connections close
-- (kill -9, a crash), not only when its TTL runs out. Each replica's LISTEN
-- connection is named connector-svc-listener:<replica id> in
-- pg_stat_activity; listening_since is when that connection last started
-- listening (set over it). A live replica whose listener was seen since the
-- server started but is no longer connected has died: the others expire its
-- row at once (internal/cluster, Membership's watch). NULL: not known to
-- listen yet, and only the TTL tells.
ALTER TABLE replicas ADD COLUMN listening_since timestamptz;

---- create above / drop below ----

ALTER TABLE replicas DROP COLUMN listening_since;
