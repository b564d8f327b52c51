package registry_test

import (
	"context"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/connector-svc/connector-svc/internal/registry"
)

// BenchmarkTaskCall measures a call of a tool that must run as a task
// (tasks: create, tasks/get until done, tasks/result) against the same
// work as a plain tool, on one streamable-HTTP server that asks to be
// polled every 100 ms while a task works. The work itself is instant, so
// the difference is how soon the registry polls: mcp-go's server names no
// poll interval when it creates a task, so the first tasks/get waits the
// registry's default (500 ms), and finds the task done.
func BenchmarkTaskCall(b *testing.B) {
	hooks := &server.Hooks{}
	hooks.AddAfterGetTask(func(_ context.Context, _ any, _ *mcp.GetTaskRequest, res *mcp.GetTaskResult) {
		if res.Status == mcp.TaskStatusWorking {
			interval := int64(100)
			res.PollInterval = &interval
		}
	})
	m := server.NewMCPServer("tasks", "1.0", server.WithToolCapabilities(true), server.WithTaskCapabilities(true, true, true), server.WithHooks(hooks))
	m.AddTaskTool(mcp.NewTool("work", mcp.WithTaskSupport(mcp.TaskSupportRequired)),
		func(context.Context, mcp.CallToolRequest) (*mcp.CreateTaskResult, error) {
			return &mcp.CreateTaskResult{Content: []mcp.Content{mcp.NewTextContent("done")}}, nil
		})
	m.AddTool(mcp.NewTool("work_plain"), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("done"), nil
	})
	hs := httptest.NewServer(server.NewStreamableHTTPServer(m))
	b.Cleanup(hs.Close)
	cfg := testConfig()
	cfg.HealthInterval = time.Hour
	reg := run(b, newSource(httpSpec(1, hs.URL+"/mcp")), cfg)
	ctx := context.Background()
	for _, tool := range []string{"work_plain", "work"} {
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			_, err := reg.CallTool(ctx, 1, tool, nil, registry.CallOptions{})
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%s: %v", tool, err)
			}
		}
	}
	for _, tool := range []string{"work_plain", "work"} {
		b.Run(tool, func(b *testing.B) {
			var ds []time.Duration
			for b.Loop() {
				var taskID string
				start := time.Now()
				res, err := reg.CallTool(ctx, 1, tool, nil, registry.CallOptions{TaskID: &taskID})
				if err != nil || res.IsError {
					b.Fatalf("%s: %v, %v", tool, res, err)
				}
				ds = append(ds, time.Since(start))
				if (taskID != "") != (tool == "work") {
					b.Fatalf("%s ran with task id %q", tool, taskID)
				}
			}
			slices.Sort(ds)
			b.ReportMetric(float64(ds[len(ds)/2].Microseconds()), "p50-µs")
		})
	}
}
