package orchestrator_test

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"

	"github.com/connector-svc/connector-svc/internal/orchestrator"
)

// FuzzParsePlan feeds plan_only answers to the plan parser: it must never
// panic, must read back any plan it was given as JSON, and must find that
// plan inside prose or a code fence, braces in the prose included, as
// models write them.
func FuzzParsePlan(f *testing.F) {
	for _, s := range [][4]string{
		{"", "echo", "say hello", ""},
		{"```json\n", "get_orders", "list the orders", "\n```"},
		{"Here is the plan:\n", "lookup_user", "find Ada's id", "\nThen I will answer."},
		{"I'd call {lookup_user} first. ", "lookup_user", "find {the} id", ""},
		{"", "echo", "say hi", " Let me know if you need more {details}."},
		{"", "echo", "say hi", "}"},
		{"Plan: ", "a\"b", "}{", ""},
		{"{", "x", "y", ""},
		{"", "", "", ""},
		{"Sure! ", "search", "ünïcödé 🚀", " 😀"},
	} {
		f.Add(s[0], s[1], s[2], s[3])
	}
	f.Fuzz(func(t *testing.T, prefix, tool, purpose, suffix string) {
		want := []orchestrator.PlannedTool{{Tool: tool, Purpose: purpose}, {Tool: "echo", Purpose: "then this"}}
		raw, err := json.Marshal(map[string]any{"plan": []map[string]string{
			{"tool": tool, "purpose": purpose}, {"tool": "echo", "purpose": "then this"}}})
		if err != nil {
			t.Fatal(err)
		}
		// Any input at all: no panic.
		_, _ = orchestrator.ParsePlan(prefix + tool + purpose + suffix)
		if !utf8.ValidString(tool) || !utf8.ValidString(purpose) {
			return // json.Marshal replaced the invalid bytes
		}

		got, err := orchestrator.ParsePlan(string(raw))
		if err != nil || !cmp.Equal(got, want) {
			t.Fatalf("ParsePlan(%s) = %v, %v; want %v", raw, got, err, want)
		}
		// Prose around the plan, unless the prose holds a plan of its own
		// or more braces than a reply plausibly has.
		if strings.Contains(prefix+suffix, "plan") || strings.Count(prefix, "{") > 4 {
			return
		}
		content := prefix + string(raw) + suffix
		got, err = orchestrator.ParsePlan(content)
		if err != nil || !cmp.Equal(got, want) {
			t.Errorf("ParsePlan(%q) = %v, %v; want %v", content, got, err, want)
		}
	})
}
