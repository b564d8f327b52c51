-- API keys: who may call. A key is a random token shown once at creation;
-- only its SHA-256 is stored. Each key belongs to one workspace and has
-- scopes: admin (connector, tool and key lifecycle) and query (calls,
-- queries, sessions). Keys are revoked, never deleted, so that a workspace's
-- history of keys stays readable and "a key exists" never turns false.

CREATE TABLE api_keys (
    -- Public id: also the part of the token after "csk_" and before the
    -- next "_", so that a leaked token names the key to revoke.
    id            text        PRIMARY KEY,
    workspace_id  text        NOT NULL,
    token_sha256  bytea       NOT NULL UNIQUE CHECK (length(token_sha256) = 32),
    -- The token's last 4 characters, shown in listings.
    token_hint    text        NOT NULL,
    scopes        text[]      NOT NULL CHECK (cardinality(scopes) > 0 AND scopes <@ ARRAY['admin', 'query']),
    name          text        NOT NULL DEFAULT '',
    created_at    timestamptz NOT NULL DEFAULT now(),
    revoked_at    timestamptz
);

CREATE INDEX api_keys_workspace_idx ON api_keys (workspace_id, id);

-- Every change to a key (created, revoked, or deleted by hand) is announced
-- on the channel api_keys with the key's id, when its transaction commits:
-- each running service drops what it cached about the key at once, whoever
-- made the change (the keys CLI, another replica, psql).
CREATE FUNCTION api_keys_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('api_keys', OLD.id);
    ELSE
        PERFORM pg_notify('api_keys', NEW.id);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER api_keys_notify AFTER INSERT OR UPDATE OR DELETE ON api_keys
    FOR EACH ROW EXECUTE FUNCTION api_keys_notify();

---- create above / drop below ----

DROP TABLE api_keys;
DROP FUNCTION api_keys_notify();
