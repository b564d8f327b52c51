package runs_test

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/runs"
	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

func TestMain(m *testing.M) { os.Exit(storetest.Main(m)) }

// A resumed run is failed by the sweep only once its holder stops
// touching it: held, it stays running however long it runs; released
// (its replica died), it fails within the stale time.
func TestHeldRunsStayRunningAbandonedOnesFail(t *testing.T) {
	db := storetest.NewDB(t)
	ctx := context.Background()
	c, err := db.CreateConnector(ctx, &store.Connector{WorkspaceID: "ws", ExternalID: "c", Name: "c", Transport: "streamable_http",
		Config: store.Config{URL: "http://127.0.0.1:1/mcp"}})
	if err != nil {
		t.Fatal(err)
	}
	exp := time.Now().Add(time.Hour)
	for _, id := range []string{"held", "abandoned"} {
		if err := db.SaveRuns(ctx, []*store.Run{{ID: id, WorkspaceID: "ws", ConnectorID: c.ID, ConnectorExternalID: "c",
			Query: "q", MaxTools: 1, Status: store.RunAwaitingApproval, State: json.RawMessage(`{}`), CreatedAt: time.Now(),
			ExpiresAt: &exp}}); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ClaimRun(ctx, "ws", id, 1, json.RawMessage(`{}`), "replica-a"); err != nil {
			t.Fatal(err)
		}
	}
	log := runs.NewLog(db, runs.Config{Replica: "replica-a", HeartbeatInterval: 50 * time.Millisecond})
	release := log.Hold("held")
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 2)
	go func() { done <- log.Run(runCtx) }()
	sweeper := runs.NewSweeper(db, 50*time.Millisecond, time.Hour, 500*time.Millisecond, nil)
	go func() { done <- sweeper.Run(runCtx) }()
	defer func() { stop(); <-done; <-done }()

	status := func(id string) string {
		r, err := db.GetRun(ctx, "ws", id)
		if err != nil {
			t.Fatal(err)
		}
		return r.Status
	}
	deadline := time.Now().Add(10 * time.Second)
	for status("abandoned") != store.RunFailed {
		if time.Now().After(deadline) {
			t.Fatal("the abandoned run never failed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(time.Second) // two stale times
	if got := status("held"); got != store.RunRunning {
		t.Fatalf("the held run is %s after twice the stale time; want running", got)
	}
	release()
	for status("held") != store.RunFailed {
		if time.Now().After(deadline) {
			t.Fatal("the released run never failed")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
