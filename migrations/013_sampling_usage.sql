-- Sampling requests and tokens per connector per minute, over all
-- replicas: a connector's per-minute sampling limits hold across them.
--
-- A request takes one request and its capped maxTokens from the row of its
-- minute in one statement, only while both stay within the limits; when
-- the model has answered, the reservation is replaced by the tokens it
-- used (prompt and completion). Rows older than a day go when the
-- connector next samples, and all of them with the connector.

CREATE TABLE sampling_usage (
    connector_id bigint      NOT NULL REFERENCES connectors (id) ON DELETE CASCADE,
    minute       timestamptz NOT NULL,
    requests     integer     NOT NULL,
    tokens       bigint      NOT NULL,
    PRIMARY KEY (connector_id, minute)
);

---- create above / drop below ----

DROP TABLE sampling_usage;
