package registry_test

import (
	"context"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

// TestRefreshReportsAChangeASyncAppliedFirst: a RefreshTools whose listing
// is overtaken by another sync of the same change (a list_changed
// notification's, a health check's) reports the change all the same,
// though the source's own diff is empty by the time it writes (issue 27),
// and the catalog shows it when Refresh returns.
func TestRefreshReportsAChangeASyncAppliedFirst(t *testing.T) {
	var hold atomic.Bool
	held, release := make(chan struct{}, 1), make(chan struct{})
	hooks := &server.Hooks{}
	hooks.AddBeforeListTools(func(context.Context, any, *mcp.ListToolsRequest) {
		if hold.CompareAndSwap(true, false) {
			held <- struct{}{}
			<-release
		}
	})
	m := server.NewMCPServer("t", "1.0", server.WithToolCapabilities(false), server.WithHooks(hooks))
	noop := func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("ok"), nil
	}
	m.AddTool(mcp.NewTool("keep"), noop)
	m.AddTool(mcp.NewTool("sleep"), noop)
	hs := httptest.NewServer(server.NewStreamableHTTPServer(m))
	t.Cleanup(hs.Close)
	cfg := testConfig()
	cfg.HealthInterval = time.Hour // only the test syncs
	src := newSource(httpSpec(1, hs.URL+"/mcp"))
	reg := run(t, src, cfg)
	testsupport.WaitFor(t, "the first sync", func() bool { return slices.Contains(src.toolNames(1), "sleep") })

	m.DeleteTools("sleep")
	hold.Store(true)
	type result struct {
		changes registry.ToolChanges
		err     error
	}
	done := make(chan result, 1)
	go func() {
		ch, err := reg.Refresh(ctxT(t), 1)
		done <- result{ch, err}
	}()
	<-held // the refresh listed nothing yet; another sync applies the change
	if _, err := reg.Check(ctxT(t), 1); err != nil {
		t.Fatal(err)
	}
	if names := src.toolNames(1); slices.Contains(names, "sleep") {
		t.Fatalf("the other sync did not apply the change: %v", names)
	}
	close(release)
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !slices.Equal(r.changes.Removed, []string{"sleep"}) {
		t.Errorf("Refresh reported %+v, want removed [sleep]", r.changes)
	}
	if tools, _ := reg.Tools(1); slices.ContainsFunc(tools, func(t mcp.Tool) bool { return t.Name == "sleep" }) {
		t.Error("the catalog still holds sleep when Refresh has returned")
	}
}
