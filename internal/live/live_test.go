package live_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

func TestMain(m *testing.M) { os.Exit(storetest.Main(m)) }

// mcpServer serves tools "echo" and "add" over streamable HTTP and counts
// their calls.
func mcpServer(t *testing.T) (url string, calls *atomic.Int64) {
	calls = &atomic.Int64{}
	m := server.NewMCPServer("live-test", "1.0.0")
	for _, name := range []string{"echo", "add"} {
		m.AddTool(mcp.NewTool(name, mcp.WithDescription(name+" tool")), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			calls.Add(1)
			return mcp.NewToolResultText("ok"), nil
		})
	}
	srv := httptest.NewServer(server.NewStreamableHTTPServer(m))
	t.Cleanup(srv.Close)
	return srv.URL + "/mcp", calls
}

// replica is one process's live copies: a registry, the live layer and
// its listener, on db.
type replica struct {
	reg  *registry.Registry
	live *live.Connectors
	// listening counts the listener's (re)starts.
	listening atomic.Int64
}

func startReplica(t *testing.T, db *store.DB) *replica {
	t.Helper()
	src := live.NewSource(db, nil, nil)
	reg := registry.New(src, registry.Config{HealthInterval: time.Hour, BackoffBase: 20 * time.Millisecond,
		BackoffMax: 200 * time.Millisecond}, nil)
	r := &replica{reg: reg, live: live.New(db, src, reg, nil, live.Config{ReconcileInterval: time.Hour})}
	if err := r.live.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	l := db.NewListener(100*time.Millisecond, nil)
	l.Handle(store.ConnectorChangesChannel, r.live.Notified)
	l.OnListen(func() { r.listening.Add(1); r.live.Resync() })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 3)
	go func() { done <- reg.Run(ctx) }()
	go func() { done <- r.live.Run(ctx) }()
	go func() { done <- l.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		for range 3 {
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	})
	testsupport.WaitFor(t, "the listener to listen", func() bool { return r.listening.Load() > 0 })
	return r
}

func call(r *replica, id int64, tool string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := r.reg.CallTool(ctx, id, tool, nil, registry.CallOptions{})
	return err
}

// A change written by one process reaches another's live copy through a
// notification alone: a new connector is connected and callable, a tool
// switched off is refused, a settings change reaches the agent, a
// deactivated or deleted connector is dropped. Each takes well under a
// second.
func TestChangesReachAnotherReplica(t *testing.T) {
	db := storetest.NewDB(t)
	url, calls := mcpServer(t)
	b := startReplica(t, db) // the one that only listens

	c, err := db.CreateConnector(context.Background(), &store.Connector{WorkspaceID: "ws", ExternalID: "c", Name: "c",
		Transport: "streamable_http", Config: store.Config{URL: url}, Active: true})
	if err != nil {
		t.Fatal(err)
	}
	took := testsupport.WaitFor(t, "B to call the new connector", func() bool { return call(b, c.ID, "echo") == nil })
	t.Logf("created: callable on B after %v", took)
	// The owner (here B itself, a single holder) syncs the catalog; wait
	// for the tools' rows so that flags can be set.
	testsupport.WaitFor(t, "the catalog in the store", func() bool {
		tools, err := db.ConnectorTools(context.Background(), c.ID)
		return err == nil && len(tools) == 2
	})

	no := false
	if _, err := db.UpdateToolFlags(context.Background(), "ws", "c", "echo", store.ToolFlags{Enabled: &no}); err != nil {
		t.Fatal(err)
	}
	took = testsupport.WaitFor(t, "B to refuse the disabled tool", func() bool { return errors.Is(call(b, c.ID, "echo"), registry.ErrToolDisabled) })
	t.Logf("tool disabled: refused on B after %v", took)
	if took > time.Second {
		t.Errorf("the disabled tool was refused after %v; want under 1s", took)
	}

	if _, err := db.UpdateConnector(context.Background(), "ws", "c", func(c *store.Connector) error {
		c.Description = "new words"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	took = testsupport.WaitFor(t, "B's agent to take the new description", func() bool {
		a, err := b.live.Settings(c.ID, func() (*store.Connector, error) { return nil, errors.New("not loaded") })
		return err == nil && a.Row.Description == "new words"
	})
	t.Logf("description: on B after %v", took)

	if _, err := db.SetConnectorActive(context.Background(), "ws", "c", false); err != nil {
		t.Fatal(err)
	}
	took = testsupport.WaitFor(t, "B to drop the deactivated connector", func() bool { return !b.reg.Has(c.ID) })
	t.Logf("deactivated: dropped on B after %v", took)
	if _, err := db.SetConnectorActive(context.Background(), "ws", "c", true); err != nil {
		t.Fatal(err)
	}
	testsupport.WaitFor(t, "B to call the reactivated connector", func() bool { return call(b, c.ID, "add") == nil })

	if _, err := db.DeleteConnector(context.Background(), "ws", "c"); err != nil {
		t.Fatal(err)
	}
	took = testsupport.WaitFor(t, "B to drop the deleted connector", func() bool { return !b.reg.Has(c.ID) })
	t.Logf("deleted: dropped on B after %v", took)
	before := calls.Load()
	if err := call(b, c.ID, "add"); !errors.Is(err, registry.ErrNotLoaded) {
		t.Errorf("call after delete = %v; want ErrNotLoaded", err)
	}
	if calls.Load() != before {
		t.Error("a call after the delete reached the server")
	}
}

// A change made while a replica's listener was cut off is caught when it
// listens again: the reconcile that follows every LISTEN compares versions.
func TestChangesWhileNotListeningAreCaught(t *testing.T) {
	u := storetest.NewURL(t)
	db, err := store.Open(context.Background(), u, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	url, _ := mcpServer(t)
	c, err := db.CreateConnector(context.Background(), &store.Connector{WorkspaceID: "ws", ExternalID: "c", Name: "c",
		Transport: "streamable_http", Config: store.Config{URL: url}, Active: true})
	if err != nil {
		t.Fatal(err)
	}
	b := startReplica(t, db)
	testsupport.WaitFor(t, "B to call the loaded connector", func() bool { return call(b, c.ID, "echo") == nil })

	// Cut B's listener off and change the connector before it is back.
	admin, err := pgx.Connect(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	// With a timeout pg_terminate_backend waits until the listener's
	// backend has exited (without one it only signals it, and a backend
	// not yet scheduled on a busy machine still delivers the change below
	// on the old connection).
	var killed int
	var exited bool
	if err := admin.QueryRow(context.Background(),
		`SELECT count(*), coalesce(bool_and(pg_terminate_backend(pid, 20000)), false) FROM pg_stat_activity WHERE application_name LIKE $1 || '%' AND datname = current_database()`,
		store.ListenerApplicationName).Scan(&killed, &exited); err != nil {
		t.Fatal(err)
	}
	if killed == 0 || !exited {
		t.Fatalf("terminated %d listening backends (all exited within 20 s: %v); want B's", killed, exited)
	}
	if _, err := db.SetConnectorActive(context.Background(), "ws", "c", false); err != nil {
		t.Fatal(err)
	}
	took := testsupport.WaitFor(t, "B to drop the connector deactivated while it was not listening", func() bool { return !b.reg.Has(c.ID) })
	if n := b.listening.Load(); n < 2 {
		t.Errorf("the listener started %d times; want a restart after the kill", n)
	}
	t.Logf("deactivated while cut off: dropped on B after %v (listener restarts: %d)", took, b.listening.Load())
}

// Health and counter writes do not notify: a replica at rest hears
// nothing however often the owner writes them.
func TestHealthAndCountersDoNotNotify(t *testing.T) {
	db := storetest.NewDB(t)
	c, err := db.CreateConnector(context.Background(), &store.Connector{WorkspaceID: "ws", ExternalID: "c", Name: "c",
		Transport: "streamable_http", Config: store.Config{URL: "http://127.0.0.1:1/mcp"}, Active: false})
	if err != nil {
		t.Fatal(err)
	}
	var heard atomic.Int64
	l := db.NewListener(50*time.Millisecond, nil)
	listening := make(chan struct{})
	l.Handle(store.ConnectorChangesChannel, func(string) { heard.Add(1) })
	l.OnListen(func() { close(listening) })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	defer func() { cancel(); <-done }()
	<-listening
	now := time.Now()
	for range 20 {
		if err := db.SaveHealth(ctx, c.ID, store.Health{State: "ready", CheckedAt: &now}); err != nil {
			t.Fatal(err)
		}
		if err := db.AddCounters(ctx, c.ID, store.Counters{Calls: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.UpdateConnector(ctx, "ws", "c", func(c *store.Connector) error { c.Name = "renamed"; return nil }); err != nil {
		t.Fatal(err)
	}
	testsupport.WaitFor(t, "the rename's notification", func() bool { return heard.Load() >= 1 })
	time.Sleep(100 * time.Millisecond)
	if n := heard.Load(); n != 1 {
		t.Errorf("heard %d notifications; want 1 (the rename): health and counters must not notify", n)
	}
}
