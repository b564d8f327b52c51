-- Several replicas on one database: who is alive, who leads, who owns which
-- connector (internal/cluster).
--
-- replicas is the membership: each replica upserts its row at start and
-- moves expires_at forward on every heartbeat; it is live while
-- expires_at > now(), by Postgres' clock only. It deletes its row when it
-- stops; the leader deletes rows long expired (their ownership cascades).
--
-- cluster_leader is a lease with terms, as riverqueue/river's river_leader:
-- one row per name, (leader_id, elected_at) is the term, and every renewal
-- and resignation names the exact term. UNLOGGED: after a crash of Postgres
-- it is empty, and the replicas elect again.
--
-- connector_owners says which replica does a connector's owned work (health
-- checks, catalog syncs, stdio processes). epoch comes from one sequence, so
-- it grows on every claim, even across a release and a new claim: the owner
-- writes with WHERE epoch = its own, and a former owner can never overwrite
-- the new one.

CREATE TABLE replicas (
    id            text        PRIMARY KEY,
    internal_addr text        NOT NULL,
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL
);

CREATE UNLOGGED TABLE cluster_leader (
    name       text        PRIMARY KEY DEFAULT 'default',
    leader_id  text        NOT NULL,
    elected_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);

CREATE SEQUENCE connector_owner_epochs;

CREATE TABLE connector_owners (
    connector_id bigint      PRIMARY KEY REFERENCES connectors (id) ON DELETE CASCADE,
    replica_id   text        NOT NULL REFERENCES replicas (id) ON DELETE CASCADE,
    epoch        bigint      NOT NULL,
    claimed_at   timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX connector_owners_replica_id ON connector_owners (replica_id);

---- create above / drop below ----

DROP TABLE connector_owners;
DROP SEQUENCE connector_owner_epochs;
DROP TABLE cluster_leader;
DROP TABLE replicas;
