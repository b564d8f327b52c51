package server_test

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/server"
)

// queryFixture is a server with an agent on a fake LLM and one READY
// connector "m" on a real MCP server.
func queryFixture(t *testing.T, steps ...llmtest.Step) (*fixture, *llmtest.Server, *testMCP) {
	t.Helper()
	model := llmtest.New(t, steps...)
	f := setup(t, options{llmURL: model.URL()})
	srv := newTestMCP(t)
	f.create(t, "ws", mcpConnector("m", srv.url()))
	f.waitReady(t, "ws", "m")
	return f, model, srv
}

func (f *fixture) query(t *testing.T, req *connectorv1.QueryConnectorRequest) (*connectorv1.QueryResult, error) {
	t.Helper()
	if req.WorkspaceId == "" {
		req.WorkspaceId, req.ConnectorId = "ws", "m"
	}
	resp, err := f.client.QueryConnector(ctx(t), req)
	return resp.GetResult(), err
}

func TestQueryNeedsAnLLM(t *testing.T) {
	f := setup(t)
	f.create(t, "ws", mcpConnector("m", "http://127.0.0.1:9/mcp"))
	_, err := f.query(t, &connectorv1.QueryConnectorRequest{Query: "hi"})
	wantStatus(t, err, codes.FailedPrecondition, server.ReasonLLMNotConfigured, "")
	if msg := err.Error(); !strings.Contains(msg, "LLM_BASE_URL") || !strings.Contains(msg, "LLM_MODEL") {
		t.Errorf("message %q does not name the settings", msg)
	}
}

func TestQueryValidation(t *testing.T) {
	f := setup(t, options{llmURL: "http://127.0.0.1:9/v1"})
	for _, tt := range []struct {
		req   *connectorv1.QueryConnectorRequest
		field string
	}{
		{&connectorv1.QueryConnectorRequest{}, "query"},
		{&connectorv1.QueryConnectorRequest{Query: "q", MaxTools: 51}, "max_tools"},
		{&connectorv1.QueryConnectorRequest{Query: "q", MaxTools: -1}, "max_tools"},
		{&connectorv1.QueryConnectorRequest{WorkspaceId: "ws", Query: "q"}, "connector_id"},
	} {
		_, err := f.query(t, tt.req)
		wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, tt.field)
	}
}

func TestQueryRunsTheAgent(t *testing.T) {
	f, model, _ := queryFixture(t,
		llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"pong"}`}, llmtest.Call{Tool: "weather", Args: `{}`}),
		llmtest.Answer("pong; Oslo is 4°C."))
	no := false
	if _, err := f.client.UpdateTool(ctx(t), &connectorv1.UpdateToolRequest{WorkspaceId: "ws", ConnectorId: "m", ToolName: "fail", Enabled: &no}); err != nil {
		t.Fatal(err)
	}
	res, err := f.query(t, &connectorv1.QueryConnectorRequest{Query: "ping and weather", Context: "user in Oslo"})
	if err != nil {
		t.Fatal(err)
	}
	if res.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_COMPLETED || res.GetAnswer() != "pong; Oslo is 4°C." ||
		res.GetConnectorId() != "m" || !slices.Equal(res.GetToolsUsed(), []string{"echo", "weather"}) {
		t.Fatalf("result = %v", res)
	}
	if len(res.GetSteps()) != 1 || res.GetSteps()[0].GetCalls()[0].GetArguments().GetFields()["text"].GetStringValue() != "pong" {
		t.Errorf("steps = %v", res.GetSteps())
	}
	if len(res.GetContexts()) != 1 || res.GetContexts()[0].GetStructuredContent().GetFields()["city"].GetStringValue() != "Oslo" {
		t.Errorf("contexts = %v", res.GetContexts())
	}
	if res.GetUsage().GetTotalTokens() != 240 {
		t.Errorf("usage = %v", res.GetUsage())
	}
	if offered := offeredTools(model, 0); slices.Contains(offered, "fail") || !slices.Contains(offered, "echo") {
		t.Errorf("offered tools %v; a disabled tool must never be offered", offered)
	}
	got, _ := f.client.GetConnector(ctx(t), &connectorv1.GetConnectorRequest{WorkspaceId: "ws", ConnectorId: "m"})
	if c := got.GetConnector().GetCounters(); c.GetQueryCount() != 1 || c.GetPromptTokens() != 200 || c.GetCompletionTokens() != 40 {
		t.Errorf("counters = %v", c)
	}
	for _, auth := range model.Authorizations() {
		if b, _ := protojson.Marshal(res); strings.Contains(string(b), auth) || strings.Contains(f.logs.String(), distinctive+"-llm") {
			t.Error("the LLM API key leaked into a response or a log line")
		}
	}
}

func TestQueryRefusals(t *testing.T) {
	f, _, srv := queryFixture(t)
	_, err := f.client.UpdateConnector(ctx(t), &connectorv1.UpdateConnectorRequest{WorkspaceId: "ws",
		Connector:  &connectorv1.Connector{ConnectorId: "m", RateLimit: &connectorv1.RateLimit{RequestsPerSecond: 0.001, Burst: 1}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"rate_limit"}}})
	if err != nil {
		t.Fatal(err)
	}
	srv.http.CloseClientConnections()
	srv.http.Close()
	deadline := time.Now().Add(20 * time.Second)
	for { // wait until the registry has noticed
		got, _ := f.client.GetConnector(ctx(t), &connectorv1.GetConnectorRequest{WorkspaceId: "ws", ConnectorId: "m"})
		if s := got.GetConnector().GetHealth().GetState(); s == connectorv1.ConnectorState_CONNECTOR_STATE_DEGRADED || s == connectorv1.ConnectorState_CONNECTOR_STATE_ERROR {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the connector never went down")
		}
		time.Sleep(10 * time.Millisecond)
	}
	_, err = f.query(t, &connectorv1.QueryConnectorRequest{Query: "q"})
	wantStatus(t, err, codes.Unavailable, server.ReasonConnectorUnavailable, "")
	_, err = f.query(t, &connectorv1.QueryConnectorRequest{Query: "q"})
	wantStatus(t, err, codes.ResourceExhausted, server.ReasonRateLimited, "")

	if _, err := f.client.DeactivateConnector(ctx(t), &connectorv1.DeactivateConnectorRequest{WorkspaceId: "ws", ConnectorId: "m"}); err != nil {
		t.Fatal(err)
	}
	_, err = f.query(t, &connectorv1.QueryConnectorRequest{Query: "q"})
	wantStatus(t, err, codes.FailedPrecondition, server.ReasonConnectorInactive, "")
}

func TestQueryLLMDown(t *testing.T) {
	f := setup(t, options{llmURL: "http://127.0.0.1:9/v1"})
	srv := newTestMCP(t)
	f.create(t, "ws", mcpConnector("m", srv.url()))
	f.waitReady(t, "ws", "m")
	_, err := f.query(t, &connectorv1.QueryConnectorRequest{Query: "q"})
	wantStatus(t, err, codes.Unavailable, server.ReasonLLMUnavailable, "")
	got, _ := f.client.GetConnector(ctx(t), &connectorv1.GetConnectorRequest{WorkspaceId: "ws", ConnectorId: "m"})
	if c := got.GetConnector().GetCounters(); c.GetQueryCount() != 1 || c.GetQueryErrorCount() != 1 {
		t.Errorf("counters after a failed query = %v", c)
	}
}

// Every token the model served is counted, a failed run's included: one
// query that completes (240 tokens) and one whose second model request
// fails after the first served 120. The counts reach the store (written
// in the background, and at Close), and GetConnector shows them at once.
func TestQueryCountsEveryToken(t *testing.T) {
	f, _, _ := queryFixture(t,
		llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"a"}`}), llmtest.Answer("a"),
		llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"b"}`}), llmtest.Fail(http.StatusBadRequest, "no", nil))
	if _, err := f.query(t, &connectorv1.QueryConnectorRequest{Query: "q"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.query(t, &connectorv1.QueryConnectorRequest{Query: "q"}); err == nil {
		t.Fatal("the second query succeeded")
	}
	want := func(c *connectorv1.ConnectorCounters, where string) {
		t.Helper()
		if c.GetQueryCount() != 2 || c.GetQueryErrorCount() != 1 || c.GetPromptTokens() != 300 || c.GetCompletionTokens() != 60 {
			t.Errorf("%s: counters = %v, want 2 queries, 1 error, 300 + 60 tokens", where, c)
		}
	}
	got, _ := f.client.GetConnector(ctx(t), &connectorv1.GetConnectorRequest{WorkspaceId: "ws", ConnectorId: "m"})
	want(got.GetConnector().GetCounters(), "GetConnector")
	f.stop()
	row, err := f.db.GetConnector(ctx(t), "ws", "m")
	if err != nil {
		t.Fatal(err)
	}
	want(&connectorv1.ConnectorCounters{QueryCount: row.Counters.Queries, QueryErrorCount: row.Counters.QueryErrors,
		PromptTokens: row.Counters.PromptTokens, CompletionTokens: row.Counters.CompletionTokens}, "the store after the server stopped")
}

func TestPlanOnly(t *testing.T) {
	f, _, srv := queryFixture(t, llmtest.Answer(`{"plan":[{"tool":"weather","purpose":"get the weather"}]}`))
	res, err := f.query(t, &connectorv1.QueryConnectorRequest{Query: "weather?", PlanOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_PLANNED || len(res.GetPlan()) != 1 ||
		res.GetPlan()[0].GetTool() != "weather" || len(res.GetToolsUsed()) != 0 {
		t.Errorf("plan result = %v", res)
	}
	if srv.handshakes.Load() != 1 {
		t.Errorf("handshakes = %d", srv.handshakes.Load())
	}
}

func TestStreamEventOrder(t *testing.T) {
	f, _, _ := queryFixture(t, llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"a"}`}), llmtest.Answer("a"))
	stream, err := f.client.StreamQueryConnector(ctx(t), &connectorv1.StreamQueryConnectorRequest{WorkspaceId: "ws", ConnectorId: "m", Query: "q"})
	if err != nil {
		t.Fatal(err)
	}
	msgs := recvAll(t, stream)
	var kinds []string
	for _, msg := range msgs {
		kinds = append(kinds, strings.TrimPrefix(strings.SplitN(protojson.Format(msg), "\"", 3)[1], ""))
	}
	want := []string{"stepPlanned", "toolCallStarted", "toolCallFinished", "answer", "result"}
	if !slices.Equal(kinds, want) {
		t.Errorf("events = %v, want %v", kinds, want)
	}
	if last := msgs[len(msgs)-1]; last.GetResult().GetAnswer() != "a" {
		t.Errorf("final result = %v", last.GetResult())
	}
}

// recvAll receives a stream's messages until it ends.
// recvAll reads a stream to its end, failing the test on an error.
func recvAll[T any](t *testing.T, stream interface{ Recv() (*T, error) }) []*T {
	t.Helper()
	var msgs []*T
	for {
		msg, err := stream.Recv()
		if err == io.EOF {
			return msgs
		}
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, msg)
	}
}

func TestStreamCancelStopsTheRun(t *testing.T) {
	f, _, srv := queryFixture(t, llmtest.CallTools(llmtest.Call{Tool: "block", Args: `{}`}))
	cctx, cancel := context.WithCancel(ctx(t))
	stream, err := f.client.StreamQueryConnector(cctx, &connectorv1.StreamQueryConnectorRequest{WorkspaceId: "ws", ConnectorId: "m", Query: "q"})
	if err != nil {
		t.Fatal(err)
	}
	for { // until the blocking call is under way
		msg, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if msg.GetToolCallStarted() != nil {
			break
		}
	}
	cancel()
	// The run ends (and is counted as a failed query) although the tool
	// never returns: our call was cancelled. Whether the MCP server stops its
	// handler is up to it; mcp-go's HTTP server does not.
	deadline := time.Now().Add(15 * time.Second)
	for {
		got, _ := f.client.GetConnector(ctx(t), &connectorv1.GetConnectorRequest{WorkspaceId: "ws", ConnectorId: "m"})
		if c := got.GetConnector().GetCounters(); c.GetQueryCount() == 1 && c.GetQueryErrorCount() == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("cancelling the stream did not stop the run")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case <-srv.cancelled:
		t.Log("the MCP server saw the cancellation too")
	default:
	}
}

// TestRunReadableAtOnce: the run id a query answers with is readable by
// GetQueryRun at once, from the unary answer and from a stream's result.
func TestRunReadableAtOnce(t *testing.T) {
	var script []llmtest.Step
	for range 6 {
		script = append(script, llmtest.Answer("done"))
	}
	f, _, _ := queryFixture(t, script...)
	get := func(runID string) {
		t.Helper()
		resp, err := f.client.GetQueryRun(ctx(t), &connectorv1.GetQueryRunRequest{WorkspaceId: "ws", RunId: runID})
		if err != nil {
			t.Fatalf("GetQueryRun(%s) right after the query answered: %v", runID, err)
		}
		if r := resp.GetRun(); r.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_COMPLETED || r.GetResult().GetAnswer() != "done" {
			t.Errorf("run = %v", r)
		}
	}
	for range 3 {
		res, err := f.query(t, &connectorv1.QueryConnectorRequest{Query: "q"})
		if err != nil {
			t.Fatal(err)
		}
		get(res.GetRunId())
	}
	for range 3 {
		stream, err := f.client.StreamQueryConnector(ctx(t), &connectorv1.StreamQueryConnectorRequest{WorkspaceId: "ws", ConnectorId: "m", Query: "q"})
		if err != nil {
			t.Fatal(err)
		}
		var result *connectorv1.QueryResult
		for {
			msg, err := stream.Recv()
			if err != nil {
				t.Fatalf("stream ended before its result: %v", err)
			}
			if result = msg.GetResult(); result != nil {
				break
			}
		}
		get(result.GetRunId()) // before the stream's end
		recvAll(t, stream)
	}
}
