-- Exact rate limits across replicas.
--
-- A connector's rate_limit is normally enforced by each replica on its
-- share (rate/M, burst/M for M live replicas), in memory. When a share
-- would round badly (under one call a second, or a burst under one), the
-- replicas take tokens from this one row per connector instead: one
-- UPDATE per call refills the bucket for the time since updated_at, caps
-- it at the burst and takes a token only when one is there. tokens goes
-- below zero only when a query's tool call runs in debt past its deadline.

CREATE TABLE rate_buckets (
    connector_id bigint           PRIMARY KEY REFERENCES connectors (id) ON DELETE CASCADE,
    tokens       double precision NOT NULL,
    updated_at   timestamptz      NOT NULL
);

---- create above / drop below ----

DROP TABLE rate_buckets;
