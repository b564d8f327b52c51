package orchestrator_test

import (
	"context"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/llm"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
)

// restarting is a ToolCaller whose calls run on a new MCP session.
type restarting struct{ *tools }

func (r restarting) CallTool(ctx context.Context, id int64, name string, args map[string]any, opts orchestrator.CallOptions) (*mcp.CallToolResult, error) {
	if opts.Restarted != nil {
		*opts.Restarted = true
	}
	return r.tools.CallTool(ctx, id, name, args, opts)
}

// TestSessionRestartedReachesTheResult: a tool call that ran on a new MCP
// session makes the run's result say so, as a CallTool's response does
// (issue 27: QueryResult had no session_restarted).
func TestSessionRestartedReachesTheResult(t *testing.T) {
	for _, restart := range []bool{false, true} {
		srv := llmtest.New(t, llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"ping"}`}), llmtest.Answer("ping"))
		model, err := llm.New(llm.Config{BaseURL: srv.URL(), Model: "fake-model", BackoffBase: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		tc, catalog := newTools(t)
		var caller orchestrator.ToolCaller = tc
		if restart {
			caller = restarting{tc}
		}
		agent := orchestrator.New(model, caller, orchestrator.Config{ResultLimit: 1000}, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		res, err := agent.Run(ctx, orchestrator.Request{Connector: orchestrator.NewConnector(orchestrator.Profile{ID: 1, Name: "Shop"}, catalog),
			Query: "echo ping", MaxTools: 10, Session: "alice"}, nil)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if res.SessionRestarted != restart {
			t.Errorf("a run whose call restarted its session: %v; SessionRestarted = %v", restart, res.SessionRestarted)
		}
	}
}
