package server_test

import (
	"context"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/mark3labs/mcp-go/mcp"
	"google.golang.org/grpc/codes"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/server"
)

// wantChange checks what RefreshTools says changed about echo. The server
// tells the connection of the change itself (notifications/tools/list_changed
// on the classic protocol), and a sync that this starts may come first:
// then RefreshTools finds the catalog already as the server lists it.
func wantChange(t *testing.T, what string, got []string) {
	t.Helper()
	if len(got) > 0 && !slices.Equal(got, []string{"echo"}) {
		t.Errorf("%s = %v, want [echo], or nothing if the server's notification was quicker", what, got)
	}
}

// TestToolThatDropsOutKeepsItsFlags flaps a tool in the server's tools/list:
// while it is gone nobody is offered it or may call it, and when it comes
// back it is as the operator left it.
func TestToolThatDropsOutKeepsItsFlags(t *testing.T) {
	f, model, srv := queryFixture(t, llmtest.Answer("nothing to do"))
	no, yes := false, true
	_, err := f.client.UpdateTool(ctx(t), &connectorv1.UpdateToolRequest{WorkspaceId: "ws", ConnectorId: "m", ToolName: "echo",
		Enabled: &no, RequiresApproval: &yes})
	if err != nil {
		t.Fatal(err)
	}

	srv.mcp.DeleteTools("echo")
	refresh := f.refresh(t)
	wantChange(t, "removed", refresh.GetRemoved())
	if diff := cmp.Diff([]string{"big", "block", "fail", "weather"}, toolNames(refresh.GetTools())); diff != "" {
		t.Errorf("RefreshTools catalog without echo (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"big", "block", "fail", "weather"}, toolNames(f.listTools(t))); diff != "" {
		t.Errorf("ListTools without echo (-want +got):\n%s", diff)
	}
	got, err := f.client.GetConnector(ctx(t), &connectorv1.GetConnectorRequest{WorkspaceId: "ws", ConnectorId: "m"})
	if err != nil || got.GetConnector().GetToolCount() != 4 {
		t.Errorf("GetConnector without echo: tool_count = %d, %v; want 4", got.GetConnector().GetToolCount(), err)
	}
	_, err = f.call(t, "ws", "m", "echo", map[string]any{"text": "x"})
	wantStatus(t, err, codes.NotFound, server.ReasonToolNotFound, "")
	// Enabled again while it is gone: still offered to nobody.
	if _, err := f.client.UpdateTool(ctx(t), &connectorv1.UpdateToolRequest{WorkspaceId: "ws", ConnectorId: "m", ToolName: "echo", Enabled: &yes}); err != nil {
		t.Fatalf("UpdateTool of a tool the server no longer lists: %v", err)
	}
	if _, err := f.query(t, &connectorv1.QueryConnectorRequest{Query: "echo something"}); err != nil {
		t.Fatal(err)
	}
	if offered := offeredTools(model, 0); slices.Contains(offered, "echo") {
		t.Errorf("the agent was offered %v; a tool the server does not list must not be offered", offered)
	}
	if _, err := f.client.UpdateTool(ctx(t), &connectorv1.UpdateToolRequest{WorkspaceId: "ws", ConnectorId: "m", ToolName: "echo", Enabled: &no}); err != nil {
		t.Fatal(err)
	}

	srv.mcp.AddTool(mcp.NewTool("echo", mcp.WithDescription("Echoes text"), mcp.WithString("text", mcp.Required())),
		func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText(req.GetString("text", "")), nil
		})
	refresh = f.refresh(t)
	wantChange(t, "added", refresh.GetAdded())
	var echo *connectorv1.Tool
	for _, tool := range f.listTools(t) {
		if tool.GetName() == "echo" {
			echo = tool
		}
	}
	if echo == nil || echo.GetEnabled() || !echo.GetRequiresApproval() {
		t.Errorf("echo listed again = %v; want it back, disabled and requiring approval", echo)
	}
	_, err = f.call(t, "ws", "m", "echo", map[string]any{"text": "x"})
	wantStatus(t, err, codes.FailedPrecondition, server.ReasonToolDisabled, "")

	// Enabled, it still waits for approval: the flag outlived its absence.
	if _, err := f.client.UpdateTool(ctx(t), &connectorv1.UpdateToolRequest{WorkspaceId: "ws", ConnectorId: "m", ToolName: "echo", Enabled: &yes}); err != nil {
		t.Fatal(err)
	}
	_, err = f.call(t, "ws", "m", "echo", map[string]any{"text": "x"})
	wantStatus(t, err, codes.FailedPrecondition, server.ReasonApprovalRequired, "")
}

func (f *fixture) refresh(t *testing.T) *connectorv1.RefreshToolsResponse {
	t.Helper()
	resp, err := f.client.RefreshTools(ctx(t), &connectorv1.RefreshToolsRequest{WorkspaceId: "ws", ConnectorId: "m"})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func (f *fixture) listTools(t *testing.T) []*connectorv1.Tool {
	t.Helper()
	resp, err := f.client.ListTools(ctx(t), &connectorv1.ListToolsRequest{WorkspaceId: "ws", ConnectorId: "m"})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetTools()
}

func toolNames(tools []*connectorv1.Tool) []string {
	var names []string
	for _, tool := range tools {
		names = append(names, tool.GetName())
	}
	return names
}

// offeredTools names the tools of the fake model's i-th request.
func offeredTools(model *llmtest.Server, i int) []string {
	var names []string
	for _, tool := range model.Requests()[i].Tools {
		names = append(names, tool.Function.Name)
	}
	return names
}
