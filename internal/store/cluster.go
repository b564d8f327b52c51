package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ClusterChannel is the NOTIFY channel of membership, leadership and
// ownership events. Payloads are ClusterEvent JSON, a few dozen bytes; they
// are sent when a replica joins or leaves, releases connectors or resigns as
// leader, never on heartbeats or renewals.
const ClusterChannel = "cluster"

// Kinds of ClusterEvent.
const (
	EventMember = "member"
	EventOwner  = "owner"
	EventLeader = "leader"
)

// ClusterEvent is the payload of a notification on ClusterChannel.
// ConnectorID is set on an owner event about one connector, 0 when several
// connectors changed hands at once.
type ClusterEvent struct {
	Kind        string `json:"kind"`
	ConnectorID int64  `json:"connector_id,omitempty"`
}

var (
	// ErrNotOwner means a write was fenced off: the connector's ownership row
	// does not name this replica with this epoch any more (another replica
	// claimed it, it was released, or the connector was deleted).
	ErrNotOwner = errors.New("not the connector's owner")
	// ErrOwnerNotFound is ErrNotFound for a connector no live replica owns.
	ErrOwnerNotFound = fmt.Errorf("connector owner %w", ErrNotFound)
)

// Replica is one row of the replicas table.
type Replica struct {
	ID           string
	InternalAddr string
	StartedAt    time.Time
	HeartbeatAt  time.Time
	ExpiresAt    time.Time
	// Settings is the replica's fingerprint of the settings that must
	// match across replicas: setting name to a keyed hash of its value
	// (SetReplicaSettings); empty for a replica that published none.
	Settings map[string]string
}

// Fence is an owner's claim on a connector: the replica and the epoch its
// claim returned. Writes that only the owner may do carry it.
type Fence struct {
	Replica string
	Epoch   int64
}

// notify is the SQL expression that sends ev on ClusterChannel. The payload
// is written into the statement as a literal: it is JSON of a constant kind
// and an integer, so it holds no quote.
func notify(ev ClusterEvent) string {
	b, _ := json.Marshal(ev) // a string and an integer: cannot fail
	return `pg_notify('` + ClusterChannel + `', '` + string(b) + `')`
}

// RegisterReplica inserts or refreshes replica id, live for ttl from now,
// and notifies a member event. If the replica's listener (Listener.Named)
// is connected already, its row says so (listening_since), so that its
// death is seen at once (ExpireVanishedReplicas); else the listener says so
// when it starts listening.
func (db *DB) RegisterReplica(ctx context.Context, id, internalAddr string, ttl time.Duration) error {
	_, err := db.pool.Exec(ctx, `
		WITH up AS (
			INSERT INTO replicas (id, internal_addr, started_at, heartbeat_at, expires_at, listening_since)
			VALUES ($1, $2, now(), now(), now() + $3::interval,
				(SELECT now() FROM pg_stat_activity WHERE application_name = $4 AND datname = current_database() LIMIT 1))
			ON CONFLICT (id) DO UPDATE SET internal_addr = EXCLUDED.internal_addr,
				started_at = now(), heartbeat_at = now(), expires_at = EXCLUDED.expires_at,
				listening_since = EXCLUDED.listening_since
			RETURNING id
		)
		SELECT `+notify(ClusterEvent{Kind: EventMember})+` FROM up`,
		id, internalAddr, ttl, listenerName(id))
	if err != nil {
		return fmt.Errorf("register replica %q: %w", id, err)
	}
	return nil
}

// HeartbeatReplica moves replica id's expiry to ttl from now, if its row is
// still there and live, and returns the live replicas in id order, in one
// statement and without a notification. alive is false when the row was
// gone or had expired (a long pause; the leader may have cleaned it): the
// replica must then give up what it owned and register again.
func (db *DB) HeartbeatReplica(ctx context.Context, id string, ttl time.Duration) (alive bool, live []Replica, err error) {
	rows, err := db.pool.Query(ctx, `
		WITH beat AS (
			UPDATE replicas SET heartbeat_at = now(), expires_at = now() + $2::interval
			WHERE id = $1 AND expires_at > now()
			RETURNING id, internal_addr, started_at, heartbeat_at, expires_at, settings
		)
		SELECT id, internal_addr, started_at, heartbeat_at, expires_at, settings, true FROM beat
		UNION ALL
		SELECT id, internal_addr, started_at, heartbeat_at, expires_at, settings, false FROM replicas
		WHERE expires_at > now() AND id <> $1
		ORDER BY id`,
		id, ttl)
	if err != nil {
		return false, nil, fmt.Errorf("heartbeat of replica %q: %w", id, err)
	}
	for rows.Next() {
		var r Replica
		var self bool
		if err := rows.Scan(&r.ID, &r.InternalAddr, &r.StartedAt, &r.HeartbeatAt, &r.ExpiresAt, &r.Settings, &self); err != nil {
			rows.Close()
			return false, nil, fmt.Errorf("heartbeat of replica %q: %w", id, err)
		}
		alive = alive || self
		live = append(live, r)
	}
	if err := rows.Err(); err != nil {
		return false, nil, fmt.Errorf("heartbeat of replica %q: %w", id, err)
	}
	return alive, live, nil
}

// ExpireVanishedReplicas ends at once the life of every live replica but
// self whose listener was connected since the database server started
// (listening_since) and is no longer: its process died (kill -9, a crash)
// or lost the database, and Postgres saw its connection close. Its row
// expires now (so its connectors are free to claim, and its heartbeat, if
// it still runs, tells it it was lost) and a member event is notified. Its
// leader lease, if it led, is left to run out: a leader trusts its lease by
// its own clock. It returns the ids expired, in order. A replica cut off
// by a partition keeps its connection open as far as Postgres knows: then
// only its TTL tells. The statement writes nothing while nobody vanished.
// Listeners are looked for in this database only: another deployment (or
// test) on the same Postgres server may name its replicas alike.
func (db *DB) ExpireVanishedReplicas(ctx context.Context, self string) ([]string, error) {
	rows, err := db.pool.Query(ctx, `
		WITH gone AS (
			UPDATE replicas r SET expires_at = now()
			WHERE r.expires_at > now() AND r.id <> $1
				AND r.listening_since > pg_postmaster_start_time()
				AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.application_name = $2 || r.id AND a.datname = current_database())
			RETURNING r.id
		), told AS (
			SELECT id, `+notify(ClusterEvent{Kind: EventMember})+` FROM gone
		)
		SELECT id FROM told ORDER BY id`,
		self, ListenerApplicationName+":")
	if err != nil {
		return nil, fmt.Errorf("expire vanished replicas: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("expire vanished replicas: %w", err)
	}
	return ids, nil
}

// listenerName is the application_name of replica id's listener.
func listenerName(id string) string { return ListenerApplicationName + ":" + id }

// LiveReplicas returns the replicas whose expiry is still ahead, in id
// order.
func (db *DB) LiveReplicas(ctx context.Context) ([]Replica, error) {
	rows, err := db.pool.Query(ctx, `
		SELECT id, internal_addr, started_at, heartbeat_at, expires_at, settings FROM replicas
		WHERE expires_at > now() ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("live replicas: %w", err)
	}
	rs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Replica, error) {
		var r Replica
		err := row.Scan(&r.ID, &r.InternalAddr, &r.StartedAt, &r.HeartbeatAt, &r.ExpiresAt, &r.Settings)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("live replicas: %w", err)
	}
	return rs, nil
}

// SetReplicaSettings stores replica id's settings fingerprint (setting
// name to a keyed hash; never a value). A replica gone is not an error.
func (db *DB) SetReplicaSettings(ctx context.Context, id string, settings map[string]string) error {
	if settings == nil {
		settings = map[string]string{}
	}
	if _, err := db.pool.Exec(ctx, `UPDATE replicas SET settings = $2 WHERE id = $1`, id, settings); err != nil {
		return fmt.Errorf("settings of replica %q: %w", id, err)
	}
	return nil
}

// LeaveReplica deletes replica id (its connector ownership goes with it) and
// notifies a member event. A replica already gone is not an error.
func (db *DB) LeaveReplica(ctx context.Context, id string) error {
	_, err := db.pool.Exec(ctx, `
		WITH gone AS (DELETE FROM replicas WHERE id = $1 RETURNING id)
		SELECT `+notify(ClusterEvent{Kind: EventMember})+` FROM gone`, id)
	if err != nil {
		return fmt.Errorf("leave replica %q: %w", id, err)
	}
	return nil
}

// ExpireDeadReplicas deletes the replicas whose expiry passed more than
// grace ago, and with them their connector ownership, fails the runs they
// held (as GetRun reads them), and returns how many it deleted. It is the leader's housekeeping; a replica expired for less
// than grace keeps its row, so a short pause is not a re-registration.
// Others took over its connectors already once it stopped being live.
func (db *DB) ExpireDeadReplicas(ctx context.Context, grace time.Duration) (int64, error) {
	var n int64
	err := db.pool.QueryRow(ctx, `
		WITH gone AS (
			DELETE FROM replicas WHERE expires_at < now() - $1::interval RETURNING id
		), lost AS (
			UPDATE query_runs SET `+failHeldRun+`
			WHERE held_by IN (SELECT id FROM gone) AND status IN ('running', 'awaiting_input')
				AND (expires_at IS NULL OR expires_at > now())
			RETURNING id
		)
		SELECT count(*) FROM gone`, grace).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("expire dead replicas: %w", err)
	}
	return n, nil
}

// Leader is the current term of the cluster's leader lease.
type Leader struct {
	ID        string
	ElectedAt time.Time
	ExpiresAt time.Time
}

// ElectLeader makes id the leader for ttl if nobody holds the lease or its
// holder let it expire, and returns the new term (its elected_at). ok is
// false while another term is live; that term is left exactly as it was.
func (db *DB) ElectLeader(ctx context.Context, id string, ttl time.Duration) (term time.Time, ok bool, err error) {
	err = db.pool.QueryRow(ctx, `
		INSERT INTO cluster_leader AS l (leader_id, elected_at, expires_at)
		VALUES ($1, now(), now() + $2::interval)
		ON CONFLICT (name) DO UPDATE SET leader_id = EXCLUDED.leader_id,
			elected_at = EXCLUDED.elected_at, expires_at = EXCLUDED.expires_at
		WHERE l.expires_at < now()
		RETURNING elected_at`,
		id, ttl).Scan(&term)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, fmt.Errorf("elect leader %q: %w", id, err)
	}
	return term, true, nil
}

// RenewLeader moves the expiry of id's term to ttl from now. It renews only
// that exact term, still live: false means the lease expired or a newer term
// (of anyone, id included) replaced it, and the caller is not the leader.
// A replica that is not the leader can never extend anyone's lease.
func (db *DB) RenewLeader(ctx context.Context, id string, term time.Time, ttl time.Duration) (bool, error) {
	tag, err := db.pool.Exec(ctx, `
		UPDATE cluster_leader SET expires_at = now() + $3::interval
		WHERE name = 'default' AND leader_id = $1 AND elected_at = $2 AND expires_at >= now()`,
		id, term, ttl)
	if err != nil {
		return false, fmt.Errorf("renew leader %q: %w", id, err)
	}
	return tag.RowsAffected() == 1, nil
}

// ResignLeader ends id's term, if it is still the current one, and notifies
// a leader event so that followers elect at once.
func (db *DB) ResignLeader(ctx context.Context, id string, term time.Time) error {
	_, err := db.pool.Exec(ctx, `
		WITH gone AS (
			DELETE FROM cluster_leader WHERE name = 'default' AND leader_id = $1 AND elected_at = $2
			RETURNING leader_id
		)
		SELECT `+notify(ClusterEvent{Kind: EventLeader})+` FROM gone`,
		id, term)
	if err != nil {
		return fmt.Errorf("resign leader %q: %w", id, err)
	}
	return nil
}

// CurrentLeader returns the leader's term, live or expired. Returns
// ErrNotFound if nobody was elected (or the last leader resigned).
func (db *DB) CurrentLeader(ctx context.Context) (Leader, error) {
	var l Leader
	err := db.pool.QueryRow(ctx, `
		SELECT leader_id, elected_at, expires_at FROM cluster_leader WHERE name = 'default'`).
		Scan(&l.ID, &l.ElectedAt, &l.ExpiresAt)
	if err != nil {
		return Leader{}, fmt.Errorf("current leader: %w", translate(err, ErrNotFound))
	}
	return l, nil
}

// ClaimConnectors makes replica the owner of those of ids that exist and
// that nobody live holds, or that replica holds already, and returns the
// epoch of each connector it now owns. Every claim draws a new epoch, so a
// claim also ends replica's own earlier tenure (and the writes still
// fenced with it). Nothing is claimed while replica itself is not live. The
// ids that are missing from the result are held by another live replica or
// do not exist.
func (db *DB) ClaimConnectors(ctx context.Context, replica string, ids []int64) (map[int64]int64, error) {
	if len(ids) == 0 {
		return map[int64]int64{}, nil
	}
	rows, err := db.pool.Query(ctx, `
		INSERT INTO connector_owners AS o (connector_id, replica_id, epoch, claimed_at)
		SELECT c.id, $1, nextval('connector_owner_epochs'), now()
		FROM connectors c
		WHERE c.id = ANY($2::bigint[])
		  AND EXISTS (SELECT 1 FROM replicas r WHERE r.id = $1 AND r.expires_at > now())
		ORDER BY c.id
		ON CONFLICT (connector_id) DO UPDATE SET replica_id = EXCLUDED.replica_id,
			epoch = EXCLUDED.epoch, claimed_at = EXCLUDED.claimed_at
		WHERE o.replica_id = EXCLUDED.replica_id
		   OR NOT EXISTS (SELECT 1 FROM replicas r WHERE r.id = o.replica_id AND r.expires_at > now())
		RETURNING connector_id, epoch`,
		replica, ids)
	if err != nil {
		return nil, fmt.Errorf("claim %d connectors for replica %q: %w", len(ids), replica, err)
	}
	return collectEpochs(rows, "claim connectors")
}

// ConnectorsOwnedBy returns the connectors replica holds and their epochs.
func (db *DB) ConnectorsOwnedBy(ctx context.Context, replica string) (map[int64]int64, error) {
	rows, err := db.pool.Query(ctx, `
		SELECT connector_id, epoch FROM connector_owners WHERE replica_id = $1`, replica)
	if err != nil {
		return nil, fmt.Errorf("connectors owned by replica %q: %w", replica, err)
	}
	return collectEpochs(rows, "connectors owned by replica "+replica)
}

func collectEpochs(rows pgx.Rows, op string) (map[int64]int64, error) {
	epochs := make(map[int64]int64)
	var id, epoch int64
	_, err := pgx.ForEachRow(rows, []any{&id, &epoch}, func() error {
		epochs[id] = epoch
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return epochs, nil
}

// ReleaseConnectors gives up replica's ownership of ids, in one statement
// with one owner event (naming the connector when there is one), and
// returns the ids it released. ids replica does not hold are skipped.
func (db *DB) ReleaseConnectors(ctx context.Context, replica string, ids []int64) ([]int64, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	return db.release(ctx, replica, `AND connector_id = ANY($2::bigint[])`, ids)
}

// ReleaseAllConnectors gives up everything replica owns, in one statement
// with one owner event, and returns the ids it released.
func (db *DB) ReleaseAllConnectors(ctx context.Context, replica string) ([]int64, error) {
	return db.release(ctx, replica, ``)
}

func (db *DB) release(ctx context.Context, replica, where string, args ...any) ([]int64, error) {
	// One event: the connector's id when one was released, none for several.
	rows, err := db.pool.Query(ctx, `
		WITH gone AS (
			DELETE FROM connector_owners WHERE replica_id = $1 `+where+`
			RETURNING connector_id
		), told AS (
			SELECT pg_notify('`+ClusterChannel+`', json_strip_nulls(json_build_object('kind', '`+EventOwner+`',
				'connector_id', CASE WHEN count(*) = 1 THEN min(connector_id) END))::text)
			FROM gone HAVING count(*) > 0
		)
		SELECT connector_id FROM gone, (SELECT count(*) FROM told) t ORDER BY connector_id`,
		append([]any{replica}, args...)...)
	if err != nil {
		return nil, fmt.Errorf("release connectors of replica %q: %w", replica, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("release connectors of replica %q: %w", replica, err)
	}
	return ids, nil
}

// ConnectorOwner returns the live replica that owns connector id, with its
// epoch. Returns ErrOwnerNotFound if nobody owns it or its owner is not
// live.
func (db *DB) ConnectorOwner(ctx context.Context, id int64) (Replica, Fence, error) {
	var r Replica
	var f Fence
	err := db.pool.QueryRow(ctx, `
		SELECT r.id, r.internal_addr, r.started_at, r.heartbeat_at, r.expires_at, o.epoch
		FROM connector_owners o JOIN replicas r ON r.id = o.replica_id
		WHERE o.connector_id = $1 AND r.expires_at > now()`, id).
		Scan(&r.ID, &r.InternalAddr, &r.StartedAt, &r.HeartbeatAt, &r.ExpiresAt, &f.Epoch)
	if err != nil {
		return Replica{}, Fence{}, fmt.Errorf("owner of connector %d: %w", id, translate(err, ErrOwnerNotFound))
	}
	f.Replica = r.ID
	return r, f, nil
}

// CheckFence returns nil if f still owns connector id, and holds a share
// lock on the ownership row until q ends, so no claim can change hands
// before the caller's transaction commits. Returns ErrNotOwner otherwise.
func (db *DB) CheckFence(ctx context.Context, q pgx.Tx, id int64, f Fence) error {
	var one int
	err := q.QueryRow(ctx, `
		SELECT 1 FROM connector_owners WHERE connector_id = $1 AND replica_id = $2 AND epoch = $3
		FOR SHARE`, id, f.Replica, f.Epoch).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("connector %d, replica %q, epoch %d: %w", id, f.Replica, f.Epoch, ErrNotOwner)
	}
	if err != nil {
		return fmt.Errorf("check ownership of connector %d: %w", id, err)
	}
	return nil
}

// SaveHealthFenced is SaveHealth for the connector's owner: it writes only
// while f still owns connector id, in one statement. Returns ErrNotOwner
// otherwise, also when the connector was deleted (its ownership goes with
// it).
func (db *DB) SaveHealthFenced(ctx context.Context, id int64, f Fence, h Health) error {
	tag, err := db.pool.Exec(ctx, `
		WITH fence AS (
			SELECT 1 FROM connector_owners WHERE connector_id = $1 AND replica_id = $7 AND epoch = $8
			FOR SHARE
		)
		UPDATE connectors SET health_state = $2, last_error = $3, latency_ms = $4, checked_at = $5, protocol_version = $6
		WHERE id = $1 AND EXISTS (SELECT 1 FROM fence)`,
		id, h.State, h.LastError, h.Latency.Milliseconds(), h.CheckedAt, h.ProtocolVersion, f.Replica, f.Epoch)
	if err != nil {
		return fmt.Errorf("save health of connector %d: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("save health of connector %d, replica %q, epoch %d: %w", id, f.Replica, f.Epoch, ErrNotOwner)
	}
	return nil
}

// WorkspaceOwners maps the connectors of workspace (their ids as callers
// name them) to the live replica that owns each; a connector nobody live
// owns is missing.
func (db *DB) WorkspaceOwners(ctx context.Context, workspace string) (map[string]string, error) {
	rows, err := db.pool.Query(ctx, `
		SELECT c.external_id, o.replica_id
		FROM connectors c
		JOIN connector_owners o ON o.connector_id = c.id
		JOIN replicas r ON r.id = o.replica_id AND r.expires_at > now()
		WHERE c.workspace_id = $1`, workspace)
	if err != nil {
		return nil, fmt.Errorf("owners of workspace %q's connectors: %w", workspace, err)
	}
	owners := map[string]string{}
	var id, replica string
	if _, err := pgx.ForEachRow(rows, []any{&id, &replica}, func() error {
		owners[id] = replica
		return nil
	}); err != nil {
		return nil, fmt.Errorf("owners of workspace %q's connectors: %w", workspace, err)
	}
	return owners, nil
}
