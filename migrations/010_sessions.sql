-- Per-session connections across replicas. A caller's session (connector,
-- session id) has one owner replica, which holds its MCP connection; the
-- others forward its calls there. The owner records the MCP session it
-- opened (Mcp-Session-Id and protocol version, sealed under SECRET_KEY: the
-- id is a bearer capability), so that when it stops or dies another replica
-- can adopt a classic streamable-HTTP session with the server's state
-- intact. A replica leaving sets its sessions' owner to NULL: free to take.

CREATE TABLE sessions (
    connector_id  bigint      NOT NULL REFERENCES connectors (id) ON DELETE CASCADE,
    session_id    text        NOT NULL,
    workspace_id  text        NOT NULL,
    replica_id    text        REFERENCES replicas (id) ON DELETE SET NULL,
    sealed_handle bytea,
    opened_at     timestamptz NOT NULL DEFAULT now(),
    claimed_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (connector_id, session_id)
);

CREATE INDEX sessions_by_replica ON sessions (replica_id);
CREATE INDEX sessions_by_workspace ON sessions (workspace_id, session_id);

---- create above / drop below ----

DROP TABLE sessions;
