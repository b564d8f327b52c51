-- Tool embeddings, for the semantic ranking of a large catalog: one vector
-- per tool and embeddings model, for the text it was made of (its name,
-- description and parameters), known by that text's SHA-256. A tool whose
-- text changes gets a new vector; one that does not keeps its vector
-- across restarts, so an embedding is computed once per tool version.

CREATE TABLE tool_embeddings (
    connector_id bigint      NOT NULL REFERENCES connectors (id) ON DELETE CASCADE,
    tool_name    text        NOT NULL,
    model        text        NOT NULL,
    text_sha256  bytea       NOT NULL CHECK (length(text_sha256) = 32),
    embedding    real[]      NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (connector_id, model, tool_name)
);

---- create above / drop below ----

DROP TABLE tool_embeddings;
