-- OAuth for connectors whose MCP servers need it (package oauth).
--
-- oauth_clients: the service's registration with an authorization server,
-- made once per issuer (and callback URL) by dynamic client registration
-- and used by every replica from then on. Two replicas registering at once
-- both insert with ON CONFLICT DO NOTHING and read back: one row wins.
--
-- oauth_pending: authorizations a user's browser is on its way through.
-- The key is the SHA-256 of the state parameter, never the state itself;
-- the PKCE verifier (and a pre-registered client's secret) are sealed.
-- A row is consumed once (used_at) and only before it expires.
--
-- oauth_tokens: one standing authorization per connector and user ('' for
-- a client credentials connector's own identity): the tokens, sealed under
-- SECRET_KEY bound to the row, what was granted and until when. A refresh
-- holds the row (SELECT ... FOR UPDATE) so replicas never spend one refresh
-- token twice.

CREATE TABLE oauth_clients (
    issuer                     text        NOT NULL,
    redirect_uri               text        NOT NULL,
    client_id                  text        NOT NULL,
    sealed_client_secret       bytea,
    token_endpoint_auth_method text        NOT NULL,
    kind                       text        NOT NULL CHECK (kind IN ('dcr', 'cimd')),
    created_at                 timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (issuer, redirect_uri)
);

CREATE TABLE oauth_pending (
    state_hash                 bytea       PRIMARY KEY,
    workspace_id               text        NOT NULL,
    connector_id               bigint      NOT NULL REFERENCES connectors (id) ON DELETE CASCADE,
    user_id                    text        NOT NULL,
    sealed_verifier            bytea       NOT NULL,
    issuer                     text        NOT NULL,
    client_id                  text        NOT NULL,
    sealed_client_secret       bytea,
    token_endpoint_auth_method text        NOT NULL,
    resource                   text        NOT NULL,
    scopes                     text[]      NOT NULL DEFAULT '{}',
    redirect_uri               text        NOT NULL,
    return_to                  text        NOT NULL DEFAULT '',
    created_at                 timestamptz NOT NULL DEFAULT now(),
    expires_at                 timestamptz NOT NULL,
    used_at                    timestamptz
);

CREATE INDEX oauth_pending_expires ON oauth_pending (expires_at);

CREATE TABLE oauth_tokens (
    connector_id         bigint      NOT NULL REFERENCES connectors (id) ON DELETE CASCADE,
    user_id              text        NOT NULL,
    workspace_id         text        NOT NULL,
    issuer               text        NOT NULL,
    resource             text        NOT NULL,
    -- The client the tokens were issued to: a refresh or revocation must
    -- authenticate as it.
    client_id            text        NOT NULL,
    sealed_access_token  bytea       NOT NULL,
    sealed_refresh_token bytea,
    token_type           text        NOT NULL DEFAULT 'Bearer',
    scopes               text[]      NOT NULL DEFAULT '{}',
    expires_at           timestamptz,
    needs_reauth         boolean     NOT NULL DEFAULT false,
    reauth_reason        text        NOT NULL DEFAULT '',
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (connector_id, user_id)
);

CREATE INDEX oauth_tokens_by_workspace ON oauth_tokens (workspace_id, connector_id, user_id);

---- create above / drop below ----

DROP TABLE oauth_tokens;
DROP TABLE oauth_pending;
DROP TABLE oauth_clients;
