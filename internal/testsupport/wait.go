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
	if !Poll(d, cond) {
		t.Fatalf("timed out after %v waiting for %s", d, what)
	}
	return time.Since(start)
}

// Poll calls cond every 5 ms until it holds, and reports whether it did
// within d: for a test that says more than WaitFor can when it does not.
// cond is called at least once, and once more after d has passed.
func Poll(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}
