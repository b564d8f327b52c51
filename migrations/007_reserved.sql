-- Reserved for the cluster branch's migration 007 (007_cluster.sql); tern
-- refuses a gap in the sequence, so the forward branch carries this empty
-- step to load 008. Delete this file when merging.
SELECT 1;

---- create above / drop below ----

SELECT 1;
