// Package asktools serves the tools of the registry's tests whose servers
// ask back: they elicit (a form, a URL) and sample through mcp-go's input
// requests, which mcp-go's server turns into elicitation/create and
// sampling/createMessage for a client of the classic protocol, and sends
// as input_required to one of the sessionless protocol.
package asktools

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

// Schema is the form the "ask" tool requests.
var Schema = map[string]any{
	"type": "object",
	"properties": map[string]any{
		"name":  map[string]any{"type": "string", "minLength": 1},
		"age":   map[string]any{"type": "integer", "minimum": 0},
		"ok":    map[string]any{"type": "boolean"},
		"color": map[string]any{"type": "string", "enum": []any{"red", "green"}},
	},
	"required": []any{"name"},
}

// URL is what the "askurl" tool sends the user to.
const URL = "https://auth.example.com/login?state=abc"

// Add adds the tools to s:
//   - caps: the client's capabilities as the server sees them, as JSON;
//   - ask: elicits Schema as "who", and says the answer;
//   - askurl: elicits a URL-mode consent as "consent", and says the answer;
//   - sample: samples as "s", and says the completion and its model;
//   - both: samples ("s") and elicits ("who") in one round;
//   - busy: asks for nothing once (a busy server's "retry later"), then
//     answers, on the sessionless protocol;
//   - hold: waits ms milliseconds (classic protocol);
//   - askmine: elicits Schema with the progress token of its call's
//     request in the request's _meta, naming the call (classic protocol);
//   - needurl: fails with -32042 (URL elicitation required) on the classic
//     protocol.
func Add(s *server.MCPServer) {
	s.AddTool(mcp.NewTool("caps"), func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var caps mcp.ClientCapabilities
		if info := server.RequestProtocolInfoFromContext(ctx); info != nil && info.ClientCapabilities != nil {
			caps = *info.ClientCapabilities
		} else if cs, ok := server.ClientSessionFromContext(ctx).(server.SessionWithClientInfo); ok {
			caps = cs.GetClientCapabilities()
		}
		b, _ := json.Marshal(caps)
		return mcp.NewToolResultText(string(b)), nil
	})
	s.AddTool(mcp.NewTool("ask"), func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if ans := server.ElicitationResponse(req.Params.InputResponses, "who"); ans != nil {
			return mcp.NewToolResultText(answer(ans)), nil
		}
		return server.NewInputRequestBuilder("state-ask").Elicit("who", mcp.ElicitationParams{
			Message: "Who are you?", RequestedSchema: Schema}).ToolResult(), nil
	})
	s.AddTool(mcp.NewTool("askurl"), func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if ans := server.ElicitationResponse(req.Params.InputResponses, "consent"); ans != nil {
			return mcp.NewToolResultText(answer(ans)), nil
		}
		return server.NewInputRequestBuilder("state-url").Elicit("consent", mcp.ElicitationParams{
			Mode: mcp.ElicitationModeURL, Message: "Log in to Example", URL: URL, ElicitationID: "el-1"}).ToolResult(), nil
	})
	s.AddTool(mcp.NewTool("sample"), func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if res := server.SamplingResponse(req.Params.InputResponses, "s"); res != nil {
			return mcp.NewToolResultText(sampled(res)), nil
		}
		return server.NewInputRequestBuilder("state-sample").Sample("s", samplingParams()).ToolResult(), nil
	})
	s.AddTool(mcp.NewTool("both"), func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		res := server.SamplingResponse(req.Params.InputResponses, "s")
		ans := server.ElicitationResponse(req.Params.InputResponses, "who")
		if res != nil && ans != nil {
			return mcp.NewToolResultText(sampled(res) + " " + answer(ans)), nil
		}
		return server.NewInputRequestBuilder("state-both").Sample("s", samplingParams()).
			Elicit("who", mcp.ElicitationParams{Message: "Who are you?", RequestedSchema: Schema}).ToolResult(), nil
	})
	s.AddTool(mcp.NewTool("busy"), func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if req.Params.RequestState == "busy-1" {
			return mcp.NewToolResultText("done after a busy round"), nil
		}
		return server.NewInputRequestBuilder("busy-1").ToolResult(), nil
	})
	s.AddTool(mcp.NewTool("hold", mcp.WithNumber("ms", mcp.Required())),
		func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			select {
			case <-time.After(time.Duration(req.GetFloat("ms", 0)) * time.Millisecond):
			case <-ctx.Done():
			}
			return mcp.NewToolResultText("held"), nil
		})
	s.AddTool(mcp.NewTool("askmine"), func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		p := mcp.ElicitationParams{Message: "Who are you?", RequestedSchema: Schema}
		if m := req.Params.Meta; m != nil && m.ProgressToken != nil {
			p.Meta = &mcp.Meta{ProgressToken: m.ProgressToken}
		}
		res, err := s.RequestElicitation(ctx, mcp.ElicitationRequest{Params: p})
		if err != nil {
			return mcp.NewToolResultText("error: " + err.Error()), nil
		}
		return mcp.NewToolResultText(answer(res)), nil
	})
	s.AddTool(mcp.NewTool("needurl"), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return nil, mcp.URLElicitationRequiredError{Elicitations: []mcp.ElicitationParams{{
			Mode: mcp.ElicitationModeURL, Message: "Grant access", URL: URL, ElicitationID: "el-9"}}}
	})
}

func samplingParams() mcp.CreateMessageParams {
	return mcp.CreateMessageParams{
		Messages:     []mcp.SamplingMessage{{Role: mcp.RoleUser, Content: mcp.NewTextContent("hello")}},
		SystemPrompt: "be brief",
		MaxTokens:    50,
	}
}

func answer(ans *mcp.ElicitationResult) string {
	b, _ := json.Marshal(ans.Content)
	return fmt.Sprintf("action=%s content=%s", ans.Action, b)
}

func sampled(res *mcp.CreateMessageResult) string {
	text := ""
	if tc, ok := mcp.AsTextContent(res.Content); ok {
		text = tc.Text
	} else if m, ok := res.Content.(map[string]any); ok {
		text, _ = m["text"].(string)
	}
	return fmt.Sprintf("sampled=%q model=%s", text, res.Model)
}
