package cluster

import (
	"fmt"
	"testing"
)

// TestOwnerSpreadsAndMovesLittle checks rendezvous hashing: the same owner
// whatever the order of members, an even spread, and a join that moves
// about 1/M of the keys, all of them to the newcomer.
func TestOwnerSpreadsAndMovesLittle(t *testing.T) {
	const n = 10000
	three := []string{"replica-a", "replica-b", "replica-c"}
	four := append([]string{"replica-d"}, three...)
	if got := Owner("k", nil); got != "" {
		t.Errorf("Owner with no members = %q, want empty", got)
	}
	count := map[string]int{}
	moved := 0
	for i := range n {
		key := fmt.Sprint(i)
		before := Owner(key, three)
		if again := Owner(key, []string{"replica-c", "replica-a", "replica-b"}); again != before {
			t.Fatalf("Owner(%s) depends on the order of members: %s vs %s", key, before, again)
		}
		count[before]++
		after := Owner(key, four)
		if after != before {
			moved++
			if after != "replica-d" {
				t.Fatalf("key %s moved from %s to %s, not to the newcomer", key, before, after)
			}
		}
	}
	for _, m := range three {
		if share := float64(count[m]) / n; share < 0.30 || share > 0.37 {
			t.Errorf("%s owns %.1f%% of the keys among 3, want about a third", m, 100*share)
		}
	}
	if share := float64(moved) / n; share < 0.22 || share > 0.28 {
		t.Errorf("a fourth member took %.1f%% of the keys, want about a quarter", 100*share)
	}
}

func TestNewIDIsNewEachTime(t *testing.T) {
	if a, b := NewID("host"), NewID("host"); a == b || len(a) != len("host-")+8 {
		t.Errorf("NewID twice = %q, %q; want two distinct host-XXXXXXXX", a, b)
	}
}
