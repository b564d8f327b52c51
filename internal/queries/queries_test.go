package queries_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/calls"
	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/live/livetest"
	"github.com/connector-svc/connector-svc/internal/llm"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/pending"
	"github.com/connector-svc/connector-svc/internal/queries"
	"github.com/connector-svc/connector-svc/internal/ratelimit"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/runs"
	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

func TestMain(m *testing.M) { storetest.Main(m) }

// mcpURL serves a real mcp-go server over streamable HTTP with three
// tools: echo (read-only), wipe (destructive, and it counts its runs in
// wiped) and who (read-only), which elicits a name and says what it got.
func mcpURL(t *testing.T, wiped *atomic.Int32) string {
	t.Helper()
	m := mcpserver.NewMCPServer("queries", "1.0", mcpserver.WithToolCapabilities(true), mcpserver.WithElicitation())
	m.AddTool(mcp.NewTool("echo", mcp.WithString("message"), mcp.WithReadOnlyHintAnnotation(true)),
		func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText(req.GetString("message", "")), nil
		})
	m.AddTool(mcp.NewTool("wipe", mcp.WithDestructiveHintAnnotation(true), mcp.WithReadOnlyHintAnnotation(false)),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			wiped.Add(1)
			return mcp.NewToolResultText("wiped"), nil
		})
	m.AddTool(mcp.NewTool("who", mcp.WithReadOnlyHintAnnotation(true)), func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		res, err := mcpserver.ServerFromContext(ctx).RequestElicitation(ctx, mcp.ElicitationRequest{Params: mcp.ElicitationParams{
			Message: "Who are you?", RequestedSchema: map[string]any{"type": "object",
				"properties": map[string]any{"name": map[string]any{"type": "string"}}}}})
		if err != nil {
			return nil, err
		}
		b, _ := json.Marshal(res.Content)
		return mcp.NewToolResultText(fmt.Sprintf("%s %s", res.Action, b)), nil
	})
	hs := httptest.NewServer(mcpserver.NewStreamableHTTPServer(m))
	t.Cleanup(hs.Close)
	return hs.URL + "/mcp"
}

// toolCaller runs the agent's tool calls with the registry.
type toolCaller struct{ reg *registry.Registry }

func (c toolCaller) CallTool(ctx context.Context, id int64, name string, args map[string]any, o orchestrator.CallOptions) (*mcp.CallToolResult, error) {
	return c.reg.CallTool(ctx, id, name, args, registry.CallOptions{Session: o.Session, UserID: o.UserID, Retry: o.Retry, TaskID: o.TaskID})
}

// noLimits admits every run.
type noLimits struct{}

func (noLimits) Admit(context.Context, *store.Connector) error         { return nil }
func (noLimits) Throttle(*store.Connector) func(context.Context) error { return nil }
func noEvents() func(orchestrator.Event)                               { return nil }
func wantNoError(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
func ctx(t *testing.T) context.Context { t.Helper(); return t.Context() }

type fixture struct {
	svc   *queries.Service
	db    *store.DB
	log   *runs.Log // running: it writes the finished runs
	wiped atomic.Int32
}

// setup runs the live state of one READY per-session connector "c" of
// workspace "ws" (approval policy destructive, elicitation on) on a real
// server, and a Service over it whose model answers with steps.
func setup(t *testing.T, steps ...llmtest.Step) *fixture {
	t.Helper()
	f := &fixture{db: storetest.NewDB(t)}
	reg, lv := livetest.Run(t, f.db)
	runCtx := t.Context()
	cfg := store.Config{URL: mcpURL(t, &f.wiped), CallTimeout: store.Duration(20 * time.Second), SessionMode: registry.SessionPerSession,
		Elicitation: true, ApprovalPolicy: live.PolicyDestructive}
	row, err := f.db.CreateConnector(runCtx, &store.Connector{WorkspaceID: "ws", ExternalID: "c", Name: "The C", Active: true,
		Transport: store.TransportStreamableHTTP, Config: cfg})
	wantNoError(t, err)
	lv.Apply(runCtx, row)
	model, err := llm.New(llm.Config{BaseURL: llmtest.New(t, steps...).URL(), APIKey: "k", Model: "fake-model", MaxRetries: 1,
		BackoffBase: time.Millisecond})
	wantNoError(t, err)
	logger := slog.New(slog.DiscardHandler)
	counters := runs.NewCounters(f.db, time.Second, nil, logger)
	asks := &pending.Table{}
	lookup := calls.New(calls.Deps{Registry: reg, Live: lv, Store: f.db, Limits: calls.Limits{Limiter: ratelimit.New(ratelimit.Config{})}, Counters: counters,
		Asks: asks})
	f.log = runs.NewLog(f.db, runs.Config{Replica: "r1", Logger: logger})
	logCtx, stopLog := context.WithCancel(context.Background())
	logDone := make(chan error, 1)
	go func() { logDone <- f.log.Run(logCtx) }()
	t.Cleanup(func() { stopLog(); <-logDone })
	f.svc = queries.New(queries.Deps{Agent: orchestrator.New(model, toolCaller{reg}, orchestrator.Config{}, logger), Registry: reg,
		Live: lv, Connectors: lookup, Runs: f.db, Log: f.log,
		Counters: counters, Limits: noLimits{}, Asks: asks, QueryTimeout: 30 * time.Second,
		ApprovalTimeout: time.Hour, Logger: logger})
	// READY: a call goes through.
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := lookup.Call(runCtx, calls.Request{WorkspaceID: "ws", ConnectorID: "c", Tool: "echo", SessionID: "warm"})
		if err == nil {
			return f
		}
		if time.Now().After(deadline) {
			t.Fatalf("connector not callable within 20s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// start runs query on "c" in session s1.
func (f *fixture) start(t *testing.T, query string, emit func(orchestrator.Event)) *queries.Outcome {
	t.Helper()
	out, err := f.svc.Start(ctx(t), queries.Start{WorkspaceID: "ws", ConnectorID: "c", Query: query, SessionID: "s1"}, emit)
	wantNoError(t, err)
	return out
}

// wantStored checks run id reads status, here and on another replica.
func (f *fixture) wantStored(t *testing.T, id, status string) {
	t.Helper()
	run, err := f.log.GetRun(ctx(t), "ws", id) // what GetQueryRun reads
	wantNoError(t, err)
	if run.Status != status {
		t.Errorf("run %s reads %s, want %s", id, run.Status, status)
	}
	// And another replica, which reads the store (waiting for the row of a
	// run finished a moment ago).
	run, err = runs.NewLog(f.db, runs.Config{Replica: "r2"}).GetRun(ctx(t), "ws", id)
	wantNoError(t, err)
	if run.Status != status {
		t.Errorf("run %s is stored %s, want %s", id, run.Status, status)
	}
}

// lastCall is the last step's last call of res.
func lastCall(t *testing.T, res *orchestrator.Result) orchestrator.Call {
	t.Helper()
	if len(res.Steps) == 0 || len(res.Steps[len(res.Steps)-1].Calls) == 0 {
		t.Fatalf("no call in %+v", res.Steps)
	}
	st := res.Steps[len(res.Steps)-1]
	return st.Calls[len(st.Calls)-1]
}

// A query runs the model and its tool calls to an answer: the outcome
// carries the run and the connector, the events reach the caller, and the
// run is readable, here and on every replica, once the caller hears of it.
func TestQueryCompletes(t *testing.T) {
	f := setup(t, llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"message":"pong"}`}), llmtest.Answer("It said pong."))
	var mu sync.Mutex
	var kinds []orchestrator.EventKind
	out := f.start(t, "ping", func(e orchestrator.Event) { mu.Lock(); kinds = append(kinds, e.Kind); mu.Unlock() })
	if out.Result.Status != orchestrator.StatusCompleted || out.Result.Answer != "It said pong." || out.RunID == "" ||
		out.Connector.ExternalID != "c" || out.ExpiresAt != nil {
		t.Fatalf("outcome %+v, result %+v", out, out.Result)
	}
	if c := lastCall(t, out.Result); c.Tool != "echo" || !strings.Contains(c.ResultExcerpt, "pong") {
		t.Errorf("call %+v", c)
	}
	f.wantStored(t, out.RunID, store.RunCompleted)
	mu.Lock()
	defer mu.Unlock()
	finished := false
	for _, k := range kinds {
		finished = finished || k == orchestrator.EventToolCallFinished
	}
	if !finished {
		t.Errorf("events %v: no tool call finished", kinds)
	}
	_, err := f.svc.Start(ctx(t), queries.Start{WorkspaceID: "ws", ConnectorID: "c", Query: "ping"}, nil)
	if !errors.Is(err, registry.ErrSessionRequired) {
		t.Errorf("a query of a per_session connector without a session = %v, want ErrSessionRequired", err)
	}
}

// A query whose model asks for a destructive tool pauses before it, with
// the call to decide; an approval resumes it, the call runs once, and
// the pause cannot be decided twice.
func TestQueryPausesForApprovalAndResumes(t *testing.T) {
	f := setup(t, llmtest.CallTools(llmtest.Call{Tool: "wipe", Args: `{}`}), llmtest.Answer("Wiped."))
	out := f.start(t, "wipe it", noEvents())
	if out.Result.Status != orchestrator.StatusAwaitingApproval || len(out.Result.Pending) != 1 || out.ExpiresAt == nil {
		t.Fatalf("outcome %+v, result %+v; want a pause for one call", out, out.Result)
	}
	f.wantStored(t, out.RunID, store.RunAwaitingApproval)
	if f.wiped.Load() != 0 {
		t.Fatal("the gated call ran before its approval")
	}
	call := out.Result.Pending[0].Call
	resume := queries.Resume{WorkspaceID: "ws", RunID: out.RunID, ActorID: "ada"}
	_, err := f.svc.Resume(ctx(t), resume, nil)
	var invalid *queries.InvalidError
	if !errors.As(err, &invalid) || invalid.Violations[0].Field != "decisions" {
		t.Fatalf("a resume without decisions = %v, want InvalidError naming decisions", err)
	}
	resume.Decisions = []queries.Decision{{CallID: call.ID, Kind: orchestrator.Approve, Message: "go"}}
	res, err := f.svc.Resume(ctx(t), resume, nil)
	wantNoError(t, err)
	if res.Result.Status != orchestrator.StatusCompleted || res.Result.Answer != "Wiped." || res.RunID != out.RunID || f.wiped.Load() != 1 {
		t.Fatalf("resumed %+v, result %+v, wiped %d times", res, res.Result, f.wiped.Load())
	}
	if c := lastCall(t, res.Result); c.Decision == nil || c.Decision.Actor != "ada" || c.Decision.Kind != orchestrator.Approve {
		t.Errorf("the call's decision %+v", c.Decision)
	}
	f.wantStored(t, out.RunID, store.RunCompleted)
	_, err = f.svc.Resume(ctx(t), resume, nil)
	var notAwaiting *queries.RunNotAwaitingError
	if !errors.As(err, &notAwaiting) {
		t.Errorf("a second resume = %v, want RunNotAwaitingError", err)
	}
}

// A server's question in the middle of a run's tool call pauses the run
// live: its caller gets the question at once, the row says it waits, and
// the answer given through Resume reaches the server on the open call.
func TestLiveInputAnswered(t *testing.T) {
	f := setup(t, llmtest.CallTools(llmtest.Call{Tool: "who", Args: `{}`}), llmtest.Answer("You are Ada."))
	out := f.start(t, "who am I?", noEvents())
	if out.Result.Status != orchestrator.StatusAwaitingInput || len(out.Result.Inputs) != 1 {
		t.Fatalf("outcome %+v, result %+v; want a live pause for one input", out, out.Result)
	}
	in := out.Result.Inputs[0]
	if in.Message != "Who are you?" || in.Mode != ask.ModeForm || in.Durable {
		t.Fatalf("input %+v", in)
	}
	f.wantStored(t, out.RunID, store.RunAwaitingInput)
	resume := queries.Resume{WorkspaceID: "ws", RunID: out.RunID, ActorID: "ada",
		Inputs: []queries.Answer{{InputID: in.ID, Action: ask.Accept, Content: map[string]any{"name": 7}}}}
	_, err := f.svc.Resume(ctx(t), resume, nil)
	var invalid *queries.InvalidError
	if !errors.As(err, &invalid) || invalid.Violations[0].Field != "inputs[0].content" {
		t.Fatalf("an answer off the schema = %v, want InvalidError naming inputs[0].content", err)
	}
	resume.Inputs[0].Content = map[string]any{"name": "Ada"}
	res, err := f.svc.Resume(ctx(t), resume, nil)
	wantNoError(t, err)
	if res.Result.Status != orchestrator.StatusCompleted || res.Result.Answer != "You are Ada." {
		t.Fatalf("resumed %+v, result %+v", res, res.Result)
	}
	if c := lastCall(t, res.Result); c.Tool != "who" || !strings.Contains(c.ResultExcerpt, `accept {\"name\":\"Ada\"}`) &&
		!strings.Contains(c.ResultExcerpt, `accept {"name":"Ada"}`) {
		t.Errorf("call %+v: the server did not get the answer", c)
	}
	f.wantStored(t, out.RunID, store.RunCompleted)
	_, err = f.svc.Resume(ctx(t), resume, nil)
	var notAwaiting *queries.RunNotAwaitingInputError
	if !errors.As(err, &notAwaiting) {
		t.Errorf("a second answer = %v, want RunNotAwaitingInputError", err)
	}
}
