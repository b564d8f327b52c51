package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

func TestMain(m *testing.M) { os.Exit(storetest.Main(m)) }

func newConnector(ws, id string) *store.Connector {
	return &store.Connector{
		WorkspaceID: ws, ExternalID: id, Name: "Name " + id, Transport: store.TransportStreamableHTTP,
		Config: store.Config{URL: "http://127.0.0.1:9/mcp", CallTimeout: store.Duration(time.Minute)},
		Active: true,
	}
}

func mustCreate(t *testing.T, db *store.DB, c *store.Connector) *store.Connector {
	t.Helper()
	got, err := db.CreateConnector(context.Background(), c)
	if err != nil {
		t.Fatalf("CreateConnector(%s): %v", c.ExternalID, err)
	}
	return got
}

func TestMigrateTwiceIsNoOp(t *testing.T) {
	db := storetest.NewDB(t)
	for range 2 {
		if err := db.Migrate(context.Background()); err != nil {
			t.Fatalf("Migrate on a migrated database: %v", err)
		}
	}
}

func TestOpenCreatesMissingDatabase(t *testing.T) {
	ctx := context.Background()
	u := storetest.NewURL(t)
	name := "cs_test_missing_" + strings.ReplaceAll(time.Now().Format("150405.000000"), ".", "")
	storetest.DropOnCleanup(t, name)
	missing := strings.Replace(u, u[strings.LastIndex(u, "/"):strings.Index(u, "?")], "/"+name, 1)
	for range 2 { // the second Open finds the database there
		db, err := store.Open(ctx, missing, nil)
		if err != nil {
			t.Fatalf("Open(missing database): %v", err)
		}
		err = db.Migrate(ctx)
		db.Close()
		if err != nil {
			t.Fatalf("Migrate: %v", err)
		}
	}
}

func TestOpenUnreachableFailsFast(t *testing.T) {
	start := time.Now()
	_, err := store.Open(context.Background(), "postgres://postgres@127.0.0.1:1/x?sslmode=disable", nil)
	if err == nil {
		t.Fatal("Open(127.0.0.1:1) succeeded")
	}
	if !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Errorf("error %q does not say which server it tried", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("Open took %v", d)
	}
}

func TestConnectorCRUD(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewDB(t)
	c := newConnector("ws1", "github")
	c.SealedSecrets = []byte{1, 2, 3}
	c.Config.HeaderNames = []string{"Authorization"}
	created := mustCreate(t, db, c)
	if created.ID == 0 || created.CreatedAt.IsZero() || created.Health.State != store.HealthUnknown {
		t.Errorf("created = %+v, want an id, a create time and health %q", created, store.HealthUnknown)
	}

	got, err := db.GetConnector(ctx, "ws1", "github")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(created, got); diff != "" {
		t.Errorf("GetConnector (-created +got):\n%s", diff)
	}

	updated, err := db.UpdateConnector(ctx, "ws1", "github", func(c *store.Connector) error {
		c.Name = "GitHub"
		c.Config.Model = "gpt-x"
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if updated.Name != "GitHub" || updated.Config.Model != "gpt-x" || updated.Config.URL != c.Config.URL ||
		string(updated.SealedSecrets) != string(c.SealedSecrets) {
		t.Errorf("after update: %+v", updated)
	}

	inactive, err := db.SetConnectorActive(ctx, "ws1", "github", false)
	if err != nil || inactive.Active {
		t.Fatalf("SetConnectorActive(false) = %+v, %v", inactive, err)
	}

	if id, err := db.DeleteConnector(ctx, "ws1", "github"); err != nil || id != created.ID {
		t.Fatalf("DeleteConnector = %d, %v; want %d", id, err, created.ID)
	}
	if _, err := db.GetConnector(ctx, "ws1", "github"); !errors.Is(err, store.ErrConnectorNotFound) {
		t.Errorf("GetConnector after delete: err = %v, want ErrConnectorNotFound", err)
	}
	if _, err := db.DeleteConnector(ctx, "ws1", "github"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("second delete: err = %v, want ErrNotFound", err)
	}
}

func TestCreateDuplicateConflictsAndKeepsFirst(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewDB(t)
	mustCreate(t, db, newConnector("ws1", "a"))
	dup := newConnector("ws1", "a")
	dup.Name = "other"
	if _, err := db.CreateConnector(ctx, dup); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("duplicate create: err = %v, want ErrConflict", err)
	}
	got, err := db.GetConnector(ctx, "ws1", "a")
	if err != nil || got.Name != "Name a" {
		t.Errorf("first connector after duplicate create = %+v, %v", got, err)
	}
	// The same id in another workspace is a different connector.
	mustCreate(t, db, newConnector("ws2", "a"))
}

func TestWorkspaceIsolation(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewDB(t)
	mustCreate(t, db, newConnector("ws1", "a"))
	checks := map[string]error{}
	_, checks["get"] = db.GetConnector(ctx, "ws2", "a")
	_, checks["update"] = db.UpdateConnector(ctx, "ws2", "a", func(*store.Connector) error { return nil })
	_, checks["activate"] = db.SetConnectorActive(ctx, "ws2", "a", true)
	_, checks["list tools"] = db.ListTools(ctx, "ws2", "a", "", 10)
	_, checks["update tool"] = db.UpdateToolFlags(ctx, "ws2", "a", "t", store.ToolFlags{})
	_, checks["delete"] = db.DeleteConnector(ctx, "ws2", "a")
	_, checks["get tool"] = db.GetTool(ctx, "ws2", "a", "t")
	for op, err := range checks {
		if !errors.Is(err, store.ErrConnectorNotFound) {
			t.Errorf("%s from another workspace: err = %v, want ErrConnectorNotFound", op, err)
		}
	}
	if cs, err := db.ListConnectors(ctx, "ws2", "", 10); err != nil || len(cs) != 0 {
		t.Errorf("ListConnectors(ws2) = %d connectors, %v; want none", len(cs), err)
	}
}

func TestListConnectorsPages(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewDB(t)
	for _, id := range []string{"c", "a", "e", "b", "d"} {
		mustCreate(t, db, newConnector("ws1", id))
	}
	var got []string
	after := ""
	for {
		page, err := db.ListConnectors(ctx, "ws1", after, 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range page {
			got = append(got, c.ExternalID)
		}
		if len(page) < 2 {
			break
		}
		after = page[len(page)-1].ExternalID
	}
	if diff := cmp.Diff([]string{"a", "b", "c", "d", "e"}, got); diff != "" {
		t.Errorf("paged ids (-want +got):\n%s", diff)
	}
}

func TestUpdateConnectorErrorWritesNothing(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewDB(t)
	mustCreate(t, db, newConnector("ws1", "a"))
	boom := errors.New("boom")
	_, err := db.UpdateConnector(ctx, "ws1", "a", func(c *store.Connector) error {
		c.Name = "changed"
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the closure's error", err)
	}
	if got, _ := db.GetConnector(ctx, "ws1", "a"); got.Name != "Name a" {
		t.Errorf("name = %q after a failed update", got.Name)
	}
}

func spec(name, desc, schema string) store.ToolSpec {
	return store.ToolSpec{Name: name, Description: desc, InputSchema: json.RawMessage(schema)}
}

func toolsByName(t *testing.T, db *store.DB, ws, id string) map[string]*store.Tool {
	t.Helper()
	tools, err := db.ListTools(context.Background(), ws, id, "", 100)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]*store.Tool{}
	for _, tool := range tools {
		m[tool.Name] = tool
	}
	return m
}

func TestSyncToolsKeepsOperatorFlags(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewDB(t)
	c := mustCreate(t, db, newConnector("ws1", "a"))
	yes := true

	res, err := db.SyncTools(ctx, c.ID, []store.ToolSpec{
		spec("echo", "Echoes", `{"type":"object","properties":{"text":{"type":"string"}}}`),
		spec("add", "Adds", `{"type":"object"}`),
		spec("gone", "Goes away", `{}`),
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(store.SyncResult{Added: []string{"add", "echo", "gone"}}, res); diff != "" {
		t.Errorf("first sync (-want +got):\n%s", diff)
	}
	no := false
	if _, err := db.UpdateToolFlags(ctx, "ws1", "a", "echo", store.ToolFlags{Enabled: &no, SetApproval: true, RequiresApproval: &yes}); err != nil {
		t.Fatal(err)
	}

	// Same schema with other spacing and key order is not a change.
	echo := spec("echo", "Echoes", `{"properties": {"text": {"type": "string"}}, "type": "object"}`)
	echo.Annotations.ReadOnlyHint = &yes
	res, err = db.SyncTools(ctx, c.ID, []store.ToolSpec{echo, spec("add", "Adds two numbers", `{"type":"object"}`), spec("new", "", "")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := store.SyncResult{Added: []string{"new"}, Removed: []string{"gone"}, Changed: []string{"add", "echo"}, Disabled: []string{"echo"},
		Approval: map[string]bool{"echo": true}}
	if diff := cmp.Diff(want, res); diff != "" {
		t.Errorf("second sync (-want +got):\n%s", diff)
	}

	tools := toolsByName(t, db, "ws1", "a")
	if len(tools) != 3 || tools["gone"] != nil {
		t.Errorf("catalog after sync = %v, want add, echo, new", tools)
	}
	if e := tools["echo"]; e.Enabled || !isTrue(e.RequiresApproval) || e.Annotations.ReadOnlyHint == nil || !*e.Annotations.ReadOnlyHint {
		t.Errorf("echo after re-sync = %+v; want operator flags kept and the new read-only hint", e)
	}
	if a := tools["add"]; !a.Enabled || a.Description != "Adds two numbers" {
		t.Errorf("add after re-sync = %+v", a)
	}

	res, err = db.SyncTools(ctx, c.ID, []store.ToolSpec{echo, spec("add", "Adds two numbers", `{"type":"object"}`), spec("new", "", "")}, nil)
	if err != nil || len(res.Added)+len(res.Changed)+len(res.Removed) != 0 || !slices.Equal(res.Disabled, []string{"echo"}) || !res.Approval["echo"] {
		t.Errorf("unchanged sync = %+v, %v; want no changes and echo disabled", res, err)
	}
}

func TestSyncToolsDisableNewTools(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewDB(t)
	c := newConnector("ws1", "a")
	c.Config.DisableNewTools = true
	c = mustCreate(t, db, c)
	if _, err := db.SyncTools(ctx, c.ID, []store.ToolSpec{spec("t", "", "")}, nil); err != nil {
		t.Fatal(err)
	}
	if tool := toolsByName(t, db, "ws1", "a")["t"]; tool.Enabled {
		t.Error("a new tool of a DisableNewTools connector is enabled")
	}
	if got, _ := db.GetConnector(ctx, "ws1", "a"); got.ToolCount != 1 {
		t.Errorf("ToolCount = %d, want 1", got.ToolCount)
	}
}

func TestUpdateToolFlags(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewDB(t)
	c := mustCreate(t, db, newConnector("ws1", "a"))
	if _, err := db.SyncTools(ctx, c.ID, []store.ToolSpec{spec("t", "", "")}, nil); err != nil {
		t.Fatal(err)
	}
	yes, no := true, false
	if got, _ := db.GetTool(ctx, "ws1", "a", "t"); got.RequiresApproval != nil {
		t.Errorf("a new tool's approval override = %v, want none (the policy decides)", *got.RequiresApproval)
	}
	got, err := db.UpdateToolFlags(ctx, "ws1", "a", "t", store.ToolFlags{SetApproval: true, RequiresApproval: &yes})
	if err != nil || !got.Enabled || !isTrue(got.RequiresApproval) {
		t.Errorf("UpdateToolFlags(approval=true) = %+v, %v; want enabled kept, approval set", got, err)
	}
	got, err = db.UpdateToolFlags(ctx, "ws1", "a", "t", store.ToolFlags{Enabled: &no})
	if err != nil || got.Enabled || !isTrue(got.RequiresApproval) {
		t.Errorf("UpdateToolFlags(enabled=false) = %+v, %v; want disabled, approval kept", got, err)
	}
	got, err = db.UpdateToolFlags(ctx, "ws1", "a", "t", store.ToolFlags{SetApproval: true, RequiresApproval: &no})
	if err != nil || got.RequiresApproval == nil || *got.RequiresApproval {
		t.Errorf("UpdateToolFlags(approval=false) = %+v, %v; want an explicit false", got, err)
	}
	got, err = db.UpdateToolFlags(ctx, "ws1", "a", "t", store.ToolFlags{SetApproval: true})
	if err != nil || got.RequiresApproval != nil {
		t.Errorf("UpdateToolFlags(approval cleared) = %+v, %v; want no override", got, err)
	}
	if _, err := db.UpdateToolFlags(ctx, "ws1", "a", "nope", store.ToolFlags{Enabled: &yes}); !errors.Is(err, store.ErrToolNotFound) {
		t.Errorf("unknown tool: err = %v, want ErrToolNotFound", err)
	}
}

func TestDeleteCascadesTools(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewDB(t)
	c := mustCreate(t, db, newConnector("ws1", "a"))
	if _, err := db.SyncTools(ctx, c.ID, []store.ToolSpec{spec("t", "", "")}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := db.DeleteConnector(ctx, "ws1", "a"); err != nil {
		t.Fatal(err)
	}
	again := mustCreate(t, db, newConnector("ws1", "a"))
	if again.ToolCount != 0 {
		t.Errorf("re-created connector has %d tools, want 0", again.ToolCount)
	}
	if _, err := db.SyncTools(ctx, c.ID, nil, nil); !errors.Is(err, store.ErrConnectorNotFound) {
		t.Errorf("SyncTools on a deleted connector: err = %v, want ErrConnectorNotFound", err)
	}
}

func TestHealthCountersAndActive(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewDB(t)
	a := mustCreate(t, db, newConnector("ws1", "a"))
	off := newConnector("ws1", "off")
	off.Active = false
	mustCreate(t, db, off)

	active, err := db.ActiveConnectors(ctx)
	if err != nil || len(active) != 1 || active[0].ExternalID != "a" {
		t.Fatalf("ActiveConnectors = %v, %v; want only a", active, err)
	}

	checked := time.Now().Truncate(time.Millisecond)
	h := store.Health{State: "ready", Latency: 42 * time.Millisecond, CheckedAt: &checked, ProtocolVersion: "2025-06-18"}
	if err := db.SaveHealth(ctx, a.ID, h); err != nil {
		t.Fatal(err)
	}
	used := time.Now().Truncate(time.Millisecond)
	for range 2 {
		if err := db.AddCounters(ctx, a.ID, store.Counters{Calls: 3, Errors: 1, Reinitializations: 1, LastUsedAt: &used}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := db.GetConnector(ctx, "ws1", "a")
	if err != nil {
		t.Fatal(err)
	}
	if got.Health.State != "ready" || got.Health.Latency != 42*time.Millisecond || !got.Health.CheckedAt.Equal(checked) ||
		got.Health.ProtocolVersion != "2025-06-18" {
		t.Errorf("health = %+v", got.Health)
	}
	if c := got.Counters; c.Calls != 6 || c.Errors != 2 || c.Reinitializations != 2 || c.LastUsedAt == nil || !c.LastUsedAt.Equal(used) {
		t.Errorf("counters = %+v", c)
	}
	if !got.UpdatedAt.Equal(a.UpdatedAt) {
		t.Error("saving health or counters changed updated_at")
	}
}

func TestGetTool(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewDB(t)
	c := mustCreate(t, db, newConnector("ws1", "a"))
	if _, err := db.SyncTools(ctx, c.ID, []store.ToolSpec{spec("t", "desc", "")}, nil); err != nil {
		t.Fatal(err)
	}
	if tool, err := db.GetTool(ctx, "ws1", "a", "t"); err != nil || tool.Description != "desc" {
		t.Errorf("GetTool = %+v, %v", tool, err)
	}
	if _, err := db.GetTool(ctx, "ws1", "a", "nope"); !errors.Is(err, store.ErrToolNotFound) {
		t.Errorf("unknown tool: err = %v, want ErrToolNotFound", err)
	}
	if _, err := db.SyncTools(ctx, c.ID, []store.ToolSpec{spec("t", "desc", ""), spec("a", "", "")}, nil); err != nil {
		t.Fatal(err)
	}
	all, err := db.ConnectorTools(ctx, c.ID)
	if err != nil || len(all) != 2 || all[0].Name != "a" || all[1].Name != "t" {
		t.Errorf("ConnectorTools = %v, %v; want a, t", all, err)
	}
}

func TestSyncToolsKeepsFlagsOfToolsThatDropOut(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewDB(t)
	c := mustCreate(t, db, newConnector("ws1", "a"))
	both := []store.ToolSpec{spec("x", "Flaps", `{}`), spec("y", "Stays", `{}`)}
	if _, err := db.SyncTools(ctx, c.ID, both, nil); err != nil {
		t.Fatal(err)
	}
	no, yes := false, true
	if _, err := db.UpdateToolFlags(ctx, "ws1", "a", "x", store.ToolFlags{Enabled: &no, SetApproval: true, RequiresApproval: &yes}); err != nil {
		t.Fatal(err)
	}

	res, err := db.SyncTools(ctx, c.ID, both[1:], nil)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(store.SyncResult{Removed: []string{"x"}}, res); diff != "" {
		t.Errorf("sync without x (-want +got):\n%s", diff)
	}
	// x is offered to nobody while the server does not list it.
	if tools := toolsByName(t, db, "ws1", "a"); len(tools) != 1 || tools["y"] == nil {
		t.Errorf("ListTools without x = %v, want only y", tools)
	}
	if all, err := db.ConnectorTools(ctx, c.ID); err != nil || len(all) != 1 || all[0].Name != "y" {
		t.Errorf("ConnectorTools without x = %v, %v; want only y", all, err)
	}
	if _, err := db.GetTool(ctx, "ws1", "a", "x"); !errors.Is(err, store.ErrToolNotFound) {
		t.Errorf("GetTool(x) while not listed: err = %v, want ErrToolNotFound", err)
	}
	if got, _ := db.GetConnector(ctx, "ws1", "a"); got.ToolCount != 1 {
		t.Errorf("ToolCount without x = %d, want 1", got.ToolCount)
	}
	res, err = db.SyncTools(ctx, c.ID, both[1:], nil)
	if err != nil || len(res.Added)+len(res.Changed)+len(res.Removed)+len(res.Disabled) != 0 {
		t.Errorf("second sync without x = %+v, %v; want no changes", res, err)
	}

	res, err = db.SyncTools(ctx, c.ID, both, nil)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(store.SyncResult{Added: []string{"x"}, Disabled: []string{"x"}, Approval: map[string]bool{"x": true}}, res); diff != "" {
		t.Errorf("sync with x again (-want +got):\n%s", diff)
	}
	x := toolsByName(t, db, "ws1", "a")["x"]
	if x == nil || x.Enabled || !isTrue(x.RequiresApproval) || !x.Listed {
		t.Errorf("x listed again = %+v; want it listed, still disabled and still requiring approval", x)
	}
}

func TestUpdateToolFlagsOfUnlistedTool(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewDB(t)
	c := mustCreate(t, db, newConnector("ws1", "a"))
	for _, specs := range [][]store.ToolSpec{{spec("x", "", "")}, nil} {
		if _, err := db.SyncTools(ctx, c.ID, specs, nil); err != nil {
			t.Fatal(err)
		}
	}
	// An operator disables a tool before it comes back.
	no := false
	got, err := db.UpdateToolFlags(ctx, "ws1", "a", "x", store.ToolFlags{Enabled: &no})
	if err != nil || got.Enabled || got.Listed {
		t.Fatalf("UpdateToolFlags(unlisted x, enabled=false) = %+v, %v; want it disabled, not listed", got, err)
	}
	res, err := db.SyncTools(ctx, c.ID, []store.ToolSpec{spec("x", "", "")}, nil)
	if err != nil || !slices.Equal(res.Added, []string{"x"}) || !slices.Equal(res.Disabled, []string{"x"}) {
		t.Errorf("sync with x again = %+v, %v; want x added and disabled", res, err)
	}
}

func isTrue(b *bool) bool { return b != nil && *b }
