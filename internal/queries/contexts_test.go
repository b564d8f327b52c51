package queries_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/queries"
)

// Contexts that fit are rendered whole, in order; one that does not is
// cut to a note and an excerpt, without its resource links, and the ones
// after it get what is left.
func TestFitContexts(t *testing.T) {
	render := func(c orchestrator.Context) orchestrator.Context { return c }
	size := func(c orchestrator.Context) int { b, _ := json.Marshal(c); return len(b) }
	small := orchestrator.Context{Tool: "a", StructuredContent: map[string]any{"n": 1}}
	big := orchestrator.Context{Tool: "b", StructuredContent: map[string]any{"data": strings.Repeat("y", 20_000)},
		ResourceLinks: []mcp.ResourceLink{mcp.NewResourceLink("file:///x", "x", "", "")}}
	budget := size(small) + 10_000
	out := queries.FitContexts([]orchestrator.Context{small, big, small}, budget, render, size)
	if len(out) != 3 || out[0].Tool != "a" || out[0].StructuredContent["n"] != 1 || out[2].StructuredContent["n"] != 1 {
		t.Fatalf("contexts = %+v; want the small ones whole", out)
	}
	cut := out[1]
	note, _ := cut.StructuredContent["truncated"].(string)
	excerpt, _ := cut.StructuredContent["excerpt"].(string)
	const want = "this context (20011 bytes of structured content as JSON, 1 resource links) is over the 10000 bytes"
	if cut.Tool != "b" || cut.ResourceLinks != nil || !strings.Contains(note, want) ||
		!strings.HasPrefix(excerpt, `{"data":"yyy`) || len(excerpt) > 8<<10+100 {
		t.Fatalf("the big context = %+v; want it cut", cut)
	}
	if got := queries.FitContexts([]orchestrator.Context{small}, 0, render, size); got[0].StructuredContent["truncated"] == nil {
		t.Errorf("no budget: %+v; want the context cut", got)
	}
}
