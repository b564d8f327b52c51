package sampling_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
	openai "github.com/sashabaranov/go-openai"

	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/sampling"
	"github.com/connector-svc/connector-svc/internal/store"
)

// samplingServer is an MCP server (streamable HTTP, in process) whose
// tools ask the client's model:
//   - ask: one sampling request with the server's system prompt, times
//     "times" rounds; it answers with the last completion, or the error;
//   - ask_mrtr: one sampling request the sessionless way (2026-07-28): the
//     call answers input_required, and is retried with the completion;
//   - echo: no sampling, for comparison;
//   - agent: a sampling loop with a "weather" tool the server runs itself
//     when the model asks for it, until the model answers.
//
// ran counts the server's runs of its weather tool.
func samplingServer(t testing.TB, ran *atomic.Int64) string {
	m := server.NewMCPServer("sampler", "1.0.0")
	m.EnableSampling()
	m.AddTool(mcp.NewTool("ask", mcp.WithString("prompt", mcp.Required()), mcp.WithNumber("times")),
		func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			times := max(req.GetInt("times", 1), 1)
			var last string
			for range times {
				var sreq mcp.CreateMessageRequest
				sreq.SystemPrompt = "You are the sampler server's helper."
				sreq.MaxTokens = 2000
				sreq.Messages = []mcp.SamplingMessage{{Role: mcp.RoleUser, Content: mcp.NewTextContent(req.GetString("prompt", ""))}}
				res, err := m.RequestSampling(ctx, sreq)
				if err != nil {
					return mcp.NewToolResultError("sampling: " + err.Error()), nil
				}
				last = fmt.Sprintf("%s (%s, %s)", textOf(res.Content), res.Model, res.StopReason)
			}
			return mcp.NewToolResultText(last), nil
		})
	m.AddTool(mcp.NewTool("agent", mcp.WithString("question", mcp.Required())),
		func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var sreq mcp.CreateMessageRequest
			sreq.MaxTokens = 500
			sreq.Tools = []mcp.Tool{mcp.NewTool("weather", mcp.WithDescription("Weather of a city"), mcp.WithString("city", mcp.Required()))}
			sreq.Messages = []mcp.SamplingMessage{{Role: mcp.RoleUser, Content: mcp.NewTextContent(req.GetString("question", ""))}}
			for round := 0; round < 5; round++ {
				res, err := m.RequestSampling(ctx, sreq)
				if err != nil {
					return mcp.NewToolResultError("sampling: " + err.Error()), nil
				}
				if res.StopReason != sampling.StopToolUse {
					return mcp.NewToolResultText(textOf(res.Content)), nil
				}
				blocks, _ := res.Content.([]mcp.Content)
				var results []mcp.Content
				for _, b := range blocks {
					if use, ok := b.(mcp.ToolUseContent); ok {
						ran.Add(1)
						city, _ := use.Input.(map[string]any)["city"].(string)
						results = append(results, mcp.NewToolResultContent(use.ID, []mcp.Content{mcp.NewTextContent("sunny in " + city)}, false))
					}
				}
				sreq.Messages = append(sreq.Messages, mcp.SamplingMessage{Role: mcp.RoleAssistant, Content: blocks},
					mcp.SamplingMessage{Role: mcp.RoleUser, Content: results})
			}
			return mcp.NewToolResultError("too many rounds"), nil
		})
	m.AddTool(mcp.NewTool("ask_mrtr", mcp.WithString("prompt", mcp.Required())),
		func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			if res := server.SamplingResponse(req.Params.InputResponses, "s1"); res != nil {
				return mcp.NewToolResultText(fmt.Sprintf("%s (%s, %s)", textOf(res.Content), res.Model, res.StopReason)), nil
			}
			params := mcp.CreateMessageParams{SystemPrompt: "Sessionless helper.", MaxTokens: 64,
				Messages: []mcp.SamplingMessage{{Role: mcp.RoleUser, Content: mcp.NewTextContent(req.GetString("prompt", ""))}}}
			return server.NewInputRequestBuilder("round-1").Sample("s1", params).ToolResult(), nil
		})
	m.AddTool(mcp.NewTool("echo", mcp.WithString("prompt")), func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText(req.GetString("prompt", "")), nil
	})
	hs := httptest.NewServer(server.NewStreamableHTTPServer(m, server.WithStreamableHTTPLogger(slog.New(slog.DiscardHandler))))
	t.Cleanup(hs.Close)
	return hs.URL + "/mcp"
}

func textOf(content any) string {
	if parsed, err := mcp.ParseSamplingContent(content); err == nil {
		content = parsed
	}
	switch c := content.(type) {
	case mcp.TextContent:
		return c.Text
	case []mcp.Content:
		var parts []string
		for _, b := range c {
			if tc, ok := b.(mcp.TextContent); ok {
				parts = append(parts, tc.Text)
			}
		}
		return strings.Join(parts, " ")
	}
	return fmt.Sprintf("%v", content)
}

// handler adapts a Sampler to mcp-go's client, for connector id and the
// caller a: what the registry does on a connection.
type handler struct {
	s  *sampling.Sampler
	id int64
	a  ask.Asker
}

func (h handler) CreateMessage(ctx context.Context, req mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
	return h.s.Sample(ctx, h.id, h.a, ask.Call{Tool: "ask"}, req)
}

// dial connects an mcp-go client that declares sampling with tools and
// answers with h, on the classic protocol.
func dial(t testing.TB, url string, h client.SamplingHandler) *client.Client {
	return dialVersion(t, url, h, "2025-11-25")
}

func dialVersion(t testing.TB, url string, h client.SamplingHandler, version string) *client.Client {
	t.Helper()
	opts := []transport.StreamableHTTPCOption{transport.WithLogger(slog.New(slog.DiscardHandler))}
	if !mcp.IsModernProtocol(version) {
		// The classic protocol's server requests come on the GET stream.
		opts = append(opts, transport.WithContinuousListening())
	}
	tr, err := transport.NewStreamableHTTP(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	c := client.NewClient(tr, client.WithSamplingHandler(h), client.WithProtocolVersion(version),
		client.WithClientCapabilities(mcp.ClientCapabilities{Sampling: &mcp.SamplingCapability{Tools: &struct{}{}}}))
	// The client listens for the server's requests on a stream that lives
	// as long as Start's context.
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var init mcp.InitializeRequest
	init.Params.ClientInfo = mcp.Implementation{Name: "connector-svc-test", Version: "1"}
	res, err := c.Initialize(ctx, init)
	if err != nil {
		t.Fatal(err)
	}
	if res.ProtocolVersion != version {
		t.Fatalf("the client negotiated %s, want %s", res.ProtocolVersion, version)
	}
	return c
}

func callTool(t testing.TB, c *client.Client, name string, args map[string]any) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var req mcp.CallToolRequest
	req.Params.Name, req.Params.Arguments = name, args
	res, err := c.CallTool(ctx, req)
	if err != nil {
		t.Fatalf("call %s: %v", name, err)
	}
	return textOf(res.Content), res.IsError
}

// TestEndToEnd: a real mcp-go server's tool samples over streamable HTTP;
// the client's handler is the Sampler: the fake model gets the server's
// system prompt and the capped maxTokens, the tool gets the completion;
// a sampling loop with tools gets tool uses, runs the tool itself (the
// service runs nothing) and gets the final answer; past the run's budget
// the tool gets an error at once, naming the budget.
func TestEndToEnd(t *testing.T) {
	var ran atomic.Int64
	url := samplingServer(t, &ran)
	srv := llmtest.New(t,
		llmtest.Answer("It is 42."),
		llmtest.CallTools(llmtest.Call{Tool: "weather", Args: `{"city":"Oslo"}`}, llmtest.Call{Tool: "weather", Args: `{"city":"Rome"}`}),
		llmtest.Answer("Sunny in both."),
	)
	s := newSampler(t, srv, on(store.SamplingConfig{MaxTokensPerRequest: 256}), nil)
	a := &asker{budget: s.Budget(on(store.SamplingConfig{MaxRequestsPerRun: 3}))}
	c := dial(t, url, handler{s: s, id: 1, a: a})

	text, isErr := callTool(t, c, "ask", map[string]any{"prompt": "What is the answer?"})
	if isErr || text != "It is 42. (fake, endTurn)" {
		t.Errorf("ask: %q (error %v)", text, isErr)
	}
	got := srv.Requests()[0]
	if got.MaxTokens != 256 || got.Messages[0].Role != "system" || got.Messages[0].Content != "You are the sampler server's helper." ||
		got.Messages[1].Content != "What is the answer?" || got.Model != "conn-model" {
		t.Errorf("the model got %+v", got)
	}

	text, isErr = callTool(t, c, "agent", map[string]any{"question": "Weather in Oslo and Rome?"})
	if isErr || text != "Sunny in both." {
		t.Errorf("agent: %q (error %v)", text, isErr)
	}
	if n := ran.Load(); n != 2 {
		t.Errorf("the server ran its tool %d times, want 2", n)
	}
	reqs := srv.Requests()
	second := reqs[2]
	if len(second.Tools) != 1 || second.Tools[0].Function.Name != "weather" || len(second.Messages) != 4 ||
		second.Messages[1].Role != "assistant" || len(second.Messages[1].ToolCalls) != 2 ||
		second.Messages[2].Role != "tool" || second.Messages[2].ToolCallID != "call_1" || second.Messages[2].Content != "sunny in Oslo" ||
		second.Messages[3].ToolCallID != "call_2" || second.Messages[3].Content != "sunny in Rome" {
		t.Errorf("the second round of the loop sent %+v", second)
	}

	// The run's budget of 3 is spent: the next request is refused.
	text, isErr = callTool(t, c, "ask", map[string]any{"prompt": "Again?"})
	if !isErr || !strings.Contains(text, "sampling budget exhausted: 3 sampling requests per run") {
		t.Errorf("over budget: %q (error %v), want the budget named", text, isErr)
	}
	if n := len(srv.Requests()); n != 3 {
		t.Errorf("the model was asked %d times, want 3", n)
	}
	recs := a.Records()
	if len(recs) != 4 || len(recs[1].ToolUses) != 2 || recs[1].StopReason != "toolUse" || recs[3].Err == "" {
		t.Errorf("records %+v", recs)
	}
}

// TestEndToEndSessionless: on the 2026-07-28 protocol the server asks in
// an input_required answer, and the client's retry carries the
// completion the Sampler made.
func TestEndToEndSessionless(t *testing.T) {
	var ran atomic.Int64
	srv := llmtest.New(t, llmtest.Answer("Stateless answer."))
	s := newSampler(t, srv, on(store.SamplingConfig{}), nil)
	a := &asker{budget: s.Budget(nil)}
	c := dialVersion(t, samplingServer(t, &ran), handler{s: s, id: 1, a: a}, "2026-07-28")
	text, isErr := callTool(t, c, "ask_mrtr", map[string]any{"prompt": "hello"})
	if isErr || text != "Stateless answer. (fake, endTurn)" {
		t.Errorf("ask_mrtr: %q (error %v)", text, isErr)
	}
	reqs := srv.Requests()
	if len(reqs) != 1 || reqs[0].Messages[0].Content != "Sessionless helper." || reqs[0].Messages[1].Content != "hello" || reqs[0].MaxTokens != 64 {
		t.Errorf("the model got %+v", reqs)
	}
	if req, _ := a.budget.Used(); req != 1 {
		t.Errorf("the run's budget counted %d requests, want 1", req)
	}
}

// TestEndToEndOff: a connector that does not sample answers the server
// with an error at once.
func TestEndToEndOff(t *testing.T) {
	var ran atomic.Int64
	srv := llmtest.New(t)
	s := newSampler(t, srv, &store.SamplingConfig{}, nil)
	c := dial(t, samplingServer(t, &ran), handler{s: s, id: 1})
	text, isErr := callTool(t, c, "ask", map[string]any{"prompt": "hi"})
	if !isErr || !strings.Contains(text, `sampling is not enabled on connector "shop"`) {
		t.Errorf("ask: %q (error %v), want sampling refused", text, isErr)
	}
}

// BenchmarkSamplingRoundTrip is a tool call whose tool samples once,
// through the streamable-HTTP server, the client and the Sampler to the
// fake model; BenchmarkToolCall is a tool call that does not sample, and
// BenchmarkPlainChat the fake model's request alone.
func BenchmarkSamplingRoundTrip(b *testing.B) { benchCall(b, "ask") }

func BenchmarkToolCall(b *testing.B) { benchCall(b, "echo") }

// benchCall times calls of the sampling server's tool; the fake model
// answers every sampling request.
func benchCall(b *testing.B, tool string) {
	var ran atomic.Int64
	url := samplingServer(b, &ran)
	srv := llmtest.New(b, answers(b.N+1)...)
	c := dial(b, url, handler{s: newSampler(b, srv, on(store.SamplingConfig{}), nil), id: 1})
	callTool(b, c, tool, map[string]any{"prompt": "warm up"})
	b.ResetTimer()
	for range b.N {
		if _, isErr := callTool(b, c, tool, map[string]any{"prompt": "hi"}); isErr {
			b.Fatal("the call failed")
		}
	}
}

func BenchmarkPlainChat(b *testing.B) {
	srv := llmtest.New(b, answers(b.N+1)...)
	chat := model(b, srv).Chat
	req := openai.ChatCompletionRequest{Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "hi"}}, MaxTokens: 100}
	if _, err := chat(context.Background(), req); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if _, err := chat(context.Background(), req); err != nil {
			b.Fatal(err)
		}
	}
}
