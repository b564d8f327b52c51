-- Reserved for the lead's migration 006 on main; tern refuses a gap in the
-- sequence, so the cluster branch carries this empty step to load 007.
-- Delete this file when merging (main's own 006 takes its place).
SELECT 1;

---- create above / drop below ----

SELECT 1;
