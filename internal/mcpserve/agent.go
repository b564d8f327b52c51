package mcpserve

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
	"google.golang.org/grpc"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/queries"
	"github.com/connector-svc/connector-svc/internal/registry"
)

// The agent tools: ask_<connector> runs QueryConnector's use case (a run
// of the connector's agent, placed as a query is) and answers with the
// agent's answer, and, in structured content, the run id, its status and
// the tools it used. A run that pauses (for a person's approval, the
// user's authorization or input) answers with a tool error that names the
// run and how to go on: ResumeQuery through the gRPC API.

// agentHandler runs queries on connector's agent.
func (h *Handler) agentHandler(ws, connector string) server.ToolHandlerFunc {
	return func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if !callerFrom(ctx).allows(auth.ScopeQuery) {
			return mcp.NewToolResultError("the agent tools need an API key of scope query"), nil
		}
		query, err := req.RequireString("query")
		if err != nil || strings.TrimSpace(query) == "" {
			return mcp.NewToolResultError("query: required, the question for the connector's agent"), nil
		}
		start := queries.Start{WorkspaceID: ws, ConnectorID: connector, Query: query, Context: req.GetString("context", ""),
			MaxTools: req.GetInt("max_tools", 0), UserID: callerFrom(ctx).userID}
		if row, ok := h.d.Live.Lookup(ws, connector); ok && row.Config.SessionMode == registry.SessionPerSession {
			if s := server.ClientSessionFromContext(ctx); s != nil {
				start.SessionID = serviceSession(s.SessionID())
			}
		}
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, h.cfg.QueryTimeout)
			defer cancel()
		}
		conn, err := h.d.Placer.Place(ctx, live.Target{WorkspaceID: ws, ConnectorID: connector, SessionID: start.SessionID,
			UserID: start.UserID})
		if err != nil {
			return toolError(err), nil
		}
		if conn != nil {
			return h.forwardQuery(ctx, conn, start)
		}
		out, err := h.d.Queries.Start(ctx, start, nil)
		if err != nil {
			return toolError(err), nil
		}
		return agentResult(connector, out.RunID, out.Result), nil
	}
}

// agentResult is a run's outcome as the tool's result.
func agentResult(connector, runID string, res *orchestrator.Result) *mcp.CallToolResult {
	used := res.ToolsUsed
	if used == nil {
		used = []string{}
	}
	structured := map[string]any{"run_id": runID, "status": statusName(res.Status), "tools_used": used}
	switch res.Status {
	case orchestrator.StatusAwaitingApproval, orchestrator.StatusAwaitingAuthorization, orchestrator.StatusAwaitingInput:
		var what string
		switch res.Status {
		case orchestrator.StatusAwaitingApproval:
			names := make([]string, 0, len(res.Pending))
			for _, p := range res.Pending {
				names = append(names, p.Call.Tool)
			}
			what = "a person's approval of " + strings.Join(names, ", ")
		case orchestrator.StatusAwaitingAuthorization:
			what = "the user's authorization of the connector"
		default:
			what = "the user's input to the connector's server"
		}
		r := mcp.NewToolResultError(fmt.Sprintf("run %s of connector %q is paused, waiting for %s. Resume it with ResumeQuery "+
			"(workspace's gRPC API) once that is given; GetQueryRun shows what it waits for.", runID, connector, what))
		r.StructuredContent = structured
		return r
	}
	r := mcp.NewToolResultText(res.Answer)
	r.StructuredContent = structured
	return r
}

func statusName(s orchestrator.Status) string {
	switch s {
	case orchestrator.StatusCompleted:
		return "completed"
	case orchestrator.StatusBudgetExhausted:
		return "budget_exhausted"
	case orchestrator.StatusPlanned:
		return "planned"
	case orchestrator.StatusAwaitingApproval:
		return "awaiting_approval"
	case orchestrator.StatusAwaitingAuthorization:
		return "awaiting_authorization"
	case orchestrator.StatusAwaitingInput:
		return "awaiting_input"
	}
	return "unknown"
}

// forwardQuery runs the query on the replica conn leads to.
func (h *Handler) forwardQuery(ctx context.Context, conn *grpc.ClientConn, start queries.Start) (*mcp.CallToolResult, error) {
	resp, err := connectorv1.NewConnectorServiceClient(conn).QueryConnector(ctx, &connectorv1.QueryConnectorRequest{
		WorkspaceId: start.WorkspaceID, ConnectorId: start.ConnectorID, Query: start.Query, Context: start.Context,
		MaxTools: int32(start.MaxTools), SessionId: start.SessionID, UserId: start.UserID})
	if err != nil {
		if errors.Is(ctx.Err(), context.Canceled) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, ctx.Err()
		}
		return mcp.NewToolResultError(statusMessage(err)), nil
	}
	r := resp.GetResult()
	res := &orchestrator.Result{Answer: r.GetAnswer(), ToolsUsed: r.GetToolsUsed()}
	switch r.GetStatus() {
	case connectorv1.QueryStatus_QUERY_STATUS_AWAITING_APPROVAL:
		res.Status = orchestrator.StatusAwaitingApproval
		for _, p := range r.GetPendingCalls() {
			res.Pending = append(res.Pending, orchestrator.PendingCall{Call: orchestrator.Call{Tool: p.GetTool()}})
		}
	case connectorv1.QueryStatus_QUERY_STATUS_AWAITING_AUTHORIZATION:
		res.Status = orchestrator.StatusAwaitingAuthorization
	case connectorv1.QueryStatus_QUERY_STATUS_AWAITING_INPUT:
		res.Status = orchestrator.StatusAwaitingInput
	case connectorv1.QueryStatus_QUERY_STATUS_BUDGET_EXHAUSTED:
		res.Status = orchestrator.StatusBudgetExhausted
	default:
		res.Status = orchestrator.StatusCompleted
	}
	return agentResult(start.ConnectorID, r.GetRunId(), res), nil
}
