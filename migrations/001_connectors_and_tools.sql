-- Connectors and their tool catalogs: one row per configured MCP server, its tools beside it.

CREATE TABLE connectors (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workspace_id    text        NOT NULL,
    external_id     text        NOT NULL,
    name            text        NOT NULL,
    description     text        NOT NULL DEFAULT '',
    transport       text        NOT NULL CHECK (transport IN ('stdio', 'sse', 'streamable_http')),
    -- Non-secret connection and behaviour settings (url, command, args,
    -- header and env key names, timeouts, session mode, model, rate limit).
    config          jsonb       NOT NULL DEFAULT '{}',
    -- Header or env values, AES-256-GCM sealed by the service; NULL when none.
    sealed_secrets  bytea,
    active          boolean     NOT NULL DEFAULT true,

    health_state     text        NOT NULL DEFAULT 'unknown',
    last_error       text        NOT NULL DEFAULT '',
    latency_ms       integer     NOT NULL DEFAULT 0,
    checked_at       timestamptz,
    protocol_version text        NOT NULL DEFAULT '',

    call_count         bigint NOT NULL DEFAULT 0,
    error_count        bigint NOT NULL DEFAULT 0,
    reconnect_count    bigint NOT NULL DEFAULT 0,
    reinitialize_count bigint NOT NULL DEFAULT 0,
    query_count        bigint NOT NULL DEFAULT 0,
    query_error_count  bigint NOT NULL DEFAULT 0,
    prompt_tokens      bigint NOT NULL DEFAULT 0,
    completion_tokens  bigint NOT NULL DEFAULT 0,
    last_used_at       timestamptz,

    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),

    UNIQUE (workspace_id, external_id)
);

CREATE INDEX connectors_active_idx ON connectors (id) WHERE active;

CREATE TABLE tools (
    connector_id      bigint      NOT NULL REFERENCES connectors (id) ON DELETE CASCADE,
    name              text        NOT NULL,
    description       text        NOT NULL DEFAULT '',
    input_schema      jsonb       NOT NULL DEFAULT '{}',
    -- MCP hints: title, readOnlyHint, destructiveHint, idempotentHint, openWorldHint.
    annotations       jsonb       NOT NULL DEFAULT '{}',
    enabled           boolean     NOT NULL DEFAULT true,
    requires_approval boolean     NOT NULL DEFAULT false,
    synced_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (connector_id, name)
);

---- create above / drop below ----

DROP TABLE tools;
DROP TABLE connectors;
