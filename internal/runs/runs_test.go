package runs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
	db, c := dbWithConnector(t)
	ctx := context.Background()
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

// TestFinishedRunReadableAtOnceEverywhere keeps a new finished run the way
// a query's end does: Keep returns without writing it, the keeping Log's
// GetRun reads it from memory at once, another replica's Log waits for its
// row (written by the keeping Log's Run), and an id the store does not
// have and that is not fresh is not found at once.
func TestFinishedRunReadableAtOnceEverywhere(t *testing.T) {
	db, c := dbWithConnector(t)
	ctx := context.Background()
	a := runs.NewLog(db, runs.Config{Replica: "a", FlushInterval: time.Hour})
	b := runs.NewLog(db, runs.Config{Replica: "b"})
	now := time.Now()
	rec := &store.Run{ID: runs.NewID(), WorkspaceID: "ws", ConnectorID: c.ID, ConnectorExternalID: "c", Query: "q", MaxTools: 1,
		Status: store.RunCompleted, Answer: "done", CreatedAt: now, FinishedAt: &now}
	if err := a.Keep(ctx, rec, false); err != nil {
		t.Fatal(err)
	}
	if _, err := db.GetRun(ctx, "ws", rec.ID); !errors.Is(err, store.ErrRunNotFound) {
		t.Fatalf("the row before a's Log ran: %v, want not written yet (Keep must not wait for the write)", err)
	}
	if got, err := a.GetRun(ctx, "ws", rec.ID); err != nil || got.Status != store.RunCompleted || got.Answer != "done" {
		t.Fatalf("a.GetRun before the write = %v, %v; want the finished run from memory", got, err)
	}

	// b waits for the row; a's Log writes it (at once: its flush interval
	// is an hour, so only the kick can write it).
	got := make(chan error, 1)
	go func() {
		r, err := b.GetRun(ctx, "ws", rec.ID)
		if err == nil && r.Answer != "done" {
			err = fmt.Errorf("answer %q", r.Answer)
		}
		got <- err
	}()
	time.Sleep(100 * time.Millisecond)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	defer func() { stop(); <-done }()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("b.GetRun of a run a just finished: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("b.GetRun did not return within 10s")
	}

	if _, err := a.GetRun(ctx, "other", rec.ID); !errors.Is(err, store.ErrRunNotFound) {
		t.Errorf("a.GetRun of another workspace's run: %v, want ErrRunNotFound", err)
	}

	// An id that is not fresh is not waited for.
	start := time.Now()
	if _, err := b.GetRun(ctx, "ws", "0190b9b0-0000-7000-8000-000000000000"); !errors.Is(err, store.ErrRunNotFound) {
		t.Errorf("b.GetRun of an old unknown id: %v, want ErrRunNotFound", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("b.GetRun of an old unknown id took %v: it waited for a run nobody is writing", d)
	}
}

// dbWithConnector is a fresh database with one connector, "c" of "ws".
func dbWithConnector(t *testing.T) (*store.DB, *store.Connector) {
	t.Helper()
	db := storetest.NewDB(t)
	c, err := db.CreateConnector(context.Background(), &store.Connector{WorkspaceID: "ws", ExternalID: "c", Name: "c",
		Transport: "streamable_http", Config: store.Config{URL: "http://127.0.0.1:1/mcp"}})
	if err != nil {
		t.Fatal(err)
	}
	return db, c
}
