package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/store"
)

// activeConnector loads a workspace's connector and refuses an inactive one.
func (s *Server) activeConnector(ctx context.Context, workspaceID, connectorID string) (*store.Connector, error) {
	c, err := s.db.GetConnector(ctx, workspaceID, connectorID)
	if err != nil {
		return nil, err
	}
	if !c.Active {
		return nil, newStatus(codes.FailedPrecondition, ReasonConnectorInactive,
			"connector is inactive; activate it with ActivateConnector")
	}
	return c, nil
}

// CallTool implements connector.v1.ConnectorService.
func (s *Server) CallTool(ctx context.Context, req *connectorv1.CallToolRequest) (*connectorv1.CallToolResponse, error) {
	var ch checker
	ch.toolRef(req.GetWorkspaceId(), req.GetConnectorId(), req.GetToolName())
	if err := ch.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	id, err := s.callable(ctx, req.GetWorkspaceId(), req.GetConnectorId(), req.GetToolName())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	start := time.Now()
	res, err := s.reg.CallTool(ctx, id, req.GetToolName(), req.GetArguments().AsMap())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	resp := callResultToProto(res)
	resp.Duration = durationpb.New(time.Since(start))
	return resp, nil
}

// callable returns the registry id of an active connector whose tool may
// be called. On the hot path the registry answers from memory: it holds
// exactly the active connectors and their synced catalog with the
// operators' flags. Anything it does not know goes to the store, which
// gives the precise error.
func (s *Server) callable(ctx context.Context, workspaceID, connectorID, tool string) (int64, error) {
	id, ok := s.reg.Lookup(workspaceID, connectorID)
	if ok {
		if known, enabled := s.reg.ToolState(id, tool); known {
			if !enabled {
				return 0, errToolDisabled
			}
			return id, nil
		}
	}
	c, err := s.activeConnector(ctx, workspaceID, connectorID)
	if err != nil {
		return 0, err
	}
	t, err := s.db.GetTool(ctx, workspaceID, connectorID, tool)
	if err != nil {
		return 0, err
	}
	if !t.Enabled {
		return 0, errToolDisabled
	}
	return c.ID, nil
}

var errToolDisabled = newStatus(codes.FailedPrecondition, ReasonToolDisabled, "tool is disabled; enable it with UpdateTool")

// RefreshTools implements connector.v1.ConnectorService.
func (s *Server) RefreshTools(ctx context.Context, req *connectorv1.RefreshToolsRequest) (*connectorv1.RefreshToolsResponse, error) {
	if err := connectorRef(req.GetWorkspaceId(), req.GetConnectorId()); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	c, err := s.activeConnector(ctx, req.GetWorkspaceId(), req.GetConnectorId())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	changes, err := s.reg.Refresh(ctx, c.ID)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	tools, err := s.db.ConnectorTools(ctx, c.ID)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	resp := &connectorv1.RefreshToolsResponse{Added: changes.Added, Removed: changes.Removed, Changed: changes.Changed}
	for _, t := range tools {
		resp.Tools = append(resp.Tools, toolToProto(t))
	}
	return resp, nil
}

// CheckConnector implements connector.v1.ConnectorService. An inactive
// connector is reported as such, without a probe.
func (s *Server) CheckConnector(ctx context.Context, req *connectorv1.CheckConnectorRequest) (*connectorv1.CheckConnectorResponse, error) {
	if err := connectorRef(req.GetWorkspaceId(), req.GetConnectorId()); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	c, err := s.db.GetConnector(ctx, req.GetWorkspaceId(), req.GetConnectorId())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	if !c.Active {
		return &connectorv1.CheckConnectorResponse{Health: healthToProto(c)}, nil
	}
	h, err := s.reg.Check(ctx, c.ID)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &connectorv1.CheckConnectorResponse{Health: liveHealthToProto(h)}, nil
}

// liveHealthToProto renders the registry's in-memory health.
func liveHealthToProto(h registry.Health) *connectorv1.ConnectorHealth {
	p := &connectorv1.ConnectorHealth{
		State:           healthStates[string(h.State)],
		LastError:       h.LastError,
		ProtocolVersion: h.ProtocolVersion,
	}
	if !h.CheckedAt.IsZero() {
		p.CheckTime = timestamppb.New(h.CheckedAt)
		p.Latency = durationpb.New(h.Latency)
	}
	return p
}

// callResultToProto converts an MCP tool result.
func callResultToProto(res *mcp.CallToolResult) *connectorv1.CallToolResponse {
	resp := &connectorv1.CallToolResponse{IsError: res.IsError}
	for _, c := range res.Content {
		if pc := contentToProto(c); pc != nil {
			resp.Content = append(resp.Content, pc)
		}
	}
	resp.StructuredContent = structuredToProto(res)
	return resp
}

func structuredToProto(res *mcp.CallToolResult) *structpb.Struct {
	raw := res.RawStructuredContent
	if len(raw) == 0 && res.StructuredContent != nil {
		raw, _ = json.Marshal(res.StructuredContent)
	}
	if len(raw) == 0 {
		return nil
	}
	st := &structpb.Struct{}
	if err := st.UnmarshalJSON(raw); err != nil {
		return nil // not an object: the text content carries it
	}
	return st
}

func contentToProto(c mcp.Content) *connectorv1.Content {
	switch c := c.(type) {
	case mcp.TextContent:
		return &connectorv1.Content{Kind: &connectorv1.Content_Text{Text: &connectorv1.TextContent{Text: c.Text}}}
	case mcp.ImageContent:
		return &connectorv1.Content{Kind: &connectorv1.Content_Image{Image: binary(c.MIMEType, c.Data)}}
	case mcp.AudioContent:
		return &connectorv1.Content{Kind: &connectorv1.Content_Audio{Audio: binary(c.MIMEType, c.Data)}}
	case mcp.ResourceLink:
		return &connectorv1.Content{Kind: &connectorv1.Content_ResourceLink{ResourceLink: &connectorv1.ResourceLink{
			Uri: c.URI, Name: c.Name, Description: c.Description, MimeType: c.MIMEType}}}
	case mcp.EmbeddedResource:
		r := &connectorv1.EmbeddedResource{}
		switch rc := c.Resource.(type) {
		case mcp.TextResourceContents:
			r.Uri, r.MimeType, r.Text = rc.URI, rc.MIMEType, rc.Text
		case mcp.BlobResourceContents:
			r.Uri, r.MimeType = rc.URI, rc.MIMEType
			r.Blob, _ = base64.StdEncoding.DecodeString(rc.Blob)
		}
		return &connectorv1.Content{Kind: &connectorv1.Content_Resource{Resource: r}}
	default:
		return nil
	}
}

func binary(mime, b64 string) *connectorv1.BinaryContent {
	data, _ := base64.StdEncoding.DecodeString(b64)
	return &connectorv1.BinaryContent{MimeType: mime, Data: data}
}
