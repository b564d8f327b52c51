package connectors

import (
	"regexp"
	"strings"
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

// Scopes are RFC 6749 scope-tokens: 1*( %x21 / %x23-5B / %x5D-7E ).
func FuzzValidScope(f *testing.F) {
	pattern := regexp.MustCompile(`^[\x21\x23-\x5b\x5d-\x7e]{1,256}$`)
	for _, s := range []string{"", "read", "files:read", "https://x.test/y", "a b", `a"b`, `a\b`, "é", "a\x00", "[]~!#", strings.Repeat("s", 257)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := validScope(s), pattern.MatchString(s); got != want {
			t.Errorf("validScope(%q) = %v, want %v", s, got, want)
		}
	})
}
