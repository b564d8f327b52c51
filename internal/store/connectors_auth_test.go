package store_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

// A connector's auth settings round-trip through the config; a run keeps
// its user and may await authorization, expire, and be claimed like a run
// awaiting approval.
func TestAuthConfigAndAuthorizationRuns(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewDB(t)
	in := newConnector("ws1", "a")
	in.Config.Auth = &store.AuthConfig{Mode: store.AuthUser, ClientID: "cid", Scopes: []string{"read", "write"}, HasClientSecret: true}
	c := mustCreate(t, db, in)
	got, err := db.GetConnector(ctx, "ws1", "a")
	if err != nil || got.Config.AuthMode() != store.AuthUser || got.Config.Auth.ClientID != "cid" ||
		!slices.Equal(got.Config.Auth.Scopes, []string{"read", "write"}) || !got.Config.Auth.HasClientSecret {
		t.Fatalf("GetConnector = %+v, %v", got.Config.Auth, err)
	}
	if mode := (store.Config{}).AuthMode(); mode != store.AuthNone {
		t.Errorf("AuthMode of no auth = %q, want none", mode)
	}

	exp := time.Now().Add(time.Hour)
	paused := &store.Run{ID: "r1", WorkspaceID: "ws1", ConnectorID: c.ID, ConnectorExternalID: "a", UserID: "alice", Query: "q",
		MaxTools: 3, Status: store.RunAwaitingAuthorization, CreatedAt: time.Now(), ExpiresAt: &exp}
	past := time.Now().Add(-time.Second)
	late := &store.Run{ID: "r2", WorkspaceID: "ws1", ConnectorID: c.ID, ConnectorExternalID: "a", UserID: "bob", Query: "q",
		MaxTools: 3, Status: store.RunAwaitingAuthorization, CreatedAt: time.Now(), ExpiresAt: &past}
	if err := db.SaveRuns(ctx, []*store.Run{paused, late}); err != nil {
		t.Fatal(err)
	}
	r, err := db.GetRun(ctx, "ws1", "r1")
	if err != nil || r.UserID != "alice" || r.Status != store.RunAwaitingAuthorization {
		t.Fatalf("GetRun = %+v, %v", r, err)
	}
	if runs, _ := db.ListRuns(ctx, store.RunFilter{WorkspaceID: "ws1", Status: store.RunExpired, Limit: 10}); len(runs) != 1 || runs[0].ID != "r2" {
		t.Errorf("ListRuns(expired) = %+v; want r2, past its time", runs)
	}
	if n, err := db.ExpireRuns(ctx, time.Hour); err != nil || n != 1 {
		t.Errorf("ExpireRuns = %d, %v; want 1", n, err)
	}
	if _, err := db.ClaimRun(ctx, "ws1", "r1", r.Version, json.RawMessage(`{}`), "a"); err != nil {
		t.Errorf("ClaimRun of a run awaiting authorization: %v", err)
	}

	// Deleting the connector fails a run still awaiting authorization.
	third := &store.Run{ID: "r3", WorkspaceID: "ws1", ConnectorID: c.ID, ConnectorExternalID: "a", UserID: "carol", Query: "q",
		MaxTools: 3, Status: store.RunAwaitingAuthorization, CreatedAt: time.Now(), ExpiresAt: &exp}
	if err := db.SaveRuns(ctx, []*store.Run{third}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.DeleteConnector(ctx, "ws1", "a"); err != nil {
		t.Fatal(err)
	}
	if r, _ := db.GetRun(ctx, "ws1", "r3"); r.Status != store.RunFailed || r.Error != "the connector was deleted while the run waited for authorization" {
		t.Errorf("r3 after delete = %s %q", r.Status, r.Error)
	}
}
