package orchestrator

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	openai "github.com/sashabaranov/go-openai"
)

// Narrowing. A connector with more enabled tools than its threshold does
// not offer them all: a query is offered the best-ranked for its text and
// context (index), and a search_tools meta-tool that finds the others.
// What search_tools finds is offered from the next model turn on, with the
// usual checks; a call to a tool that is not offered is refused like a
// call to an unknown one, so the model can search and try again.

// searchParameters is the meta-tool's input schema.
var searchParameters = json.RawMessage(`{"type":"object","properties":{"query":{"type":"string",` +
	`"description":"What the tool you need does, in a few words"}},"required":["query"]}`)

// selectTools decides what the run offers: every tool, or a selection.
func (r *run) selectTools(ctx context.Context) {
	c := r.conn
	r.res.ToolsTotal = len(c.order)
	if len(c.order) <= cmp.Or(c.NarrowAbove, r.agent.cfg.NarrowAbove) {
		r.head, r.defs, r.res.ToolsOffered = c.prompt, c.defs, c.order
		return
	}
	order := rank(c.index.scores(r.req.Query + "\n" + r.req.Context))
	r.offered = map[string]bool{}
	r.defs = make([]openai.Tool, 0, r.agent.cfg.NarrowTo+r.agent.cfg.SearchResults+1)
	r.defs = append(r.defs, openai.Tool{Type: openai.ToolTypeFunction, Function: &openai.FunctionDefinition{
		Name: c.search, Parameters: searchParameters,
		Description: fmt.Sprintf("Finds more of this connector's tools by what they do: up to %d names and descriptions, "+
			"callable from your next turn.", r.agent.cfg.SearchResults)}})
	for _, i := range order[:min(r.agent.cfg.NarrowTo, len(order))] {
		r.offer(i)
	}
	r.head = promptHead(c.Profile, c, r.res.ToolsOffered, true)
	r.res.Narrowed = true
	r.agent.counters.narrowed.Add(ctx, 1, connectorAttrs(c))
}

// offer adds the connector's tool i to what the model is offered.
func (r *run) offer(i int) {
	t := r.conn.list[i]
	r.offered[t.Name] = true
	r.defs = append(r.defs, r.conn.defs[i])
	r.res.ToolsOffered = append(r.res.ToolsOffered, t.Name)
}

// isOffered reports whether the model may call the tool now.
func (r *run) isOffered(name string) bool {
	return r.offered == nil || r.offered[name]
}

// isSearch reports whether a call is one of search_tools.
func (r *run) isSearch(name string) bool {
	return r.offered != nil && name == r.conn.search
}

// search runs a search_tools call: the best-ranked tools for its phrase
// that are not offered yet become offered, and the model gets their names
// and descriptions.
func (r *run) search(ctx context.Context, arguments string) string {
	r.agent.counters.searches.Add(ctx, 1, connectorAttrs(r.conn))
	args, err := decodeArguments(arguments)
	phrase, _ := args["query"].(string)
	if err != nil || strings.TrimSpace(phrase) == "" {
		return fmt.Sprintf(`Error: call %s with {"query": "<what the tool does>"}`, r.conn.search)
	}
	scores := r.conn.index.scores(phrase)
	var found []string
	for _, i := range rank(scores) {
		if len(found) == r.agent.cfg.SearchResults || scores[i] == 0 {
			break
		}
		if t := r.conn.list[i]; !r.offered[t.Name] {
			r.offer(i)
			found = append(found, fmt.Sprintf("- %s: %s", t.Name, cmp.Or(strings.TrimSpace(t.Description), "(no description)")))
		}
	}
	if len(found) == 0 {
		return fmt.Sprintf("No other tool matches %q. The tools you were offered are all there is for it.", phrase)
	}
	return "These tools are now available; call them in your next turn:\n" + strings.Join(found, "\n")
}

// notOffered is what a call to a tool that exists but is not offered is
// told.
func (r *run) notOffered(name string) string {
	return fmt.Sprintf("there is no tool %q among the tools offered; call %s to find more tools, then call the one you need",
		name, r.conn.search)
}
