package benchgoal

import "testing"

func TestMet(t *testing.T) {
	for _, c := range []struct {
		v, target float64
		dir       Direction
		want      bool
	}{
		{49, 50, AtMost, true}, {50, 50, AtMost, true}, {51, 50, AtMost, false},
		{0.79, 0.8, AtLeast, false}, {0.8, 0.8, AtLeast, true}, {1.2, 0.8, AtLeast, true},
	} {
		if got := Met(c.v, c.dir, c.target); got != c.want {
			t.Errorf("Met(%v, %v, %v) = %v, want %v", c.v, c.dir, c.target, got, c.want)
		}
	}
}
