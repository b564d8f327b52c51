package orchestrator_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/llm"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
)

// askingTools is a ToolCaller whose "book" tool asks its caller as a
// connection would: live (ask.From(ctx).Elicit while the call is open),
// or durably (an ask.InputRequiredError, then the retry's answers), or
// with a -32042 (ask.URLRequiredError).
type askingTools struct {
	mode string // "live", "durable" or "url"

	mu      sync.Mutex
	calls   int
	retries []*ask.Retry
	answers []ask.Answer
	sampled bool
}

func (a *askingTools) CallTool(ctx context.Context, _ int64, name string, _ map[string]any, opts orchestrator.CallOptions) (*mcp.CallToolResult, error) {
	a.mu.Lock()
	a.calls++
	n := a.calls
	a.retries = append(a.retries, opts.Retry)
	a.mu.Unlock()
	asker, call, ok := ask.From(ctx)
	if !ok || call.Tool != name {
		return mcp.NewToolResultError("no asker in the call's context"), nil
	}
	if a.sampled {
		asker.Sampled(call, ask.SamplingRecord{Model: "m", PromptTokens: 7, CompletionTokens: 3})
	}
	switch a.mode {
	case "live":
		ans, err := asker.Elicit(ctx, call, ask.Input{Mode: ask.ModeForm, Message: "Which date?",
			Schema:   map[string]any{"type": "object", "properties": map[string]any{"date": map[string]any{"type": "string"}}},
			Deadline: time.Now().Add(500 * time.Millisecond)})
		if err != nil {
			return nil, err
		}
		a.mu.Lock()
		a.answers = append(a.answers, ans)
		a.mu.Unlock()
		if ans.Action != ask.Accept {
			return mcp.NewToolResultText("not booked: " + ans.Action), nil
		}
		return mcp.NewToolResultText("booked for " + ans.Content["date"].(string)), nil
	case "again":
		return nil, &ask.InputRequiredError{RequestState: "state-2",
			Inputs: []ask.Input{{ID: "date", Mode: ask.ModeForm, Message: "Which date, then?", Durable: true}}}
	case "durable":
		if opts.Retry == nil {
			return nil, &ask.InputRequiredError{RequestState: "state-1",
				Inputs: []ask.Input{{ID: "date", Mode: ask.ModeForm, Message: "Which date?", Durable: true}},
				Served: map[string]json.RawMessage{"s1": json.RawMessage(`{"ok":true}`)}}
		}
		return mcp.NewToolResultText("booked for " + opts.Retry.Answers["date"].Content["date"].(string)), nil
	default:
		if n == 1 {
			return nil, &ask.URLRequiredError{Inputs: []ask.Input{{Mode: ask.ModeURL, URL: "https://idp.example/login", ElicitationID: "e1"}}}
		}
		return mcp.NewToolResultText("booked"), nil
	}
}

// broker answers each input with answer, after a delay; a nil answer
// never comes (the deadline passes).
type broker struct {
	mu     sync.Mutex
	seen   []orchestrator.Input
	snaps  []*orchestrator.Result
	answer *ask.Answer
}

func (b *broker) Await(ctx context.Context, in orchestrator.Input, snap *orchestrator.Result) (ask.Answer, error) {
	b.mu.Lock()
	b.seen, b.snaps = append(b.seen, in), append(b.snaps, snap)
	b.mu.Unlock()
	if b.answer == nil {
		<-ctx.Done()
		return ask.Answer{}, ctx.Err()
	}
	return *b.answer, nil
}

func askingSetup(t *testing.T, tc *askingTools, steps ...llmtest.Step) (*llmtest.Server, *orchestrator.Agent, orchestrator.Request) {
	t.Helper()
	srv := llmtest.New(t, steps...)
	model, err := llm.New(llm.Config{BaseURL: srv.URL(), Model: "fake-model", BackoffBase: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	tools := []orchestrator.Tool{{Name: "book", Description: "Books a table", InputSchema: json.RawMessage(`{"type":"object"}`)}}
	return srv, orchestrator.New(model, tc, orchestrator.Config{}, nil),
		orchestrator.Request{Connector: orchestrator.NewConnector(orchestrator.Profile{ID: 1, Name: "Diner"}, tools), Query: "book", MaxTools: 5}
}

func TestLiveInputIsAnsweredWhileTheCallIsOpen(t *testing.T) {
	tc := &askingTools{mode: "live", sampled: true}
	model, agent, req := askingSetup(t, tc, llmtest.CallTools(llmtest.Call{Tool: "book", Args: `{}`}), llmtest.Answer("Booked."))
	b := &broker{answer: &ask.Answer{Action: ask.Accept, Content: map[string]any{"date": "friday"}, Actor: "alice"}}
	req.Inputs = b
	var mu sync.Mutex
	var events []orchestrator.Event
	res, err := agent.Run(context.Background(), req, func(e orchestrator.Event) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != orchestrator.StatusCompleted || len(b.seen) != 1 || b.seen[0].ID != "call_1.1" || b.seen[0].CallID != "call_1" {
		t.Fatalf("result %v, broker saw %+v; want one input call_1.1, completed", res.Status, b.seen)
	}
	if s := b.snaps[0]; s.Status != orchestrator.StatusAwaitingInput || len(s.Steps) != 1 || len(s.Steps[0].Calls[0].Inputs) != 1 {
		t.Errorf("snapshot at the pause = %+v; want the running step with its input", s)
	}
	call := res.Steps[0].Calls[0]
	if len(call.Inputs) != 1 || call.Inputs[0].Answer == nil || call.Inputs[0].Answer.Action != ask.Accept || call.ResultExcerpt != "booked for friday" {
		t.Fatalf("call = %+v; want its input with the answer, and the result", call)
	}
	if len(call.Samplings) != 1 || res.Usage.PromptTokens != 2*100+7 || res.Usage.CompletionTokens != 2*20+3 {
		t.Errorf("samplings %v, usage %+v; want the sampling's tokens in the run's usage", call.Samplings, res.Usage)
	}
	var required int
	for _, e := range events {
		if e.Kind == orchestrator.EventInputRequired && len(e.Inputs) == 1 && e.Inputs[0].ID == "call_1.1" {
			required++
		}
	}
	if required != 1 {
		t.Errorf("input_required events = %d, want 1", required)
	}
	if got := model.Requests()[1].Messages; !strings.Contains(got[len(got)-1].Content, "booked for friday") {
		t.Errorf("tool message = %q", got[len(got)-1].Content)
	}
}

func TestLiveInputNobodyAnswersIsCancelledAndTheModelIsTold(t *testing.T) {
	tc := &askingTools{mode: "live"}
	model, agent, req := askingSetup(t, tc, llmtest.CallTools(llmtest.Call{Tool: "book", Args: `{}`}), llmtest.Answer("Could not book."))
	req.Inputs = &broker{}
	res, err := agent.Run(context.Background(), req, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(tc.answers) != 1 || tc.answers[0].Action != ask.Cancel {
		t.Fatalf("the server got %+v; want cancel", tc.answers)
	}
	msgs := model.Requests()[1].Messages
	if last := msgs[len(msgs)-1].Content; !strings.Contains(last, "not booked: cancel") || !strings.Contains(last, "did not answer the server's request in time") {
		t.Errorf("tool message = %q; want the result and the note", last)
	}
	if a := res.Steps[0].Calls[0].Inputs[0].Answer; a == nil || a.Action != ask.Cancel {
		t.Errorf("recorded answer = %+v", a)
	}
}

func TestNoBrokerMeansNobodyToAsk(t *testing.T) {
	tc := &askingTools{mode: "live"}
	_, agent, req := askingSetup(t, tc, llmtest.CallTools(llmtest.Call{Tool: "book", Args: `{}`}), llmtest.Answer("no"))
	res, err := agent.Run(context.Background(), req, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c := res.Steps[0].Calls[0]; !c.IsError || !strings.Contains(c.ResultExcerpt, ask.ErrNobodyToAsk.Error()) {
		t.Errorf("call = %+v; want the ToolCaller's error", c)
	}
}

func TestDurableInputPausesAndResumeRetriesWithTheAnswers(t *testing.T) {
	tc := &askingTools{mode: "durable"}
	model, agent, req := askingSetup(t, tc, llmtest.CallTools(llmtest.Call{Tool: "book", Args: `{}`}), llmtest.Answer("Booked."))
	var required []orchestrator.Event
	res, err := agent.Run(context.Background(), req, func(e orchestrator.Event) {
		if e.Kind == orchestrator.EventInputRequired {
			required = append(required, e)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != orchestrator.StatusAwaitingInput || len(res.Inputs) != 1 || res.Inputs[0].ID != "call_1/date" || !res.Inputs[0].Durable {
		t.Fatalf("result = %v %+v; want AWAITING_INPUT with input call_1/date", res.Status, res.Inputs)
	}
	if len(required) != 1 || len(res.Pending) != 0 || len(res.ToolsUsed) != 0 {
		t.Errorf("events %d, pending %v, tools used %v", len(required), res.Pending, res.ToolsUsed)
	}
	// The state travels as JSON, as through the store.
	b, err := orchestrator.EncodeState(res.State)
	if err != nil {
		t.Fatal(err)
	}
	st, err := orchestrator.DecodeState(b)
	if err != nil {
		t.Fatal(err)
	}
	st.Answered(map[string]ask.Answer{"call_1/date": {Action: ask.Accept, Content: map[string]any{"date": "monday"}}})
	done, err := agent.Resume(context.Background(), req, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	if done.Status != orchestrator.StatusCompleted || done.Answer != "Booked." {
		t.Fatalf("resumed = %v %q", done.Status, done.Answer)
	}
	r := tc.retries[1]
	if r == nil || r.RequestState != "state-1" || r.Answers["date"].Action != ask.Accept || string(r.Served["s1"]) != `{"ok":true}` {
		t.Fatalf("retry = %+v; want the state, the answer by the server's key, and the served answers", r)
	}
	msgs := model.Requests()[1].Messages
	if last := msgs[len(msgs)-1].Content; last != "booked for monday" {
		t.Errorf("tool message = %q", last)
	}
	c := done.Steps[0].Calls[0]
	if len(c.Inputs) != 1 || c.Inputs[0].Answer == nil || c.Pending || c.AwaitsInput {
		t.Errorf("call = %+v", c)
	}
}

func TestURLInputDeclinedIsNotRetried(t *testing.T) {
	for _, action := range []string{ask.Decline, ask.Accept} {
		t.Run(action, func(t *testing.T) {
			tc := &askingTools{mode: "url"}
			model, agent, req := askingSetup(t, tc, llmtest.CallTools(llmtest.Call{Tool: "book", Args: `{}`}), llmtest.Answer("ok"))
			res, err := agent.Run(context.Background(), req, nil)
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != orchestrator.StatusAwaitingInput || len(res.Inputs) != 1 || res.Inputs[0].ID != "call_1/e1" ||
				res.Inputs[0].Mode != ask.ModeURL || res.Inputs[0].URL != "https://idp.example/login" {
				t.Fatalf("result = %v %+v", res.Status, res.Inputs)
			}
			res.State.Answered(map[string]ask.Answer{"call_1/e1": {Action: action}})
			if _, err := agent.Resume(context.Background(), req, res.State, nil); err != nil {
				t.Fatal(err)
			}
			msgs := model.Requests()[1].Messages
			last := msgs[len(msgs)-1].Content
			if action == ask.Accept {
				if tc.calls != 2 || tc.retries[1] != nil || last != "booked" {
					t.Errorf("calls %d, retry %+v, tool message %q; want a plain retry", tc.calls, tc.retries[1], last)
				}
				return
			}
			if tc.calls != 1 || !strings.Contains(last, "declined the server's request to open a URL") {
				t.Errorf("calls %d, tool message %q; want no retry and the model told", tc.calls, last)
			}
		})
	}
}

func TestDurableInputAskedAgainHasANewID(t *testing.T) {
	tc := &askingTools{mode: "durable"}
	_, agent, req := askingSetup(t, tc, llmtest.CallTools(llmtest.Call{Tool: "book", Args: `{}`}), llmtest.Answer("Booked."))
	res, err := agent.Run(context.Background(), req, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Declined, the server asks again under the same key.
	tc.mode = "again"
	res.State.Answered(map[string]ask.Answer{"call_1/date": {Action: ask.Decline}})
	res, err = agent.Resume(context.Background(), req, res.State, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != orchestrator.StatusAwaitingInput || len(res.Inputs) != 1 || res.Inputs[0].ID != "call_1/date#2" {
		t.Fatalf("second round = %v %+v; want call_1/date#2", res.Status, res.Inputs)
	}
	if c := res.Steps[0].Calls[0]; len(c.Inputs) != 2 || c.Inputs[0].Answer == nil || c.Inputs[1].Answer != nil {
		t.Errorf("call inputs = %+v; want the answered round and the new one", c.Inputs)
	}
}
