package orchestrator

import openai "github.com/sashabaranov/go-openai"

// ParsePlan is parsePlan: the plan in a model's plan_only answer.
var ParsePlan = parsePlan

// CheckCall checks one tool call of the model as a run does: tools are the
// enabled tools, used of maxTools calls are spent. It returns the
// arguments to run the tool with, or why it must not run.
func CheckCall(tools []Tool, maxTools, used int, name, arguments string) (map[string]any, string) {
	c := NewConnector(Profile{}, tools)
	r := &run{req: Request{Connector: c, MaxTools: maxTools}, conn: c, used: used}
	return r.check(openai.ToolCall{Function: openai.FunctionCall{Name: name, Arguments: arguments}})
}
