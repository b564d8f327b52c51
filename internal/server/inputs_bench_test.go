package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
)

// askingModel is an instant fake model: it calls "ask" if it is offered
// ("echo" otherwise), then answers once it has the tool's result.
func askingModel(b *testing.B) string {
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req openai.ChatCompletionRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		msg := openai.ChatCompletionMessage{Role: openai.ChatMessageRoleAssistant}
		if req.Messages[len(req.Messages)-1].Role == openai.ChatMessageRoleTool {
			msg.Content = "Done."
		} else {
			call := openai.FunctionCall{Name: "echo", Arguments: `{"text":"hi"}`}
			if slices.ContainsFunc(req.Tools, func(t openai.Tool) bool { return t.Function.Name == "ask" }) {
				call = openai.FunctionCall{Name: "ask", Arguments: `{}`}
			}
			msg.ToolCalls = []openai.ToolCall{{ID: "call_1", Type: openai.ToolTypeFunction, Function: call}}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(openai.ChatCompletionResponse{ID: "x", Object: "chat.completion", Model: req.Model,
			Choices: []openai.ChatCompletionChoice{{Message: msg, FinishReason: openai.FinishReasonStop}},
			Usage:   openai.Usage{PromptTokens: 10, CompletionTokens: 2, TotalTokens: 12}})
	}))
	b.Cleanup(hs.Close)
	return hs.URL + "/v1"
}

// BenchmarkLiveInput measures what a live pause for input costs: a query
// whose tool call asks the user (a classic per-session connection: the
// call stays open) until it pauses, and the ResumeQuery that answers and
// finishes the run, against the same query on a tool that asks nothing.
// It reports each one's p50 and the bytes the paused run's row takes.
func BenchmarkLiveInput(b *testing.B) {
	ctx := context.Background()
	f := setup(b, options{llmURL: askingModel(b)})
	plain := mcpConnector("plain", benchMCP(b, 0))
	plain.SessionMode = connectorv1.SessionMode_SESSION_MODE_PER_SESSION
	asks := mcpConnector("asks", newAskMCPB(b).url)
	asks.SessionMode, asks.Elicitation = connectorv1.SessionMode_SESSION_MODE_PER_SESSION, true
	asks.ProtocolPreference = connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_CLASSIC
	for _, c := range []*connectorv1.Connector{plain, asks} {
		if _, err := f.client.CreateConnector(ctx, &connectorv1.CreateConnectorRequest{WorkspaceId: "ws", Connector: c}); err != nil {
			b.Fatal(err)
		}
	}
	query := func(id string) (*connectorv1.QueryResult, error) {
		resp, err := f.client.QueryConnector(ctx, &connectorv1.QueryConnectorRequest{WorkspaceId: "ws", ConnectorId: id, Query: "q",
			SessionId: "s1"})
		return resp.GetResult(), err
	}
	answer := func(p *connectorv1.QueryResult) error {
		resp, err := f.client.ResumeQuery(ctx, &connectorv1.ResumeQueryRequest{WorkspaceId: "ws", RunId: p.GetRunId(),
			Inputs: []*connectorv1.InputAnswer{{InputId: p.GetInputRequests()[0].GetInputId(), Action: connectorv1.InputAction_INPUT_ACTION_ACCEPT,
				Content: mustStructT(map[string]any{"name": "bench"})}}})
		if err == nil && resp.GetResult().GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_COMPLETED {
			b.Fatalf("answered run = %v", resp.GetResult())
		}
		return err
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		a, errA := query("plain")
		p, errP := query("asks")
		if errA == nil && errP == nil && len(a.GetToolsUsed()) == 1 && p.GetStatus() == connectorv1.QueryStatus_QUERY_STATUS_AWAITING_INPUT {
			if err := answer(p); err != nil {
				b.Fatal(err)
			}
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("the connectors did not answer: %v, %v", errA, errP)
		}
	}
	plainD, pauseD, answerD, row := pauseLoop(b, f, query, answer)
	b.StopTimer()
	p50 := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds())
	}
	b.ReportMetric(p50(plainD), "plain-query-p50-µs")
	b.ReportMetric(p50(pauseD), "paused-query-p50-µs")
	b.ReportMetric(p50(answerD), "answer-p50-µs")
	b.ReportMetric(p50(pauseD)+p50(answerD)-p50(plainD), "pause-cost-µs")
	b.ReportMetric(float64(row), "paused-row-bytes")
}
