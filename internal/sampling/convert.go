package sampling

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"
	openai "github.com/sashabaranov/go-openai"
)

// Stop reasons of a sampling result, as MCP names them.
const (
	StopEndTurn   = "endTurn"
	StopMaxTokens = "maxTokens"
	StopToolUse   = "toolUse"
)

// blocks returns a sampling message's content as a list of blocks: mcp-go
// hands it over as one block or a list, typed, or as decoded JSON when a
// transport did not parse it.
func blocks(content any) ([]mcp.Content, error) {
	parsed, err := mcp.ParseSamplingContent(content)
	if err != nil {
		return nil, err
	}
	switch c := parsed.(type) {
	case nil:
		return nil, nil
	case []mcp.Content:
		return c, nil
	case mcp.Content:
		return []mcp.Content{c}, nil
	case *mcp.TextContent:
		return []mcp.Content{*c}, nil
	case *mcp.ImageContent:
		return []mcp.Content{*c}, nil
	case *mcp.AudioContent:
		return []mcp.Content{*c}, nil
	case *mcp.ToolUseContent:
		return []mcp.Content{*c}, nil
	case *mcp.ToolResultContent:
		return []mcp.Content{*c}, nil
	}
	// Anything else (a typed list, raw JSON): through JSON once more.
	raw, err := json.Marshal(parsed)
	if err != nil {
		return nil, err
	}
	var generic any
	if err := json.Unmarshal(raw, &generic); err != nil {
		return nil, err
	}
	switch generic.(type) {
	case map[string]any, []any:
		return blocks(generic)
	}
	return nil, fmt.Errorf("content of type %T", parsed)
}

// functionNames maps tool names to function names the chat API takes
// (letters, digits, _ and -, at most 64): MCP allows dots, slashes and
// longer names, which some endpoints refuse. A name that fits stays as it
// is; the model's calls are mapped back.
type functionNames struct {
	fn   map[string]string // tool name → function name
	tool map[string]string // function name → tool name
}

func newFunctionNames() *functionNames {
	return &functionNames{fn: map[string]string{}, tool: map[string]string{}}
}

// of returns tool's function name, making one the first time.
func (n *functionNames) of(tool string) string {
	if f, ok := n.fn[tool]; ok {
		return f
	}
	b := []byte(tool)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			b[i] = '_'
		}
	}
	f := string(b)
	if len(f) > 64 {
		f = f[:64]
	}
	if f == "" {
		f = "tool"
	}
	for i := 2; ; i++ {
		if _, taken := n.tool[f]; !taken {
			break
		}
		suffix := fmt.Sprintf("_%d", i)
		f = string(b[:min(len(b), 64-len(suffix))]) + suffix
	}
	n.fn[tool], n.tool[f] = f, tool
	return f
}

// toolOf returns the tool name of function name f.
func (n *functionNames) toolOf(f string) string {
	if t, ok := n.tool[f]; ok {
		return t
	}
	return f
}

// invalidf is an error about the request's shape (-32602).
func invalidf(format string, args ...any) *Error {
	return &Error{Code: mcp.INVALID_PARAMS, Outcome: OutcomeInvalid, Msg: "invalid sampling request: " + fmt.Sprintf(format, args...)}
}

// messages maps a sampling request's system prompt and messages to the
// chat API's. An assistant's tool uses become its tool calls; the user
// message after it must hold only their results, every one of them, which
// become tool messages.
func messages(req mcp.CreateMessageRequest, names *functionNames) ([]openai.ChatCompletionMessage, error) {
	var out []openai.ChatCompletionMessage
	if req.SystemPrompt != "" {
		out = append(out, openai.ChatCompletionMessage{Role: openai.ChatMessageRoleSystem, Content: req.SystemPrompt})
	}
	if len(req.Messages) == 0 {
		return nil, invalidf("no messages")
	}
	var pending []string // tool uses of the last assistant message, unanswered
	for i, m := range req.Messages {
		bs, err := blocks(m.Content)
		if err != nil {
			return nil, invalidf("message %d: %v", i, err)
		}
		if len(bs) == 0 {
			return nil, invalidf("message %d has no content", i)
		}
		switch m.Role {
		case mcp.RoleUser:
			if isToolResult(bs[0]) || len(pending) > 0 {
				tools, err := toolResults(i, bs, pending)
				if err != nil {
					return nil, err
				}
				out = append(out, tools...)
				pending = nil
				continue
			}
			msg, err := userMessage(i, bs)
			if err != nil {
				return nil, err
			}
			out = append(out, msg)
		case mcp.RoleAssistant:
			if len(pending) > 0 {
				return nil, invalidf("message %d: tool use %s of the message before it has no result", i, strings.Join(pending, ", "))
			}
			msg, err := assistantMessage(i, bs, names)
			if err != nil {
				return nil, err
			}
			for _, tc := range msg.ToolCalls {
				pending = append(pending, tc.ID)
			}
			out = append(out, msg)
		default:
			return nil, invalidf("message %d has role %q, want user or assistant", i, m.Role)
		}
	}
	if len(pending) > 0 {
		return nil, invalidf("tool use %s of the last message has no result", strings.Join(pending, ", "))
	}
	return out, nil
}

func isToolResult(c mcp.Content) bool {
	_, ok := c.(mcp.ToolResultContent)
	return ok
}

// toolResults maps user message i, which answers the tool uses pending:
// one tool message per result, only results, each use answered once.
func toolResults(i int, bs []mcp.Content, pending []string) ([]openai.ChatCompletionMessage, error) {
	if len(pending) == 0 {
		return nil, invalidf("message %d holds tool results, but the message before it used no tools", i)
	}
	left := make(map[string]bool, len(pending))
	for _, id := range pending {
		left[id] = true
	}
	out := make([]openai.ChatCompletionMessage, 0, len(bs))
	for _, b := range bs {
		r, ok := b.(mcp.ToolResultContent)
		if !ok {
			return nil, invalidf("message %d mixes tool results with other content, or does not answer the tool uses before it", i)
		}
		if !left[r.ToolUseID] {
			return nil, invalidf("message %d: tool result %q answers no tool use of the message before it", i, r.ToolUseID)
		}
		delete(left, r.ToolUseID)
		out = append(out, openai.ChatCompletionMessage{Role: openai.ChatMessageRoleTool, ToolCallID: r.ToolUseID, Content: resultText(r)})
	}
	for _, id := range pending {
		if left[id] {
			return nil, invalidf("message %d has no result for tool use %q", i, id)
		}
	}
	return out, nil
}

// resultText is a tool result as the model reads it: its text, or its
// structured content as JSON when it has no text.
func resultText(r mcp.ToolResultContent) string {
	var parts []string
	for _, c := range r.Content {
		switch c := c.(type) {
		case mcp.TextContent:
			parts = append(parts, c.Text)
		case mcp.ImageContent:
			parts = append(parts, "[an image ("+c.MIMEType+") the model cannot see here]")
		case mcp.AudioContent:
			parts = append(parts, "[audio ("+c.MIMEType+") the model cannot hear]")
		default:
			if raw, err := json.Marshal(c); err == nil {
				parts = append(parts, string(raw))
			}
		}
	}
	text := strings.Join(parts, "\n")
	if text == "" && r.StructuredContent != nil {
		if raw, err := json.Marshal(r.StructuredContent); err == nil {
			text = string(raw)
		}
	}
	if r.IsError {
		text = "The tool failed: " + text
	}
	return text
}

// userMessage maps user message i: text alone as plain content, text and
// images as parts (an image as a data URL).
func userMessage(i int, bs []mcp.Content) (openai.ChatCompletionMessage, error) {
	msg := openai.ChatCompletionMessage{Role: openai.ChatMessageRoleUser}
	if t, ok := bs[0].(mcp.TextContent); ok && len(bs) == 1 {
		msg.Content = t.Text
		return msg, nil
	}
	for _, b := range bs {
		switch c := b.(type) {
		case mcp.TextContent:
			msg.MultiContent = append(msg.MultiContent, openai.ChatMessagePart{Type: openai.ChatMessagePartTypeText, Text: c.Text})
		case mcp.ImageContent:
			msg.MultiContent = append(msg.MultiContent, openai.ChatMessagePart{Type: openai.ChatMessagePartTypeImageURL,
				ImageURL: &openai.ChatMessageImageURL{URL: "data:" + c.MIMEType + ";base64," + c.Data}})
		case mcp.AudioContent:
			return msg, unsupported(i, "audio")
		case mcp.ToolUseContent:
			return msg, invalidf("message %d: a user message cannot use a tool", i)
		case mcp.ToolResultContent:
			return msg, invalidf("message %d mixes tool results with other content", i)
		default:
			return msg, unsupported(i, contentType(b))
		}
	}
	return msg, nil
}

// assistantMessage maps assistant message i: its text, and its tool uses
// as tool calls.
func assistantMessage(i int, bs []mcp.Content, names *functionNames) (openai.ChatCompletionMessage, error) {
	msg := openai.ChatCompletionMessage{Role: openai.ChatMessageRoleAssistant}
	var text []string
	seen := map[string]bool{}
	for _, b := range bs {
		switch c := b.(type) {
		case mcp.TextContent:
			text = append(text, c.Text)
		case mcp.ToolUseContent:
			if seen[c.ID] {
				return msg, invalidf("message %d uses tool %q twice", i, c.ID)
			}
			seen[c.ID] = true
			args, err := json.Marshal(c.Input)
			if err != nil || c.Input == nil {
				args = []byte("{}")
			}
			msg.ToolCalls = append(msg.ToolCalls, openai.ToolCall{ID: c.ID, Type: openai.ToolTypeFunction,
				Function: openai.FunctionCall{Name: names.of(c.Name), Arguments: string(args)}})
		case mcp.ToolResultContent:
			return msg, invalidf("message %d: an assistant message cannot hold tool results", i)
		case mcp.ImageContent:
			return msg, unsupported(i, "image in an assistant message")
		case mcp.AudioContent:
			return msg, unsupported(i, "audio")
		default:
			return msg, unsupported(i, contentType(b))
		}
	}
	msg.Content = strings.Join(text, "\n")
	return msg, nil
}

func unsupported(i int, what string) *Error {
	return &Error{Code: mcp.INVALID_PARAMS, Outcome: OutcomeInvalid,
		Msg: fmt.Sprintf("sampling refused: message %d has %s content, which the connector's model does not take", i, what)}
}

func contentType(c mcp.Content) string {
	raw, _ := json.Marshal(c)
	var t struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(raw, &t)
	if t.Type == "" {
		return fmt.Sprintf("%T", c)
	}
	return t.Type
}

// tools maps the request's tools to functions, and its tool choice: auto
// (the default) and required as they are; none sends no tools at all,
// since some models ignore tool_choice.
func tools(req mcp.CreateMessageRequest, names *functionNames) ([]openai.Tool, any, error) {
	if len(req.Tools) == 0 {
		return nil, nil, nil
	}
	choice := "auto"
	if req.ToolChoice != nil {
		switch req.ToolChoice.Mode {
		case "", mcp.ToolChoiceModeAuto:
		case mcp.ToolChoiceModeRequired:
			choice = "required"
		case mcp.ToolChoiceModeNone:
			return nil, nil, nil
		default:
			return nil, nil, invalidf("tool choice mode %q, want auto, required or none", req.ToolChoice.Mode)
		}
	}
	out := make([]openai.Tool, 0, len(req.Tools))
	for _, t := range req.Tools {
		if t.Name == "" {
			return nil, nil, invalidf("a tool has no name")
		}
		out = append(out, openai.Tool{Type: openai.ToolTypeFunction, Function: &openai.FunctionDefinition{
			Name: names.of(t.Name), Description: t.Description, Parameters: inputSchema(t)}})
	}
	return out, choice, nil
}

// inputSchema is a tool's input schema as JSON, as the server sent it; an
// object without properties if it has none.
func inputSchema(t mcp.Tool) json.RawMessage {
	raw, err := json.Marshal(t)
	var wire struct {
		InputSchema json.RawMessage `json:"inputSchema"`
	}
	if err == nil {
		err = json.Unmarshal(raw, &wire)
	}
	var b bytes.Buffer
	if err != nil || len(bytes.TrimSpace(wire.InputSchema)) == 0 || json.Compact(&b, wire.InputSchema) != nil {
		return json.RawMessage(`{"type":"object"}`)
	}
	return b.Bytes()
}

// result maps the model's answer: its text, or, when it asked for tools
// (and was offered some), its text and a tool use per call — never run
// here: the server runs them and asks again with their results.
func result(resp openai.ChatCompletionResponse, model string, offered bool, names *functionNames) (*mcp.CreateMessageResult, []string, error) {
	ch := resp.Choices[0]
	msg := ch.Message
	res := &mcp.CreateMessageResult{Model: resp.Model, StopReason: StopEndTurn}
	if res.Model == "" {
		res.Model = model
	}
	res.Role = mcp.RoleAssistant
	text := msg.Content
	if text == "" {
		for _, p := range msg.MultiContent {
			text += p.Text
		}
	}
	if ch.FinishReason == openai.FinishReasonLength {
		res.StopReason = StopMaxTokens
	}
	if len(msg.ToolCalls) == 0 || !offered {
		res.Content = mcp.NewTextContent(text)
		return res, nil, nil
	}
	var content []mcp.Content
	if text != "" {
		content = append(content, mcp.NewTextContent(text))
	}
	uses := make([]string, 0, len(msg.ToolCalls))
	for i, tc := range msg.ToolCalls {
		input := map[string]any{}
		if args := strings.TrimSpace(tc.Function.Arguments); args != "" && args != "null" {
			// Numbers stay as the model wrote them: an id past 2^53
			// keeps its digits.
			d := json.NewDecoder(strings.NewReader(args))
			d.UseNumber()
			if err := d.Decode(&input); err != nil || d.More() {
				return nil, nil, &Error{Code: mcp.INTERNAL_ERROR, Outcome: OutcomeFailed,
					Msg: fmt.Sprintf("sampling failed: the model's arguments for tool %q are not a JSON object", tc.Function.Name)}
			}
		}
		id := tc.ID
		if id == "" {
			id = fmt.Sprintf("toolu_%d", i+1)
		}
		name := names.toolOf(tc.Function.Name)
		content = append(content, mcp.NewToolUseContent(id, name, input))
		uses = append(uses, name)
	}
	res.Content = content
	res.StopReason = StopToolUse
	return res, uses, nil
}
