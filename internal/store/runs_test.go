package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

func TestRunsLifecycle(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewDB(t)
	c := mustCreate(t, db, newConnector("ws1", "a"))
	exp := time.Now().Add(time.Hour)
	paused := &store.Run{ID: "r2", WorkspaceID: "ws1", ConnectorID: c.ID, ConnectorExternalID: "a", Query: "pay", MaxTools: 3,
		Status: store.RunAwaitingApproval, State: json.RawMessage(`{"Turn":0}`), Trace: json.RawMessage(`{"x":1}`),
		CreatedAt: time.Now(), ExpiresAt: &exp, PromptTokens: 100}
	now := time.Now()
	done := &store.Run{ID: "r1", WorkspaceID: "ws1", ConnectorID: c.ID, ConnectorExternalID: "a", Query: "q", MaxTools: 3,
		Status: store.RunCompleted, Answer: "yes", CreatedAt: now.Add(-time.Minute), FinishedAt: &now}
	if err := db.SaveRuns(ctx, []*store.Run{done, paused}); err != nil {
		t.Fatal(err)
	}
	got, err := db.GetRun(ctx, "ws1", "r2")
	if err != nil || got.Status != store.RunAwaitingApproval || string(got.State) != `{"Turn": 0}` || got.Version != 1 || got.PromptTokens != 100 {
		t.Fatalf("GetRun = %+v, %v", got, err)
	}
	if _, err := db.GetRun(ctx, "ws2", "r2"); !errors.Is(err, store.ErrRunNotFound) {
		t.Errorf("GetRun from another workspace: %v, want ErrRunNotFound", err)
	}

	// One claim per version: a second with the same version loses.
	if _, err := db.ClaimRun(ctx, "ws1", "r2", 1, json.RawMessage(`{"decided":true}`), "a"); err != nil {
		t.Fatalf("ClaimRun: %v", err)
	}
	if _, err := db.ClaimRun(ctx, "ws1", "r2", 1, json.RawMessage(`{"decided":true}`), "a"); !errors.Is(err, store.ErrRunNotPending) {
		t.Errorf("second ClaimRun: %v, want ErrRunNotPending", err)
	}
	if _, err := db.ClaimRun(ctx, "ws1", "r1", 1, json.RawMessage(`{}`), "a"); !errors.Is(err, store.ErrRunNotPending) {
		t.Errorf("ClaimRun of a finished run: %v, want ErrRunNotPending", err)
	}

	runs, err := db.ListRuns(ctx, store.RunFilter{WorkspaceID: "ws1", Limit: 10})
	if err != nil || len(runs) != 2 || runs[0].ID != "r2" || runs[0].State != nil || runs[0].Status != store.RunRunning ||
		string(runs[0].Trace) != `{"decided": true}` {
		t.Errorf("ListRuns = %+v, %v; want r2 (running, its trace the claim's, no state) then r1", runs, err)
	}
	runs, _ = db.ListRuns(ctx, store.RunFilter{WorkspaceID: "ws1", Status: store.RunCompleted, Limit: 10})
	if len(runs) != 1 || runs[0].ID != "r1" {
		t.Errorf("ListRuns(completed) = %+v", runs)
	}
	runs, _ = db.ListRuns(ctx, store.RunFilter{WorkspaceID: "ws1", Before: "r2", Limit: 10})
	if len(runs) != 1 || runs[0].ID != "r1" {
		t.Errorf("ListRuns(before r2) = %+v", runs)
	}

	// A running run left behind fails; a paused one past its time expires.
	past := time.Now().Add(-time.Second)
	late := &store.Run{ID: "r3", WorkspaceID: "ws1", ConnectorID: c.ID, ConnectorExternalID: "a", Query: "late", MaxTools: 1,
		Status: store.RunAwaitingApproval, State: json.RawMessage(`{}`), CreatedAt: time.Now(), ExpiresAt: &past}
	if err := db.SaveRuns(ctx, []*store.Run{late}); err != nil {
		t.Fatal(err)
	}
	// Claimed in an earlier transaction, r2 has been running longer than 0.
	if n, err := db.ExpireRuns(ctx, 0); err != nil || n != 2 {
		t.Errorf("ExpireRuns = %d, %v; want 2 (r2 stale, r3 expired)", n, err)
	}
	if r, _ := db.GetRun(ctx, "ws1", "r3"); r.Status != store.RunExpired || r.State != nil || r.FinishedAt == nil {
		t.Errorf("r3 = %+v; want expired, its state dropped", r)
	}
	if r, _ := db.GetRun(ctx, "ws1", "r2"); r.Status != store.RunFailed || r.Error == "" {
		t.Errorf("r2 = %+v; want failed with a reason", r)
	}

	// Deleting the connector keeps its runs, by external id.
	if _, err := db.DeleteConnector(ctx, "ws1", "a"); err != nil {
		t.Fatal(err)
	}
	if r, err := db.GetRun(ctx, "ws1", "r1"); err != nil || r.ConnectorID != 0 || r.ConnectorExternalID != "a" {
		t.Errorf("r1 after the connector's deletion = %+v, %v", r, err)
	}
	if n, err := db.PurgeRuns(ctx, time.Now().Add(time.Second)); err != nil || n != 3 {
		t.Errorf("PurgeRuns = %d, %v; want 3", n, err)
	}
}

// TestSaveRunsAsyncCommit: rows saved with an asynchronous commit are
// readable at once, and saved again as any other.
func TestSaveRunsAsyncCommit(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewDB(t)
	c := mustCreate(t, db, newConnector("ws1", "a"))
	now := time.Now()
	run := &store.Run{ID: "r1", WorkspaceID: "ws1", ConnectorID: c.ID, ConnectorExternalID: "a", Query: "q", MaxTools: 1,
		Status: store.RunCompleted, Answer: "yes", CreatedAt: now, FinishedAt: &now}
	if err := db.SaveRunsAsyncCommit(ctx, []*store.Run{run}); err != nil {
		t.Fatal(err)
	}
	if got, err := db.GetRun(ctx, "ws1", "r1"); err != nil || got.Answer != "yes" || got.Version != 1 {
		t.Fatalf("GetRun after SaveRunsAsyncCommit = %+v, %v", got, err)
	}
	run.Answer = "no"
	if err := db.SaveRunsAsyncCommit(ctx, []*store.Run{run}); err != nil {
		t.Fatal(err)
	}
	if got, err := db.GetRun(ctx, "ws1", "r1"); err != nil || got.Answer != "no" || got.Version != 2 {
		t.Fatalf("GetRun after a second save = %+v, %v", got, err)
	}
}

// TestFinishedRunStaysFinished: a run's row, once finished, is not taken
// back by a late write of the run going on (its replica wrote it running
// again after an answer, while the run itself ended and wrote its end).
func TestFinishedRunStaysFinished(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewDB(t)
	c := mustCreate(t, db, newConnector("ws1", "a"))
	now := time.Now()
	done := &store.Run{ID: "r1", WorkspaceID: "ws1", ConnectorID: c.ID, ConnectorExternalID: "a", Query: "q", MaxTools: 1,
		Status: store.RunCompleted, Answer: "yes", CreatedAt: now, FinishedAt: &now}
	if err := db.SaveRunsAsyncCommit(ctx, []*store.Run{done}); err != nil {
		t.Fatal(err)
	}
	late := *done
	late.Status, late.Answer, late.FinishedAt, late.HeldBy = store.RunRunning, "", nil, "replica-a"
	if err := db.SaveRuns(ctx, []*store.Run{&late}); err != nil {
		t.Fatal(err)
	}
	got, err := db.GetRun(ctx, "ws1", "r1")
	if err != nil || got.Status != store.RunCompleted || got.Answer != "yes" || got.FinishedAt == nil || got.Version != 1 {
		t.Fatalf("GetRun after a late running write = %+v, %v; want it completed, unchanged", got, err)
	}
}

// TestRunsAwaitingInput: a durable pause for input is claimed as an
// approval is; a live one, held by its replica, is not claimable, keeps
// its heartbeat while the replica touches it, and fails once it stops.
func TestRunsAwaitingInput(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewDB(t)
	c := mustCreate(t, db, newConnector("ws1", "a"))
	exp := time.Now().Add(time.Hour)
	durable := &store.Run{ID: "d1", WorkspaceID: "ws1", ConnectorID: c.ID, ConnectorExternalID: "a", Query: "q", MaxTools: 3,
		Status: store.RunAwaitingInput, State: json.RawMessage(`{}`), CreatedAt: time.Now(), ExpiresAt: &exp}
	live := &store.Run{ID: "l1", WorkspaceID: "ws1", ConnectorID: c.ID, ConnectorExternalID: "a", Query: "q", MaxTools: 3,
		Status: store.RunAwaitingInput, CreatedAt: time.Now(), ExpiresAt: &exp, HeldBy: "replica-a"}
	if err := db.SaveRuns(ctx, []*store.Run{durable, live}); err != nil {
		t.Fatal(err)
	}
	if err := db.RegisterReplica(ctx, "replica-a", "a:7000", time.Hour); err != nil {
		t.Fatal(err)
	}
	if r, err := db.GetRun(ctx, "ws1", "l1"); err != nil || r.HeldBy != "replica-a" || r.Status != store.RunAwaitingInput {
		t.Fatalf("live run = %+v, %v", r, err)
	}
	if _, err := db.ClaimRun(ctx, "ws1", "l1", 1, json.RawMessage(`{}`), "replica-b"); !errors.Is(err, store.ErrRunNotPending) {
		t.Errorf("ClaimRun of a live pause: %v, want ErrRunNotPending", err)
	}
	if _, err := db.ClaimRun(ctx, "ws1", "d1", 1, json.RawMessage(`{}`), "replica-b"); err != nil {
		t.Errorf("ClaimRun of a durable pause: %v", err)
	}
	runs, err := db.ListRuns(ctx, store.RunFilter{WorkspaceID: "ws1", Status: store.RunAwaitingInput, Limit: 10})
	if err != nil || len(runs) != 1 || runs[0].ID != "l1" {
		t.Errorf("ListRuns(awaiting_input) = %+v, %v", runs, err)
	}
	if n, err := db.TouchRuns(ctx, "replica-a", []string{"l1"}); err != nil || n != 1 {
		t.Errorf("TouchRuns = %d, %v; want the live pause touched", n, err)
	}
	if n, err := db.ExpireRuns(ctx, time.Hour); err != nil || n != 0 {
		t.Errorf("ExpireRuns with fresh heartbeats = %d, %v", n, err)
	}
	// Its replica stopped: the heartbeat is older than 0.
	if n, err := db.ExpireRuns(ctx, 0); err != nil || n != 2 {
		t.Errorf("ExpireRuns = %d, %v; want 2 (l1 and d1 stale)", n, err)
	}
	if r, _ := db.GetRun(ctx, "ws1", "l1"); r.Status != store.RunFailed || r.Error == "" {
		t.Errorf("l1 = %+v; want failed with a reason", r)
	}
	// A live pause past its input's deadline expires.
	past := time.Now().Add(-time.Second)
	late := &store.Run{ID: "l2", WorkspaceID: "ws1", ConnectorID: c.ID, ConnectorExternalID: "a", Query: "q", MaxTools: 3,
		Status: store.RunAwaitingInput, CreatedAt: time.Now(), ExpiresAt: &past, HeldBy: "replica-a"}
	if err := db.SaveRuns(ctx, []*store.Run{late}); err != nil {
		t.Fatal(err)
	}
	if n, err := db.ExpireRuns(ctx, time.Hour); err != nil || n != 1 {
		t.Errorf("ExpireRuns = %d, %v; want l2", n, err)
	}
	if r, _ := db.GetRun(ctx, "ws1", "l2"); r.Status != store.RunExpired {
		t.Errorf("l2 = %+v; want expired", r)
	}
	// Saved finished, a run is held by nobody.
	now := time.Now()
	live.Status, live.HeldBy, live.ExpiresAt, live.FinishedAt = store.RunCompleted, "", nil, &now
	if err := db.SaveRuns(ctx, []*store.Run{live}); err != nil {
		t.Fatal(err)
	}
	if r, _ := db.GetRun(ctx, "ws1", "l1"); r.HeldBy != "" || r.Status != store.RunCompleted {
		t.Errorf("l1 = %+v; want completed, held by nobody", r)
	}
}

// TestGetRunOfALostHolder: a run held by a replica whose row expired
// (paused live for input, or resumed and running there) reads FAILED at
// once, as the sweep would leave it once its heartbeat is missed; one whose
// holder is live reads as it is; the leader's deletion of a dead replica
// fails the runs it held.
func TestGetRunOfALostHolder(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewDB(t)
	c := mustCreate(t, db, newConnector("ws1", "a"))
	exp := time.Now().Add(time.Hour)
	for _, r := range []string{"a", "b"} {
		if err := db.RegisterReplica(ctx, r, r+":7000", time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	paused := &store.Run{ID: "p1", WorkspaceID: "ws1", ConnectorID: c.ID, ConnectorExternalID: "a", Query: "q", MaxTools: 3,
		Status: store.RunAwaitingInput, CreatedAt: time.Now(), ExpiresAt: &exp, HeldBy: "a"}
	running := &store.Run{ID: "r1", WorkspaceID: "ws1", ConnectorID: c.ID, ConnectorExternalID: "a", Query: "q", MaxTools: 3,
		Status: store.RunRunning, CreatedAt: time.Now(), HeldBy: "a"}
	other := &store.Run{ID: "o1", WorkspaceID: "ws1", ConnectorID: c.ID, ConnectorExternalID: "a", Query: "q", MaxTools: 3,
		Status: store.RunRunning, CreatedAt: time.Now(), HeldBy: "b"}
	if err := db.SaveRuns(ctx, []*store.Run{paused, running, other}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"p1", "r1"} {
		if r, err := db.GetRun(ctx, "ws1", id); err != nil || r.Status == store.RunFailed {
			t.Fatalf("run %s while its holder is live = %+v, %v", id, r, err)
		}
	}
	// a's row expires (its connections closed, or its TTL passed).
	if _, _, err := db.HeartbeatReplica(ctx, "a", -time.Second); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{"p1": "waited for input stopped", "r1": "running the resumed run stopped"} {
		r, err := db.GetRun(ctx, "ws1", id)
		if err != nil || r.Status != store.RunFailed || !strings.Contains(r.Error, want) || r.FinishedAt == nil {
			t.Errorf("run %s after its holder expired = %+v, %v; want failed, %q", id, r, err, want)
		}
	}
	if r, err := db.GetRun(ctx, "ws1", "o1"); err != nil || r.Status != store.RunRunning {
		t.Errorf("run o1 held by live b = %+v, %v; want running", r, err)
	}
	// A run held by a replica the leader deletes, long expired, fails with it.
	if _, _, err := db.HeartbeatReplica(ctx, "b", -time.Hour); err != nil {
		t.Fatal(err)
	}
	if n, err := db.ExpireDeadReplicas(ctx, time.Minute); err != nil || n != 1 {
		t.Errorf("ExpireDeadReplicas = %d, %v; want b (a expired a moment ago)", n, err)
	}
	if r, err := db.ListRuns(ctx, store.RunFilter{WorkspaceID: "ws1", Status: store.RunRunning, Limit: 10}); err != nil || len(r) != 0 {
		t.Errorf("running runs after their holder was deleted = %+v, %v; want none", r, err)
	}
	if _, err := db.GetRun(ctx, "ws1", "nope"); !errors.Is(err, store.ErrRunNotFound) {
		t.Errorf("GetRun of no run = %v, want ErrRunNotFound", err)
	}
}
