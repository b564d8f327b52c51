package registry_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

func TestHealthIsWrittenWhenItChanges(t *testing.T) {
	srv := newMCPServer(t, legacyServer)
	src := newSource(httpSpec(1, srv.url()))
	reg := run(t, src, testConfig())
	echo(t, reg, 1, "up")
	first, _ := reg.Health(1)

	const checks = 5
	testsupport.WaitFor(t, "health checks", func() bool { return srv.lists.Load() >= 1+checks }) // one list at connect
	if h, _ := reg.Health(1); !h.CheckedAt.After(first.CheckedAt) || h.State != registry.StateReady {
		t.Errorf("health after %d checks = %+v; want READY, checked after the connect at %v", checks, h, first.CheckedAt)
	}
	if n := src.healthCount(1); n != 1 {
		t.Errorf("a connect and %d checks of a healthy connector wrote its health %d times, want 1", checks, n)
	}

	srv.stop()
	testsupport.WaitFor(t, "the loss to be written", func() bool { return src.lastHealth(1).State != registry.StateReady })
	srv.start(srv.addr)
	testsupport.WaitFor(t, "READY to be written again", func() bool { return src.lastHealth(1).State == registry.StateReady })
}

func TestUnchangedHealthIsWrittenEverySaveInterval(t *testing.T) {
	srv := newMCPServer(t, legacyServer)
	src := newSource(httpSpec(1, srv.url()))
	cfg := testConfig()
	cfg.HealthSaveInterval = 300 * time.Millisecond
	reg := run(t, src, cfg)
	echo(t, reg, 1, "up")

	testsupport.WaitFor(t, "three writes", func() bool { return src.healthCount(1) >= 3 })
	lists := srv.lists.Load()
	src.mu.Lock()
	written := slices.Clone(src.health[1])
	src.mu.Unlock()
	for i := 1; i < len(written); i++ {
		if gap := written[i].CheckedAt.Sub(written[i-1].CheckedAt); gap < cfg.HealthSaveInterval {
			t.Errorf("health written %v after the last, want at least %v apart", gap, cfg.HealthSaveInterval)
		}
	}
	if int64(len(written)) >= lists {
		t.Errorf("%d health writes for %d tools/list, want fewer writes than checks", len(written), lists)
	}
}

// TestChecksSpreadOverTheInterval loads connectors together and checks that
// their health checks do not run together: each has its own moment in the
// interval, and keeps it.
func TestChecksSpreadOverTheInterval(t *testing.T) {
	const n, parts = 40, 8
	srv := newMCPServer(t, legacyServer)
	specs := make([]registry.Spec, n)
	for i := range specs {
		// What is measured is when checks run, not how long they take:
		// forty connects and checks at once on a busy machine may take
		// longer than the usual timeouts.
		specs[i] = httpSpec(int64(i+1), srv.url())
		specs[i].ConnectTimeout = testsupport.Within
	}
	cfg := testConfig()
	cfg.HealthInterval = time.Second
	cfg.HealthTimeout = testsupport.Within
	reg := run(t, newSource(specs...), cfg)
	// Ready fails fast on a connector whose connect failed; each connector
	// READY once is what is waited for.
	ready := map[int64]bool{}
	testsupport.WaitFor(t, "every connector READY", func() bool {
		for _, s := range specs {
			if h, _ := reg.Health(s.ID); h.State == registry.StateReady {
				ready[s.ID] = true
			}
		}
		return len(ready) == n
	})

	testsupport.WaitFor(t, "two rounds of checks", func() bool { return srv.lists.Load() >= 3*n }) // n lists at connect
	// Where each connector's last check falls in the interval, looked at
	// every 5 ms for a whole interval: checks that bunch up show
	// as one crowded eighth at some moment of it. A busy machine may stall
	// the checks due in a stretch of the interval and run them together
	// after it, once: the next round runs each on its own phase again, so
	// an interval of spread checks may come only after a few.
	var byAge [parts]int
	spread := func() bool {
		now := time.Now()
		byAge = [parts]int{}
		for _, s := range specs {
			h, _ := reg.Health(s.ID)
			// A check may end after now was read: its age is 0. One that
			// runs late on a busy machine is older than the interval: it
			// counts where in the interval its age falls.
			age := max(0, now.Sub(h.CheckedAt)) % cfg.HealthInterval
			byAge[int(age*parts/cfg.HealthInterval)]++
		}
		return slices.Max(byAge[:]) <= n/2
	}
	spreadThroughAnInterval := func() bool {
		for end := time.Now().Add(cfg.HealthInterval); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			if !spread() {
				return false
			}
		}
		return true
	}
	if !testsupport.Poll(10*cfg.HealthInterval, spreadThroughAnInterval) {
		t.Errorf("last checks by age, in eighths of the interval: %v; want them spread, not %d of %d together", byAge, slices.Max(byAge[:]), n)
	}
}

// TestCheckFindsAChangedSchema: a health check notices a tool that changed
// in anything but its name, with no notification to say so.
func TestCheckFindsAChangedSchema(t *testing.T) {
	srv := newMCPServer(t, legacyServer, quietServer)
	reg := run(t, newSource(httpSpec(1, srv.url())), testConfig())
	echo(t, reg, 1, "x")

	srv.server().AddTool(mcp.NewTool("echo", mcp.WithDescription("Echoes text"), mcp.WithString("text", mcp.Required()),
		mcp.WithString("suffix")), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("x"), nil
	})
	testsupport.WaitFor(t, "the new echo parameter in the catalog", func() bool {
		tools, _ := reg.Tools(1)
		i := slices.IndexFunc(tools, func(t mcp.Tool) bool { return t.Name == "echo" })
		return i >= 0 && tools[i].InputSchema.Properties["suffix"] != nil
	})
}
