package registry_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

func echo(t *testing.T, reg *registry.Registry, id int64, msg string) {
	t.Helper()
	res, err := reg.CallTool(ctxT(t), id, "echo", map[string]any{"text": msg}, registry.CallOptions{})
	if err != nil {
		t.Fatalf("echo on connector %d: %v", id, err)
	}
	if got := text(t, res); got != msg {
		t.Fatalf("echo = %q, want %q", got, msg)
	}
}

func TestOneConnectionForManyCalls(t *testing.T) {
	srv := newMCPServer(t, legacyServer)
	src := newSource(httpSpec(1, srv.url()))
	reg := run(t, src, testConfig())

	for i := range 20 {
		echo(t, reg, 1, fmt.Sprint("seq", i))
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"text": fmt.Sprint("par", i)}, registry.CallOptions{})
			if err == nil && (len(res.Content) == 0 || res.Content[0].(mcp.TextContent).Text != fmt.Sprint("par", i)) {
				err = fmt.Errorf("call %d got %v", i, res.Content)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if n := srv.inits.Load(); n != 1 {
		t.Errorf("server saw %d initialize requests for 84 calls, want 1", n)
	}
	if got := src.toolNames(1); !slices.Equal(got, []string{"block", "echo", "fail"}) {
		t.Errorf("synced tools = %v", got)
	}
	testsupport.WaitFor(t, "usage to be reported", func() bool {
		src.mu.Lock()
		defer src.mu.Unlock()
		return src.usage[1].Calls == 84
	})
}

func TestConcurrentFirstCallsShareOneConnect(t *testing.T) {
	srv := newMCPServer(t, legacyServer)
	// Not loaded at start: added while calls are already waiting.
	src := newSource()
	reg := run(t, src, testConfig())
	reg.Add(httpSpec(7, srv.url()))
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := reg.CallTool(ctxT(t), 7, "echo", map[string]any{"text": fmt.Sprint(i)}, registry.CallOptions{}); err != nil {
				t.Errorf("call %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if n := srv.inits.Load(); n != 1 {
		t.Errorf("32 concurrent first calls made %d connections, want 1", n)
	}
}

func TestSessionExpiredReinitializesOnce(t *testing.T) {
	srv := newMCPServer(t, legacyServer)
	src := newSource(httpSpec(1, srv.url()))
	cfg := testConfig()
	cfg.HealthInterval = time.Hour // only calls touch the session
	reg := run(t, src, cfg)
	echo(t, reg, 1, "before")

	srv.expireSessions()
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"text": fmt.Sprint(i)}, registry.CallOptions{}); err != nil {
				t.Errorf("call %d after expiry: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if n := srv.inits.Load(); n != 2 {
		t.Errorf("initialize requests = %d, want 2 (connect + one shared re-initialize)", n)
	}
	testsupport.WaitFor(t, "the re-initialize to be counted", func() bool {
		src.mu.Lock()
		defer src.mu.Unlock()
		return src.usage[1].Reinitializations == 1 && src.usage[1].Reconnects == 0
	})
}

func TestServerRestartWithStaleSession(t *testing.T) {
	srv := newMCPServer(t, legacyServer)
	src := newSource(httpSpec(1, srv.url()))
	cfg := testConfig()
	cfg.HealthInterval = time.Hour
	reg := run(t, src, cfg)
	echo(t, reg, 1, "before")
	srv.restart()
	echo(t, reg, 1, "after restart")
	if n := srv.inits.Load(); n != 2 {
		t.Errorf("initialize requests = %d, want 2", n)
	}
}

func TestServerDownFailsFastAndRecovers(t *testing.T) {
	srv := newMCPServer(t, legacyServer)
	src := newSource(httpSpec(1, srv.url()))
	reg := run(t, src, testConfig())
	echo(t, reg, 1, "up")

	srv.stop()
	testsupport.WaitFor(t, "state ERROR", func() bool {
		h, _ := reg.Health(1)
		return h.State == registry.StateError
	})
	start := time.Now()
	_, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"text": "x"}, registry.CallOptions{})
	if !errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("call while down: err = %v, want ErrUnavailable", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("call while down took %v; it should fail fast", d)
	}
	if h := src.lastHealth(1); h.State != registry.StateError || h.LastError == "" {
		t.Errorf("persisted health = %+v, want ERROR with the last error", h)
	}

	srv.start(srv.addr)
	testsupport.WaitFor(t, "state READY again", func() bool {
		h, _ := reg.Health(1)
		return h.State == registry.StateReady
	})
	echo(t, reg, 1, "back")
}

func TestHungServerDoesNotDelayOthers(t *testing.T) {
	hung := newMCPServer(t, legacyServer)
	ok := newMCPServer(t, legacyServer)
	src := newSource(httpSpec(1, hung.url()), httpSpec(2, ok.url()))
	reg := run(t, src, testConfig())
	echo(t, reg, 1, "warm")
	echo(t, reg, 2, "warm")

	blocked := make(chan error, 1)
	go func() {
		_, err := reg.CallTool(ctxT(t), 1, "block", nil, registry.CallOptions{})
		blocked <- err
	}()
	select { // the hung call must be in flight on the server before the others run
	case <-hung.blocking:
	case <-time.After(20 * time.Second):
		t.Fatal("the blocking call never reached the server")
	}
	for i := range 20 {
		echo(t, reg, 2, fmt.Sprint(i))
	}
	select {
	case err := <-blocked:
		t.Fatalf("the hung call returned early: %v", err)
	default:
	}
	close(hung.release)
	if err := <-blocked; err != nil {
		t.Errorf("released call: %v", err)
	}
}

func TestToolListChangesAreSynced(t *testing.T) {
	srv := newMCPServer(t, legacyServer)
	src := newSource(httpSpec(1, srv.url()))
	reg := run(t, src, testConfig())
	echo(t, reg, 1, "x")

	srv.server().AddTool(mcp.NewTool("new_tool", mcp.WithDescription("Appeared later")),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText("hi"), nil
		})
	testsupport.WaitFor(t, "new_tool in the synced catalog", func() bool { return slices.Contains(src.toolNames(1), "new_tool") })
	tools, _ := reg.Tools(1)
	if !slices.ContainsFunc(tools, func(t mcp.Tool) bool { return t.Name == "new_tool" }) {
		t.Error("the registry's cached tools lack new_tool")
	}

	srv.server().DeleteTools("fail")
	testsupport.WaitFor(t, "fail removed from the catalog", func() bool { return !slices.Contains(src.toolNames(1), "fail") })
}

// TestProtocolGenerations connects servers of either generation. A
// connector that prefers the sessionless one probes with server/discover,
// and falls back to the classic handshake, also when the server ignores
// the probe; by default a server that offers both gets the classic one.
func TestProtocolGenerations(t *testing.T) {
	tests := []struct {
		name   string
		opts   []serverOption
		pref   string
		modern bool
	}{
		{"both, by default", nil, "", false},
		{"both, sessionless preferred", nil, registry.ProtocolSessionless, true},
		{"legacy", []serverOption{legacyServer}, registry.ProtocolSessionless, false},
		{"legacy ignoring the probe", []serverOption{silentProbe}, registry.ProtocolSessionless, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newMCPServer(t, tt.opts...)
			spec := httpSpec(1, srv.url())
			spec.Protocol = tt.pref
			src := newSource(spec)
			reg := run(t, src, testConfig())
			echo(t, reg, 1, "hello")
			h, _ := reg.Health(1)
			if mcp.IsModernProtocol(h.ProtocolVersion) != tt.modern || h.ProtocolVersion == "" {
				t.Errorf("negotiated %q; modern = %t, want %t", h.ProtocolVersion, !tt.modern, tt.modern)
			}
		})
	}
}

func TestToolErrorsAndUnknownTools(t *testing.T) {
	srv := newMCPServer(t, legacyServer)
	reg := run(t, newSource(httpSpec(1, srv.url())), testConfig())
	res, err := reg.CallTool(ctxT(t), 1, "fail", nil, registry.CallOptions{})
	if err != nil || !res.IsError || text(t, res) != "it failed" {
		t.Errorf("fail tool = %v, %v; want an isError result", res, err)
	}
	if _, err := reg.CallTool(ctxT(t), 99, "echo", nil, registry.CallOptions{}); !errors.Is(err, registry.ErrNotLoaded) {
		t.Errorf("unknown connector: err = %v, want ErrNotLoaded", err)
	}
	h, _ := reg.Health(1)
	if h.State != registry.StateReady {
		t.Errorf("a tool error changed the connector's state to %s", h.State)
	}
}

func TestSSETransport(t *testing.T) {
	srv := newMCPServer(t, sseServer, legacyServer)
	spec := httpSpec(1, srv.url())
	spec.Transport = registry.TransportSSE
	reg := run(t, newSource(spec), testConfig())
	for i := range 5 {
		echo(t, reg, 1, fmt.Sprint(i))
	}
	if n := srv.inits.Load(); n != 1 {
		t.Errorf("initialize requests = %d, want 1", n)
	}
	srv.restart() // the SSE stream dies with the server
	testsupport.WaitFor(t, "the SSE connector to come back", func() bool {
		res, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"text": "again"}, registry.CallOptions{})
		return err == nil && !res.IsError
	})
}

func TestRemoveAndReplace(t *testing.T) {
	a := newMCPServer(t, legacyServer)
	b := newMCPServer(t, legacyServer)
	reg := run(t, newSource(httpSpec(1, a.url())), testConfig())
	echo(t, reg, 1, "on a")
	reg.Replace(ctxT(t), httpSpec(1, b.url()))
	echo(t, reg, 1, "on b")
	if b.inits.Load() != 1 {
		t.Errorf("replacement server initializes = %d, want 1", b.inits.Load())
	}
	reg.Remove(1)
	if _, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"text": "x"}, registry.CallOptions{}); !errors.Is(err, registry.ErrNotLoaded) {
		t.Errorf("after Remove: err = %v, want ErrNotLoaded", err)
	}
}

// TestUsageIsReportedWhenConnectionsGo checks that counts not yet reported
// are not lost when a connector is removed or the registry shuts down.
func TestUsageIsReportedWhenConnectionsGo(t *testing.T) {
	srv := newMCPServer(t, legacyServer)
	src := newSource(httpSpec(1, srv.url()), httpSpec(2, srv.url()))
	cfg := testConfig()
	cfg.UsageInterval = time.Hour // only the goodbyes report
	reg := registry.New(src, cfg, nil)
	if err := reg.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- reg.Run(ctx) }()
	for range 3 {
		echo(t, reg, 1, "x")
		echo(t, reg, 2, "y")
	}
	reg.Remove(1)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	src.mu.Lock()
	defer src.mu.Unlock()
	for id := range int64(2) {
		if u := src.usage[id+1]; u.Calls != 3 {
			t.Errorf("connector %d: reported %d calls, want 3", id+1, u.Calls)
		}
	}
}
