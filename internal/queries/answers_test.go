package queries_test

import (
	"reflect"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/queries"
	"github.com/connector-svc/connector-svc/internal/registry/elicit"
)

// TestCheckAnswerFillsFormDefaults: an accept that leaves out fields whose
// schema gives a default sends those defaults (SEP-1034), also for a
// required field, and never overrides what the user gave; the input says
// which fields have defaults.
func TestCheckAnswerFillsFormDefaults(t *testing.T) {
	// The conformance suite's elicitation-sep1034-client-defaults form,
	// plus a field without a default.
	field := func(typ string, def any) map[string]any {
		if def == nil {
			return map[string]any{"type": typ}
		}
		return map[string]any{"type": typ, "default": def}
	}
	status := field("string", "active")
	status["enum"] = []any{"active", "inactive"}
	props := map[string]any{"name": field("string", "John Doe"), "age": field("integer", float64(30)),
		"score": field("number", 95.5), "status": status, "verified": field("boolean", true),
		"note": field("string", nil)}
	schema := map[string]any{"type": "object", "properties": props, "required": []any{"name"}}
	in, err := elicit.InputOf(mcp.ElicitationParams{Message: "Who?", RequestedSchema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"age", "name", "score", "status", "verified"}; !reflect.DeepEqual(in.Defaulted, want) {
		t.Errorf("Defaulted = %v, want %v", in.Defaulted, want)
	}
	for _, tc := range []struct {
		name    string
		content map[string]any
		want    map[string]any
	}{
		{"nothing given", nil, map[string]any{"name": "John Doe", "age": float64(30), "score": 95.5,
			"status": "active", "verified": true}},
		{"some given", map[string]any{"name": "Ann", "verified": false, "note": "hi"},
			map[string]any{"name": "Ann", "age": float64(30), "score": 95.5, "status": "active",
				"verified": false, "note": "hi"}},
	} {
		given := map[string]any(nil)
		if tc.content != nil {
			given = map[string]any{}
			for k, v := range tc.content {
				given[k] = v
			}
		}
		ans, bad := queries.CheckAnswer("inputs[0]", in, queries.Answer{Action: ask.Accept, Content: tc.content})
		if len(bad) > 0 {
			t.Errorf("%s: violations %v", tc.name, bad)
			continue
		}
		if !reflect.DeepEqual(ans.Content, tc.want) {
			t.Errorf("%s: content sent = %v, want %v", tc.name, ans.Content, tc.want)
		}
		if !reflect.DeepEqual(tc.content, given) {
			t.Errorf("%s: the answer's own content was changed: %v", tc.name, tc.content)
		}
	}
	// A decline carries no content, defaults or not.
	if ans, _ := queries.CheckAnswer("inputs[0]", in, queries.Answer{Action: ask.Decline}); ans.Content != nil {
		t.Errorf("decline carries %v", ans.Content)
	}
}
