package server

import (
	"context"
	"log/slog"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/store"
)

// ListTools implements connector.v1.ConnectorService.
func (s *Server) ListTools(ctx context.Context, req *connectorv1.ListToolsRequest) (*connectorv1.ListToolsResponse, error) {
	var c checker
	c.ref(req.GetWorkspaceId(), req.GetConnectorId())
	size, after := c.page(req.GetPageSize(), req.GetPageToken(), defaultToolPageSize)
	if err := c.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	conn, err := s.db.GetConnector(ctx, req.GetWorkspaceId(), req.GetConnectorId())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	tools, err := s.db.ListTools(ctx, req.GetWorkspaceId(), req.GetConnectorId(), after, size+1)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	resp := &connectorv1.ListToolsResponse{}
	tools, resp.NextPageToken = nextPage(tools, size, func(t *store.Tool) string { return t.Name })
	for _, t := range tools {
		resp.Tools = append(resp.Tools, toolToProto(t, conn.Config.ApprovalPolicy))
	}
	return resp, nil
}

// UpdateTool implements connector.v1.ConnectorService.
func (s *Server) UpdateTool(ctx context.Context, req *connectorv1.UpdateToolRequest) (*connectorv1.UpdateToolResponse, error) {
	var c checker
	c.toolRef(req.GetWorkspaceId(), req.GetConnectorId(), req.GetToolName())
	f := store.ToolFlags{Enabled: req.Enabled}
	approvalFlags(&c, req, &f)
	if f.Enabled == nil && !f.SetApproval {
		c.add("enabled", "set enabled, requires_approval or approval_override")
	}
	if err := c.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	conn, err := s.db.GetConnector(ctx, req.GetWorkspaceId(), req.GetConnectorId())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	t, err := s.db.UpdateToolFlags(ctx, req.GetWorkspaceId(), req.GetConnectorId(), req.GetToolName(), f)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	if err := s.live.Reconcile(ctx, t.ConnectorID); err != nil {
		s.logger.WarnContext(ctx, "apply tool flags", slog.String("error", err.Error())) // the next reconcile does
	}
	p := toolToProto(t, conn.Config.ApprovalPolicy)
	s.logger.InfoContext(ctx, "tool updated",
		slog.String("workspace_id", req.GetWorkspaceId()), slog.String("connector_id", req.GetConnectorId()),
		slog.String("tool", t.Name), slog.Bool("enabled", t.Enabled), slog.Bool("requires_approval", p.RequiresApproval),
		slog.String("approval_override", p.ApprovalOverride.String()))
	return &connectorv1.UpdateToolResponse{Tool: p}, nil
}
