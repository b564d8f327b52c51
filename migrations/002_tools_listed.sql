-- A tool the server stops listing keeps its row and operator flags, marked
-- not listed, so that it comes back as operators left it.

ALTER TABLE tools ADD COLUMN listed boolean NOT NULL DEFAULT true;

---- create above / drop below ----

DELETE FROM tools WHERE NOT listed;
ALTER TABLE tools DROP COLUMN listed;
