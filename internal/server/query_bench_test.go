package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
	openai "github.com/sashabaranov/go-openai"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/benchgoal"
)

// BenchmarkQueryOverhead measures what the service adds to a query beyond
// its parts: one QueryConnector (the model asks for one echo call, then
// answers) side by side, in turn, with the same parts made directly — the
// gRPC hop (a health check on the same connection), the model's two
// requests (the very bodies the agent sent, posted again to the instant
// fake model, and its answers decoded) and the echo call on an mcp-go
// client of the same server. Making the request bodies is the service's
// work, so it counts in the overhead. The overhead is the query's p50 less the p50 of the
// parts' sum. With 500 tools, the same with every tool offered and
// narrowed to the ones that fit the query, with the size of a model
// request.
func BenchmarkQueryOverhead(b *testing.B) {
	b.Run("tools-1", func(b *testing.B) {
		benchQueryOverhead(b, 1, 0)
	})
	var all, narrowed float64 // bytes per model request
	b.Run("tools-500-all", func(b *testing.B) {
		all = benchQueryOverhead(b, 500, 100000)
	})
	b.Run("tools-500-narrowed", func(b *testing.B) {
		narrowed = benchQueryOverhead(b, 500, 0)
		if all > 0 {
			benchgoal.Report(b, "narrowed-request-bytes-vs-all", narrowed/all, "x-bytes", benchgoal.AtMost, 0.1)
		}
	})
}

// benchQueryOverhead runs the benchmark on a connector with tools tools
// and narrowAbove as its narrowing threshold (0: the default), and returns
// the size of the first model request of a query.
func benchQueryOverhead(b *testing.B, tools, narrowAbove int) float64 {
	ctx := context.Background()
	mcpURL := benchMCP(b, tools-1)
	model := newInstantModel(b)
	conn, _ := serveService(b, benchService{auth: auth.ModeNone, llmURL: model.url()})
	svc := connectorv1.NewConnectorServiceClient(conn)
	spec := mcpConnector("m", mcpURL)
	spec.NarrowToolsAbove = int32(narrowAbove)
	if _, err := svc.CreateConnector(ctx, &connectorv1.CreateConnectorRequest{WorkspaceId: "ws", Connector: spec}); err != nil {
		b.Fatal(err)
	}
	query := &connectorv1.QueryConnectorRequest{WorkspaceId: "ws", ConnectorId: "m", Query: "Echo hi."}
	waitQueryWorks(b, svc, query)
	sent := model.sent() // the two requests of the last query

	health := healthpb.NewHealthClient(conn)
	mc := benchMCPClient(b, mcpURL)
	var echo mcp.CallToolRequest
	echo.Params.Name = "echo"
	echo.Params.Arguments = map[string]any{"text": "hi"}

	var latQuery, latParts []time.Duration
	timed := func(f func() error) time.Duration {
		start := time.Now()
		if err := f(); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	parts := func() time.Duration {
		d := timed(func() error { _, err := health.Check(ctx, &healthpb.HealthCheckRequest{}); return err })
		for _, req := range sent {
			d += timed(func() error { return model.post(req) })
		}
		d += timed(func() error { _, err := mc.CallTool(ctx, echo); return err })
		return d
	}
	runQuery := func() time.Duration {
		return timed(func() error { _, err := svc.QueryConnector(ctx, query); return err })
	}
	for i := 0; b.Loop(); i++ {
		if i%2 == 0 {
			latQuery = append(latQuery, runQuery())
			latParts = append(latParts, parts())
		} else {
			latParts = append(latParts, parts())
			latQuery = append(latQuery, runQuery())
		}
	}
	slices.Sort(latQuery)
	slices.Sort(latParts)
	p50q, p50p := latQuery[len(latQuery)/2], latParts[len(latParts)/2]
	b.ReportMetric(float64(p50q.Nanoseconds())/1e3, "query-p50-µs")
	b.ReportMetric(float64(p50p.Nanoseconds())/1e3, "parts-p50-µs")
	b.ReportMetric(float64(len(sent[0]))/1024, "KiB/llm-request")
	// The model reads about 4 bytes of JSON per token.
	b.ReportMetric(float64(len(sent[0]))/4, "est-tokens/llm-request")
	overhead := float64((p50q - p50p).Nanoseconds()) / 1e3
	switch {
	case tools == 1:
		benchgoal.Report(b, "query-agent-overhead-p50", overhead, "overhead-µs", benchgoal.AtMost, 200)
	case narrowAbove == 0:
		benchgoal.Report(b, "narrowed-500-tools-service-time-p50", overhead, "overhead-µs", benchgoal.AtMost, 1000)
	default:
		b.ReportMetric(overhead, "overhead-µs")
	}
	return float64(len(sent[0]))
}

// waitQueryWorks waits until query runs with one tool call: the connector
// is connected and the agent ready.
func waitQueryWorks(b *testing.B, svc connectorv1.ConnectorServiceClient, query *connectorv1.QueryConnectorRequest) {
	deadline := time.Now().Add(20 * time.Second)
	for {
		res, err := svc.QueryConnector(context.Background(), query)
		if err == nil && len(res.GetResult().GetToolsUsed()) == 1 {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("no query succeeded: %v, %v", res, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// benchMCP serves echo and extra tools of realistic size (a description
// and four parameters each) over streamable HTTP.
func benchMCP(b *testing.B, extra int) string {
	m := mcpserver.NewMCPServer("bench", "1.0", mcpserver.WithToolCapabilities(true))
	m.AddTool(mcp.NewTool("echo", mcp.WithDescription("Echoes text"), mcp.WithString("text", mcp.Required())),
		func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText(req.GetString("text", "")), nil
		})
	for i := range extra {
		m.AddTool(mcp.NewTool(fmt.Sprintf("tool_%03d", i),
			mcp.WithDescription(fmt.Sprintf("Tool %d of the bench catalog: lists, filters and sorts the records of collection %d by owner, state and date.", i, i)),
			mcp.WithString("owner", mcp.Required(), mcp.Description("The owner's login, e.g. ada")),
			mcp.WithString("state", mcp.Enum("open", "closed", "all"), mcp.Description("Which records to list")),
			mcp.WithNumber("limit", mcp.Description("At most this many records, 1 to 100")),
			mcp.WithString("since", mcp.Description("Only records changed after this RFC 3339 time"))),
			func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				return mcp.NewToolResultText("[]"), nil
			})
	}
	h := httptest.NewServer(mcpserver.NewStreamableHTTPServer(m))
	b.Cleanup(h.Close)
	return h.URL + "/mcp"
}

func benchMCPClient(b *testing.B, url string) *client.Client {
	ctx := context.Background()
	c, err := client.NewStreamableHttpClient(url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	if err := c.Start(ctx); err != nil {
		b.Fatal(err)
	}
	var init mcp.InitializeRequest
	init.Params.ClientInfo = mcp.Implementation{Name: "bench", Version: "1"}
	if _, err := c.Initialize(ctx, init); err != nil {
		b.Fatal(err)
	}
	return c
}

// instantModel is an OpenAI-compatible endpoint that answers at once: a
// request whose last message is the user's asks for one echo call, one
// that ends with a tool result is answered. It keeps the last two
// requests.
type instantModel struct {
	http *httptest.Server
	hc   *http.Client // what post sends with; nil: http.DefaultClient

	mu   sync.Mutex
	last [][]byte
}

func newInstantModel(b *testing.B) *instantModel {
	m := &instantModel{}
	m.http = httptest.NewServer(http.HandlerFunc(m.handle))
	b.Cleanup(m.http.Close)
	return m
}

func (m *instantModel) url() string { return m.http.URL + "/v1" }

func (m *instantModel) handle(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req openai.ChatCompletionRequest
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	msg := openai.ChatCompletionMessage{Role: openai.ChatMessageRoleAssistant}
	if req.Messages[len(req.Messages)-1].Role == openai.ChatMessageRoleTool {
		msg.Content = "It said hi (echo)."
	} else {
		msg.ToolCalls = []openai.ToolCall{{ID: "call_1", Type: openai.ToolTypeFunction,
			Function: openai.FunctionCall{Name: "echo", Arguments: `{"text":"hi"}`}}}
	}
	m.mu.Lock()
	if len(m.last) == 2 {
		m.last = nil
	}
	m.last = append(m.last, body)
	m.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(openai.ChatCompletionResponse{ID: "x", Object: "chat.completion", Model: req.Model,
		Choices: []openai.ChatCompletionChoice{{Message: msg, FinishReason: openai.FinishReasonStop}},
		Usage:   openai.Usage{PromptTokens: 10, CompletionTokens: 2, TotalTokens: 12}})
}

// sent returns the request bodies of the last query.
func (m *instantModel) sent() [][]byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.last)
}

// post sends body as a chat completion request and decodes the answer, as
// a client does.
func (m *instantModel) post(body []byte) error {
	hc := m.hc
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Post(m.url()+"/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var out openai.ChatCompletionResponse
	return json.NewDecoder(resp.Body).Decode(&out)
}

// BenchmarkConcurrentQueries runs 32 callers at once, in blocks of 2,000
// queries taken in turn: QueryConnector on one connector through the
// service (the model asks for one echo call, then answers), and the same
// parts made directly by each caller: the gRPC hop (a health check on the
// same connection), the model's two requests (the bodies the agent sent)
// and the echo call on one mcp-go client of the same server. Both sides
// send the model requests over one HTTP client of the same settings. It
// reports both throughputs and their ratio.
func BenchmarkConcurrentQueries(b *testing.B) {
	const callers, block = 32, 2000
	ctx := context.Background()
	mcpURL := benchMCP(b, 0)
	model := newInstantModel(b)
	// Go's default client keeps 2 idle connections per host: 32 callers
	// would open a connection for most model requests, on either side.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 2 * callers
	model.hc = &http.Client{Transport: tr}
	conn, _ := serveService(b, benchService{auth: auth.ModeNone, llmURL: model.url(), llmHTTP: model.hc})
	svc := connectorv1.NewConnectorServiceClient(conn)
	if _, err := svc.CreateConnector(ctx, &connectorv1.CreateConnectorRequest{WorkspaceId: "ws",
		Connector: mcpConnector("m", mcpURL)}); err != nil {
		b.Fatal(err)
	}
	query := &connectorv1.QueryConnectorRequest{WorkspaceId: "ws", ConnectorId: "m", Query: "Echo hi."}
	waitQueryWorks(b, svc, query)
	sent := model.sent()
	health := healthpb.NewHealthClient(conn)
	mc := benchMCPClient(b, mcpURL)
	var echo mcp.CallToolRequest
	echo.Params.Name = "echo"
	echo.Params.Arguments = map[string]any{"text": "hi"}
	sides := []func() error{
		func() error { _, err := svc.QueryConnector(ctx, query); return err },
		func() error {
			if _, err := health.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
				return err
			}
			for _, req := range sent {
				if err := model.post(req); err != nil {
					return err
				}
			}
			_, err := mc.CallTool(ctx, echo)
			return err
		},
	}
	var elapsed [2]time.Duration
	var errs [2]int64
	runBlock := func(k int) {
		var next, failed atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= block {
					if err := sides[k](); err != nil {
						failed.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		elapsed[k] += time.Since(start)
		errs[k] += failed.Load()
	}
	runBlock(0) // unmeasured: both sides warm their connections
	runBlock(1)
	elapsed, errs = [2]time.Duration{}, [2]int64{}
	blocks := 0
	for i := 0; b.Loop(); i++ {
		for j := range sides {
			runBlock((i + j) % len(sides))
		}
		blocks++
	}
	b.StopTimer()
	rate := func(k int) float64 { return float64(blocks*block) / elapsed[k].Seconds() }
	b.ReportMetric(rate(0), "queries/s")
	b.ReportMetric(rate(1), "direct-parts/s")
	b.Logf("%d callers: service %.0f queries/s, direct %.0f/s", callers, rate(0), rate(1))
	benchgoal.Report(b, "concurrent-queries-vs-direct", rate(0)/rate(1), "x-direct", benchgoal.AtLeast, 0.9)
	if errs[0]+errs[1] != 0 {
		b.Errorf("%d queries and %d direct runs failed", errs[0], errs[1])
	}
}
