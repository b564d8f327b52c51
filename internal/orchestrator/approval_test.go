package orchestrator_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/telemetry/telemetrytest"
)

// callsWithoutIDs replies with tool calls that have no ids, as some
// OpenAI-compatible servers send them.
func callsWithoutIDs(text string, calls ...llmtest.Call) llmtest.Step {
	return func(openai.ChatCompletionRequest) llmtest.Reply {
		msg := openai.ChatCompletionMessage{Role: "assistant", Content: text}
		for _, c := range calls {
			msg.ToolCalls = append(msg.ToolCalls, openai.ToolCall{Type: openai.ToolTypeFunction,
				Function: openai.FunctionCall{Name: c.Tool, Arguments: c.Args}})
		}
		return llmtest.Reply{Body: openai.ChatCompletionResponse{Object: "chat.completion", Model: "fake",
			Choices: []openai.ChatCompletionChoice{{Message: msg, FinishReason: "tool_calls"}},
			Usage:   openai.Usage{PromptTokens: 100, CompletionTokens: 20, TotalTokens: 120}}}
	}
}

// TestPausedRunResumesFromItsEncodedState pauses a run before a gated
// call, keeps only its encoded state, and resumes it with a new agent:
// the gated call runs with its arguments exactly as the model wrote them.
func TestPausedRunResumesFromItsEncodedState(t *testing.T) {
	f := setup(t,
		callsWithoutIDs("Ada's orders need her id first; I have it.",
			llmtest.Call{Tool: "lookup_user", Args: `{"name":"ada"}`},
			llmtest.Call{Tool: "charge", Args: `{"user_id":9007199254740993,"cents":500}`}),
		llmtest.Answer("Charged Ada 5 EUR."))
	gated := slices.Clone(f.catalog)
	for i := range gated {
		gated[i].RequiresApproval = gated[i].Name == "charge"
	}
	f.req.Connector = orchestrator.NewConnector(f.req.Connector.Profile, gated)

	res, err := f.run(t)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != orchestrator.StatusAwaitingApproval || len(res.Pending) != 1 || res.State == nil {
		t.Fatalf("result = %+v; want it paused on one call", res)
	}
	p := res.Pending[0]
	if p.Call.Tool != "charge" || p.Call.ID != "call_0_1" || p.Reasoning != "Ada's orders need her id first; I have it." {
		t.Errorf("pending = %+v; want charge with an id of its own and the model's reasoning", p)
	}
	if f.tools.count("lookup_user") != 1 || f.tools.count("charge") != 0 {
		t.Fatalf("calls before the decision: lookup_user %d, charge %d; want 1 and 0",
			f.tools.count("lookup_user"), f.tools.count("charge"))
	}

	b, err := orchestrator.EncodeState(res.State)
	if err != nil {
		t.Fatal(err)
	}
	st, err := orchestrator.DecodeState(b)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st.Decide(map[string]orchestrator.Decision{"call_0_1": {Kind: orchestrator.Approve, Actor: "alice", At: time.Now()}})
	done, err := f.agent.Resume(ctx, f.req, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	if done.Status != orchestrator.StatusCompleted || done.Answer != "Charged Ada 5 EUR." || done.Usage.PromptTokens != 200 {
		t.Errorf("resumed = %+v", done)
	}
	f.tools.mu.Lock()
	got := f.tools.calls["charge"]
	f.tools.mu.Unlock()
	if len(got) != 1 || got[0]["user_id"] != json.Number("9007199254740993") {
		t.Errorf("charge got %v; want the id with all its digits", got)
	}
	tm := toolMessages(f.llm.Requests()[1])
	if len(tm) != 2 || tm[0].ToolCallID != "call_0_0" || tm[1].ToolCallID != "call_0_1" {
		t.Errorf("tool messages = %+v; want both calls answered, in order, by their ids", tm)
	}
	if d := done.Steps[0].Calls[1].Decision; d == nil || d.Actor != "alice" || done.Steps[0].Calls[1].Pending {
		t.Errorf("the decided call = %+v", done.Steps[0].Calls[1])
	}
}

// TestResumedRunKeepsWhatSearchFound: a narrowed run that found a tool
// with search_tools, then paused, offers that tool again once resumed;
// the decision is counted.
func TestResumedRunKeepsWhatSearchFound(t *testing.T) {
	tools := bigCatalog(40)
	tools[0].RequiresApproval = true // send_invoice
	srv, rec, agent, req, meters := narrowFixture(t, tools,
		llmtest.CallTools(llmtest.Call{Tool: "search_tools", Args: `{"query":"widget 30 of the factory"}`}),
		llmtest.CallTools(llmtest.Call{Tool: "manage_widget_30", Args: `{}`}, llmtest.Call{Tool: "send_invoice", Args: `{"customer":"acme"}`}),
		llmtest.CallTools(llmtest.Call{Tool: "manage_widget_30", Args: `{}`}),
		llmtest.Answer("Done."))
	ctx := context.Background()
	res, err := agent.Run(ctx, req, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != orchestrator.StatusAwaitingApproval || !slices.Equal(rec.calls, []string{"manage_widget_30"}) {
		t.Fatalf("paused run: status %v, ran %v; want it paused after manage_widget_30 ran", res.Status, rec.calls)
	}
	b, _ := orchestrator.EncodeState(res.State)
	st, err := orchestrator.DecodeState(b)
	if err != nil {
		t.Fatal(err)
	}
	st.Decide(map[string]orchestrator.Decision{"call_2": {Kind: orchestrator.Deny, Message: "not this month"}})
	done, err := agent.Resume(ctx, req, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	var offered []string
	for _, tool := range srv.Requests()[2].Tools {
		offered = append(offered, tool.Function.Name)
	}
	if !slices.Contains(offered, "manage_widget_30") || offered[0] != "search_tools" {
		t.Errorf("the resumed run offers %v; want search_tools and what it found", offered)
	}
	if done.Status != orchestrator.StatusCompleted || !slices.Equal(rec.calls, []string{"manage_widget_30", "manage_widget_30"}) {
		t.Errorf("resumed: status %v, ran %v", done.Status, rec.calls)
	}
	attrs := telemetrytest.Attrs("workspace", "acme", "connector", "shop", "decision", "deny")
	if n := meters.Value(t, "connector.approval.decisions", attrs...); n != 1 {
		t.Errorf("counted %v denials, want 1", n)
	}
}
