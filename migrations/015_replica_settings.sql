-- Each replica publishes a fingerprint of the settings that must match
-- across the replicas (cmd/connector-svc/fingerprint.go): setting name to a
-- keyed hash of its value, never the value. A replica that sees another's
-- differ warns, naming the settings.
ALTER TABLE replicas ADD COLUMN settings jsonb NOT NULL DEFAULT '{}';
