package devmodel_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	openai "github.com/sashabaranov/go-openai"

	"github.com/connector-svc/connector-svc/internal/llm/devmodel"
)

// client is a go-openai client of a development model served over real
// HTTP, and the model's log lines.
func client(t *testing.T) (*openai.Client, func() []string) {
	t.Helper()
	var (
		mu    sync.Mutex
		lines []string
	)
	srv := httptest.NewServer(devmodel.Handler(func(l string) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, l)
	}))
	t.Cleanup(srv.Close)
	cfg := openai.DefaultConfig("")
	cfg.BaseURL = srv.URL + "/v1"
	return openai.NewClientWithConfig(cfg), func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), lines...)
	}
}

// tool is a function tool with a JSON schema.
func tool(name, schema string) openai.Tool {
	return openai.Tool{Type: openai.ToolTypeFunction, Function: &openai.FunctionDefinition{Name: name, Parameters: json.RawMessage(schema)}}
}

// The reference MCP server's tools, as the connector agent offers them.
var (
	echo        = tool("echo", `{"type":"object","properties":{"message":{"type":"string"}},"required":["message"]}`)
	getSum      = tool("get-sum", `{"type":"object","properties":{"a":{"type":"number"},"b":{"type":"number"}},"required":["a","b"]}`)
	tinyImage   = tool("get-tiny-image", `{"type":"object","properties":{}}`)
	elicitation = tool("trigger-elicitation-request", `{"type":"object","properties":{}}`)
	urlElicit   = tool("trigger-url-elicitation", `{"type":"object","properties":{"url":{"type":"string"}},"required":["url"]}`)
	sampling    = tool("trigger-sampling-request", `{"type":"object","properties":{"prompt":{"type":"string"},"maxTokens":{"type":"number","default":100},"note":{"type":"string"}},"required":["prompt","maxTokens"]}`)
)

func chat(t *testing.T, c *openai.Client, req openai.ChatCompletionRequest) openai.ChatCompletionResponse {
	t.Helper()
	if req.Model == "" {
		req.Model = "dev-model"
	}
	resp, err := c.CreateChatCompletion(context.Background(), req)
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	if len(resp.Choices) != 1 {
		t.Fatalf("%d choices; want 1", len(resp.Choices))
	}
	return resp
}

func user(text string) []openai.ChatCompletionMessage {
	return []openai.ChatCompletionMessage{
		{Role: openai.ChatMessageRoleSystem, Content: "You are the agent of the \"everything\" connector."},
		{Role: openai.ChatMessageRoleUser, Content: text},
	}
}

// calls returns a reply's tool calls as tool name → decoded arguments.
func calls(t *testing.T, resp openai.ChatCompletionResponse) []call {
	t.Helper()
	var out []call
	for _, c := range resp.Choices[0].Message.ToolCalls {
		var args map[string]any
		if err := json.Unmarshal([]byte(c.Function.Arguments), &args); err != nil {
			t.Fatalf("the arguments of %s are not a JSON object: %v", c.Function.Name, err)
		}
		if c.ID == "" || c.Type != openai.ToolTypeFunction {
			t.Errorf("call %+v: want an id and type function", c)
		}
		out = append(out, call{c.Function.Name, args})
	}
	return out
}

type call struct {
	Tool string
	Args map[string]any
}

func TestToolChoice(t *testing.T) {
	c, _ := client(t)
	offered := []openai.Tool{echo, getSum, tinyImage, elicitation, urlElicit, sampling}
	for _, tt := range []struct {
		name, query string
		want        []call
	}{
		{"a tool the query names", "Say hello through the echo tool",
			[]call{{"echo", map[string]any{"message": "Say hello through the echo tool"}}}},
		{"every tool the query names, in the order offered; numbers in turn", "Add 2 and 3.5 with get sum, then echo it",
			[]call{{"echo", map[string]any{"message": "Add 2 and 3.5 with get sum, then echo it"}}, {"get-sum", map[string]any{"a": 2.0, "b": 3.5}}}},
		{"else the name closest to the query", "Fill in my profile: trigger an elicitation request",
			[]call{{"trigger-elicitation-request", map[string]any{}}}},
		{"else the first tool", "What is the weather like?",
			[]call{{"echo", map[string]any{"message": "What is the weather like?"}}}},
		{"the query, not the agent's context", "Context:\nThe user likes images.\n\nQuery:\nSay hi with echo",
			[]call{{"echo", map[string]any{"message": "Say hi with echo"}}}},
		{"a default, and no optional field", "Ask the model through trigger-sampling-request",
			[]call{{"trigger-sampling-request", map[string]any{"prompt": "Ask the model through trigger-sampling-request", "maxTokens": 100.0}}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp := chat(t, c, openai.ChatCompletionRequest{Messages: user(tt.query), Tools: offered, ToolChoice: "auto"})
			if diff := cmp.Diff(tt.want, calls(t, resp)); diff != "" {
				t.Errorf("calls (-want +got):\n%s", diff)
			}
			if got := resp.Choices[0].FinishReason; got != openai.FinishReasonToolCalls {
				t.Errorf("finish reason %q; want tool_calls", got)
			}
			if resp.Usage.TotalTokens == 0 {
				t.Error("no usage")
			}
		})
	}
}

func TestArgumentsFromSchema(t *testing.T) {
	c, _ := client(t)
	schema := `{"type":"object","properties":{
		"text":{"type":"string"},"count":{"type":"integer"},"ratio":{"type":["number","null"]},"on":{"type":"boolean"},
		"color":{"type":"string","enum":["red","green"]},"tags":{"type":"array","items":{"type":"string"}},
		"where":{"type":"object","properties":{"city":{"type":"string"},"zip":{"type":"string"}},"required":["city"]},
		"optional":{"type":"string"}},
		"required":["text","count","ratio","on","color","tags","where"]}`
	resp := chat(t, c, openai.ChatCompletionRequest{Messages: user("fill-form with 7.9 and -2"), Tools: []openai.Tool{tool("fill-form", schema)}})
	want := []call{{"fill-form", map[string]any{"text": "fill-form with 7.9 and -2", "count": 7.0, "ratio": -2.0, "on": false,
		"color": "red", "tags": []any{}, "where": map[string]any{"city": "fill-form with 7.9 and -2"}}}}
	if diff := cmp.Diff(want, calls(t, resp)); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
}

func TestForcedToolChoice(t *testing.T) {
	c, _ := client(t)
	resp := chat(t, c, openai.ChatCompletionRequest{Messages: user("Say hello through the echo tool"), Tools: []openai.Tool{echo, getSum},
		ToolChoice: openai.ToolChoice{Type: openai.ToolTypeFunction, Function: openai.ToolFunction{Name: "get-sum"}}})
	if diff := cmp.Diff([]call{{"get-sum", map[string]any{"a": 0.0, "b": 0.0}}}, calls(t, resp)); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	resp = chat(t, c, openai.ChatCompletionRequest{Messages: user("Say hello through the echo tool"), Tools: []openai.Tool{echo}, ToolChoice: "none"})
	if msg := resp.Choices[0].Message; len(msg.ToolCalls) != 0 || !strings.HasPrefix(msg.Content, devmodel.Label) {
		t.Errorf("tool_choice none: %+v; want an answer", msg)
	}
}

func TestFinalAnswer(t *testing.T) {
	c, logged := client(t)
	msgs := append(user("Say hello through echo and add 2 and 3 with get-sum"), openai.ChatCompletionMessage{
		Role: openai.ChatMessageRoleAssistant, ToolCalls: []openai.ToolCall{
			{ID: "call_1", Type: openai.ToolTypeFunction, Function: openai.FunctionCall{Name: "echo", Arguments: `{"message":"hello"}`}},
			{ID: "call_2", Type: openai.ToolTypeFunction, Function: openai.FunctionCall{Name: "get-sum", Arguments: `{"a":2,"b":3}`}},
		}},
		openai.ChatCompletionMessage{Role: openai.ChatMessageRoleTool, ToolCallID: "call_1", Content: "Echo: hello"},
		openai.ChatCompletionMessage{Role: openai.ChatMessageRoleTool, ToolCallID: "call_2", Content: "The sum of 2 and 3 is 5.\n" + strings.Repeat("x", 1000)},
	)
	resp := chat(t, c, openai.ChatCompletionRequest{Messages: msgs, Tools: []openai.Tool{echo, getSum}, ToolChoice: "auto"})
	msg := resp.Choices[0].Message
	if len(msg.ToolCalls) != 0 {
		t.Fatalf("tool results, then more calls: %+v", msg.ToolCalls)
	}
	want := devmodel.Label + ": echo returned: Echo: hello; get-sum returned: The sum of 2 and 3 is 5. xxx"
	if !strings.HasPrefix(msg.Content, want) || !strings.HasSuffix(msg.Content, "x…") || len(msg.Content) > 600 {
		t.Errorf("answer %q; want it to start %q, the long result cut", msg.Content, want)
	}
	if resp.Choices[0].FinishReason != openai.FinishReasonStop {
		t.Errorf("finish reason %q; want stop", resp.Choices[0].FinishReason)
	}
	if l := logged(); len(l) != 1 || !strings.Contains(l[0], "answered from 2 tool results") {
		t.Errorf("log %q", l)
	}
}

// A server's sampling request offers no tools: the answer repeats what it
// was asked.
func TestAnswerWithoutTools(t *testing.T) {
	c, _ := client(t)
	resp := chat(t, c, openai.ChatCompletionRequest{MaxTokens: 50, Messages: []openai.ChatCompletionMessage{
		{Role: openai.ChatMessageRoleSystem, Content: "You are a helpful test server."},
		{Role: openai.ChatMessageRoleUser, MultiContent: []openai.ChatMessagePart{{Type: openai.ChatMessagePartTypeText, Text: "Say hi in three words"}}},
	}})
	if got, want := resp.Choices[0].Message.Content, devmodel.Label+" got: Say hi in three words"; got != want {
		t.Errorf("answer %q; want %q", got, want)
	}
}

func TestPlan(t *testing.T) {
	c, _ := client(t)
	system := "You are the agent of the \"everything\" connector.\nYou answer one query with this connector's tools:\n" +
		"- echo: Echoes back the input string\n- get-sum: Returns the sum of two numbers\n\nRules:\n- Use only the tools you are offered.\n\n" +
		"Do not call any tool now. Reply with only a JSON object of the form\n{\"plan\": [{\"tool\": \"<tool name>\", \"purpose\": \"<one line on why>\"}]}\n"
	for query, want := range map[string]string{
		"Say hello through the echo tool": `{"plan":[{"tool":"echo","purpose":"dev-model (a scripted stand-in): the query names it"}]}`,
		"What is the sum of 2 and 3?":     `{"plan":[{"tool":"get-sum","purpose":"dev-model (a scripted stand-in): its name is the closest to the query"}]}`,
		"Hi":                              `{"plan":[{"tool":"echo","purpose":"dev-model (a scripted stand-in): the first tool offered"}]}`,
	} {
		resp := chat(t, c, openai.ChatCompletionRequest{Messages: []openai.ChatCompletionMessage{
			{Role: openai.ChatMessageRoleSystem, Content: system}, {Role: openai.ChatMessageRoleUser, Content: query}}})
		if got := resp.Choices[0].Message.Content; got != want {
			t.Errorf("plan for %q: %s; want %s", query, got, want)
		}
	}
}

func TestEmbeddings(t *testing.T) {
	c, _ := client(t)
	resp, err := c.CreateEmbeddings(context.Background(), openai.EmbeddingRequest{Model: "dev-model",
		Input: []string{"echo a message back", "Echo the message", "add two numbers"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Data) != 3 {
		t.Fatalf("%d embeddings; want 3", len(resp.Data))
	}
	dot := func(a, b []float32) (s float32) {
		for i := range a {
			s += a[i] * b[i]
		}
		return s
	}
	v := [3][]float32{resp.Data[0].Embedding, resp.Data[1].Embedding, resp.Data[2].Embedding}
	if self := dot(v[0], v[0]); self < 0.999 || self > 1.001 {
		t.Errorf("|v|² = %v; want 1", self)
	}
	if near, far := dot(v[0], v[1]), dot(v[0], v[2]); near <= far {
		t.Errorf("texts sharing words are %v apart, texts sharing none %v; want the first nearer", near, far)
	}
}

func TestRefusesStreaming(t *testing.T) {
	c, _ := client(t)
	_, err := c.CreateChatCompletionStream(context.Background(), openai.ChatCompletionRequest{Model: "dev-model", Messages: user("hi"), Stream: true})
	var apiErr *openai.APIError
	if !errors.As(err, &apiErr) || apiErr.HTTPStatusCode != http.StatusBadRequest || !strings.Contains(apiErr.Message, "does not stream") {
		t.Errorf("stream: %v; want a 400 saying the dev-model does not stream", err)
	}
}
