package orchestrator_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
	openai "github.com/sashabaranov/go-openai"

	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
)

// answeringModel answers every request at once, without tools.
type answeringModel struct{}

func (answeringModel) Chat(context.Context, openai.ChatCompletionRequest) (openai.ChatCompletionResponse, error) {
	return openai.ChatCompletionResponse{Choices: []openai.ChatCompletionChoice{{Message: openai.ChatCompletionMessage{
		Role: "assistant", Content: "done"}}}}, nil
}

// textTools answers every tool call with a text.
type textTools struct{}

func (textTools) CallTool(context.Context, int64, string, map[string]any, orchestrator.CallOptions) (*mcp.CallToolResult, error) {
	return mcp.NewToolResultText("ok"), nil
}

// FuzzDecodeState: DecodeState never panics; a state it takes encodes,
// and reads back to the same encoding; and a run resumed from it, with
// every pending call approved or every input answered, does not panic.
func FuzzDecodeState(f *testing.F) {
	for _, name := range []string{"state-v1-approval.json", "state-v1-input.json", "state-v2-approval.json", "state-v2-input.json"} {
		f.Add(readFixture(f, name))
	}
	for _, s := range []string{`{}`, `null`, `[]`, `{"version":2}`, `{"version":3}`, `{"version":"2"}`,
		`{"version":2,"messages":[{"role":"assistant","tool_calls":[{"id":"a","name":"echo","arguments":"{}"}]}],"result":{"Steps":[{"Calls":[{"ID":"a","Tool":"echo","Pending":true}]}]},"pending":[{"step":0,"call":{"ID":"a"}}],"approved":[0]}`,
		`{"Messages":[{"role":"assistant","content":[{"type":"text","text":"x"}],"tool_calls":[{"id":"a","type":"function","function":{"name":"echo"}}]}],"Result":{"Steps":[{"Calls":[{"ID":"a","AwaitsInput":true,"Pending":true}]}]},"Durable":{"a":{"Keys":{"a/k":"k"}}}}`,
	} {
		f.Add([]byte(s))
	}
	agent := orchestrator.New(answeringModel{}, textTools{}, orchestrator.Config{}, nil)
	conn := orchestrator.NewConnector(orchestrator.Profile{ID: 1, Name: "Fuzz"},
		[]orchestrator.Tool{{Name: "echo", Description: "Echoes", InputSchema: json.RawMessage(`{"type":"object"}`)}})
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := orchestrator.DecodeState(b)
		if err != nil {
			return
		}
		once, err := orchestrator.EncodeState(st)
		if err != nil {
			t.Fatalf("a decoded state does not encode: %v", err)
		}
		again, err := orchestrator.DecodeState(once)
		if err != nil {
			t.Fatalf("an encoded state does not decode: %v\n%s", err, once)
		}
		twice, err := orchestrator.EncodeState(again)
		if err != nil || !bytes.Equal(once, twice) {
			t.Fatalf("a state changes on its way through the store (%v):\n%s\n%s", err, once, twice)
		}
		decisions := map[string]orchestrator.Decision{}
		answers := map[string]ask.Answer{}
		for _, c := range st.Result.Steps[len(st.Result.Steps)-1].Calls {
			decisions[c.ID] = orchestrator.Decision{Kind: orchestrator.Approve}
			for _, in := range c.Inputs {
				answers[in.ID] = ask.Answer{Action: ask.Accept}
			}
		}
		switch st.Result.Status {
		case orchestrator.StatusAwaitingInput:
			st.Answered(answers)
		case orchestrator.StatusAwaitingAuthorization:
			st.Authorized()
		default:
			st.Decide(decisions)
		}
		_, err = agent.Resume(context.Background(), orchestrator.Request{Connector: conn, Query: "q", MaxTools: 5}, st, nil)
		if errors.Is(err, orchestrator.ErrPanic) {
			t.Fatalf("a resume of a decoded state panicked:\n%s", once)
		}
	})
}
