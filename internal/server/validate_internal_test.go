package server

import (
	"strings"
	"testing"
)

// A user id is counted in characters, not bytes, and must be valid UTF-8
// without control characters.
func TestUserIDForm(t *testing.T) {
	for _, tt := range []struct {
		id, problem string
	}{
		{strings.Repeat("é", 200), ""},
		{strings.Repeat("é", 256), ""},
		{"alice@example.com", ""},
		{strings.Repeat("é", 257), "longer than 256 characters"},
		{"al\xffice", "not valid UTF-8"},
		{"alice\x00", "contains a control character"},
		{"alice\u0085", "contains a control character"},
		{"alice\x7f", "contains a control character"},
	} {
		var c checker
		c.userIDForm(tt.id)
		got := ""
		if len(c.violations) > 0 {
			got = c.violations[0].problem
		}
		if got != tt.problem {
			t.Errorf("userIDForm(%q): %q, want %q", tt.id, got, tt.problem)
		}
	}
}
