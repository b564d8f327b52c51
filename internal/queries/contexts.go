package queries

import (
	"encoding/json"
	"fmt"

	"github.com/connector-svc/connector-svc/internal/orchestrator"
)

// contextExcerptBytes is the size of the JSON excerpt a cut context keeps.
const contextExcerptBytes = 8 << 10

// FitContexts renders a run's contexts, in order, within budget bytes of
// a response: render converts a context as the front door sends it, and
// size measures what it rendered. A context that does not fit what is
// left is cut: rendered as a Context of the same tool whose structured
// content is a "truncated" note (its sizes, and the bytes left) and an
// "excerpt" of its JSON, without its resource links. What the contexts
// take is at most budget, the cut ones' notes aside.
func FitContexts[T any](contexts []orchestrator.Context, budget int, render func(orchestrator.Context) T, size func(T) int) []T {
	var out []T
	left := budget
	for _, qc := range contexts {
		// The JSON size is looked at first, so a huge context is cut
		// without being rendered.
		var js []byte
		if qc.StructuredContent != nil {
			js, _ = json.Marshal(qc.StructuredContent)
		}
		var r T
		fits := false
		if len(js) <= left {
			r = render(qc)
			fits = size(r) <= left
		}
		if !fits {
			r = render(cutContext(qc, js, left))
		}
		left -= size(r)
		out = append(out, r)
	}
	return out
}

// cutContext is the visible stand-in of a context over the left bytes,
// whose structured content is js.
func cutContext(qc orchestrator.Context, js []byte, left int) orchestrator.Context {
	note := fmt.Sprintf("this context (%d bytes of structured content as JSON, %d resource links) is over the %d bytes "+
		"left for contexts in this response (MAX_TOOL_RESULT_BYTES); its resource links are left out",
		len(js), len(qc.ResourceLinks), max(left, 0))
	content := map[string]any{"truncated": note}
	if qc.StructuredContent != nil {
		content["excerpt"] = orchestrator.Truncate(string(js), min(contextExcerptBytes, max(left, 0)))
	}
	return orchestrator.Context{Tool: qc.Tool, StructuredContent: content}
}
