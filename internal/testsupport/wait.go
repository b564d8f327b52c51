// Package testsupport is what the tests of several packages share:
// waiting for a condition with a deadline instead of sleeping. It is
// imported by tests only.
package testsupport

import (
	"testing"
	"time"
)

// Within is how long WaitFor waits: generous, so that a busy machine does
// not fail a test that would pass, while a hang still ends as a failure.
const Within = 20 * time.Second

// WaitFor polls cond every 5 ms until it holds, and fails t after Within,
// naming what it waited for. It returns how long it waited.
func WaitFor(t testing.TB, what string, cond func() bool) time.Duration {
	t.Helper()
	return WaitWithin(t, Within, what, cond)
}

// WaitWithin is WaitFor with a deadline of d.
func WaitWithin(t testing.TB, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}
