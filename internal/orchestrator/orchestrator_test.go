package orchestrator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
	openai "github.com/sashabaranov/go-openai"

	"github.com/connector-svc/connector-svc/internal/llm"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
)

// tools is a ToolCaller backed by a real mcp-go server, reached through
// mcp-go's in-process client. It counts calls per tool.
type tools struct {
	c     *client.Client
	mu    sync.Mutex
	calls map[string][]map[string]any
	panic bool
}

func (m *tools) CallTool(ctx context.Context, _ int64, name string, args map[string]any, _ orchestrator.CallOptions) (*mcp.CallToolResult, error) {
	if m.panic {
		panic("tool caller bug")
	}
	m.mu.Lock()
	m.calls[name] = append(m.calls[name], args)
	m.mu.Unlock()
	var req mcp.CallToolRequest
	req.Params.Name, req.Params.Arguments = name, args
	return m.c.CallTool(ctx, req)
}

func (m *tools) count(name string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.calls[name])
}

func (m *tools) total() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, c := range m.calls {
		n += len(c)
	}
	return n
}

// barrier lets the "together" tool prove that calls overlap: each call
// waits until three have started.
type barrier struct {
	mu      sync.Mutex
	started int
	all     chan struct{}
}

func newTools(t *testing.T) (*tools, []orchestrator.Tool) {
	t.Helper()
	s := server.NewMCPServer("test", "1.0")
	b := &barrier{all: make(chan struct{})}
	add := func(tool mcp.Tool, h server.ToolHandlerFunc) { s.AddTool(tool, h) }
	add(mcp.NewTool("echo", mcp.WithDescription("Echoes text"), mcp.WithString("text", mcp.Required())),
		func(_ context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText(r.GetString("text", "")), nil
		})
	add(mcp.NewTool("lookup_user", mcp.WithDescription("Finds a user id by name"), mcp.WithString("name", mcp.Required())),
		func(_ context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText("user " + r.GetString("name", "") + " has id 42"), nil
		})
	add(mcp.NewTool("get_orders", mcp.WithDescription("Lists a user's orders"), mcp.WithString("user_id", mcp.Required())),
		func(_ context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultStructured(map[string]any{"user_id": r.GetString("user_id", ""), "orders": 3}, "3 orders"), nil
		})
	add(mcp.NewTool("charge", mcp.WithDescription("Charges a user's card"), mcp.WithNumber("user_id", mcp.Required()),
		mcp.WithNumber("cents", mcp.Required())),
		func(_ context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText(fmt.Sprintf("charged %v cents", r.GetArguments()["cents"])), nil
		})
	add(mcp.NewTool("together", mcp.WithDescription("Waits for two others")),
		func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			b.mu.Lock()
			b.started++
			if b.started == 3 {
				close(b.all)
			}
			b.mu.Unlock()
			select {
			case <-b.all:
				return mcp.NewToolResultText("overlapped"), nil
			case <-time.After(10 * time.Second):
				return mcp.NewToolResultText("ran alone"), nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		})
	add(mcp.NewTool("fail", mcp.WithDescription("Always fails")),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultError("the backend said no"), nil
		})
	add(mcp.NewTool("big", mcp.WithDescription("Returns a lot")),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText(strings.Repeat("x", 20000)), nil
		})
	add(mcp.NewTool("block", mcp.WithDescription("Never returns")),
		func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		})

	c, err := client.NewInProcessClient(s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var init mcp.InitializeRequest
	init.Params.ClientInfo = mcp.Implementation{Name: "test", Version: "1"}
	if _, err := c.Initialize(ctx, init); err != nil {
		t.Fatal(err)
	}
	list, err := c.ListTools(ctx, mcp.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var catalog []orchestrator.Tool
	for _, tool := range list.Tools {
		schema, _ := json.Marshal(tool.InputSchema)
		catalog = append(catalog, orchestrator.Tool{Name: tool.Name, Description: tool.Description, InputSchema: schema})
	}
	return &tools{c: c, calls: map[string][]map[string]any{}}, catalog
}

type fixture struct {
	llm     *llmtest.Server
	tools   *tools
	catalog []orchestrator.Tool // the server's tools, as the connector was made of them
	agent   *orchestrator.Agent
	req     orchestrator.Request
}

func setup(t *testing.T, steps ...llmtest.Step) *fixture {
	t.Helper()
	srv := llmtest.New(t, steps...)
	model, err := llm.New(llm.Config{BaseURL: srv.URL(), Model: "fake-model", BackoffBase: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	tc, catalog := newTools(t)
	return &fixture{
		llm: srv, tools: tc, catalog: catalog,
		agent: orchestrator.New(model, tc, orchestrator.Config{ResultLimit: 1000}, nil),
		req: orchestrator.Request{Connector: orchestrator.NewConnector(orchestrator.Profile{ID: 1, Name: "Shop", Description: "The shop's backend."}, catalog),
			Query: "How many orders does Ada have?", MaxTools: 10},
	}
}

func (f *fixture) run(t *testing.T) (*orchestrator.Result, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return f.agent.Run(ctx, f.req, nil)
}

// toolMessages returns the tool messages of a request to the model.
func toolMessages(req openai.ChatCompletionRequest) []openai.ChatCompletionMessage {
	var out []openai.ChatCompletionMessage
	for _, m := range req.Messages {
		if m.Role == openai.ChatMessageRoleTool {
			out = append(out, m)
		}
	}
	return out
}

func TestOneToolThenAnswer(t *testing.T) {
	f := setup(t, llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"ping"}`}), llmtest.Answer("It said ping (echo)."))
	f.req.Context = "The user is testing."
	res, err := f.run(t)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != orchestrator.StatusCompleted || res.Answer != "It said ping (echo)." || !slices.Equal(res.ToolsUsed, []string{"echo"}) {
		t.Fatalf("result = %+v", res)
	}
	if len(res.Steps) != 1 || res.Steps[0].Calls[0].ResultExcerpt != "ping" || res.Usage.TotalTokens != 240 {
		t.Errorf("steps = %+v, usage = %+v", res.Steps, res.Usage)
	}
	reqs := f.llm.Requests()
	first := reqs[0]
	if first.Messages[0].Role != "system" || !strings.Contains(first.Messages[0].Content, "- echo: Echoes text") ||
		!strings.Contains(first.Messages[0].Content, "Shop") {
		t.Errorf("system prompt = %q", first.Messages[0].Content)
	}
	if first.Messages[1].Content != "Context:\nThe user is testing.\n\nQuery:\nHow many orders does Ada have?" {
		t.Errorf("user message = %q", first.Messages[1].Content)
	}
	if len(first.Tools) != len(f.req.Connector.Tools()) || first.Tools[0].Function.Parameters == nil {
		t.Errorf("offered %d tools, want %d with schemas", len(first.Tools), len(f.req.Connector.Tools()))
	}
	tm := toolMessages(reqs[1])
	if len(tm) != 1 || tm[0].ToolCallID != "call_1" || tm[0].Content != "ping" {
		t.Errorf("tool messages sent back = %+v", tm)
	}
}

func TestDependentToolsInSequence(t *testing.T) {
	f := setup(t,
		llmtest.CallTools(llmtest.Call{Tool: "lookup_user", Args: `{"name":"ada"}`}),
		// The second call uses what the first returned.
		func(req openai.ChatCompletionRequest) llmtest.Reply {
			tm := toolMessages(req)
			id := strings.TrimPrefix(tm[len(tm)-1].Content, "user ada has id ")
			return llmtest.CallTools(llmtest.Call{Tool: "get_orders", Args: fmt.Sprintf(`{"user_id":%q}`, id)})(req)
		},
		llmtest.Answer("Ada has 3 orders."))
	res, err := f.run(t)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.ToolsUsed, []string{"lookup_user", "get_orders"}) || len(res.Steps) != 2 {
		t.Fatalf("tools used = %v, steps = %d", res.ToolsUsed, len(res.Steps))
	}
	if got := f.tools.calls["get_orders"][0]["user_id"]; got != "42" {
		t.Errorf("get_orders got user_id %v, want the 42 lookup_user returned", got)
	}
	if len(res.Contexts) != 1 || res.Contexts[0].StructuredContent["orders"] != float64(3) {
		t.Errorf("contexts = %+v", res.Contexts)
	}
}

func TestIndependentToolsRunConcurrently(t *testing.T) {
	f := setup(t, llmtest.CallTools(
		llmtest.Call{Tool: "together", Args: `{}`}, llmtest.Call{Tool: "together", Args: `{}`}, llmtest.Call{Tool: "together", Args: `{}`}),
		llmtest.Answer("done"))
	res, err := f.run(t)
	if err != nil {
		t.Fatal(err)
	}
	// Each call waits until all three have started: run one by one, they
	// would each wait alone.
	for _, c := range res.Steps[0].Calls {
		if c.ResultExcerpt != "overlapped" {
			t.Errorf("call %s: %q; the three calls of one turn did not run concurrently", c.ID, c.ResultExcerpt)
		}
	}
	tm := toolMessages(f.llm.Requests()[1])
	if len(tm) != 3 || tm[0].ToolCallID != "call_1" || tm[2].ToolCallID != "call_3" {
		t.Errorf("tool messages out of call order: %+v", tm)
	}
}

func TestHallucinatedToolAndInvalidArgumentsAreCorrected(t *testing.T) {
	f := setup(t,
		llmtest.CallTools(llmtest.Call{Tool: "delete_everything", Args: `{}`}, llmtest.Call{Tool: "echo", Args: `{"txt":"typo"}`}),
		llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"fixed"}`}),
		llmtest.Answer("fixed"))
	res, err := f.run(t)
	if err != nil {
		t.Fatal(err)
	}
	first := res.Steps[0].Calls
	if !strings.Contains(first[0].RejectedReason, `no tool "delete_everything"`) || !strings.Contains(first[1].RejectedReason, "invalid arguments") {
		t.Errorf("rejections = %q, %q", first[0].RejectedReason, first[1].RejectedReason)
	}
	tm := toolMessages(f.llm.Requests()[1])
	if !strings.HasPrefix(tm[0].Content, "Error: there is no tool") || !strings.Contains(tm[1].Content, "text") {
		t.Errorf("the model was not told what was wrong: %q / %q", tm[0].Content, tm[1].Content)
	}
	if f.tools.total() != 1 || f.tools.calls["echo"][0]["text"] != "fixed" {
		t.Errorf("tools ran %v; want only the corrected echo", f.tools.calls)
	}
	if !slices.Equal(res.ToolsUsed, []string{"echo"}) {
		t.Errorf("tools used = %v", res.ToolsUsed)
	}
}

func TestToolErrorIsShownToTheModel(t *testing.T) {
	f := setup(t, llmtest.CallTools(llmtest.Call{Tool: "fail", Args: `{}`}), llmtest.Answer("The backend refused."))
	res, err := f.run(t)
	if err != nil {
		t.Fatal(err)
	}
	if c := res.Steps[0].Calls[0]; !c.IsError || c.RejectedReason != "" {
		t.Errorf("call = %+v; want a tool error, not a rejection", c)
	}
	if tm := toolMessages(f.llm.Requests()[1]); tm[0].Content != "Error: the backend said no" {
		t.Errorf("tool message = %q", tm[0].Content)
	}
}

func TestBudgetForcesSynthesis(t *testing.T) {
	f := setup(t,
		llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"1"}`}, llmtest.Call{Tool: "echo", Args: `{"text":"2"}`},
			llmtest.Call{Tool: "echo", Args: `{"text":"3"}`}),
		llmtest.Answer("forced"))
	f.req.MaxTools = 2
	res, err := f.run(t)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != orchestrator.StatusBudgetExhausted || res.Answer != "forced" {
		t.Errorf("result = %+v", res)
	}
	if n := f.tools.count("echo"); n != 2 {
		t.Errorf("echo ran %d times with a budget of 2", n)
	}
	if !strings.Contains(res.Steps[0].Calls[2].RejectedReason, "budget") {
		t.Errorf("third call = %+v", res.Steps[0].Calls[2])
	}
	// The forced answer offers no tool at all: a model that ignores
	// tool_choice (Ollama) cannot call one.
	last := f.llm.Requests()[1]
	if last.ToolChoice != nil || len(last.Tools) != 0 {
		t.Errorf("synthesis request offers %d tools, tool_choice %v; want none", len(last.Tools), last.ToolChoice)
	}
}

// A model that ignores tool_choice and answers the forced final request
// with tool calls and no text: the calls do not run, and the caller gets an
// answer that says so, with the results the run got, never an empty one.
func TestForcedAnswerWithToolCallsIsNeverEmpty(t *testing.T) {
	f := setup(t,
		llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"ping"}`}),
		llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"again"}`}))
	f.req.MaxTools = 1
	res, err := f.run(t)
	if err != nil {
		t.Fatal(err)
	}
	if n := f.tools.count("echo"); n != 1 {
		t.Errorf("echo ran %d times, want 1", n)
	}
	if res.Status != orchestrator.StatusBudgetExhausted || !strings.HasPrefix(res.Answer, "[no answer: the model returned no text]") ||
		!strings.Contains(res.Answer, "echo (result): ping") {
		t.Errorf("result = %q (%v)", res.Answer, res.Status)
	}
}

// A model that answers with nothing at all, tool use or not.
func TestEmptyAnswerIsNeverPassedOn(t *testing.T) {
	f := setup(t, llmtest.Answer(""))
	res, err := f.run(t)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != orchestrator.StatusCompleted || res.Answer != "[no answer: the model returned no text] No tool was called." {
		t.Errorf("answer = %q", res.Answer)
	}
}

// A connector with no enabled tool: no tools and no tool_choice are sent
// (some endpoints refuse a tool_choice without tools), and the prompt says
// there is none.
func TestNoEnabledToolsSendsNoToolChoice(t *testing.T) {
	f := setup(t, llmtest.Answer("I have no tool for that."))
	f.req.Connector = orchestrator.NewConnector(f.req.Connector.Profile, nil)
	res, err := f.run(t)
	if err != nil || res.Answer != "I have no tool for that." {
		t.Fatalf("Run = %+v, %v", res, err)
	}
	req := f.llm.Requests()[0]
	if req.ToolChoice != nil || len(req.Tools) != 0 {
		t.Errorf("request offers %d tools, tool_choice %v", len(req.Tools), req.ToolChoice)
	}
	if !strings.Contains(req.Messages[0].Content, "no enabled tools") {
		t.Errorf("system prompt = %q", req.Messages[0].Content)
	}
}

// The tokens of a run that fails are still the run's: the result that
// comes with the error carries them.
func TestFailedRunKeepsItsUsage(t *testing.T) {
	f := setup(t, llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"ping"}`}),
		llmtest.Fail(http.StatusBadRequest, "no", nil))
	res, err := f.run(t)
	if err == nil {
		t.Fatal("a run whose model failed succeeded")
	}
	if res == nil || res.Usage.TotalTokens != 120 || len(res.Steps) != 1 {
		t.Fatalf("result with the error = %+v, want the first request's 120 tokens and its step", res)
	}
}

func TestTurnLimitForcesSynthesis(t *testing.T) {
	var steps []llmtest.Step
	for range 8 {
		steps = append(steps, llmtest.CallTools(llmtest.Call{Tool: "nope", Args: `{}`}))
	}
	f := setup(t, append(steps, llmtest.Answer("gave up"))...)
	res, err := f.run(t)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != orchestrator.StatusBudgetExhausted || len(f.llm.Requests()) != 9 || f.tools.total() != 0 {
		t.Errorf("status %v after %d model calls and %d tool calls", res.Status, len(f.llm.Requests()), f.tools.total())
	}
}

func TestHugeOutputIsTruncated(t *testing.T) {
	f := setup(t, llmtest.CallTools(llmtest.Call{Tool: "big", Args: `{}`}), llmtest.Answer("ok"))
	if _, err := f.run(t); err != nil {
		t.Fatal(err)
	}
	content := toolMessages(f.llm.Requests()[1])[0].Content
	if len(content) > 1100 || !strings.Contains(content, "[truncated: showing 1000 of 20000 characters]") {
		t.Errorf("tool message is %d characters: %q…", len(content), content[len(content)-60:])
	}
}

func TestLLMRateLimitedThenSucceeds(t *testing.T) {
	f := setup(t, llmtest.Fail(http.StatusTooManyRequests, "slow down", http.Header{"Retry-After": {"0"}}), llmtest.Answer("hi"))
	res, err := f.run(t)
	if err != nil || res.Answer != "hi" {
		t.Fatalf("Run = %+v, %v", res, err)
	}
}

func TestLLMDown(t *testing.T) {
	model, err := llm.New(llm.Config{BaseURL: "http://127.0.0.1:9/v1", Model: "m", MaxRetries: 1, BackoffBase: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	tc, catalog := newTools(t)
	agent := orchestrator.New(model, tc, orchestrator.Config{}, nil)
	_, err = agent.Run(context.Background(), orchestrator.Request{Connector: orchestrator.NewConnector(orchestrator.Profile{}, catalog), Query: "q", MaxTools: 5}, nil)
	var lerr *llm.Error
	if !errors.As(err, &lerr) || !lerr.Temporary() {
		t.Errorf("err = %v, want an unreachable *llm.Error", err)
	}
}

func TestDeadlineMidRun(t *testing.T) {
	f := setup(t, llmtest.CallTools(llmtest.Call{Tool: "block", Args: `{}`}))
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := f.agent.Run(ctx, f.req, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want DeadlineExceeded", err)
	}
}

func TestEventsInOrder(t *testing.T) {
	f := setup(t, llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"a"}`}), llmtest.Answer("a"))
	var kinds []orchestrator.EventKind
	_, err := f.agent.Run(context.Background(), f.req, func(e orchestrator.Event) { kinds = append(kinds, e.Kind) })
	if err != nil {
		t.Fatal(err)
	}
	want := []orchestrator.EventKind{orchestrator.EventStepPlanned, orchestrator.EventToolCallStarted,
		orchestrator.EventToolCallFinished, orchestrator.EventAnswer}
	if !slices.Equal(kinds, want) {
		t.Errorf("events = %v, want %v", kinds, want)
	}
}

func TestPlanOnlyRunsNothing(t *testing.T) {
	f := setup(t, llmtest.Answer("```json\n"+`{"plan":[{"tool":"lookup_user","purpose":"find Ada's id"},`+
		`{"tool":"made_up","purpose":"?"},{"tool":"get_orders","purpose":"count her orders"}]}`+"\n```"))
	f.req.PlanOnly = true
	res, err := f.run(t)
	if err != nil {
		t.Fatal(err)
	}
	want := []orchestrator.PlannedTool{{Tool: "lookup_user", Purpose: "find Ada's id"}, {Tool: "get_orders", Purpose: "count her orders"}}
	if res.Status != orchestrator.StatusPlanned || !slices.Equal(res.Plan, want) {
		t.Errorf("plan = %+v (status %v)", res.Plan, res.Status)
	}
	if f.tools.total() != 0 || len(f.llm.Requests()[0].Tools) != 0 {
		t.Errorf("plan_only ran %d tools / offered %d", f.tools.total(), len(f.llm.Requests()[0].Tools))
	}

	bad := setup(t, llmtest.Answer("I would use lookup_user."))
	bad.req.PlanOnly = true
	if _, err := bad.run(t); !errors.Is(err, orchestrator.ErrBadPlan) {
		t.Errorf("a prose plan: err = %v, want ErrBadPlan", err)
	}
}

// Models also answer a plan as a bare JSON array, without the object
// around it; a one-step plan must not come back empty.
func TestPlanAsABareArray(t *testing.T) {
	for reply, want := range map[string][]orchestrator.PlannedTool{
		`[{"tool":"lookup_user","purpose":"find Ada's id"}]`: {{Tool: "lookup_user", Purpose: "find Ada's id"}},
		"Plan:\n```json\n[{\"tool\":\"echo\",\"purpose\":\"a\"},{\"tool\":\"get_orders\"}]\n```": {
			{Tool: "echo", Purpose: "a"}, {Tool: "get_orders"}},
		"[]": {},
		// An object with a plan wins over an array before it.
		`See [1]. {"plan":[{"tool":"echo","purpose":"b"}]}`: {{Tool: "echo", Purpose: "b"}},
	} {
		got, err := orchestrator.ParsePlan(reply)
		if err != nil || !slices.Equal(got, want) || got == nil {
			t.Errorf("ParsePlan(%q) = %v, %v; want %v", reply, got, err, want)
		}
	}
	for _, reply := range []string{`[1, 2]`, `[{"purpose":"no tool"}]`, `["echo"]`} {
		if _, err := orchestrator.ParsePlan(reply); !errors.Is(err, orchestrator.ErrBadPlan) {
			t.Errorf("ParsePlan(%q): err = %v, want ErrBadPlan", reply, err)
		}
	}
}

func TestPanicInAToolCallIsContained(t *testing.T) {
	f := setup(t, llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"a"}`}))
	f.tools.panic = true
	_, err := f.agent.Run(context.Background(), f.req, nil)
	if !errors.Is(err, orchestrator.ErrPanic) {
		t.Errorf("err = %v, want ErrPanic", err)
	}
}
