package calls_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/calls"
	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/live/livetest"
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
// tools: echo (read-only), wipe (destructive) and who, which elicits a
// name and says what it got.
func mcpURL(t *testing.T) string {
	t.Helper()
	m := mcpserver.NewMCPServer("calls", "1.0", mcpserver.WithToolCapabilities(true), mcpserver.WithElicitation())
	m.AddTool(mcp.NewTool("echo", mcp.WithString("message"), mcp.WithReadOnlyHintAnnotation(true)),
		func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText(req.GetString("message", "")), nil
		})
	m.AddTool(mcp.NewTool("wipe", mcp.WithDestructiveHintAnnotation(true), mcp.WithReadOnlyHintAnnotation(false)),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
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

// setup runs the live state of one READY per-session connector "c" of
// workspace "ws" on a real server, with cfg's settings, and a Service
// over it; opts change its Deps.
func setup(t *testing.T, cfg store.Config, opts ...func(*calls.Deps)) *calls.Service {
	t.Helper()
	db := storetest.NewDB(t)
	reg, lv := livetest.Run(t, db)
	ctx := context.Background()

	cfg.URL, cfg.CallTimeout, cfg.SessionMode, cfg.Elicitation = mcpURL(t), store.Duration(20*time.Second), registry.SessionPerSession, true
	row, err := db.CreateConnector(ctx, &store.Connector{WorkspaceID: "ws", ExternalID: "c", Name: "The C", Active: true,
		Transport: store.TransportStreamableHTTP, Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	lv.Apply(ctx, row)
	d := calls.Deps{Registry: reg, Live: lv, Store: db, Limits: calls.Limits{Limiter: ratelimit.New(ratelimit.Config{})},
		Counters: runs.NewCounters(db, time.Second, nil, nil), Asks: &pending.Table{}}
	for _, o := range opts {
		o(&d)
	}
	svc := calls.New(d)
	// READY: a call goes through.
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := svc.Call(ctx, calls.Request{WorkspaceID: "ws", ConnectorID: "c", Tool: "echo", SessionID: "warm"})
		if err == nil {
			return svc
		}
		if time.Now().After(deadline) {
			t.Fatalf("connector not callable within 20s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func text(t *testing.T, res *calls.Result) string {
	t.Helper()
	if len(res.Content) != 1 {
		t.Fatalf("content %+v; want one text", res.Content)
	}
	tc, ok := mcp.AsTextContent(res.Content[0])
	if !ok {
		t.Fatalf("content %+v; want text", res.Content[0])
	}
	return tc.Text
}

func TestCallRunsOnTheSessionsConnection(t *testing.T) {
	svc := setup(t, store.Config{})
	res, err := svc.Call(context.Background(), calls.Request{WorkspaceID: "ws", ConnectorID: "c", Tool: "echo",
		Args: map[string]any{"message": "hi"}, SessionID: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	if got := text(t, res); got != "hi" || res.ConnectorName != "The C" || res.Duration <= 0 {
		t.Errorf("result %q, connector %q, duration %v", got, res.ConnectorName, res.Duration)
	}
	_, err = svc.Call(context.Background(), calls.Request{WorkspaceID: "ws", ConnectorID: "nope", Tool: "echo", SessionID: "s1"})
	if !errors.Is(err, store.ErrConnectorNotFound) {
		t.Errorf("a call of an unknown connector = %v, want store.ErrConnectorNotFound", err)
	}
}

func TestCallNeedsApprovalUnderThePolicy(t *testing.T) {
	svc := setup(t, store.Config{ApprovalPolicy: live.PolicyDestructive})
	req := calls.Request{WorkspaceID: "ws", ConnectorID: "c", Tool: "wipe", SessionID: "s1"}
	_, err := svc.Call(context.Background(), req)
	var approval *calls.ApprovalRequiredError
	if !errors.As(err, &approval) || approval.Tool != "wipe" {
		t.Fatalf("an unapproved destructive call = %v, want ApprovalRequiredError naming wipe", err)
	}
	req.UserApproved = true
	if res, err := svc.Call(context.Background(), req); err != nil || text(t, res) != "wiped" {
		t.Fatalf("the approved call = %v, %v", res, err)
	}
}

func TestCallOverTheRateLimit(t *testing.T) {
	svc := setup(t, store.Config{RateLimit: &store.RateLimit{RequestsPerSecond: 0.01, Burst: 1}})
	// The warm-up call of setup took the only token.
	_, err := svc.Call(context.Background(), calls.Request{WorkspaceID: "ws", ConnectorID: "c", Tool: "echo", SessionID: "s1"})
	var limited *calls.RateLimitedError
	if !errors.As(err, &limited) || limited.Limit.Burst != 1 {
		t.Fatalf("a call over the limit = %v, want RateLimitedError", err)
	}
}

// A server's question reaches a caller that can carry it, and the answer
// given through the service reaches the server; a caller that cannot
// has it answered cancel, and listed.
func TestServersQuestionAnswered(t *testing.T) {
	svc := setup(t, store.Config{})
	asked := make(chan orchestrator.Input, 1)
	req := calls.Request{WorkspaceID: "ws", ConnectorID: "c", Tool: "who", SessionID: "s1",
		Ask: func(name string, in orchestrator.Input) {
			if name != "The C" || in.Tool != "who" {
				t.Errorf("asked by %q about %q", name, in.Tool)
			}
			asked <- in
		}}
	type outcome struct {
		res *calls.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() { res, err := svc.Call(context.Background(), req); done <- outcome{res, err} }()
	var in orchestrator.Input
	select {
	case in = <-asked:
	case <-time.After(20 * time.Second):
		t.Fatal("no question within 20s")
	}
	if _, ok := svc.Pending("ws", "c", "other-session", "", in.ID); ok {
		t.Error("another session sees the question")
	}
	if _, ok := svc.Pending("ws", "c", "s1", "", in.ID); !ok {
		t.Fatal("the question does not wait for an answer")
	}
	if err := svc.Answer("ws", "c", "s1", "", in.ID, ask.Answer{Action: ask.Accept, Content: map[string]any{"name": "Ada"}}); err != nil {
		t.Fatal(err)
	}
	out := <-done
	if out.err != nil || text(t, out.res) != `accept {"name":"Ada"}` {
		t.Fatalf("call = %v, %v", out.res, out.err)
	}
	if err := svc.Answer("ws", "c", "s1", "", in.ID, ask.Answer{Action: ask.Decline}); !errors.Is(err, pending.ErrNotOpen) {
		t.Errorf("a second answer = %v, want ErrNotOpen", err)
	}

	req.Ask = nil
	res, err := svc.Call(context.Background(), req)
	if err != nil || text(t, res) != "cancel null" || len(res.Cancelled) != 1 || res.Cancelled[0].Message != "Who are you?" {
		t.Fatalf("a unary call = %+v, %v; want it cancelled and listed", res, err)
	}
}

// Arguments over MaxArgumentsBytes are refused before the call, a result
// over MaxResultBytes after it; the errors name sizes and limits only.
func TestCallSizeLimits(t *testing.T) {
	svc := setup(t, store.Config{}, func(d *calls.Deps) { d.MaxArgumentsBytes, d.MaxResultBytes = 100, 50 })
	req := calls.Request{WorkspaceID: "ws", ConnectorID: "c", Tool: "echo", SessionID: "s1", ArgumentsBytes: 101}
	_, err := svc.Call(context.Background(), req)
	var args *calls.ArgumentsTooLargeError
	if !errors.As(err, &args) || err.Error() != "the arguments are 101 bytes, over the limit of 100 bytes (MAX_TOOL_ARGUMENTS_BYTES)" {
		t.Fatalf("arguments over the limit = %v, want ArgumentsTooLargeError", err)
	}
	req.ArgumentsBytes, req.Args = 100, map[string]any{"message": strings.Repeat("x", 51)}
	_, err = svc.Call(context.Background(), req)
	var res *calls.ResultTooLargeError
	if !errors.As(err, &res) || res.Size != 51 || res.Limit != 50 || strings.Contains(err.Error(), "xxx") {
		t.Fatalf("a result over the limit = %v, want ResultTooLargeError of 51 bytes", err)
	}
	req.Args = map[string]any{"message": strings.Repeat("x", 50)}
	if out, err := svc.Call(context.Background(), req); err != nil || text(t, out) != strings.Repeat("x", 50) {
		t.Fatalf("a result at the limit = %v, %v", out, err)
	}
	if svc.CheckResultBytes(50) != nil || svc.CheckResultBytes(51) == nil {
		t.Error("CheckResultBytes does not hold the limit")
	}
	if msg := (&calls.ResultTooLargeError{Limit: 50}).Error(); !strings.HasPrefix(msg,
		"the tool result is over the limit of 50 bytes (MAX_TOOL_RESULT_BYTES) and was not read; ask the tool for less") {
		t.Errorf("a result the registry did not read says %q", msg)
	}
}

func TestResultSize(t *testing.T) {
	res := &mcp.CallToolResult{Content: []mcp.Content{mcp.NewTextContent("four"),
		mcp.NewImageContent(base64.StdEncoding.EncodeToString(make([]byte, 12)), "image/png")},
		StructuredContent: map[string]any{"a": 1}}
	if n := calls.ResultSize(res); n != 4+12+len(`{"a":1}`) {
		t.Errorf("ResultSize = %d, want %d", n, 4+12+len(`{"a":1}`))
	}
}

// An answer to a question that does not wait here says so, naming it.
func TestAnswerInputNotWaiting(t *testing.T) {
	svc := setup(t, store.Config{})
	err := svc.AnswerInput(calls.AnswerRequest{WorkspaceID: "ws", ConnectorID: "c", SessionID: "s1",
		Answer: queries.Answer{InputID: "in-1", Action: ask.Accept}})
	var nf *calls.InputNotFoundError
	if !errors.As(err, &nf) || err.Error() != `no input request "in-1" waits for an answer on this connector, session and user: `+
		"it was answered, its deadline passed, or its call ended" {
		t.Fatalf("an answer nobody waits for = %v, want InputNotFoundError", err)
	}
	if msg := (&calls.InputNotFoundError{ID: "in-1", Meanwhile: true}).Error(); msg !=
		`input request "in-1" was answered, or its deadline passed, meanwhile` {
		t.Errorf("meanwhile says %q", msg)
	}
}
