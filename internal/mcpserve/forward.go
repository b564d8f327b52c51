package mcpserve

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/registry"
)

// A call another replica serves (a stdio connector's, on its owner; a
// per_session or per-user connection's, where it is held) goes there as
// the gRPC adapter's calls do: one hop over the internal listener, as a
// StreamCallTool, whose progress and questions come back on the stream.
// The hop carries what the gRPC API carries of a result: text, images,
// audio, resource links and embedded resources, structured content and
// isError; content annotations and _meta stay behind on the owner.

// forward runs c on the replica conn leads to.
func (h *Handler) forward(ctx context.Context, conn *grpc.ClientConn, c *mcpCall, args map[string]any, approved bool) (*mcp.CallToolResult, error) {
	st, err := structpb.NewStruct(args)
	if err != nil {
		return mcp.NewToolResultError("the arguments cannot be sent on: " + err.Error()), nil
	}
	client := connectorv1.NewConnectorServiceClient(conn)
	stream, err := client.StreamCallTool(ctx, &connectorv1.StreamCallToolRequest{WorkspaceId: c.ws, ConnectorId: c.connector,
		ToolName: c.tool, Arguments: st, SessionId: c.session, UserId: c.user, UserApproved: approved})
	if err != nil {
		return h.forwardError(ctx, c, args, err)
	}
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return mcp.NewToolResultError("the replica that ran the call ended it without a result; call the tool again"), nil
		}
		if err != nil {
			return h.forwardError(ctx, c, args, err)
		}
		switch ev := msg.GetEvent().(type) {
		case *connectorv1.StreamCallToolResponse_Progress:
			if c.progress != nil {
				p := ev.Progress
				c.progress(registry.Progress{Progress: p.GetProgress(), Total: p.GetTotal(), Message: p.GetMessage()})
			}
		case *connectorv1.StreamCallToolResponse_InputRequired:
			go h.relayForwardedQuestion(ctx, client, c, ev.InputRequired)
		case *connectorv1.StreamCallToolResponse_Result:
			return resultFromProto(ev.Result), nil
		}
	}
}

// forwardError is what the client hears of a forwarded call's error: the
// owner's approval and authorization refusals are asked as here; the rest
// as the owner said it.
func (h *Handler) forwardError(ctx context.Context, c *mcpCall, args map[string]any, err error) (*mcp.CallToolResult, error) {
	st := status.Convert(err)
	for _, d := range st.Details() {
		info, ok := d.(*errdetails.ErrorInfo)
		if !ok {
			continue
		}
		switch info.GetReason() {
		case "APPROVAL_REQUIRED":
			return h.askApproval(ctx, c, args)
		case "AUTHORIZATION_REQUIRED":
			if u := info.GetMetadata()["authorization_url"]; u != "" {
				return mcp.NewToolResultError(fmt.Sprintf("user %q must authorize connector %q first: open %s, then call the tool again",
					c.user, c.connector, u)), nil
			}
		}
	}
	switch st.Code() {
	case codes.Canceled, codes.DeadlineExceeded:
		return nil, ctx.Err()
	case codes.Unavailable, codes.Unauthenticated, codes.Internal, codes.Unknown:
		if !hasInfo(st) {
			return mcp.NewToolResultError("the replica that serves this call could not be reached (it may have just stopped); " +
				"call the tool again"), nil
		}
	}
	return mcp.NewToolResultError(st.Message()), nil
}

func hasInfo(st *status.Status) bool {
	for _, d := range st.Details() {
		if _, ok := d.(*errdetails.ErrorInfo); ok {
			return true
		}
	}
	return false
}

// relayForwardedQuestion asks the MCP client a question the owner's call
// put, and answers it there (AnswerInput, on the same connection).
func (h *Handler) relayForwardedQuestion(ctx context.Context, client connectorv1.ConnectorServiceClient, c *mcpCall, in *connectorv1.InputRequest) {
	answer := &connectorv1.InputAnswer{InputId: in.GetInputId(), Action: connectorv1.InputAction_INPUT_ACTION_CANCEL}
	if c.caps.Elicitation && c.srv != nil && in.GetMode() == connectorv1.InputMode_INPUT_MODE_FORM {
		res, err := c.srv.RequestElicitation(ctx, mcp.ElicitationRequest{Request: mcp.Request{Method: string(mcp.MethodElicitationCreate)},
			Params: mcp.ElicitationParams{Message: in.GetMessage(), RequestedSchema: in.GetRequestedSchema().AsMap()}})
		if err == nil && res != nil {
			switch res.Action {
			case mcp.ElicitationResponseActionAccept:
				answer.Action = connectorv1.InputAction_INPUT_ACTION_ACCEPT
				if content, ok := res.Content.(map[string]any); ok {
					answer.Content, _ = structpb.NewStruct(content)
				}
			case mcp.ElicitationResponseActionDecline:
				answer.Action = connectorv1.InputAction_INPUT_ACTION_DECLINE
			}
		}
	}
	_, _ = client.AnswerInput(ctx, &connectorv1.AnswerInputRequest{WorkspaceId: c.ws, ConnectorId: c.connector,
		SessionId: c.session, UserId: c.user, Answer: answer})
}

// resultFromProto is the MCP result of a forwarded call's response.
func resultFromProto(r *connectorv1.CallToolResponse) *mcp.CallToolResult {
	res := &mcp.CallToolResult{IsError: r.GetIsError(), Content: []mcp.Content{}}
	for _, c := range r.GetContent() {
		switch k := c.GetKind().(type) {
		case *connectorv1.Content_Text:
			res.Content = append(res.Content, mcp.NewTextContent(k.Text.GetText()))
		case *connectorv1.Content_Image:
			res.Content = append(res.Content, mcp.NewImageContent(base64.StdEncoding.EncodeToString(k.Image.GetData()), k.Image.GetMimeType()))
		case *connectorv1.Content_Audio:
			res.Content = append(res.Content, mcp.NewAudioContent(base64.StdEncoding.EncodeToString(k.Audio.GetData()), k.Audio.GetMimeType()))
		case *connectorv1.Content_ResourceLink:
			l := k.ResourceLink
			res.Content = append(res.Content, mcp.NewResourceLink(l.GetUri(), l.GetName(), l.GetDescription(), l.GetMimeType()))
		case *connectorv1.Content_Resource:
			e := k.Resource
			if e.GetBlob() != nil || (e.GetText() == "" && !strings.HasPrefix(e.GetMimeType(), "text/")) {
				res.Content = append(res.Content, mcp.NewEmbeddedResource(mcp.BlobResourceContents{URI: e.GetUri(), MIMEType: e.GetMimeType(),
					Blob: base64.StdEncoding.EncodeToString(e.GetBlob())}))
			} else {
				res.Content = append(res.Content, mcp.NewEmbeddedResource(mcp.TextResourceContents{URI: e.GetUri(), MIMEType: e.GetMimeType(),
					Text: e.GetText()}))
			}
		}
	}
	if sc := r.GetStructuredContent(); sc != nil {
		res.StructuredContent = sc.AsMap()
	}
	return res
}

// statusMessage is a gRPC error's message.
func statusMessage(err error) string { return status.Convert(err).Message() }
