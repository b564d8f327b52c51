package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	openai "github.com/sashabaranov/go-openai"
)

// ErrBadPlan means the model did not return a plan in the asked format.
var ErrBadPlan = errors.New("the model did not return a plan as JSON")

// plan asks which tools the query needs, in order, and runs nothing.
func (r *run) plan(ctx context.Context) (*Result, error) {
	msgs := []openai.ChatCompletionMessage{
		{Role: openai.ChatMessageRoleSystem, Content: systemPrompt(r.head, r.conn, r.req.MaxTools) + "\n\n" + planInstructions},
		{Role: openai.ChatMessageRoleUser, Content: userMessage(r.req)},
	}
	msg, err := r.chat(ctx, msgs, false)
	if err != nil {
		return nil, err
	}
	plan, err := parsePlan(msg.Content)
	if err != nil {
		return nil, err
	}
	for _, p := range plan {
		if _, ok := r.conn.tools[p.Tool]; !ok {
			r.agent.logger.WarnContext(ctx, "plan names an unknown tool; dropped", slog.String("tool", p.Tool))
			continue
		}
		r.res.Plan = append(r.res.Plan, p)
	}
	return r.finish(ctx, "", StatusPlanned), nil
}

// maxPlanCandidates bounds how many '{' of a reply parsePlan tries.
const maxPlanCandidates = 16

// parsePlan reads the plan out of a plan_only reply: the first JSON object
// with a "plan" list, wherever it starts (prose or a code fence around it
// may hold braces of their own) and whatever follows it.
func parsePlan(content string) ([]PlannedTool, error) {
	lastErr := errors.New("no JSON object in the reply")
	rest, tries := content, 0
	for tries < maxPlanCandidates {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			break
		}
		rest, tries = rest[i:], tries+1
		var out struct {
			Plan *[]planEntry `json:"plan"`
		}
		err := json.NewDecoder(strings.NewReader(rest)).Decode(&out)
		if err == nil && out.Plan != nil {
			return plannedTools(*out.Plan), nil
		}
		if err == nil {
			err = errors.New(`a JSON object without a "plan" list`)
		}
		lastErr, rest = err, rest[1:]
	}
	if plan, ok := bareArrayPlan(content); ok {
		return plan, nil
	}
	return nil, fmt.Errorf("%w: %v", ErrBadPlan, lastErr)
}

// planEntry is a step of a plan as the model writes it.
type planEntry struct {
	Tool    string `json:"tool"`
	Purpose string `json:"purpose"`
}

func plannedTools(entries []planEntry) []PlannedTool {
	plan := make([]PlannedTool, 0, len(entries))
	for _, e := range entries {
		plan = append(plan, PlannedTool{Tool: e.Tool, Purpose: e.Purpose})
	}
	return plan
}

// bareArrayPlan reads a plan a model gave as a bare JSON array of steps,
// without the object around it: the first array whose every entry names a
// tool, or a reply that is just "[]".
func bareArrayPlan(content string) ([]PlannedTool, bool) {
	if strings.TrimSpace(content) == "[]" {
		return []PlannedTool{}, true
	}
	rest := content
	for tries := 0; tries < maxPlanCandidates; tries++ {
		i := strings.IndexByte(rest, '[')
		if i < 0 {
			break
		}
		rest = rest[i:]
		var steps []planEntry
		if json.NewDecoder(strings.NewReader(rest)).Decode(&steps) == nil && len(steps) > 0 &&
			!slices.ContainsFunc(steps, func(e planEntry) bool { return e.Tool == "" }) {
			return plannedTools(steps), true
		}
		rest = rest[1:]
	}
	return nil, false
}
