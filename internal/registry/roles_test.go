package registry_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

// runFollower runs a registry over src that follows connector id from
// the start (SetOwner before Load), until the test ends.
func runFollower(t *testing.T, src registry.ConnectorSource, cfg registry.Config, id int64) *registry.Registry {
	t.Helper()
	reg := registry.New(src, cfg, nil)
	reg.SetOwner(id, false)
	start(t, reg)
	return reg
}

// healthClock is an owned connector of a server of its own: the health
// checks its server sees tick at the registries' health interval, so a
// test waits for a number of intervals by waiting for as many checks, not
// for a time.
type healthClock struct{ srv *mcpServer }

func newHealthClock(t *testing.T, cfg registry.Config) healthClock {
	srv := newMCPServer(t, quietServer)
	reg := run(t, newSource(httpSpec(99, srv.url())), cfg)
	if err := reg.Ready(ctxT(t), 99); err != nil {
		t.Fatal(err)
	}
	return healthClock{srv}
}

// wait returns once n more health checks have reached the clock's server.
func (c healthClock) wait(t *testing.T, n int64) {
	t.Helper()
	from := c.srv.lists.Load()
	testsupport.WaitFor(t, "health intervals to pass", func() bool { return c.srv.lists.Load() >= from+n })
}

func (f *fakeSource) syncCount(id int64) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.syncs[id]
}

func (f *fakeSource) usageOf(id int64) registry.Usage {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.usage[id]
}

// A follower lists the tools once, at connect, and then checks nothing
// and writes neither health nor catalog over many health intervals, while
// an owner checks about once per interval; the follower serves calls with
// the flags it read, refuses a tool the source does not know, and still
// reports its usage.
func TestFollowerChecksAndWritesNothing(t *testing.T) {
	cfg := testConfig()
	ownSrv, folSrv := newMCPServer(t, quietServer), newMCPServer(t, quietServer)
	ownSrc := newSource(httpSpec(1, ownSrv.url()))
	folSrc := newSource(httpSpec(1, folSrv.url()))
	folSrc.flags[1] = registry.ToolFlags{Enabled: map[string]bool{"echo": true, "block": true}, DisableNew: true} // "fail" is not synced yet, and new tools start disabled
	owner := run(t, ownSrc, cfg)
	follower := runFollower(t, folSrc, cfg, 1)
	for _, reg := range []*registry.Registry{owner, follower} {
		if err := reg.Ready(ctxT(t), 1); err != nil {
			t.Fatal(err)
		}
	}
	if follower.Owner(1) || !owner.Owner(1) {
		t.Fatalf("roles: follower owns %v, owner owns %v", follower.Owner(1), owner.Owner(1))
	}
	if got := folSrv.lists.Load(); got != 1 {
		t.Fatalf("the follower listed the tools %d times to connect, want 1", got)
	}

	start, from := time.Now(), ownSrv.lists.Load()
	const checks = 10
	testsupport.WaitFor(t, "the owner's health checks", func() bool { return ownSrv.lists.Load() >= from+checks })
	intervals := float64(time.Since(start)) / float64(cfg.HealthInterval)
	if per := checks / intervals; per > 1.3 {
		t.Errorf("the owner checked %d times in %.1f intervals: %.2f per interval, want about 1", checks, intervals, per)
	}
	if got := folSrv.lists.Load(); got != 1 {
		t.Errorf("the follower listed the tools %d times over %.0f health intervals, want only its connect's", got, intervals)
	}
	if n, s := folSrc.healthCount(1), folSrc.syncCount(1); n != 0 || s != 0 {
		t.Errorf("the follower wrote health %d times and synced the catalog %d times, want neither", n, s)
	}
	if ownSrc.healthCount(1) == 0 || ownSrc.syncCount(1) == 0 {
		t.Errorf("the owner wrote health %d times, synced %d times", ownSrc.healthCount(1), ownSrc.syncCount(1))
	}

	res, err := follower.CallTool(ctxT(t), 1, "echo", map[string]any{"text": "hi"}, registry.CallOptions{})
	if err != nil || text(t, res) != "hi" {
		t.Fatalf("echo on the follower: %v, %v", res, err)
	}
	if _, err := follower.CallTool(ctxT(t), 1, "fail", nil, registry.CallOptions{}); !errors.Is(err, registry.ErrToolDisabled) {
		t.Errorf("a tool the source does not know, on the follower: %v, want ErrToolDisabled", err)
	}
	testsupport.WaitFor(t, "the follower's usage report", func() bool { return folSrc.usageOf(1).Calls == 1 })
	if h, err := follower.Health(1); err != nil || h.State != registry.StateReady {
		t.Errorf("the follower's own health: %+v, %v", h, err)
	}
}

// Roles flip both ways: a follower made owner checks at once, syncs the
// catalog and writes health, and keeps checking; made follower again, it
// stops.
func TestOwnerRoleFlipsBothWays(t *testing.T) {
	cfg := testConfig()
	clock := newHealthClock(t, cfg)
	srv := newMCPServer(t, quietServer)
	src := newSource(httpSpec(1, srv.url()))
	reg := runFollower(t, src, cfg, 1)
	if err := reg.Ready(ctxT(t), 1); err != nil {
		t.Fatal(err)
	}
	clock.wait(t, 3)
	if got := srv.lists.Load(); got != 1 || src.healthCount(1) != 0 || src.syncCount(1) != 0 {
		t.Fatalf("as follower: %d lists, %d health writes, %d syncs; want 1, 0, 0", got, src.healthCount(1), src.syncCount(1))
	}

	reg.SetOwner(1, true)
	testsupport.WaitFor(t, "the new owner's sync and health write", func() bool { return src.syncCount(1) == 1 && src.healthCount(1) == 1 })
	if h := src.lastHealth(1); h.State != registry.StateReady {
		t.Errorf("the new owner wrote %+v", h)
	}
	from := srv.lists.Load()
	testsupport.WaitFor(t, "the new owner's checks", func() bool { return srv.lists.Load() >= from+3 })

	reg.SetOwner(1, false)
	clock.wait(t, 1) // a check under way at the flip ends
	lists, health, syncs := srv.lists.Load(), src.healthCount(1), src.syncCount(1)
	clock.wait(t, 5)
	if srv.lists.Load() != lists || src.healthCount(1) != health || src.syncCount(1) != syncs {
		t.Errorf("follower again, over 5 intervals: lists %d -> %d, health writes %d -> %d, syncs %d -> %d; want no change",
			lists, srv.lists.Load(), health, src.healthCount(1), syncs, src.syncCount(1))
	}
	if _, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"text": "x"}, registry.CallOptions{}); err != nil {
		t.Errorf("a call on the follower: %v", err)
	}
}

// A follower whose server goes away finds its session dead on a call,
// reconnects with backoff by itself once the server is back, and writes no
// health meanwhile.
func TestFollowerReconnectsAfterServerRestart(t *testing.T) {
	srv := newMCPServer(t, quietServer)
	src := newSource(httpSpec(1, srv.url()))
	src.flags[1] = registry.ToolFlags{Enabled: map[string]bool{"echo": true}, DisableNew: true}
	reg := runFollower(t, src, testConfig(), 1)
	if err := reg.Ready(ctxT(t), 1); err != nil {
		t.Fatal(err)
	}
	srv.stop()
	if _, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"text": "x"}, registry.CallOptions{}); !errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("a call with the server gone: %v, want ErrUnavailable", err)
	}
	testsupport.WaitFor(t, "the follower to see its connector down", func() bool {
		h, _ := reg.Health(1)
		return h.State == registry.StateDegraded || h.State == registry.StateError
	})
	srv.start(srv.addr)
	testsupport.WaitFor(t, "the follower to reconnect by itself", func() bool {
		h, _ := reg.Health(1)
		return h.State == registry.StateReady
	})
	res, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"text": "back"}, registry.CallOptions{})
	if err != nil || text(t, res) != "back" {
		t.Fatalf("echo after the restart: %v, %v", res, err)
	}
	if got := srv.lists.Load(); got != 2 {
		t.Errorf("tools/list %d times, want 2: one per connect", got)
	}
	if n, s := src.healthCount(1), src.syncCount(1); n != 0 || s != 0 {
		t.Errorf("the follower wrote health %d times and synced %d times, want neither", n, s)
	}
}

// Resync lists the tools once and takes the flags from the source, writing
// nothing: of a connector whose new tools start disabled, a tool the owner
// has not synced yet stays disabled until the flags say otherwise.
func TestFollowerResync(t *testing.T) {
	srv := newMCPServer(t, quietServer)
	src := newSource(httpSpec(1, srv.url()))
	src.flags[1] = registry.ToolFlags{Enabled: map[string]bool{"echo": true, "fail": true, "block": true}, DisableNew: true}
	reg := runFollower(t, src, testConfig(), 1)
	if err := reg.Ready(ctxT(t), 1); err != nil {
		t.Fatal(err)
	}
	srv.server().AddTool(mcp.NewTool("extra", mcp.WithDescription("Appeared later")),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText("extra"), nil
		})
	if err := reg.Resync(ctxT(t), 1); err != nil {
		t.Fatal(err)
	}
	tools, _ := reg.Tools(1)
	if len(tools) != 4 {
		t.Fatalf("after Resync the follower has %d tools, want 4", len(tools))
	}
	if _, err := reg.CallTool(ctxT(t), 1, "extra", nil, registry.CallOptions{}); !errors.Is(err, registry.ErrToolDisabled) {
		t.Errorf("a tool the owner has not synced: %v, want ErrToolDisabled", err)
	}
	src.mu.Lock()
	src.flags[1] = registry.ToolFlags{Enabled: map[string]bool{"echo": true, "fail": true, "block": true, "extra": true}, DisableNew: true}
	src.mu.Unlock()
	if err := reg.Resync(ctxT(t), 1); err != nil {
		t.Fatal(err)
	}
	if res, err := reg.CallTool(ctxT(t), 1, "extra", nil, registry.CallOptions{}); err != nil || text(t, res) != "extra" {
		t.Errorf("the tool once synced: %v, %v", res, err)
	}
	if got := srv.lists.Load(); got != 3 {
		t.Errorf("tools/list %d times, want 3: the connect's and one per Resync", got)
	}
	// Of a connector whose new tools start enabled, one the owner has not
	// synced yet is callable at once, as the owner's sync will leave it.
	srv.server().AddTool(mcp.NewTool("newer", mcp.WithDescription("Appeared later still")),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText("newer"), nil
		})
	src.mu.Lock()
	src.flags[1] = registry.ToolFlags{Enabled: map[string]bool{"echo": true, "fail": true, "block": true, "extra": true}}
	src.mu.Unlock()
	if err := reg.Resync(ctxT(t), 1); err != nil {
		t.Fatal(err)
	}
	if res, err := reg.CallTool(ctxT(t), 1, "newer", nil, registry.CallOptions{}); err != nil || text(t, res) != "newer" {
		t.Errorf("a tool not synced yet, new tools enabled: %v, %v", res, err)
	}
	if src.syncCount(1) != 0 || src.healthCount(1) != 0 {
		t.Errorf("the follower synced %d times and wrote health %d times", src.syncCount(1), src.healthCount(1))
	}
}

// fencedSource refuses every catalog write, as the store refuses the
// writes of a replica whose ownership of the connector has moved on.
type fencedSource struct{ *fakeSource }

func (fencedSource) SyncTools(context.Context, int64, []mcp.Tool) (registry.ToolChanges, error) {
	return registry.ToolChanges{}, errors.New("not the connector's owner")
}

// An owner whose first catalog write is refused (its ownership moved
// before SetOwner told it) connects all the same, with the stored flags as
// a follower takes them, instead of staying without a catalog.
func TestOwnerFencedOffTakesStoredFlags(t *testing.T) {
	srv := newMCPServer(t, quietServer)
	src := newSource(httpSpec(1, srv.url()))
	src.flags[1] = registry.ToolFlags{Enabled: map[string]bool{"echo": true, "fail": false}}
	reg := run(t, fencedSource{src}, testConfig())
	if err := reg.Ready(ctxT(t), 1); err != nil {
		t.Fatalf("an owner whose catalog write is refused: %v, want it connected", err)
	}
	cat, err := reg.Catalog(ctxT(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	var enabled []string
	for _, tool := range cat.Enabled() {
		enabled = append(enabled, tool.Name)
	}
	if !slices.Contains(enabled, "echo") || slices.Contains(enabled, "fail") {
		t.Errorf("enabled tools %v: want echo, and not fail (disabled in the stored flags)", enabled)
	}
	if _, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"text": "x"}, registry.CallOptions{}); err != nil {
		t.Errorf("a call: %v", err)
	}
}
