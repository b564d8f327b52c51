// Package benchgoal lets a benchmark state the goal it measures: the value
// is reported as a benchmark metric and as one "GOAL" line that `make
// bench` gathers into a table, so a run says which goals it met.
package benchgoal

import (
	"fmt"
	"testing"
)

// Direction says which side of the target meets the goal.
type Direction int

// Directions.
const (
	AtMost  Direction = iota + 1 // value <= target
	AtLeast                      // value >= target
)

// Met reports whether value meets the goal.
func Met(value float64, dir Direction, target float64) bool {
	if dir == AtMost {
		return value <= target
	}
	return value >= target
}

// Report records value (in unit) as a metric of b and logs the goal line
//
//	GOAL <name>: <value> <unit> (goal <= <target>) met
//
// name is short and stable (it is the table's key), e.g.
// "calltool-service-work-p50". The benchmark's other metrics stay as they
// are; this adds the verdict.
func Report(b testing.TB, name string, value float64, unit string, dir Direction, target float64) {
	b.Helper()
	if bb, ok := b.(*testing.B); ok {
		bb.ReportMetric(value, unit)
	}
	op := "<="
	if dir == AtLeast {
		op = ">="
	}
	verdict := "NOT MET"
	if Met(value, dir, target) {
		verdict = "met"
	}
	b.Logf("%s", fmt.Sprintf("GOAL %s: %.3g %s (goal %s %g) %s", name, value, unit, op, target, verdict))
}
