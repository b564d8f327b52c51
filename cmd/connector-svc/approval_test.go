package main

import (
	"context"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

// TestPausedRunSurvivesARestart pauses a run for approval, stops the
// service, starts a new one on the same database and resumes the run
// there: what the agent needs to go on is in Postgres, not in memory.
func TestPausedRunSurvivesARestart(t *testing.T) {
	var sent atomic.Int64
	m := mcpserver.NewMCPServer("pay", "1.0")
	m.AddTool(mcp.NewTool("send_money", mcp.WithDescription("Sends money"), mcp.WithNumber("amount", mcp.Required()),
		mcp.WithDestructiveHintAnnotation(true)),
		func(_ context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			sent.Add(1)
			return mcp.NewToolResultText("sent " + r.GetString("amount", "?")), nil
		})
	mcpSrv := httptest.NewServer(mcpserver.NewStreamableHTTPServer(m))
	t.Cleanup(mcpSrv.Close)
	model := llmtest.New(t,
		llmtest.CallToolsSaying("The user asked to pay the invoice.", llmtest.Call{Tool: "send_money", Args: `{"amount":120}`}),
		llmtest.Answer("Paid 120."))
	url := storetest.NewURL(t)
	env := map[string]string{"SECRET_KEY": testKey, "LLM_BASE_URL": model.URL(), "LLM_MODEL": "fake-model", "HEALTH_INTERVAL": "1s"}

	svc := start(t, url, env)
	client := connectorv1.NewConnectorServiceClient(dial(t, svc.addr))
	_, err := client.CreateConnector(testCtx(t), &connectorv1.CreateConnectorRequest{WorkspaceId: "acme",
		Connector: &connectorv1.Connector{ConnectorId: "pay", Transport: connectorv1.Transport_TRANSPORT_STREAMABLE_HTTP,
			Connection: &connectorv1.Connector_Http{Http: &connectorv1.HttpConfig{Url: mcpSrv.URL + "/mcp"}}}})
	if err != nil {
		t.Fatal(err)
	}
	waitTools(t, client, "acme", "pay", 1)
	resp, err := client.QueryConnector(testCtx(t), &connectorv1.QueryConnectorRequest{WorkspaceId: "acme", ConnectorId: "pay", Query: "pay the invoice"})
	if err != nil {
		t.Fatal(err)
	}
	res := resp.GetResult()
	if res.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_AWAITING_APPROVAL || len(res.GetPendingCalls()) != 1 || sent.Load() != 0 {
		t.Fatalf("query = %v, %d sent; want it paused before send_money (the default policy)", res, sent.Load())
	}
	if err := svc.stop(); err != nil {
		t.Fatal(err)
	}

	svc = start(t, url, env)
	client = connectorv1.NewConnectorServiceClient(dial(t, svc.addr))
	waitTools(t, client, "acme", "pay", 1)
	done, err := client.ResumeQuery(testCtx(t), &connectorv1.ResumeQueryRequest{WorkspaceId: "acme", RunId: res.GetRunId(), ActorId: "bob",
		Decisions: []*connectorv1.Decision{{CallId: res.GetPendingCalls()[0].GetCallId(), Kind: connectorv1.DecisionKind_DECISION_KIND_APPROVE}}})
	if err != nil {
		t.Fatal(err)
	}
	r := done.GetResult()
	if r.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_COMPLETED || r.GetAnswer() != "Paid 120." || sent.Load() != 1 ||
		r.GetSteps()[0].GetReasoning() != "The user asked to pay the invoice." {
		t.Errorf("resumed after a restart = %v, %d sent; want COMPLETED with one payment", r, sent.Load())
	}
	if err := svc.stop(); err != nil {
		t.Fatal(err)
	}
	// Stopping wrote the finished run.
	svc = start(t, url, env)
	run, err := connectorv1.NewConnectorServiceClient(dial(t, svc.addr)).GetQueryRun(testCtx(t),
		&connectorv1.GetQueryRunRequest{WorkspaceId: "acme", RunId: res.GetRunId()})
	if err != nil || run.GetRun().GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_COMPLETED ||
		run.GetRun().GetResult().GetSteps()[0].GetCalls()[0].GetDecision().GetActorId() != "bob" {
		t.Errorf("GetQueryRun after another restart = %v, %v", run.GetRun(), err)
	}
}
