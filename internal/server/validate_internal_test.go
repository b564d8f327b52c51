package server

import (
	"regexp"
	"testing"
)

// FuzzValidID checks validID against the pattern it stands for.
func FuzzValidID(f *testing.F) {
	pattern := regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	for _, s := range []string{"", "a", "ws", "Z9", "a.b_c-d", ".a", "-a", "_a", "a b", "a/b", "é", "a\n", "a..", "0-"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := validID(s), pattern.MatchString(s); got != want {
			t.Errorf("validID(%q) = %v, want %v", s, got, want)
		}
	})
}
