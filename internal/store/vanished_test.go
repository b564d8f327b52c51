package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

// TestExpireVanishedReplicas: a live replica whose listener connection
// closed is expired at once, with a member event, and another replica
// claims its connector with a newer epoch while its fence no longer holds;
// a replica whose listener is connected, one never known to listen, and
// the caller itself are left alone.
func TestExpireVanishedReplicas(t *testing.T) {
	ctx := context.Background()
	url := storetest.NewURL(t)
	db, err := store.Open(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	events := listenCluster(t, url)
	id := mustCreate(t, db, newConnector("acme", "c0")).ID

	// a and b listen (a before registering, b after), c never does.
	listen := func(replica string) *pgx.Conn {
		cfg, err := pgx.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.RuntimeParams["application_name"] = store.ListenerApplicationName + ":" + replica
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(context.Background()) })
		if _, err := conn.Exec(ctx, `UPDATE replicas SET listening_since = now() WHERE id = $1`, replica); err != nil {
			t.Fatal(err)
		}
		return conn
	}
	connA := listen("a")
	for _, r := range []string{"a", "b", "c"} {
		if err := db.RegisterReplica(ctx, r, r+":7000", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	listen("b")
	member := store.ClusterEvent{Kind: store.EventMember}
	expectEvents(t, events, member, member, member)
	epochA, err := db.ClaimConnectors(ctx, "a", []int64{id})
	if err != nil || len(epochA) != 1 {
		t.Fatalf("a claims its connector: %v, %v", epochA, err)
	}
	fenceA := store.Fence{Replica: "a", Epoch: epochA[id]}

	if gone, err := db.ExpireVanishedReplicas(ctx, "b"); err != nil || len(gone) != 0 {
		t.Fatalf("ExpireVanishedReplicas while all listen = %v, %v; want none", gone, err)
	}
	expectEvents(t, events)

	connA.Close(ctx) // as kill -9 does
	var gone []string
	deadline := time.Now().Add(5 * time.Second) // the backend's exit is asynchronous
	for len(gone) == 0 && err == nil && time.Now().Before(deadline) {
		gone, err = db.ExpireVanishedReplicas(ctx, "b")
		time.Sleep(10 * time.Millisecond)
	}
	if diff := cmp.Diff([]string{"a"}, gone); err != nil || diff != "" {
		t.Fatalf("ExpireVanishedReplicas after a's listener closed (-want +got), err %v:\n%s", err, diff)
	}
	expectEvents(t, events, member)
	live, err := db.LiveReplicas(ctx)
	if diff := cmp.Diff([]string{"b", "c"}, replicaIDs(live)); err != nil || diff != "" {
		t.Errorf("live replicas after a vanished (-want +got), err %v:\n%s", err, diff)
	}
	epochB, err := db.ClaimConnectors(ctx, "b", []int64{id})
	if err != nil || epochB[id] <= fenceA.Epoch {
		t.Errorf("b claims a's connector = %v, %v; want an epoch above %d", epochB, err, fenceA.Epoch)
	}
	if err := db.SaveHealthFenced(ctx, id, fenceA, store.Health{State: "error"}); !errors.Is(err, store.ErrNotOwner) {
		t.Errorf("a's fenced write after it vanished = %v, want ErrNotOwner", err)
	}
	// a's heartbeat, if it still ran, would tell it it was lost.
	if alive, _, err := db.HeartbeatReplica(ctx, "a", time.Minute); err != nil || alive {
		t.Errorf("a's heartbeat after it vanished: alive %v, %v; want false", alive, err)
	}
	if gone, err := db.ExpireVanishedReplicas(ctx, "c"); err != nil || len(gone) != 0 {
		t.Errorf("ExpireVanishedReplicas again = %v, %v; want none", gone, err)
	}
}
