package server_test

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/structpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/server"
)

// limited is mcpConnector with a rate limit of burst calls that refills
// too slowly to matter during a test.
func limited(c *connectorv1.Connector, burst int32) *connectorv1.Connector {
	c.RateLimit = &connectorv1.RateLimit{RequestsPerSecond: 0.001, Burst: burst}
	return c
}

func wantRateLimited(t *testing.T, err error) {
	t.Helper()
	wantStatus(t, err, codes.ResourceExhausted, server.ReasonRateLimited, "")
	if msg := status.Convert(err).Message(); !strings.Contains(msg, "rate_limit (0.001 per second, burst 1)") {
		t.Errorf("message %q does not name the limit", msg)
	}
}

// TestRateLimitCoversDirectCalls: on a connector limited to one call, the
// first CallTool runs and the next ones, streamed or not, on a session or
// not, are refused before they reach the server; a query too.
func TestRateLimitCoversDirectCalls(t *testing.T) {
	model := llmtest.New(t)
	f := setup(t, options{llmURL: model.URL()})
	srv := newTestMCP(t)
	f.create(t, "ws", limited(mcpConnector("m", srv.url()), 1))
	f.waitReady(t, "ws", "m")
	args, _ := structpb.NewStruct(map[string]any{"text": "hi"})
	call := &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: "m", ToolName: "echo", Arguments: args}
	if _, err := f.client.CallTool(ctx(t), call); err != nil {
		t.Fatalf("first CallTool: %v", err)
	}
	for range 2 {
		_, err := f.client.CallTool(ctx(t), call)
		wantRateLimited(t, err)
	}
	stream, err := f.client.StreamCallTool(ctx(t), &connectorv1.StreamCallToolRequest{WorkspaceId: "ws", ConnectorId: "m", ToolName: "echo", Arguments: args})
	if err == nil {
		_, err = stream.Recv()
	}
	wantRateLimited(t, err)
	_, err = f.client.QueryConnector(ctx(t), &connectorv1.QueryConnectorRequest{WorkspaceId: "ws", ConnectorId: "m", Query: "q"})
	wantRateLimited(t, err)
	if n := len(srv.toolCallHeaders()); n != 1 {
		t.Errorf("the server got %d tool calls, want 1", n)
	}
	if n := len(model.Requests()); n != 0 {
		t.Errorf("the model was asked %d times", n)
	}

	sessions, _ := newSessionMCP(t)
	f.create(t, "ws", limited(perSessionConnector("p", sessions.url()), 1))
	f.waitReady(t, "ws", "p")
	f.sessionCall(t, "ws", "p", "a", "remember", map[string]any{"value": "apple"})
	_, err = f.sessionCallErr(t, "ws", "p", "b", "remember", map[string]any{"value": "banana"})
	wantRateLimited(t, err)
}

// TestRateLimitCoversQueryToolCalls: a query takes a token to start and
// each of its tool calls one more; a call whose token would come after the
// run's deadline runs at once, in debt, so the admitted query finishes,
// and the direct call after it is refused.
func TestRateLimitCoversQueryToolCalls(t *testing.T) {
	f, _, srv := queryFixture(t,
		llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"a"}`}, llmtest.Call{Tool: "echo", Args: `{"text":"b"}`},
			llmtest.Call{Tool: "echo", Args: `{"text":"c"}`}),
		llmtest.Answer("abc"))
	if _, err := f.client.UpdateConnector(ctx(t), &connectorv1.UpdateConnectorRequest{WorkspaceId: "ws",
		Connector: limited(&connectorv1.Connector{ConnectorId: "m"}, 3), UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"rate_limit"}}}); err != nil {
		t.Fatal(err)
	}
	res, err := f.query(t, &connectorv1.QueryConnectorRequest{Query: "q"})
	if err != nil {
		t.Fatal(err)
	}
	if res.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_COMPLETED || len(res.GetSteps()) != 1 || len(res.GetSteps()[0].GetCalls()) != 3 {
		t.Fatalf("result = %v", res)
	}
	for _, c := range res.GetSteps()[0].GetCalls() {
		if c.GetIsError() {
			t.Errorf("call %v failed", c)
		}
	}
	if n := len(srv.toolCallHeaders()); n != 3 {
		t.Errorf("the server got %d tool calls, want 3", n)
	}
	args, _ := structpb.NewStruct(map[string]any{"text": "hi"})
	_, err = f.client.CallTool(ctx(t), &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: "m", ToolName: "echo", Arguments: args})
	wantStatus(t, err, codes.ResourceExhausted, server.ReasonRateLimited, "")
}

// TestQueryToolCallsWaitForTheRateLimit: at 5 calls a second, a query
// that takes the only token to start and then makes two tool calls, one
// after the other, waits for a token before each: it cannot end sooner
// than 2/5 s after it started.
func TestQueryToolCallsWaitForTheRateLimit(t *testing.T) {
	f, _, srv := queryFixture(t,
		llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"a"}`}),
		llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"b"}`}),
		llmtest.Answer("ab"))
	if _, err := f.client.UpdateConnector(ctx(t), &connectorv1.UpdateConnectorRequest{WorkspaceId: "ws",
		Connector:  &connectorv1.Connector{ConnectorId: "m", RateLimit: &connectorv1.RateLimit{RequestsPerSecond: 5, Burst: 1}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"rate_limit"}}}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res, err := f.query(t, &connectorv1.QueryConnectorRequest{Query: "q"})
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if res.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_COMPLETED || len(res.GetSteps()) != 2 {
		t.Fatalf("result = %v", res)
	}
	if n := len(srv.toolCallHeaders()); n != 2 {
		t.Errorf("the server got %d tool calls, want 2", n)
	}
	if took < 390*time.Millisecond {
		t.Errorf("the query took %v; its two tool calls must each wait for a token (0.2s apart)", took)
	}
}

// TestRateLimitAcrossReplicasTakesFromTheSharedBucket: among 3 replicas a
// limit of one call (whose share would be a third of one) is taken from
// the shared bucket in Postgres: the first call empties it, the next is
// refused.
func TestRateLimitAcrossReplicasTakesFromTheSharedBucket(t *testing.T) {
	f := setup(t, options{replicas: 3})
	srv := newTestMCP(t)
	c := f.create(t, "ws", limited(mcpConnector("m", srv.url()), 1))
	f.waitReady(t, "ws", "m")
	args, _ := structpb.NewStruct(map[string]any{"text": "hi"})
	call := &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: "m", ToolName: "echo", Arguments: args}
	if _, err := f.client.CallTool(ctx(t), call); err != nil {
		t.Fatalf("first CallTool: %v", err)
	}
	_, err := f.client.CallTool(ctx(t), call)
	wantRateLimited(t, err)
	row, err := f.db.GetConnector(ctx(t), "ws", c.GetConnectorId())
	if err != nil {
		t.Fatal(err)
	}
	if tokens, err := f.db.RateTokens(ctx(t), row.ID, 0.001, 1, time.Now()); err != nil || tokens > 0.01 {
		t.Errorf("the shared bucket has %v tokens (%v), want it emptied by the first call", tokens, err)
	}
	if n := len(srv.toolCallHeaders()); n != 1 {
		t.Errorf("the server got %d tool calls, want 1", n)
	}
}
