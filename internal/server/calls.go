package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/calls"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/registry"
)

// CallTool implements connector.v1.ConnectorService.
func (s *Server) CallTool(ctx context.Context, req *connectorv1.CallToolRequest) (*connectorv1.CallToolResponse, error) {
	if resp, done, err := forwardUnary(ctx, s, s.toCaller(req), req, connectorv1.ConnectorServiceClient.CallTool); done {
		return resp, err
	}
	resp, err := s.callTool(ctx, req, nil, nil)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return resp, nil
}

// StreamCallTool implements connector.v1.ConnectorService: CallTool, with
// the server's progress notifications for the call streamed before the
// result, and its input requests (input_required), which AnswerInput
// answers. The caller cancelling the stream cancels the call.
func (s *Server) StreamCallTool(req *connectorv1.StreamCallToolRequest, stream connectorv1.ConnectorService_StreamCallToolServer) error {
	if done, err := forwardStream(stream.Context(), s, s.toCaller(req), req, connectorv1.ConnectorServiceClient.StreamCallTool, stream.Send); done {
		return err
	}
	return serveStream(s, stream, s.cfg.DefaultRPCTimeout,
		func(ctx context.Context, send func(*connectorv1.StreamCallToolResponse)) (*connectorv1.StreamCallToolResponse, error) {
			// Progress and input requests come from different goroutines.
			var mu sync.Mutex
			locked := func(m *connectorv1.StreamCallToolResponse) {
				mu.Lock()
				defer mu.Unlock()
				send(m)
			}
			resp, err := s.callTool(ctx, req, func(p registry.Progress) {
				locked(&connectorv1.StreamCallToolResponse{Event: &connectorv1.StreamCallToolResponse_Progress{Progress: progressToProto(p)}})
			}, locked)
			if err != nil {
				return nil, err
			}
			return &connectorv1.StreamCallToolResponse{Event: &connectorv1.StreamCallToolResponse_Result{Result: resp}}, nil
		})
}

// callRequest is what CallTool and StreamCallTool requests share.
type callRequest interface {
	GetWorkspaceId() string
	GetConnectorId() string
	GetToolName() string
	GetArguments() *structpb.Struct
	GetSessionId() string
	GetUserApproved() bool
	GetUserId() string
}

// callTool validates, runs the tool and fits its result into a response;
// progress, if not nil, receives the call's progress updates; send, if not
// nil, sends the server's input requests on the caller's stream (without,
// each is answered cancel and listed in the response).
func (s *Server) callTool(ctx context.Context, req callRequest, progress func(registry.Progress),
	send func(*connectorv1.StreamCallToolResponse)) (*connectorv1.CallToolResponse, error) {
	var ch checker
	ch.toolRef(req.GetWorkspaceId(), req.GetConnectorId(), req.GetToolName())
	ch.sessionID(req.GetSessionId())
	if err := ch.err(); err != nil {
		return nil, err
	}
	call := calls.Request{WorkspaceID: req.GetWorkspaceId(), ConnectorID: req.GetConnectorId(), Tool: req.GetToolName(),
		Args: req.GetArguments().AsMap(), ArgumentsBytes: proto.Size(req.GetArguments()), SessionID: req.GetSessionId(),
		UserID: req.GetUserId(), UserApproved: req.GetUserApproved(), Progress: progress}
	if send != nil {
		call.Ask = func(name string, in orchestrator.Input) {
			send(&connectorv1.StreamCallToolResponse{Event: &connectorv1.StreamCallToolResponse_InputRequired{
				InputRequired: inputToProto(req.GetConnectorId(), name, in)}})
		}
	}
	res, err := s.calls.Call(ctx, call)
	var auth *calls.AuthorizationRequiredError
	if errors.As(err, &auth) {
		// The user must authorize first: say where.
		return nil, s.authorizationNeeded(ctx, auth.Row, auth.UserID, auth.Required, "")
	}
	if err != nil {
		return nil, err
	}
	resp, err := s.fitResult(res)
	if err != nil {
		return nil, err
	}
	resp.Duration = durationpb.New(res.Duration)
	resp.SessionRestarted, resp.TaskId = res.Restarted, res.TaskID
	for _, in := range res.Cancelled {
		resp.CancelledInputs = append(resp.CancelledInputs, inputToProto(req.GetConnectorId(), res.ConnectorName, in))
	}
	return resp, nil
}

// maxProgressMessage bounds the message of one progress update: the
// server chooses it, and one message too large to send would fail the
// stream.
const maxProgressMessage = 4 << 10

func progressToProto(p registry.Progress) *connectorv1.Progress {
	return &connectorv1.Progress{Progress: p.Progress, Total: p.Total, Message: orchestrator.Truncate(p.Message, maxProgressMessage)}
}

// RefreshTools implements connector.v1.ConnectorService.
func (s *Server) RefreshTools(ctx context.Context, req *connectorv1.RefreshToolsRequest) (*connectorv1.RefreshToolsResponse, error) {
	if err := connectorRef(req.GetWorkspaceId(), req.GetConnectorId()); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	if resp, done, err := forwardUnary(ctx, s, s.toOwner(req.GetWorkspaceId(), req.GetConnectorId()), req,
		connectorv1.ConnectorServiceClient.RefreshTools); done {
		if err == nil {
			s.refreshedElsewhere(ctx, req.GetWorkspaceId(), req.GetConnectorId(), resp)
		}
		return resp, err
	}
	c, err := s.calls.ActiveConnector(ctx, req.GetWorkspaceId(), req.GetConnectorId())
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
		resp.Tools = append(resp.Tools, toolToProto(t, c.Config.ApprovalPolicy))
	}
	return resp, nil
}

// refreshedElsewhere makes this replica's catalog show what the owner's
// RefreshTools reported changed before the answer goes back: a call
// through this replica right after it must see it (read-your-writes), not
// wait for the owner's notification. A connector this replica holds no
// connection of (a stdio one's owner holds it) has nothing to re-list.
func (s *Server) refreshedElsewhere(ctx context.Context, workspaceID, connectorID string, resp *connectorv1.RefreshToolsResponse) {
	if len(resp.GetAdded())+len(resp.GetRemoved())+len(resp.GetChanged()) == 0 {
		return
	}
	id, ok := s.reg.Lookup(workspaceID, connectorID)
	if !ok {
		return
	}
	if local, err := s.reg.Tools(id); err != nil || len(local) == 0 {
		return // not connected yet: its connect lists the tools
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := s.reg.Resync(rctx, id); err != nil {
		s.logger.WarnContext(ctx, "re-list tools after the owner's refresh", slog.String("connector_id", connectorID),
			slog.String("error", err.Error()))
	}
}

// CheckConnector implements connector.v1.ConnectorService. An inactive
// connector is reported as such, without a probe.
func (s *Server) CheckConnector(ctx context.Context, req *connectorv1.CheckConnectorRequest) (*connectorv1.CheckConnectorResponse, error) {
	if err := connectorRef(req.GetWorkspaceId(), req.GetConnectorId()); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	if resp, done, err := forwardUnary(ctx, s, s.toOwner(req.GetWorkspaceId(), req.GetConnectorId()), req,
		connectorv1.ConnectorServiceClient.CheckConnector); done {
		return resp, err
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

// liveHealthToProto renders the registry's in-memory health, with the
// query values of any URL in its last error redacted.
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
	if !h.NextAttemptAt.IsZero() {
		p.NextAttemptTime = timestamppb.New(h.NextAttemptAt)
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
