package cluster

import (
	"slices"
	"testing"
)

func TestDifferingSettings(t *testing.T) {
	mine := map[string]string{"SECRET_KEY": "k1", "LLM_MODEL": "a", "AUTH": "x"}
	for _, tt := range []struct {
		theirs map[string]string
		want   []string
	}{
		{map[string]string{"SECRET_KEY": "k1", "LLM_MODEL": "a", "AUTH": "x"}, nil},
		{map[string]string{"SECRET_KEY": "k1", "LLM_MODEL": "b", "AUTH": "x"}, []string{"LLM_MODEL"}},
		{map[string]string{"SECRET_KEY": "k1", "LLM_MODEL": "a", "NEW": "n"}, []string{"AUTH", "NEW"}},
		{map[string]string{"SECRET_KEY": "k2", "LLM_MODEL": "b", "AUTH": "y"}, []string{"SECRET_KEY"}},
	} {
		if got := DifferingSettings(mine, tt.theirs, "SECRET_KEY"); !slices.Equal(got, tt.want) {
			t.Errorf("DifferingSettings(%v) = %v, want %v", tt.theirs, got, tt.want)
		}
	}
}
