package mcpserve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/authorizations"
	"github.com/connector-svc/connector-svc/internal/calls"
	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/registry"
)

// A tool call is the gRPC CallTool's, through the same use case: placed
// by live.Placer (here, or one hop to the replica that serves it), then
// calls.Service.Call, whose limits, approval policy, egress, result caps,
// counters and traces are written once. What differs is how the caller is
// asked: the MCP client is asked with elicitation (a form for approval, a
// URL for authorization, the server's own questions as they are) when it
// declared the capability; otherwise the call ends with a tool error that
// says what to do.

// toolHandler calls connector's tool for the endpoint's clients.
func (h *Handler) toolHandler(ws, connector, tool string) server.ToolHandlerFunc {
	return func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, h.cfg.CallTimeout)
			defer cancel()
		}
		args := req.GetArguments()
		if args == nil {
			args = map[string]any{}
		}
		call := h.newCall(ctx, ws, connector, tool, req)
		if res := call.needsSession(ctx, h); res != nil {
			return res, nil
		}
		// A retry of a call that asked for approval (2026-07-28 clients
		// send it; mcp-go makes it for older ones) carries the answer.
		if state := req.Params.RequestState; state != "" {
			return h.approved(ctx, call, args, req)
		}
		return h.call(ctx, call, args, false)
	}
}

// mcpCall is one tool call of an MCP client.
type mcpCall struct {
	ws, connector, tool string
	session, user       string
	progress            func(registry.Progress)
	caps                sessionClaims
	srv                 *server.MCPServer
}

func (h *Handler) newCall(ctx context.Context, ws, connector, tool string, req mcp.CallToolRequest) *mcpCall {
	c := &mcpCall{ws: ws, connector: connector, tool: tool, user: callerFrom(ctx).userID,
		caps: h.clientCaps(ctx, req.Params.Meta), srv: server.ServerFromContext(ctx)}
	if row, ok := h.d.Live.Lookup(ws, connector); ok && row.Config.SessionMode == registry.SessionPerSession {
		if s := server.ClientSessionFromContext(ctx); s != nil {
			c.session = serviceSession(s.SessionID())
		}
	}
	if req.Params.Meta != nil && req.Params.Meta.ProgressToken != nil && c.srv != nil {
		token := req.Params.Meta.ProgressToken
		c.progress = func(p registry.Progress) {
			params := map[string]any{"progressToken": token, "progress": p.Progress}
			if p.Total > 0 {
				params["total"] = p.Total
			}
			if p.Message != "" {
				params["message"] = p.Message
			}
			_ = c.srv.SendNotificationToClient(ctx, string(mcp.MethodNotificationProgress), params)
		}
	}
	return c
}

// needsSession refuses a call of a per_session connector that has no MCP
// session to keep its server session in: a 2026-07-28 client's.
func (c *mcpCall) needsSession(ctx context.Context, h *Handler) *mcp.CallToolResult {
	row, ok := h.d.Live.Lookup(c.ws, c.connector)
	if !ok || row.Config.SessionMode != registry.SessionPerSession || c.session != "" {
		return nil
	}
	return mcp.NewToolResultError(fmt.Sprintf("connector %q keeps one server session per MCP session, and this client speaks "+
		"the sessionless protocol (%s), which has none: connect with protocol version 2025-11-25 to use it",
		c.connector, server.RequestProtocolVersion(ctx)))
}

// call runs the call here or where it must run; approved says a person
// approved it.
func (h *Handler) call(ctx context.Context, c *mcpCall, args map[string]any, approved bool) (*mcp.CallToolResult, error) {
	conn, err := h.d.Placer.Place(ctx, live.Target{WorkspaceID: c.ws, ConnectorID: c.connector, SessionID: c.session, UserID: c.user})
	if err != nil {
		return toolError(err), nil
	}
	if conn != nil {
		return h.forward(ctx, conn, c, args, approved)
	}
	raw, _ := json.Marshal(args)
	req := calls.Request{WorkspaceID: c.ws, ConnectorID: c.connector, Tool: c.tool, Args: args, ArgumentsBytes: len(raw),
		SessionID: c.session, UserID: c.user, UserApproved: approved, Progress: c.progress}
	var asks sync.WaitGroup
	if c.caps.Elicitation && c.srv != nil && !mcp.IsModernProtocol(server.RequestProtocolVersion(ctx)) {
		req.Ask = func(_ string, in orchestrator.Input) {
			asks.Add(1)
			go func() {
				defer asks.Done()
				h.relayQuestion(ctx, c, in)
			}()
		}
	}
	res, err := h.d.Calls.Call(ctx, req)
	asks.Wait()
	var approval *calls.ApprovalRequiredError
	var authz *calls.AuthorizationRequiredError
	switch {
	case errors.As(err, &approval):
		return h.askApproval(ctx, c, args)
	case errors.As(err, &authz):
		return h.askAuthorization(ctx, c, authz)
	case err != nil:
		return toolError(err), nil
	}
	return res.CallToolResult, nil
}

// relayQuestion puts a server's question to the MCP client and hands its
// answer back to the call; one the client cannot answer is cancel.
func (h *Handler) relayQuestion(ctx context.Context, c *mcpCall, in orchestrator.Input) {
	answer := ask.Answer{Action: ask.Cancel}
	params := mcp.ElicitationParams{Message: in.Message, RequestedSchema: in.Schema}
	if in.Mode == ask.ModeURL {
		params = mcp.ElicitationParams{Mode: mcp.ElicitationModeURL, Message: in.Message, URL: in.URL, ElicitationID: in.ElicitationID}
	}
	if in.Mode != ask.ModeSampling && (in.Mode != ask.ModeURL || c.caps.URLElicit) {
		res, err := c.srv.RequestElicitation(ctx, mcp.ElicitationRequest{Request: mcp.Request{Method: string(mcp.MethodElicitationCreate)},
			Params: params})
		if err == nil && res != nil {
			answer = ask.Answer{Action: string(res.Action)}
			if content, ok := res.Content.(map[string]any); ok {
				answer.Content = content
			}
		} else if err != nil {
			h.logger.InfoContext(ctx, "an MCP client did not answer a server's question", slog.String("connector_id", c.connector),
				slog.String("error", err.Error()))
		}
	}
	if err := h.d.Calls.Answer(c.ws, c.connector, c.session, c.user, in.ID, answer); err != nil {
		h.logger.InfoContext(ctx, "a server's question was gone before its answer", slog.String("connector_id", c.connector),
			slog.String("error", err.Error()))
	}
}

// Approval by form. The call's result asks the client for input (an
// input_required result, SEP-2322): a form with the arguments, editable,
// and the decision. A 2026-07-28 client answers by sending the call again
// with the answer; for an older client mcp-go asks with elicitation/create
// and calls the handler again itself. The request state names the call,
// so an answer cannot approve another tool.

const approvalInput = "approval"

// askApproval asks the client to approve c, or says how to.
func (h *Handler) askApproval(_ context.Context, c *mcpCall, args map[string]any) (*mcp.CallToolResult, error) {
	if !c.caps.Elicitation {
		return mcp.NewToolResultError(fmt.Sprintf("tool %q of connector %q needs a person's approval, and this MCP client "+
			"cannot ask one (it did not declare elicitation). Approve it from a client that can, or call it through the gRPC "+
			"API with user_approved once a person approved.", c.tool, c.connector)), nil
	}
	argsJSON, _ := json.MarshalIndent(args, "", "  ")
	schema := map[string]any{
		"type": "object",
		"properties": map[string]any{
			"approve": map[string]any{"type": "boolean", "title": "Approve this call", "default": false},
			"arguments": map[string]any{"type": "string", "title": "Arguments (JSON)",
				"description": "The call's arguments; edit them before you approve, if needed.", "default": string(argsJSON)},
			"message": map[string]any{"type": "string", "title": "Why not (if you deny)"},
		},
		"required": []string{"approve"},
	}
	msg := fmt.Sprintf("Connector %q wants to run tool %q with these arguments:\n%s\nApprove it, edit the arguments, or deny it.",
		c.connector, c.tool, argsJSON)
	b := server.NewInputRequestBuilder(h.approvalState(c, args)).
		Elicit(approvalInput, mcp.ElicitationParams{Message: msg, RequestedSchema: schema})
	return b.ToolResult(), nil
}

// approvalState ties an approval to its call: the endpoint, connector,
// tool, session, user and arguments asked about, signed.
func (h *Handler) approvalState(c *mcpCall, args map[string]any) string {
	return h.ids.sign(sessionClaims{Path: approvalKey(c, args), Issued: time.Now().Unix()})
}

func approvalKey(c *mcpCall, args map[string]any) string {
	raw, _ := json.Marshal(args)
	return "approval\x00" + c.ws + "\x00" + c.connector + "\x00" + c.tool + "\x00" + c.session + "\x00" + c.user + "\x00" + hash(string(raw))
}

// approved goes on with a call after the client's answer to the approval
// form: the edited arguments run if the person approved.
func (h *Handler) approved(ctx context.Context, c *mcpCall, args map[string]any, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	st, err := h.ids.parse(req.Params.RequestState)
	if err != nil || st.Path != approvalKey(c, args) {
		return mcp.NewToolResultError("the approval's request state does not match this call (another call's, changed, or older " +
			"than a week); call the tool again"), nil
	}
	res := server.ElicitationResponse(req.Params.InputResponses, approvalInput)
	if res == nil {
		return mcp.NewToolResultError("the call was sent again without an answer to its approval form; call the tool again"), nil
	}
	content, _ := res.Content.(map[string]any)
	if res.Action != mcp.ElicitationResponseActionAccept || content["approve"] != true {
		why := "the person did not approve it"
		if m, _ := content["message"].(string); m != "" {
			why += ": " + m
		} else if res.Action != mcp.ElicitationResponseActionAccept {
			why += " (" + string(res.Action) + ")"
		}
		return mcp.NewToolResultError(fmt.Sprintf("tool %q was not run: %s", c.tool, why)), nil
	}
	if edited, _ := content["arguments"].(string); edited != "" {
		var next map[string]any
		if err := json.Unmarshal([]byte(edited), &next); err != nil {
			return mcp.NewToolResultError("the edited arguments are not a JSON object: " + err.Error() + "; the tool was not run"), nil
		}
		args = next
	}
	return h.call(ctx, c, args, true)
}

// askAuthorization sends the user to authorize: with a URL elicitation
// when the client can show one, else in the tool error.
func (h *Handler) askAuthorization(ctx context.Context, c *mcpCall, e *calls.AuthorizationRequiredError) (*mcp.CallToolResult, error) {
	if h.d.Authorizations == nil {
		return toolError(e), nil
	}
	err := h.d.Authorizations.Needed(ctx, e.Row, e.UserID, e.Required, "")
	var required *authorizations.RequiredError
	if !errors.As(err, &required) {
		return toolError(err), nil
	}
	a := required.Authorization
	msg := fmt.Sprintf("Connector %q needs your authorization (%s): open the link, sign in, and then call the tool again.",
		c.connector, a.Reason)
	if c.caps.URLElicit && c.srv != nil && server.RequestProtocolVersion(ctx) != "" && !mcp.IsModernProtocol(server.RequestProtocolVersion(ctx)) {
		if res, err := c.srv.RequestElicitation(ctx, mcp.ElicitationRequest{Request: mcp.Request{Method: string(mcp.MethodElicitationCreate)},
			Params: mcp.ElicitationParams{Mode: mcp.ElicitationModeURL, Message: msg, URL: a.URL, ElicitationID: hash(a.URL)[:16]}}); err == nil &&
			res.Action == mcp.ElicitationResponseActionAccept {
			return mcp.NewToolResultError(fmt.Sprintf("user %q was sent to authorize connector %q; call the tool again once "+
				"they have", a.UserID, c.connector)), nil
		}
	}
	return mcp.NewToolResultError(fmt.Sprintf("user %q must authorize connector %q first (%s): open %s, then call the tool again",
		a.UserID, c.connector, a.Reason, a.URL)), nil
}

// toolError is a failed call as the model reads it: a tool result with
// isError, the use case's message (which names the problem and never a
// secret).
func toolError(err error) *mcp.CallToolResult {
	return mcp.NewToolResultError(err.Error())
}
