package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

// clusterSetup is a fresh database, a store on it, a plain connection for
// the test's own SQL (moving expiries into the past), and the cluster
// notifications it hears.
type clusterSetup struct {
	db     *store.DB
	sql    *pgx.Conn
	events <-chan store.ClusterEvent
}

func newClusterSetup(t *testing.T) clusterSetup {
	t.Helper()
	url := storetest.NewURL(t)
	db, err := store.Open(context.Background(), url, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return clusterSetup{db: db, sql: conn, events: listenCluster(t, url)}
}

// listenCluster LISTENs on the cluster channel until t ends and passes on
// every event.
func listenCluster(t *testing.T, url string) <-chan store.ClusterEvent {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+store.ClusterChannel); err != nil {
		t.Fatal(err)
	}
	events := make(chan store.ClusterEvent, 100)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				return
			}
			var ev store.ClusterEvent
			if err := json.Unmarshal([]byte(n.Payload), &ev); err != nil {
				ev.Kind = "unparsable: " + n.Payload
			}
			events <- ev
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		conn.Close(context.Background())
	})
	return events
}

// expectEvents checks that exactly want arrive, in order, and nothing more
// within a short while after them.
func expectEvents(t *testing.T, events <-chan store.ClusterEvent, want ...store.ClusterEvent) {
	t.Helper()
	var got []store.ClusterEvent
	for range want {
		select {
		case ev := <-events:
			got = append(got, ev)
		case <-time.After(5 * time.Second):
		}
	}
	// Notifications are delivered at commit, before the statement returns:
	// a stray one would be here by now, give or take the listener's loop.
	select {
	case ev := <-events:
		got = append(got, ev)
	case <-time.After(200 * time.Millisecond):
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("cluster events (-want +got):\n%s", diff)
	}
}

func (s clusterSetup) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := s.sql.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func replicaIDs(rs []store.Replica) []string {
	ids := make([]string, len(rs))
	for i, r := range rs {
		ids[i] = r.ID
	}
	return ids
}

// TestReplicaSettings: the settings fingerprint a replica stores comes
// back from heartbeats and LiveReplicas; a replica that stored none (an
// earlier build) has none, {} in its row; storing for a replica gone is no
// error.
func TestReplicaSettings(t *testing.T) {
	ctx := context.Background()
	s := newClusterSetup(t)
	for _, id := range []string{"a", "b"} {
		if err := s.db.RegisterReplica(ctx, id, id+":7000", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	fp := map[string]string{"LLM_MODEL": "836ab8ff29d3", "LLM_API_KEY": "set"}
	if err := s.db.SetReplicaSettings(ctx, "a", fp); err != nil {
		t.Fatal(err)
	}
	if err := s.db.SetReplicaSettings(ctx, "gone", fp); err != nil {
		t.Errorf("SetReplicaSettings of a replica gone: %v", err)
	}
	_, beat, err := s.db.HeartbeatReplica(ctx, "b", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	live, err := s.db.LiveReplicas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for name, rows := range map[string][]store.Replica{"heartbeat": beat, "LiveReplicas": live} {
		if len(rows) != 2 || !maps.Equal(rows[0].Settings, fp) || len(rows[1].Settings) != 0 {
			t.Errorf("%s: %+v; want a's fingerprint and none for b", name, rows)
		}
	}
	var empty string
	if err := s.sql.QueryRow(ctx, `SELECT settings::text FROM replicas WHERE id = 'b'`).Scan(&empty); err != nil || empty != "{}" {
		t.Errorf("b's row's settings = %q, %v; want {}", empty, err)
	}
}

func TestReplicaMembership(t *testing.T) {
	ctx := context.Background()
	s := newClusterSetup(t)
	member := store.ClusterEvent{Kind: store.EventMember}
	for _, id := range []string{"b", "a"} {
		if err := s.db.RegisterReplica(ctx, id, id+":7000", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	expectEvents(t, s.events, member, member)

	alive, live, err := s.db.HeartbeatReplica(ctx, "a", time.Minute)
	if err != nil || !alive {
		t.Fatalf("HeartbeatReplica(a) = %v, %v; want alive", alive, err)
	}
	if diff := cmp.Diff([]string{"a", "b"}, replicaIDs(live)); diff != "" {
		t.Errorf("live after a's heartbeat (-want +got):\n%s", diff)
	}
	if live[0].InternalAddr != "a:7000" || !live[0].ExpiresAt.After(time.Now().Add(50*time.Second)) {
		t.Errorf("a after its heartbeat = %+v, want addr a:7000 and expiry a minute ahead", live[0])
	}

	s.exec(t, `UPDATE replicas SET expires_at = now() - interval '10 seconds' WHERE id = 'b'`)
	if _, live, err = s.db.HeartbeatReplica(ctx, "a", time.Minute); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"a"}, replicaIDs(live)); diff != "" {
		t.Errorf("live once b expired (-want +got):\n%s", diff)
	}
	// b's own heartbeat finds its row expired and does not revive it.
	if alive, _, err := s.db.HeartbeatReplica(ctx, "b", time.Minute); err != nil || alive {
		t.Errorf("HeartbeatReplica(expired b) = %v, %v; want not alive", alive, err)
	}
	if alive, _, err := s.db.HeartbeatReplica(ctx, "nobody", time.Minute); err != nil || alive {
		t.Errorf("HeartbeatReplica(unknown) = %v, %v; want not alive", alive, err)
	}
	expectEvents(t, s.events) // heartbeats never notify

	if n, err := s.db.ExpireDeadReplicas(ctx, time.Hour); err != nil || n != 0 {
		t.Errorf("ExpireDeadReplicas(grace 1h) = %d, %v; want 0 (b expired 10 s ago)", n, err)
	}
	if n, err := s.db.ExpireDeadReplicas(ctx, time.Second); err != nil || n != 1 {
		t.Errorf("ExpireDeadReplicas(grace 1s) = %d, %v; want 1", n, err)
	}

	if err := s.db.LeaveReplica(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := s.db.LeaveReplica(ctx, "a"); err != nil { // gone already: no error, no event
		t.Fatal(err)
	}
	expectEvents(t, s.events, member)
	if live, err := s.db.LiveReplicas(ctx); err != nil || len(live) != 0 {
		t.Errorf("LiveReplicas after a left = %v, %v; want none", replicaIDs(live), err)
	}
}

// TestLeaderTerms checks the lease: one leader at a time, renewals scoped to
// the exact live term, so that neither a non-leader (river #197) nor a
// leader whose term was replaced can extend a lease, and resignation of the
// current term only.
func TestLeaderTerms(t *testing.T) {
	ctx := context.Background()
	s := newClusterSetup(t)
	termA, ok, err := s.db.ElectLeader(ctx, "a", time.Minute)
	if err != nil || !ok {
		t.Fatalf("ElectLeader(a) on an empty lease = %v, %v; want elected", ok, err)
	}
	before, err := s.db.CurrentLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.db.ElectLeader(ctx, "b", time.Hour); err != nil || ok {
		t.Errorf("ElectLeader(b) while a leads = %v, %v; want not elected", ok, err)
	}
	// b, not the leader, renews with a's term or its own id: nothing moves.
	for _, id := range []string{"b", "a"} {
		term := termA
		if id == "a" {
			term = termA.Add(time.Microsecond) // a term that never was
		}
		if ok, err := s.db.RenewLeader(ctx, id, term, time.Hour); err != nil || ok {
			t.Errorf("RenewLeader(%s, term %v) = %v, %v; want refused", id, term, ok, err)
		}
	}
	if after, _ := s.db.CurrentLeader(ctx); after != before {
		t.Errorf("lease after refused elections and renewals = %+v, want unchanged %+v", after, before)
	}
	if ok, err := s.db.RenewLeader(ctx, "a", termA, time.Hour); err != nil || !ok {
		t.Errorf("RenewLeader(a, its term) = %v, %v; want renewed", ok, err)
	}

	// a's lease lapses; b is elected; a's old term can neither renew nor resign.
	s.exec(t, `UPDATE cluster_leader SET expires_at = now() - interval '1 second'`)
	if ok, err := s.db.RenewLeader(ctx, "a", termA, time.Hour); err != nil || ok {
		t.Errorf("RenewLeader(a) after its lease lapsed = %v, %v; want refused", ok, err)
	}
	termB, ok, err := s.db.ElectLeader(ctx, "b", time.Minute)
	if err != nil || !ok {
		t.Fatalf("ElectLeader(b) after a's lease lapsed = %v, %v; want elected", ok, err)
	}
	leaseB, _ := s.db.CurrentLeader(ctx)
	if ok, err := s.db.RenewLeader(ctx, "a", termA, time.Hour); err != nil || ok {
		t.Errorf("RenewLeader(a, stale term) under b's term = %v, %v; want refused", ok, err)
	}
	if err := s.db.ResignLeader(ctx, "a", termA); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.db.CurrentLeader(ctx); got != leaseB || got.ID != "b" || !got.ElectedAt.Equal(termB) {
		t.Errorf("lease after a's stale renew and resign = %+v, want b's untouched %+v", got, leaseB)
	}
	expectEvents(t, s.events) // nothing resigned yet

	if err := s.db.ResignLeader(ctx, "b", termB); err != nil {
		t.Fatal(err)
	}
	expectEvents(t, s.events, store.ClusterEvent{Kind: store.EventLeader})
	if _, err := s.db.CurrentLeader(ctx); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("CurrentLeader after b resigned: %v, want ErrNotFound", err)
	}
	// The same replica elected again gets a new term; its old one is dead.
	termA2, ok, err := s.db.ElectLeader(ctx, "a", time.Minute)
	if err != nil || !ok || termA2.Equal(termA) {
		t.Fatalf("ElectLeader(a) again = %v, %v, %v; want a new term", termA2, ok, err)
	}
	if ok, _ := s.db.RenewLeader(ctx, "a", termA, time.Hour); ok {
		t.Error("a renewed its first term inside its second")
	}
}

// TestConnectorOwnership checks claims, epochs, releases and fencing.
func TestConnectorOwnership(t *testing.T) {
	ctx := context.Background()
	s := newClusterSetup(t)
	var ids []int64
	for i := range 3 {
		ids = append(ids, mustCreate(t, s.db, newConnector("acme", fmt.Sprint("c", i))).ID)
	}
	for _, r := range []string{"a", "b"} {
		if err := s.db.RegisterReplica(ctx, r, r+":7000", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	expectEvents(t, s.events, store.ClusterEvent{Kind: store.EventMember}, store.ClusterEvent{Kind: store.EventMember})

	epochsA, err := s.db.ClaimConnectors(ctx, "a", append(ids, 999999)) // 999999 does not exist
	if err != nil || len(epochsA) != 3 {
		t.Fatalf("a claims 3 free connectors: %v, %v", epochsA, err)
	}
	if got, err := s.db.ClaimConnectors(ctx, "b", ids); err != nil || len(got) != 0 {
		t.Errorf("b claims connectors live a holds = %v, %v; want none", got, err)
	}
	owned, err := s.db.ConnectorsOwnedBy(ctx, "a")
	if diff := cmp.Diff(epochsA, owned); err != nil || diff != "" {
		t.Errorf("ConnectorsOwnedBy(a) (-claimed +owned), err %v:\n%s", err, diff)
	}
	owner, fenceA0, err := s.db.ConnectorOwner(ctx, ids[0])
	if err != nil || owner.ID != "a" || owner.InternalAddr != "a:7000" || fenceA0.Epoch != epochsA[ids[0]] {
		t.Errorf("ConnectorOwner(%d) = %+v, %+v, %v; want a at a:7000 with epoch %d", ids[0], owner, fenceA0, err, epochsA[ids[0]])
	}

	// Releasing one connector names it; b then claims it with a newer epoch.
	released, err := s.db.ReleaseConnectors(ctx, "a", []int64{ids[1], 999999})
	if diff := cmp.Diff([]int64{ids[1]}, released); err != nil || diff != "" {
		t.Errorf("ReleaseConnectors (-want +got), err %v:\n%s", err, diff)
	}
	expectEvents(t, s.events, store.ClusterEvent{Kind: store.EventOwner, ConnectorID: ids[1]})
	epochsB, err := s.db.ClaimConnectors(ctx, "b", ids)
	if err != nil || len(epochsB) != 1 || epochsB[ids[1]] <= epochsA[ids[1]] {
		t.Errorf("b claims after a released %d = %v, %v; want only it, epoch above %d", ids[1], epochsB, err, epochsA[ids[1]])
	}

	// a's lease lapses: b takes over the rest, and a's fence no longer holds.
	s.exec(t, `UPDATE replicas SET expires_at = now() - interval '1 second' WHERE id = 'a'`)
	if got, err := s.db.ClaimConnectors(ctx, "a", ids); err != nil || len(got) != 0 {
		t.Errorf("expired a claims = %v, %v; want nothing", got, err)
	}
	if _, _, err := s.db.ConnectorOwner(ctx, ids[0]); !errors.Is(err, store.ErrOwnerNotFound) {
		t.Errorf("ConnectorOwner of an expired replica's connector: %v, want ErrOwnerNotFound", err)
	}
	took, err := s.db.ClaimConnectors(ctx, "b", []int64{ids[0], ids[2]})
	if err != nil || len(took) != 2 || took[ids[0]] <= epochsA[ids[0]] {
		t.Fatalf("b takes over from expired a = %v, %v", took, err)
	}
	h := store.Health{State: "ready", Latency: 7 * time.Millisecond}
	fenceA := store.Fence{Replica: "a", Epoch: epochsA[ids[0]]}
	if err := s.db.SaveHealthFenced(ctx, ids[0], fenceA, store.Health{State: "error"}); !errors.Is(err, store.ErrNotOwner) {
		t.Errorf("SaveHealthFenced by the former owner: %v, want ErrNotOwner", err)
	}
	fenceB := store.Fence{Replica: "b", Epoch: took[ids[0]]}
	if err := s.db.SaveHealthFenced(ctx, ids[0], fenceB, h); err != nil {
		t.Errorf("SaveHealthFenced by the owner: %v", err)
	}
	if got, _ := s.db.GetConnector(ctx, "acme", "c0"); got.Health.State != "ready" || got.Health.Latency != h.Latency {
		t.Errorf("health after the fenced writes = %+v, want the owner's %+v", got.Health, h)
	}
	err = s.db.InTx(ctx, func(tx pgx.Tx) error { return s.db.CheckFence(ctx, tx, ids[0], fenceA) })
	if !errors.Is(err, store.ErrNotOwner) {
		t.Errorf("CheckFence(former owner): %v, want ErrNotOwner", err)
	}
	err = s.db.InTx(ctx, func(tx pgx.Tx) error { return s.db.CheckFence(ctx, tx, ids[0], fenceB) })
	if err != nil {
		t.Errorf("CheckFence(owner): %v", err)
	}
	expectEvents(t, s.events) // claims and takeovers do not notify

	// Releasing everything is one statement and one event without an id.
	all, err := s.db.ReleaseAllConnectors(ctx, "b")
	if diff := cmp.Diff(ids, all); err != nil || diff != "" {
		t.Errorf("ReleaseAllConnectors (-want +got), err %v:\n%s", err, diff)
	}
	expectEvents(t, s.events, store.ClusterEvent{Kind: store.EventOwner})
	if none, err := s.db.ReleaseAllConnectors(ctx, "b"); err != nil || len(none) != 0 {
		t.Errorf("ReleaseAllConnectors with nothing owned = %v, %v", none, err)
	}
	expectEvents(t, s.events)
	if err := s.db.SaveHealthFenced(ctx, ids[0], fenceB, h); !errors.Is(err, store.ErrNotOwner) {
		t.Errorf("SaveHealthFenced after release: %v, want ErrNotOwner", err)
	}
}

// TestCheckFenceHoldsOffClaims checks that a claim waits for a transaction
// that checked the fence, so the owner's write commits before the row
// changes hands.
func TestCheckFenceHoldsOffClaims(t *testing.T) {
	ctx := context.Background()
	s := newClusterSetup(t)
	id := mustCreate(t, s.db, newConnector("acme", "c")).ID
	for _, r := range []string{"a", "b"} {
		if err := s.db.RegisterReplica(ctx, r, r, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	epochs, err := s.db.ClaimConnectors(ctx, "a", []int64{id})
	if err != nil || len(epochs) != 1 {
		t.Fatalf("claim: %v, %v", epochs, err)
	}
	s.exec(t, `UPDATE replicas SET expires_at = now() - interval '1 second' WHERE id = 'a'`)
	claimed := make(chan map[int64]int64, 1)
	err = s.db.InTx(ctx, func(tx pgx.Tx) error {
		if err := s.db.CheckFence(ctx, tx, id, store.Fence{Replica: "a", Epoch: epochs[id]}); err != nil {
			return err
		}
		go func() {
			got, err := s.db.ClaimConnectors(ctx, "b", []int64{id})
			if err != nil {
				t.Error(err)
			}
			claimed <- got
		}()
		// The claim must be waiting on the fence's lock, not done.
		if err := waitForALockWait(ctx, tx, "the claim"); err != nil {
			return err
		}
		select {
		case got := <-claimed:
			return fmt.Errorf("the claim finished while the fence was held: %v", got)
		default:
		}
		_, err := tx.Exec(ctx, `UPDATE connectors SET last_error = 'written under the fence' WHERE id = $1`, id)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := <-claimed; len(got) != 1 || got[id] <= epochs[id] {
		t.Errorf("b's claim after the fenced transaction = %v, want epoch above %d", got, epochs[id])
	}
}

// TestConcurrentClaimsHaveOneWinner races replicas to take over the
// connectors of a dead one: each connector ends with exactly one owner, and
// the claims' results agree with the rows.
func TestConcurrentClaimsHaveOneWinner(t *testing.T) {
	ctx := context.Background()
	s := newClusterSetup(t)
	var ids []int64
	for i := range 50 {
		ids = append(ids, mustCreate(t, s.db, newConnector("acme", fmt.Sprint("c", i))).ID)
	}
	replicas := []string{"dead", "r1", "r2", "r3", "r4"}
	for _, r := range replicas {
		if err := s.db.RegisterReplica(ctx, r, r, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := s.db.ClaimConnectors(ctx, "dead", ids); err != nil || len(got) != len(ids) {
		t.Fatalf("claim: %d, %v", len(got), err)
	}
	s.exec(t, `UPDATE replicas SET expires_at = now() - interval '1 second' WHERE id = 'dead'`)
	var mu sync.Mutex
	winners := make(map[int64][]string)
	var wg sync.WaitGroup
	for _, r := range replicas[1:] {
		wg.Go(func() {
			got, err := s.db.ClaimConnectors(ctx, r, ids)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			defer mu.Unlock()
			for id := range got {
				winners[id] = append(winners[id], r)
			}
		})
	}
	wg.Wait()
	for _, id := range ids {
		if len(winners[id]) != 1 {
			t.Errorf("connector %d claimed by %v, want exactly one replica", id, winners[id])
			continue
		}
		if owner, _, err := s.db.ConnectorOwner(ctx, id); err != nil || owner.ID != winners[id][0] {
			t.Errorf("owner of %d = %q, %v; the claim said %q", id, owner.ID, err, winners[id][0])
		}
	}
}

// TestDeleteWaitsForAFencedWrite deletes a connector while its owner's
// fenced write (a catalog sync, a health save) holds the fence and has not
// yet written the connector's row. Both lock the ownership row before the
// connector's, so the delete waits and then succeeds; taken the other way
// round the two deadlock and Postgres aborts one (what made DeleteConnector
// answer INTERNAL now and then).
func TestDeleteWaitsForAFencedWrite(t *testing.T) {
	ctx := context.Background()
	s := newClusterSetup(t)
	id := mustCreate(t, s.db, newConnector("acme", "c")).ID
	if err := s.db.RegisterReplica(ctx, "a", "a", time.Minute); err != nil {
		t.Fatal(err)
	}
	epochs, err := s.db.ClaimConnectors(ctx, "a", []int64{id})
	if err != nil || len(epochs) != 1 {
		t.Fatalf("claim: %v, %v", epochs, err)
	}
	deleted := make(chan error, 1)
	err = s.db.InTx(ctx, func(tx pgx.Tx) error {
		if err := s.db.CheckFence(ctx, tx, id, store.Fence{Replica: "a", Epoch: epochs[id]}); err != nil {
			return err
		}
		go func() {
			_, err := s.db.DeleteConnector(ctx, "acme", "c")
			deleted <- err
		}()
		if err := waitForALockWait(ctx, tx, "the delete"); err != nil {
			return err
		}
		// The owner's write, as SyncTools makes it.
		_, err := tx.Exec(ctx, `SELECT config FROM connectors WHERE id = $1 FOR UPDATE`, id)
		return err
	})
	if err != nil {
		t.Fatalf("the fenced write: %v", err)
	}
	if err := <-deleted; err != nil {
		t.Fatalf("DeleteConnector after the fenced write: %v", err)
	}
	if _, err := s.db.GetConnector(ctx, "acme", "c"); !errors.Is(err, store.ErrConnectorNotFound) {
		t.Errorf("GetConnector after delete: %v, want ErrConnectorNotFound", err)
	}
}

// waitForALockWait returns once some transaction waits for a lock (what,
// started by the caller, waiting for the lock tx holds), or an error after
// 10 s.
func waitForALockWait(ctx context.Context, tx pgx.Tx, what string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted)`).Scan(&waiting); err != nil {
			return err
		}
		if waiting {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s never waited for the fence's lock", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
