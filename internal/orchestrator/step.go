package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/mark3labs/mcp-go/mcp"
	openai "github.com/sashabaranov/go-openai"

	"github.com/connector-svc/connector-svc/internal/ask"
)

// step checks and runs the tool calls of model turn index, msg, and
// returns the tool messages' contents for the model, in the order of the
// calls. Valid calls run concurrently; the others get an error message
// instead of running. A valid call whose tool needs approval does not run:
// it is returned in pending, its output left empty.
func (r *run) step(ctx context.Context, index int, msg openai.ChatCompletionMessage) (outputs []string, pending []int, err error) {
	calls := msg.ToolCalls
	step := Step{Index: index, Calls: make([]Call, len(calls)), Reasoning: strings.TrimSpace(msg.Content)}
	outputs = make([]string, len(calls))
	var runnable []int
	for i, tc := range calls {
		call := Call{ID: tc.ID, Tool: tc.Function.Name}
		switch {
		case r.isRead(tc.Function.Name):
			// Answered here, within the run's byte budget; it is no tool
			// call of the budget.
			outputs[i] = r.readResource(ctx, tc.Function.Arguments, &call)
			call.ResultExcerpt = Truncate(outputs[i], r.agent.cfg.ExcerptSize)
			call.IsError = strings.HasPrefix(outputs[i], "Error: ")
			outputs[i] = Truncate(outputs[i], r.agent.cfg.ResultLimit)
		case r.isSearch(tc.Function.Name):
			// Answered here, at once; it is no tool call of the budget.
			call.Arguments, _ = decodeArguments(tc.Function.Arguments)
			outputs[i] = r.search(ctx, tc.Function.Arguments)
			call.ResultExcerpt = Truncate(outputs[i], r.agent.cfg.ExcerptSize)
			call.IsError = strings.HasPrefix(outputs[i], "Error: ")
		default:
			call.Arguments, call.RejectedReason = r.check(tc)
			switch {
			case call.RejectedReason != "":
				call.IsError = true
				outputs[i] = "Error: " + call.RejectedReason
			case r.conn.tools[call.Tool].RequiresApproval:
				// Its share of the budget is kept for it while it waits.
				r.used++
				call.Pending = true
				pending = append(pending, i)
			default:
				r.used++
				runnable = append(runnable, i)
			}
		}
		step.Calls[i] = call
	}
	r.emit(Event{Kind: EventStepPlanned, Step: cloneStep(step)})
	if err := r.runCalls(ctx, &step, outputs, runnable); err != nil {
		return nil, nil, err
	}
	pending = r.awaitAuthorization(&step, outputs, pending)
	pending = r.awaitInput(&step, outputs, pending)
	r.res.Steps = append(r.res.Steps, step)
	return outputs, pending, nil
}

// awaitAuthorization makes the calls of step that met an
// AuthorizationError pending, so that the run pauses for its user's
// authorization and they run again on resume, and returns the step's
// pending calls. A step with calls pending for approval pauses for that
// already: its calls that met one fail into the model's context instead,
// as other errors do.
func (r *run) awaitAuthorization(step *Step, outputs []string, pending []int) []int {
	if len(pending) > 0 {
		for i := range step.Calls {
			step.Calls[i].AwaitsAuthorization = false
		}
		r.res.Authorization = nil
		return pending
	}
	for i := range step.Calls {
		c := &step.Calls[i]
		if !c.AwaitsAuthorization {
			continue
		}
		c.Pending, c.IsError, c.ResultExcerpt, outputs[i] = true, false, "", ""
		pending = append(pending, i)
		// It did not run: it counts as used when it runs on resume.
		r.unused(c.Tool)
	}
	if len(pending) == 0 {
		r.res.Authorization = nil
	}
	return pending
}

// unused takes the last use of tool off the run's tools used: a call of
// it did not finish, and runs again on resume.
func (r *run) unused(tool string) {
	for j := len(r.res.ToolsUsed) - 1; j >= 0; j-- {
		if r.res.ToolsUsed[j] == tool {
			r.res.ToolsUsed = slices.Delete(r.res.ToolsUsed, j, j+1)
			return
		}
	}
}

// needAuthorization records why the run must await its user's
// authorization: the first reason met, and every scope asked for. Calls
// of a step run concurrently.
func (r *run) needAuthorization(e *AuthorizationError) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.res.Authorization == nil {
		r.res.Authorization = &AuthorizationNeed{Reason: e.Reason}
	}
	for _, s := range e.Scopes {
		if !slices.Contains(r.res.Authorization.Scopes, s) {
			r.res.Authorization.Scopes = append(r.res.Authorization.Scopes, s)
		}
	}
}

// runCalls runs the calls of step at indexes, concurrently, and puts what
// the model sees of each into outputs.
func (r *run) runCalls(ctx context.Context, step *Step, outputs []string, indexes []int) error {
	r.mu.Lock()
	r.current = step
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.current = nil
		r.mu.Unlock()
	}()
	var wg sync.WaitGroup
	var panicked atomic.Bool
	for _, i := range indexes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				if p := recover(); p != nil {
					r.agent.logger.ErrorContext(ctx, "tool call panicked", slog.String("tool", step.Calls[i].Tool), slog.Any("panic", p))
					panicked.Store(true)
				}
			}()
			r.mu.Lock()
			c := step.Calls[i]
			r.mu.Unlock()
			r.emit(Event{Kind: EventToolCallStarted, Index: step.Index, Call: c})
			cctx := ask.With(ctx, r.asker(step.Index, c), ask.Call{ID: c.ID, Tool: c.Tool})
			out, c := r.runCall(cctx, step.Index, c, r.callOptions(step.Index, c))
			r.mu.Lock()
			outputs[i], step.Calls[i] = out, c
			r.mu.Unlock()
			r.emit(Event{Kind: EventToolCallFinished, Index: step.Index, Call: c})
		}()
	}
	wg.Wait()
	if panicked.Load() {
		return ErrPanic
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, i := range indexes {
		r.res.ToolsUsed = append(r.res.ToolsUsed, step.Calls[i].Tool)
	}
	return nil
}

// toolMessages are the answers to a turn's calls, in their order.
func toolMessages(calls []openai.ToolCall, outputs []string) []openai.ChatCompletionMessage {
	msgs := make([]openai.ChatCompletionMessage, len(calls))
	for i, tc := range calls {
		msgs[i] = openai.ChatCompletionMessage{Role: openai.ChatMessageRoleTool, ToolCallID: tc.ID, Name: tc.Function.Name, Content: outputs[i]}
	}
	return msgs
}

// uniqueCallIDs gives the calls of turn that have no id, or one an earlier
// call of the turn has, an id of their own: a decision about a call names
// it by id, and so does the tool message that answers it.
func uniqueCallIDs(calls []openai.ToolCall, turn int) {
	seen := make(map[string]bool, len(calls))
	for i := range calls {
		if id := calls[i].ID; id == "" || seen[id] {
			calls[i].ID = fmt.Sprintf("call_%d_%d", turn, i)
		}
		seen[calls[i].ID] = true
	}
}

// check returns a call's arguments, or why it must not run: an unknown or
// disabled tool, arguments that are not a JSON object or break the tool's
// schema, or a spent budget.
func (r *run) check(tc openai.ToolCall) (map[string]any, string) {
	name := tc.Function.Name
	args, err := decodeArguments(tc.Function.Arguments)
	if err != nil {
		return nil, fmt.Sprintf("the arguments of %q are not a JSON object: %v", name, err)
	}
	t, ok := r.conn.tools[name]
	switch {
	case !r.isOffered(name):
		return args, r.notOffered(name)
	case !ok:
		return args, r.conn.missing(name)
	}
	if err := t.validate(args); err != nil {
		return args, fmt.Sprintf("invalid arguments for %q: %s. Fix the arguments and call it again.", name, schemaError(err))
	}
	if r.declined(name, args) {
		return args, fmt.Sprintf("the user already declined this call of %q in this query; do not ask for it again, answer with what you have", name)
	}
	if r.used >= r.req.MaxTools {
		return args, fmt.Sprintf("the tool budget of %d calls for this query is used up; answer with the results you have", r.req.MaxTools)
	}
	return args, ""
}

// decodeArguments reads the model's arguments: a JSON object, or nothing
// (empty or null: no arguments). Numbers stay as written (json.Number), so
// an id past 2^53 reaches the tool with all its digits.
func decodeArguments(raw string) (map[string]any, error) {
	d := json.NewDecoder(strings.NewReader(raw))
	d.UseNumber()
	var args map[string]any
	if err := d.Decode(&args); err != nil && (err != io.EOF || strings.TrimSpace(raw) != "") {
		return nil, err
	}
	if d.Decode(&struct{}{}) != io.EOF {
		return nil, errors.New("text after the JSON object")
	}
	if args == nil {
		args = map[string]any{}
	}
	return args, nil
}

// callOptions are the options of one tool call of the run: its session
// and, when the run is streamed, a progress callback that emits each
// update. The ToolCaller calls back before the call returns, so every
// update comes before the call's finished event.
func (r *run) callOptions(index int, call Call) CallOptions {
	opts := CallOptions{Session: r.req.Session, UserID: r.req.UserID, Retry: r.retries[call.ID]}
	if r.progress {
		opts.Progress = func(p Progress) {
			r.emit(Event{Kind: EventToolCallProgress, Index: index, Call: call, Progress: p})
		}
	}
	return opts
}

// runCall runs one tool and returns what the model sees and the traced call.
func (r *run) runCall(ctx context.Context, index int, call Call, opts CallOptions) (string, Call) {
	var res *mcp.CallToolResult
	var err error
	if r.req.Throttle != nil {
		err = r.req.Throttle(ctx)
	}
	start := time.Now()
	var taskID string
	var restarted bool
	opts.TaskID, opts.Restarted = &taskID, &restarted
	if err == nil {
		res, err = r.agent.tools.CallTool(ctx, r.conn.ID, call.Tool, call.Arguments, opts)
	}
	call.Duration = time.Since(start)
	if restarted {
		r.mu.Lock()
		r.res.SessionRestarted = true
		r.mu.Unlock()
	}
	if taskID != "" {
		call.TaskID = taskID
	}
	timedOut := r.recorded(&call)
	var text string
	var authErr *AuthorizationError
	var inputErr *ask.InputRequiredError
	var urlErr *ask.URLRequiredError
	switch {
	case errors.As(err, &inputErr), errors.As(err, &urlErr):
		// The call ended: it is sent again once the user answered.
		call.IsError = true
		text = "Error: the tool call needs the user's input: " + err.Error()
		r.needInput(index, &call, err)
	case errors.As(err, &authErr):
		call.IsError, call.AwaitsAuthorization = true, true
		text = "Error: the tool call failed: " + err.Error()
		r.needAuthorization(authErr)
	case err != nil:
		call.IsError = true
		// The registry's errors carry no secret value (it redacts them).
		text = "Error: the tool call failed: " + err.Error()
	default:
		call.IsError = res.IsError
		text = resultText(res)
		if res.IsError {
			text = "Error: " + text
		}
		r.addContext(call.Tool, res)
	}
	if timedOut {
		text = withNote(text)
	}
	call.ResultExcerpt = Truncate(text, r.agent.cfg.ExcerptSize)
	return Truncate(text, r.agent.cfg.ResultLimit), call
}

// addContext keeps a result's structured content and resource links.
func (r *run) addContext(tool string, res *mcp.CallToolResult) {
	c := Context{Tool: tool}
	if m, ok := structured(res).(map[string]any); ok {
		c.StructuredContent = m
	}
	for _, content := range res.Content {
		if link, ok := content.(mcp.ResourceLink); ok {
			c.ResourceLinks = append(c.ResourceLinks, link)
		}
	}
	if c.StructuredContent != nil || len(c.ResourceLinks) > 0 {
		// Tool calls of one step run concurrently.
		r.mu.Lock()
		r.res.Contexts = append(r.res.Contexts, c)
		r.mu.Unlock()
	}
}

func structured(res *mcp.CallToolResult) any {
	if len(res.RawStructuredContent) > 0 {
		var v any
		if json.Unmarshal(res.RawStructuredContent, &v) == nil {
			return v
		}
	}
	return res.StructuredContent
}

// resultText renders a tool result for the model.
func resultText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		switch c := c.(type) {
		case mcp.TextContent:
			parts = append(parts, c.Text)
		case mcp.ImageContent:
			parts = append(parts, fmt.Sprintf("[image, %s]", c.MIMEType))
		case mcp.AudioContent:
			parts = append(parts, fmt.Sprintf("[audio, %s]", c.MIMEType))
		case mcp.ResourceLink:
			parts = append(parts, fmt.Sprintf("[resource %q at %s]", c.Name, c.URI))
		case mcp.EmbeddedResource:
			if t, ok := c.Resource.(mcp.TextResourceContents); ok {
				parts = append(parts, t.Text)
			} else {
				parts = append(parts, "[embedded binary resource]")
			}
		}
	}
	if len(parts) == 0 {
		if s := structured(res); s != nil {
			b, _ := json.Marshal(s)
			return string(b)
		}
	}
	return strings.Join(parts, "\n")
}

// Truncate cuts s to about limit bytes, at a character boundary, with a
// visible marker saying how much was kept.
func Truncate(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("\n…[truncated: showing %d of %d characters]", cut, len(s))
}

func cloneStep(s Step) Step {
	s.Calls = append([]Call(nil), s.Calls...)
	return s
}
