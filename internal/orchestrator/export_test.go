package orchestrator

import (
	"context"
	"encoding/json"

	openai "github.com/sashabaranov/go-openai"
)

// ParsePlan is parsePlan: the plan in a model's plan_only answer.
var ParsePlan = parsePlan

// CheckCall checks one tool call of the model as a run does: tools are the
// enabled tools, used of maxTools calls are spent. It returns the
// arguments to run the tool with, or why it must not run.
func CheckCall(tools []Tool, maxTools, used int, name, arguments string) (map[string]any, string) {
	c := NewConnector(Profile{}, tools)
	r := &run{req: Request{Connector: c, MaxTools: maxTools}, conn: c, used: used, res: &Result{}}
	return r.check(openai.ToolCall{Function: openai.FunctionCall{Name: name, Arguments: arguments}})
}

// Offered returns the tools a run of req by a offers the model before any
// search_tools call: all of the connector's, unless narrowed.
func Offered(a *Agent, req Request) []string {
	r := &run{agent: a, req: req, conn: req.Connector, res: &Result{}}
	r.selectTools(context.Background())
	return r.res.ToolsOffered
}

// Search returns the tools one search_tools call for phrase makes
// available in a run of req by a, after what Offered offers.
func Search(a *Agent, req Request, phrase string) []string {
	r := &run{agent: a, req: req, conn: req.Connector, res: &Result{}}
	r.selectTools(context.Background())
	before := len(r.res.ToolsOffered)
	args, _ := json.Marshal(map[string]string{"query": phrase})
	r.search(context.Background(), string(args))
	return r.res.ToolsOffered[before:]
}
