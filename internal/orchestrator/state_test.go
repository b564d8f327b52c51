package orchestrator_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/mark3labs/mcp-go/mcp"
	openai "github.com/sashabaranov/go-openai"

	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
)

var updateState = flag.Bool("update-state", false, "rewrite testdata/state-v2-*.json from the version 1 fixtures")

// testdata/state-v1-*.json were written by EncodeState before the state
// had a format of its own (version 1): a run paused for approval on its
// second tool-call turn, after a denied call, and a run paused for a
// durable input, with Retries as State.Answered fills them.
// testdata/state-v2-*.json are the same states as version 2 writes them.

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	tm, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return tm
}

// systemPrompt is the system prompt of a connector named name with tools
// (each "- name: description") and a budget of maxTools.
func systemPrompt(head string, maxTools int, tools ...string) string {
	return head + "\nYou answer one query with this connector's tools:\n" + strings.Join(tools, "\n") + "\n\nRules:\n" +
		"- Use only the tools you are offered.\n- Call tools that do not depend on each other together, in the same turn.\n" +
		"- When a call needs another call's result, make it in a later turn.\n" +
		fmt.Sprintf("- You may make at most %d tool calls for this query.\n", maxTools) +
		"- Stop calling tools as soon as you can answer the query.\n- Answer from the tool results, and say which tool each fact came from."
}

func toolCall(id, name, args string) openai.ToolCall {
	return openai.ToolCall{ID: id, Type: openai.ToolTypeFunction, Function: openai.FunctionCall{Name: name, Arguments: args}}
}

// approvalState is what testdata/state-v*-approval.json mean.
func approvalState(t *testing.T) *orchestrator.State {
	yes, no := true, false
	charge := orchestrator.Call{ID: "call_b2", Tool: "charge", Pending: true,
		Arguments: map[string]any{"cents": json.Number("500"), "user_id": json.Number("9007199254740993")}}
	return &orchestrator.State{
		Messages: []openai.ChatCompletionMessage{
			{Role: "system", Content: systemPrompt(`You are the agent of the "Shop" connector. The shop's backend.`, 10,
				"- big: Returns a lot", "- block: Never returns", "- charge: Charges a user's card", "- echo: Echoes text",
				"- fail: Always fails", "- get_orders: Lists a user's orders", "- lookup_user: Finds a user id by name",
				"- together: Waits for two others")},
			{Role: "user", Content: "Context:\nAda is a customer since 2019.\n\nQuery:\nHow many orders does Ada have?"},
			{Role: "assistant", ReasoningContent: "The user wants Ada's orders; get_orders needs her id.", ToolCalls: []openai.ToolCall{
				toolCall("call_a1", "lookup_user", `{"name":"Ada"}`), toolCall("call_a2", "charge", `{"user_id":42,"cents":900}`)}},
			{Role: "tool", Content: "user Ada has id 42", Name: "lookup_user", ToolCallID: "call_a1"},
			{Role: "tool", Content: "Error: the user declined this call: not that much. Do not call it again for this query unless the user asks; answer with what you have.",
				Name: "charge", ToolCallID: "call_a2"},
			{Role: "assistant", Content: "Ada has id 42. I will list her orders and charge the smaller fee.",
				ReasoningContent: "Orders first, then the fee.", ToolCalls: []openai.ToolCall{
					toolCall("call_b1", "get_orders", `{"user_id":"42"}`), toolCall("call_b2", "charge", `{"user_id":9007199254740993,"cents":500}`)}},
		},
		Turn: 1, Used: 3, Outputs: []string{"3 orders", ""},
		Result: orchestrator.Result{
			Status: orchestrator.StatusAwaitingApproval, ToolsUsed: []string{"lookup_user", "get_orders"}, ToolsTotal: 8,
			ToolsOffered: []string{"big", "block", "charge", "echo", "fail", "get_orders", "lookup_user", "together"},
			Steps: []orchestrator.Step{
				{Index: 0, Calls: []orchestrator.Call{
					{ID: "call_a1", Tool: "lookup_user", Arguments: map[string]any{"name": "Ada"}, ResultExcerpt: "user Ada has id 42", Duration: 1062001},
					{ID: "call_a2", Tool: "charge", Arguments: map[string]any{"cents": json.Number("900"), "user_id": json.Number("42")},
						ResultExcerpt: "Error: the user declined this call: not that much. Do not call it again for this query unless the user asks; answer with what you have.",
						IsError:       true, RejectedReason: "the user declined this call: not that much",
						Decision: &orchestrator.Decision{Kind: orchestrator.Deny, Message: "not that much", Actor: "alice", KeyID: "key_7",
							At: mustTime(t, "2026-11-28T08:00:00Z")}},
				}},
				{Index: 1, Reasoning: "Ada has id 42. I will list her orders and charge the smaller fee.", Calls: []orchestrator.Call{
					{ID: "call_b1", Tool: "get_orders", Arguments: map[string]any{"user_id": "42"}, ResultExcerpt: "3 orders", Duration: 295762},
					charge,
				}},
			},
			Contexts: []orchestrator.Context{{Tool: "get_orders", StructuredContent: map[string]any{"orders": json.Number("3"), "user_id": "42"}}},
			Usage:    orchestrator.Usage{PromptTokens: 200, CompletionTokens: 40, TotalTokens: 240},
			Pending: []orchestrator.PendingCall{{Step: 1, Call: charge, Description: "Charges a user's card",
				Annotations: mcp.ToolAnnotation{Title: "Charge a card", ReadOnlyHint: &no, DestructiveHint: &yes, OpenWorldHint: &yes},
				Reasoning:   "Ada has id 42. I will list her orders and charge the smaller fee."}},
		},
	}
}

// inputState is what testdata/state-v*-input.json mean.
func inputState(t *testing.T) *orchestrator.State {
	in := orchestrator.Input{Input: ask.Input{ID: "call_1/date", Mode: ask.ModeForm, Message: "Which date?", Durable: true},
		CallID: "call_1", Tool: "book"}
	served := map[string]json.RawMessage{"s1": json.RawMessage(`{"ok":true}`)}
	return &orchestrator.State{
		Messages: []openai.ChatCompletionMessage{
			{Role: "system", Content: systemPrompt(`You are the agent of the "Diner" connector.`, 5, "- book: Books a table")},
			{Role: "user", Content: "book"},
			{Role: "assistant", Content: "Booking it.", ToolCalls: []openai.ToolCall{toolCall("call_1", "book", `{"party":4}`)}},
		},
		Outputs: []string{""}, Used: 1,
		Result: orchestrator.Result{
			Status: orchestrator.StatusAwaitingInput, ToolsUsed: []string{}, ToolsTotal: 1, ToolsOffered: []string{"book"},
			Steps: []orchestrator.Step{{Index: 0, Reasoning: "Booking it.", Calls: []orchestrator.Call{{
				ID: "call_1", Tool: "book", Arguments: map[string]any{"party": json.Number("4")}, Duration: 3917, Pending: true,
				AwaitsInput: true, Inputs: []orchestrator.Input{in},
				Samplings: []ask.SamplingRecord{{Model: "m", PromptTokens: 7, CompletionTokens: 3}},
			}}}},
			Usage:  orchestrator.Usage{PromptTokens: 107, CompletionTokens: 23, TotalTokens: 130, SamplingRequests: 1},
			Inputs: []orchestrator.Input{in},
		},
		Durable: map[string]orchestrator.DurableCall{"call_1": {RequestState: "state-1", Served: served,
			Keys: map[string]string{"call_1/date": "date"}}},
		Retries: map[string]*ask.Retry{"call_1": {RequestState: "state-1", Served: served, Answers: map[string]ask.Answer{
			"date": {Action: ask.Accept, Content: map[string]any{"date": "monday", "seats": json.Number("4")}, Actor: "alice",
				At: mustTime(t, "2026-11-28T08:00:00Z")}}}},
	}
}

// stateFixtures are the stored states and what they mean.
var stateFixtures = []struct {
	name string
	want func(*testing.T) *orchestrator.State
}{
	{"approval", approvalState},
	{"input", inputState},
}

// rawJSONEqual compares raw JSON by its compact form.
var rawJSONEqual = cmp.Comparer(func(a, b json.RawMessage) bool {
	var ca, cb bytes.Buffer
	return json.Compact(&ca, a) == nil && json.Compact(&cb, b) == nil && bytes.Equal(ca.Bytes(), cb.Bytes())
})

// TestStateDecodesVersion1 decodes the states today's replicas wrote
// (version 1, no version field) into what they meant.
func TestStateDecodesVersion1(t *testing.T) {
	for _, f := range stateFixtures {
		t.Run(f.name, func(t *testing.T) {
			got, err := orchestrator.DecodeState(readFixture(t, "state-v1-"+f.name+".json"))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(f.want(t), got, rawJSONEqual); diff != "" {
				t.Errorf("decoded version 1 state (-want +got):\n%s", diff)
			}
		})
	}
}

// TestStateVersion2 writes each fixture's state as version 2, exactly as
// testdata/state-v2-*.json hold it (a change of the stored format must be
// a new version: if this fails, bump StateVersion and keep reading this
// one), and reads it back unchanged.
func TestStateVersion2(t *testing.T) {
	for _, f := range stateFixtures {
		t.Run(f.name, func(t *testing.T) {
			want := f.want(t)
			b, err := orchestrator.EncodeState(want)
			if err != nil {
				t.Fatal(err)
			}
			var head struct{ Version int }
			if err := json.Unmarshal(b, &head); err != nil || head.Version != 2 || !bytes.HasPrefix(b, []byte(`{"version":2,`)) {
				t.Errorf("encoded state starts %.40s; want version 2 first", b)
			}
			golden := filepath.Join("testdata", "state-v2-"+f.name+".json")
			if *updateState {
				var out bytes.Buffer
				_ = json.Indent(&out, b, "", "  ")
				if err := os.WriteFile(golden, append(out.Bytes(), '\n'), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			var stored bytes.Buffer
			if err := json.Compact(&stored, readFixture(t, "state-v2-"+f.name+".json")); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(stored.Bytes(), b) {
				t.Errorf("EncodeState wrote\n%s\nwant (%s)\n%s", b, golden, stored.Bytes())
			}
			got, err := orchestrator.DecodeState(b)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, got, rawJSONEqual); diff != "" {
				t.Errorf("round trip (-want +got):\n%s", diff)
			}
		})
	}
}

// TestStateVersion2IsRefusedByVersion1Readers: a replica of the build
// before version 2 reads a state as DecodeState read version 1 (State's
// Go names, matched without regard to case); in a version 2 state it
// finds no paused step, which it refuses, so it never resumes a run from
// a transcript it misread.
func TestStateVersion2IsRefusedByVersion1Readers(t *testing.T) {
	for _, f := range stateFixtures {
		var old orchestrator.State
		d := json.NewDecoder(bytes.NewReader(readFixture(t, "state-v2-"+f.name+".json")))
		d.UseNumber()
		if err := d.Decode(&old); err != nil {
			t.Fatal(err)
		}
		if len(old.Result.Steps) != 0 {
			t.Errorf("%s: a version 1 reader finds %d steps in a version 2 state; want none", f.name, len(old.Result.Steps))
		}
	}
}

// TestStateVersion2KeepsWhatMessagesCarry: content given as parts, a
// refusal, a tool call's type, and hints left unset, come back as they
// went.
func TestStateVersion2KeepsWhatMessagesCarry(t *testing.T) {
	st := inputState(t)
	st.Messages = append(st.Messages[:2], openai.ChatCompletionMessage{Role: "assistant", Refusal: "partly", Name: "agent",
		MultiContent: []openai.ChatMessagePart{{Type: openai.ChatMessagePartTypeText, Text: "Booking."},
			{Type: openai.ChatMessagePartTypeImageURL, ImageURL: &openai.ChatMessageImageURL{URL: "https://x.test/a.png", Detail: openai.ImageURLDetailLow}}},
		ToolCalls: []openai.ToolCall{{ID: "call_1", Type: "", Function: openai.FunctionCall{Name: "book"}}}})
	st.Result.Pending = []orchestrator.PendingCall{{Step: 0, Call: st.Result.Steps[0].Calls[0]},
		{Step: 0, Call: st.Result.Steps[0].Calls[0], Annotations: mcp.ToolAnnotation{Title: "Book"}}}
	st.Decided, st.Approved = true, []int{0}
	st.Retries["call_2"] = &ask.Retry{Answers: map[string]ask.Answer{}}
	b, err := orchestrator.EncodeState(st)
	if err != nil {
		t.Fatal(err)
	}
	got, err := orchestrator.DecodeState(b)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(st, got, rawJSONEqual); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
}

// TestStateNewerVersion: a state a newer build wrote is refused with the
// version named, and so is a version that is no number.
func TestStateNewerVersion(t *testing.T) {
	b := bytes.Replace(readFixture(t, "state-v2-input.json"), []byte(`"version": 2`), []byte(`"version": 3`), 1)
	_, err := orchestrator.DecodeState(b)
	var newer *orchestrator.NewerStateError
	if !errors.As(err, &newer) || newer.Version != 3 ||
		err.Error() != "run state version 3 is newer than this build understands (2): upgrade the replica" {
		t.Errorf("DecodeState of version 3 = %v; want a NewerStateError naming version 3", err)
	}
	for _, v := range []string{`0`, `-1`, `"2"`, `2.5`, `null`} {
		b := bytes.Replace(readFixture(t, "state-v2-input.json"), []byte(`"version": 2`), []byte(`"version": `+v), 1)
		if _, err := orchestrator.DecodeState(b); err == nil || errors.As(err, &newer) {
			t.Errorf("DecodeState of version %s = %v; want an error", v, err)
		}
	}
}

// TestStateRefusesWhatResumeCannotGoOn: a state whose last message does
// not hold the paused step's calls, or approves a call the step has not,
// is an error, not a resume that fails on it.
func TestStateRefusesWhatResumeCannotGoOn(t *testing.T) {
	for name, spoil := range map[string]func(*orchestrator.State){
		"no steps":    func(s *orchestrator.State) { s.Result.Steps = nil },
		"no messages": func(s *orchestrator.State) { s.Messages = nil },
		"a call too many": func(s *orchestrator.State) {
			s.Result.Steps[0].Calls = append(s.Result.Steps[0].Calls, orchestrator.Call{})
		},
		"approved no call":  func(s *orchestrator.State) { s.Approved = []int{1} },
		"the user's turn":   func(s *orchestrator.State) { s.Messages = s.Messages[:2] },
		"approved negative": func(s *orchestrator.State) { s.Approved = []int{-1} },
	} {
		st := inputState(t)
		spoil(st)
		b, err := orchestrator.EncodeState(st)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := orchestrator.DecodeState(b); err == nil {
			t.Errorf("%s: DecodeState took it", name)
		}
	}
}

// TestResumeFromVersion1State resumes the runs the version 1 fixtures
// paused: the approved call runs with its arguments as the model wrote
// them, the model reads the whole transcript with every call answered
// in order, and the durable call is retried with the server's state and
// the answers.
func TestResumeFromVersion1State(t *testing.T) {
	t.Run("approval", func(t *testing.T) {
		f := setup(t, llmtest.Answer("Ada has 3 orders; she was charged 5 EUR."))
		st, err := orchestrator.DecodeState(readFixture(t, "state-v1-approval.json"))
		if err != nil {
			t.Fatal(err)
		}
		st.Decide(map[string]orchestrator.Decision{"call_b2": {Kind: orchestrator.Approve, Actor: "bob", At: time.Now()}})
		done, err := f.agent.Resume(context.Background(), f.req, st, nil)
		if err != nil {
			t.Fatal(err)
		}
		if done.Status != orchestrator.StatusCompleted || done.Steps[1].Calls[1].ResultExcerpt != "charged 500 cents" {
			t.Errorf("resumed = %v %+v", done.Status, done.Steps)
		}
		f.tools.mu.Lock()
		got := f.tools.calls["charge"]
		f.tools.mu.Unlock()
		if len(got) != 1 || got[0]["user_id"] != json.Number("9007199254740993") {
			t.Errorf("charge got %v; want the id with all its digits", got)
		}
		msgs := f.llm.Requests()[0].Messages
		want := append(approvalState(t).Messages,
			openai.ChatCompletionMessage{Role: "tool", Content: "3 orders", Name: "get_orders", ToolCallID: "call_b1"},
			openai.ChatCompletionMessage{Role: "tool", Content: "charged 500 cents", Name: "charge", ToolCallID: "call_b2"})
		if diff := cmp.Diff(want, msgs, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("the model read (-want +got):\n%s", diff)
		}
	})
	t.Run("input", func(t *testing.T) {
		tc := &askingTools{mode: "durable"}
		_, agent, req := askingSetup(t, tc, llmtest.Answer("Booked."))
		st, err := orchestrator.DecodeState(readFixture(t, "state-v1-input.json"))
		if err != nil {
			t.Fatal(err)
		}
		st.Answered(map[string]ask.Answer{"call_1/date": {Action: ask.Accept, Content: map[string]any{"date": "tuesday"}}})
		done, err := agent.Resume(context.Background(), req, st, nil)
		if err != nil {
			t.Fatal(err)
		}
		r := tc.retries[0]
		if done.Status != orchestrator.StatusCompleted || r == nil || r.RequestState != "state-1" ||
			r.Answers["date"].Content["date"] != "tuesday" || string(r.Served["s1"]) != `{"ok":true}` {
			t.Errorf("resumed = %v, retry = %+v", done.Status, r)
		}
	})
}
