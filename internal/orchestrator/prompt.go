package orchestrator

import (
	"fmt"
	"strings"
)

// promptHead tells the model what connector it serves and the tools it is
// offered (names): the part of the system prompt that does not depend on
// the budget. narrowed says names are a selection, and search_tools finds
// the others.
func promptHead(p Profile, c *Connector, names []string, narrowed bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "You are the agent of the %q connector.", p.Name)
	if d := strings.TrimSpace(p.Description); d != "" {
		fmt.Fprintf(&b, " %s", d)
	}
	if len(c.order) == 0 {
		b.WriteString("\nThis connector has no enabled tools now: answer from the query and its context alone, and say that no tool could be used.\n")
		return b.String()
	}
	if narrowed {
		fmt.Fprintf(&b, "\nYou answer one query with this connector's tools. It has %d; these %d fit the query best:\n", len(c.order), len(names))
	} else {
		b.WriteString("\nYou answer one query with this connector's tools:\n")
	}
	for _, name := range names {
		t := c.tools[name]
		desc := strings.TrimSpace(t.Description)
		if desc == "" {
			desc = "(no description)"
		}
		fmt.Fprintf(&b, "- %s: %s\n", t.Name, desc)
	}
	if narrowed {
		fmt.Fprintf(&b, "If none of them fits, call %s with a short phrase of what you need: it lists more tools, and you can call them from your next turn.\n", c.search)
	}
	return b.String()
}

// systemPrompt is a prompt head and the rules of a run of at most maxTools
// tool calls.
func systemPrompt(head string, c *Connector, maxTools int) string {
	if len(c.order) == 0 {
		return head
	}
	return head + fmt.Sprintf(`
Rules:
- Use only the tools you are offered.
- Call tools that do not depend on each other together, in the same turn.
- When a call needs another call's result, make it in a later turn.
- You may make at most %d tool calls for this query.
- Stop calling tools as soon as you can answer the query.
- Answer from the tool results, and say which tool each fact came from.`, maxTools)
}

// userMessage is the caller's context, then the query.
func userMessage(req Request) string {
	if c := strings.TrimSpace(req.Context); c != "" {
		return "Context:\n" + c + "\n\nQuery:\n" + req.Query
	}
	return req.Query
}

const planInstructions = `Do not call any tool now. Reply with only a JSON object of the form
{"plan": [{"tool": "<tool name>", "purpose": "<one line on why>"}]}
listing the tools needed to answer the query, in the order they should run. Use an empty list if no tool is needed.`
