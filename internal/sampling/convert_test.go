package sampling_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
	openai "github.com/sashabaranov/go-openai"

	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/sampling"
	"github.com/connector-svc/connector-svc/internal/store"
)

// wire is a sampling request as its JSON arrives: content blocks decoded
// as maps and lists, the way mcp-go's transports hand them over.
func wire(t *testing.T, params string) mcp.CreateMessageRequest {
	t.Helper()
	var req mcp.CreateMessageRequest
	if err := json.Unmarshal([]byte(params), &req.CreateMessageParams); err != nil {
		t.Fatal(err)
	}
	return req
}

// finish replies with msg and finish reason.
func finish(msg openai.ChatCompletionMessage, reason openai.FinishReason) llmtest.Step {
	return func(openai.ChatCompletionRequest) llmtest.Reply {
		return llmtest.Reply{Body: openai.ChatCompletionResponse{ID: "x", Object: "chat.completion", Model: "answering-model",
			Choices: []openai.ChatCompletionChoice{{Message: msg, FinishReason: reason}},
			Usage:   openai.Usage{PromptTokens: 40, CompletionTokens: 8, TotalTokens: 48}}}
	}
}

// TestMapsRequest: the system prompt, every kind of content (a single
// block or a list), a tool round, the capped maxTokens, temperature, stop
// sequences and tools reach the model as the chat API has them; the
// model is the connector's; the answer comes back as assistant text.
func TestMapsRequest(t *testing.T) {
	srv := llmtest.New(t, llmtest.Answer("Forty-two."))
	s := newSampler(t, srv, on(store.SamplingConfig{MaxTokensPerRequest: 300}), nil)
	req := wire(t, `{
		"systemPrompt": "You are terse.",
		"includeContext": "allServers",
		"modelPreferences": {"hints": [{"name": "claude-3-sonnet"}]},
		"temperature": 0.25,
		"stopSequences": ["END"],
		"maxTokens": 5000,
		"messages": [
			{"role": "user", "content": {"type": "text", "text": "What is in this picture?"}},
			{"role": "user", "content": [{"type": "text", "text": "Look:"}, {"type": "image", "data": "iVBORw0K", "mimeType": "image/png"}]},
			{"role": "assistant", "content": [{"type": "text", "text": "Let me check."},
				{"type": "tool_use", "id": "tu_1", "name": "weather", "input": {"city": "Oslo"}},
				{"type": "tool_use", "id": "tu_2", "name": "weather", "input": {"city": "Rome"}}]},
			{"role": "user", "content": [
				{"type": "tool_result", "toolUseId": "tu_2", "content": [{"type": "text", "text": "sunny"}]},
				{"type": "tool_result", "toolUseId": "tu_1", "content": [], "structuredContent": {"temp": -3}, "isError": false}]},
			{"role": "user", "content": {"type": "text", "text": "So?"}}
		],
		"tools": [{"name": "weather", "description": "Weather of a city", "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}],
		"toolChoice": {"mode": "required"}
	}`)
	res, err := s.Sample(context.Background(), 1, nil, call, req)
	if err != nil {
		t.Fatal(err)
	}
	if res.Role != mcp.RoleAssistant || res.StopReason != sampling.StopEndTurn || res.Model != "fake" {
		t.Errorf("result role %q stop %q model %q, want assistant endTurn fake", res.Role, res.StopReason, res.Model)
	}
	if tc, ok := res.Content.(mcp.TextContent); !ok || tc.Text != "Forty-two." {
		t.Errorf("content %#v, want the text Forty-two.", res.Content)
	}
	got := srv.Requests()[0]
	if got.Model != "conn-model" || got.MaxTokens != 300 || got.Temperature != 0.25 || !reflect.DeepEqual(got.Stop, []string{"END"}) {
		t.Errorf("model %q max_tokens %d temperature %v stop %v; want conn-model 300 0.25 [END]", got.Model, got.MaxTokens, got.Temperature, got.Stop)
	}
	if got.ToolChoice != "required" || len(got.Tools) != 1 || got.Tools[0].Function.Name != "weather" ||
		got.Tools[0].Function.Description != "Weather of a city" {
		t.Errorf("tool_choice %v tools %+v", got.ToolChoice, got.Tools)
	}
	params, _ := json.Marshal(got.Tools[0].Function.Parameters)
	if !strings.Contains(string(params), `"required":["city"]`) {
		t.Errorf("the tool's parameters %s lost the input schema", params)
	}
	m := got.Messages
	if len(m) != 7 {
		t.Fatalf("%d messages, want 7: %+v", len(m), m)
	}
	if m[0].Role != "system" || m[0].Content != "You are terse." {
		t.Errorf("message 0 %+v, want the system prompt", m[0])
	}
	if m[1].Role != "user" || m[1].Content != "What is in this picture?" {
		t.Errorf("message 1 %+v, want the user's text", m[1])
	}
	if len(m[2].MultiContent) != 2 || m[2].MultiContent[0].Text != "Look:" || m[2].MultiContent[1].ImageURL == nil ||
		m[2].MultiContent[1].ImageURL.URL != "data:image/png;base64,iVBORw0K" {
		t.Errorf("message 2 %+v, want text and a data URL image", m[2])
	}
	if m[3].Role != "assistant" || m[3].Content != "Let me check." || len(m[3].ToolCalls) != 2 ||
		m[3].ToolCalls[0].ID != "tu_1" || m[3].ToolCalls[0].Function.Name != "weather" || m[3].ToolCalls[0].Function.Arguments != `{"city":"Oslo"}` {
		t.Errorf("message 3 %+v, want the assistant's text and its two tool calls", m[3])
	}
	if m[4].Role != "tool" || m[4].ToolCallID != "tu_2" || m[4].Content != "sunny" {
		t.Errorf("message 4 %+v, want tu_2's result", m[4])
	}
	if m[5].Role != "tool" || m[5].ToolCallID != "tu_1" || m[5].Content != `{"temp":-3}` {
		t.Errorf("message 5 %+v, want tu_1's structured result", m[5])
	}
	if m[6].Role != "user" || m[6].Content != "So?" {
		t.Errorf("message 6 %+v", m[6])
	}
}

// TestToolChoice: auto (or none given) offers the tools with
// tool_choice auto; none offers no tools at all, and a tool call the model
// makes anyway is not passed on.
func TestToolChoice(t *testing.T) {
	srv := llmtest.New(t, llmtest.Answer("a"), llmtest.Answer("b"),
		llmtest.CallTools(llmtest.Call{Tool: "weather", Args: `{"city":"Oslo"}`}))
	s := newSampler(t, srv, on(store.SamplingConfig{}), nil)
	tools := `"tools": [{"name": "weather", "inputSchema": {"type": "object"}}]`
	for _, params := range []string{
		`{"maxTokens": 10, "messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}], ` + tools + `}`,
		`{"maxTokens": 10, "messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}], ` + tools + `, "toolChoice": {"mode": "auto"}}`,
		`{"maxTokens": 10, "messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}], ` + tools + `, "toolChoice": {"mode": "none"}}`,
	} {
		res, err := s.Sample(context.Background(), 1, nil, call, wire(t, params))
		if err != nil {
			t.Fatal(err)
		}
		if res.StopReason != sampling.StopEndTurn {
			t.Errorf("stop reason %q, want endTurn", res.StopReason)
		}
		if _, ok := res.Content.(mcp.TextContent); !ok {
			t.Errorf("content %#v, want text", res.Content)
		}
	}
	reqs := srv.Requests()
	for i, want := range []string{"auto", "auto"} {
		if reqs[i].ToolChoice != want || len(reqs[i].Tools) != 1 {
			t.Errorf("request %d: tool_choice %v, %d tools; want %s and the tool", i, reqs[i].ToolChoice, len(reqs[i].Tools), want)
		}
	}
	if reqs[2].ToolChoice != nil || len(reqs[2].Tools) != 0 {
		t.Errorf("mode none: tool_choice %v, %d tools; want neither", reqs[2].ToolChoice, len(reqs[2].Tools))
	}
}

// TestStopReasons: the model's finish reasons map to MCP's; tool calls come
// back as tool uses (never run) with their ids and inputs.
func TestStopReasons(t *testing.T) {
	toolCalls := openai.ChatCompletionMessage{Role: "assistant", Content: "Checking both.", ToolCalls: []openai.ToolCall{
		{ID: "call_a", Type: "function", Function: openai.FunctionCall{Name: "weather", Arguments: `{"city":"Oslo"}`}},
		{ID: "call_b", Type: "function", Function: openai.FunctionCall{Name: "time", Arguments: ``}},
	}}
	srv := llmtest.New(t,
		finish(openai.ChatCompletionMessage{Role: "assistant", Content: "cut"}, openai.FinishReasonLength),
		finish(openai.ChatCompletionMessage{Role: "assistant", Content: ""}, openai.FinishReasonContentFilter),
		finish(toolCalls, openai.FinishReasonToolCalls),
		// Some endpoints (Ollama) say stop with tool calls.
		finish(toolCalls, openai.FinishReasonStop),
	)
	s := newSampler(t, srv, on(store.SamplingConfig{}), nil)
	withTools := request(50, "weather?")
	withTools.Tools = []mcp.Tool{mcp.NewTool("weather", mcp.WithString("city")), mcp.NewTool("time")}
	for i, tc := range []struct {
		req  mcp.CreateMessageRequest
		stop string
	}{{request(50, "x"), sampling.StopMaxTokens}, {request(50, "x"), sampling.StopEndTurn},
		{withTools, sampling.StopToolUse}, {withTools, sampling.StopToolUse}} {
		res, err := s.Sample(context.Background(), 1, nil, call, tc.req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if res.StopReason != tc.stop || res.Model != "answering-model" {
			t.Errorf("request %d: stop %q model %q, want %q answering-model", i, res.StopReason, res.Model, tc.stop)
		}
		if tc.stop != sampling.StopToolUse {
			continue
		}
		content, ok := res.Content.([]mcp.Content)
		if !ok || len(content) != 3 {
			t.Fatalf("request %d: content %#v, want text and two tool uses", i, res.Content)
		}
		if text, ok := content[0].(mcp.TextContent); !ok || text.Text != "Checking both." {
			t.Errorf("request %d: first block %#v", i, content[0])
		}
		use, ok := content[1].(mcp.ToolUseContent)
		if !ok || use.Type != "tool_use" || use.ID != "call_a" || use.Name != "weather" || !reflect.DeepEqual(use.Input, map[string]any{"city": "Oslo"}) {
			t.Errorf("request %d: tool use %#v", i, content[1])
		}
		if use, ok := content[2].(mcp.ToolUseContent); !ok || use.ID != "call_b" || use.Name != "time" || !reflect.DeepEqual(use.Input, map[string]any{}) {
			t.Errorf("request %d: tool use %#v", i, content[2])
		}
		// The result is valid MCP: it parses back into the same blocks.
		raw, _ := json.Marshal(res)
		var back mcp.CreateMessageResult
		if err := json.Unmarshal(raw, &back); err != nil {
			t.Fatal(err)
		}
		if parsed, err := mcp.ParseSamplingContent(back.Content); err != nil || len(parsed.([]mcp.Content)) != 3 {
			t.Errorf("request %d: the result's JSON %s does not parse back: %v", i, raw, err)
		}
	}
}

// TestRefusesMalformed: malformed requests, and what the model cannot
// take, are refused with -32602 before anything reaches the model; so are
// requests for an unknown connector or one that does not sample.
func TestRefusesMalformed(t *testing.T) {
	srv := llmtest.New(t) // any request fails the test
	s := sampling.New(sampling.Config{Chat: model(t, srv).Chat, Connector: connectors(map[int64]sampling.Target{
		1: {Name: "shop", Sampling: on(store.SamplingConfig{})},
		2: {Name: "off", Sampling: &store.SamplingConfig{}},
		3: {Name: "unset"},
	})})
	const user = `{"role": "user", "content": {"type": "text", "text": "hi"}}`
	const uses = `{"role": "assistant", "content": [{"type": "tool_use", "id": "tu_1", "name": "w", "input": {}}]}`
	for _, tc := range []struct {
		name, params, want string
		code               int
	}{
		{"mixed", `[` + user + `,` + uses + `, {"role": "user", "content": [{"type": "tool_result", "toolUseId": "tu_1", "content": []}, {"type": "text", "text": "and"}]}]`,
			"mixes tool results with other content", mcp.INVALID_PARAMS},
		{"unmatched", `[` + user + `,` + uses + `, {"role": "user", "content": [{"type": "tool_result", "toolUseId": "tu_9", "content": []}]}]`,
			`tool result "tu_9" answers no tool use`, mcp.INVALID_PARAMS},
		{"result without use", `[` + user + `, {"role": "user", "content": {"type": "tool_result", "toolUseId": "tu_1", "content": []}}]`,
			"the message before it used no tools", mcp.INVALID_PARAMS},
		{"unanswered", `[` + user + `,` + uses + `,` + user + `]`, "mixes tool results with other content, or does not answer", mcp.INVALID_PARAMS},
		{"unanswered last", `[` + user + `,` + uses + `]`, "tool use tu_1 of the last message has no result", mcp.INVALID_PARAMS},
		{"audio", `[{"role": "user", "content": {"type": "audio", "data": "AAAA", "mimeType": "audio/wav"}}]`, "audio content", mcp.INVALID_PARAMS},
		{"role", `[{"role": "system", "content": {"type": "text", "text": "x"}}]`, `role "system"`, mcp.INVALID_PARAMS},
		{"empty", `[]`, "no messages", mcp.INVALID_PARAMS},
	} {
		req := wire(t, `{"maxTokens": 10, "messages": `+tc.params+`}`)
		_, err := s.Sample(context.Background(), 1, nil, call, req)
		var e *sampling.Error
		if !errors.As(err, &e) || e.Code != tc.code || e.Outcome != sampling.OutcomeInvalid || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want code %d and %q", tc.name, err, tc.code, tc.want)
		}
	}
	for id, want := range map[int64]string{2: `sampling is not enabled on connector "off"`, 3: `sampling is not enabled on connector "unset"`,
		9: "connector 9 is not known"} {
		_, err := s.Sample(context.Background(), id, nil, call, request(10, "hi"))
		var e *sampling.Error
		if !errors.As(err, &e) || e.Outcome != sampling.OutcomeRefused || !strings.Contains(err.Error(), want) {
			t.Errorf("connector %d: error %v, want %q", id, err, want)
		}
	}
	if n := len(srv.Requests()); n != 0 {
		t.Errorf("the model was asked %d times", n)
	}
}

// TestFunctionNames: tool names the chat API does not take (dots,
// slashes, over 64 characters) are offered as function names it takes,
// the same in the history, and the model's calls come back with the
// tool's own name.
func TestFunctionNames(t *testing.T) {
	long := strings.Repeat("x", 70)
	srv := llmtest.New(t, llmtest.CallTools(llmtest.Call{Tool: "files_read_v2", Args: `{"path":"/a","n":12345678901234567890}`},
		llmtest.Call{Tool: "files_read", Args: `{}`}, llmtest.Call{Tool: long[:64], Args: `{}`}))
	s := newSampler(t, srv, on(store.SamplingConfig{}), nil)
	req := wire(t, `{"maxTokens": 10, "messages": [
		{"role": "user", "content": {"type": "text", "text": "read it"}},
		{"role": "assistant", "content": {"type": "tool_use", "id": "tu_1", "name": "files/read.v2", "input": {"path": "/b"}}},
		{"role": "user", "content": {"type": "tool_result", "toolUseId": "tu_1", "content": [{"type": "text", "text": "B"}]}}],
		"tools": [{"name": "files/read.v2", "inputSchema": {"type": "object"}}, {"name": "files_read", "inputSchema": {"type": "object"}},
			{"name": "`+long+`", "inputSchema": {"type": "object"}}]}`)
	res, err := s.Sample(context.Background(), 1, nil, call, req)
	if err != nil {
		t.Fatal(err)
	}
	got := srv.Requests()[0]
	var offered []string
	for _, tool := range got.Tools {
		offered = append(offered, tool.Function.Name)
	}
	if want := []string{"files_read_v2", "files_read", long[:64]}; !reflect.DeepEqual(offered, want) {
		t.Errorf("offered %v, want %v", offered, want)
	}
	if name := got.Messages[1].ToolCalls[0].Function.Name; name != "files_read_v2" {
		t.Errorf("the history's tool call is named %q", name)
	}
	content := res.Content.([]mcp.Content)
	var names []string
	for _, b := range content {
		names = append(names, b.(mcp.ToolUseContent).Name)
	}
	if want := []string{"files/read.v2", "files_read", long}; !reflect.DeepEqual(names, want) {
		t.Errorf("tool uses %v, want %v", names, want)
	}
	raw, _ := json.Marshal(content[0].(mcp.ToolUseContent).Input)
	if string(raw) != `{"n":12345678901234567890,"path":"/a"}` {
		t.Errorf("input %s lost the number's digits", raw)
	}
}
