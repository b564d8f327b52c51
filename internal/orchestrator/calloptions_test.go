package orchestrator_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/llm"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
)

// optionsCaller is a ToolCaller that records the options of each call
// and reports two progress updates through them before it answers.
type optionsCaller struct {
	mu   sync.Mutex
	opts []orchestrator.CallOptions
}

func (o *optionsCaller) CallTool(_ context.Context, _ int64, name string, _ map[string]any, opts orchestrator.CallOptions) (*mcp.CallToolResult, error) {
	o.mu.Lock()
	o.opts = append(o.opts, opts)
	o.mu.Unlock()
	if opts.Progress != nil {
		opts.Progress(orchestrator.Progress{Progress: 1, Total: 2, Message: "half"})
		opts.Progress(orchestrator.Progress{Progress: 2, Total: 2, Message: "all"})
	}
	return mcp.NewToolResultText("ran " + name), nil
}

// A run passes its session to every tool call, and, streamed, a progress
// callback whose updates come as events between the call's started and
// finished events; unstreamed, it asks for no progress.
func TestRunPassesSessionAndProgressToTheToolCaller(t *testing.T) {
	for _, streamed := range []bool{true, false} {
		srv := llmtest.New(t, llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{}`}), llmtest.Answer("Done."))
		model, err := llm.New(llm.Config{BaseURL: srv.URL(), Model: "fake-model", BackoffBase: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		caller := &optionsCaller{}
		agent := orchestrator.New(model, caller, orchestrator.Config{}, nil)
		req := orchestrator.Request{Connector: orchestrator.NewConnector(orchestrator.Profile{ID: 1, WorkspaceID: "acme", ExternalID: "e", Name: "E"},
			[]orchestrator.Tool{{Name: "echo", Description: "Echoes."}}), Query: "Echo.", MaxTools: 5, Session: "alice"}
		var kinds []orchestrator.EventKind
		var progress []orchestrator.Progress
		var emit func(orchestrator.Event)
		if streamed {
			emit = func(e orchestrator.Event) {
				kinds = append(kinds, e.Kind)
				if e.Kind == orchestrator.EventToolCallProgress {
					progress = append(progress, e.Progress)
				}
			}
		}
		if _, err := agent.Run(context.Background(), req, emit); err != nil {
			t.Fatal(err)
		}
		if len(caller.opts) != 1 || caller.opts[0].Session != "alice" {
			t.Fatalf("streamed %v: the tool caller got options %+v, want one call in session alice", streamed, caller.opts)
		}
		if got := caller.opts[0].Progress != nil; got != streamed {
			t.Errorf("streamed %v: the call asked for progress: %v", streamed, got)
		}
		if !streamed {
			continue
		}
		want := []orchestrator.Progress{{Progress: 1, Total: 2, Message: "half"}, {Progress: 2, Total: 2, Message: "all"}}
		if !slices.Equal(progress, want) {
			t.Errorf("progress events %+v, want %+v", progress, want)
		}
		started := slices.Index(kinds, orchestrator.EventToolCallStarted)
		finished := slices.Index(kinds, orchestrator.EventToolCallFinished)
		first := slices.Index(kinds, orchestrator.EventToolCallProgress)
		if started < 0 || first < started || finished < first+2 {
			t.Errorf("events %v: want the progress between the call's started and finished", kinds)
		}
	}
}
