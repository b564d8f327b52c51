package testsupport

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestWaitForReturnsOnceTheConditionHolds(t *testing.T) {
	var n atomic.Int32
	WaitFor(t, "three polls", func() bool { return n.Add(1) == 3 })
	if got := n.Load(); got != 3 {
		t.Errorf("polled %d times, want 3", got)
	}
}

// fatalRecorder records Fatalf instead of ending the test.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Helper() {}
func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = format
	panic(r)
}

func TestWaitWithinFailsAfterItsDeadline(t *testing.T) {
	r := &fatalRecorder{TB: t}
	func() {
		defer func() {
			if p := recover(); p != nil && p != r {
				panic(p)
			}
		}()
		WaitWithin(r, 20*time.Millisecond, "never", func() bool { return false })
	}()
	if r.msg == "" {
		t.Fatal("WaitWithin did not fail after its deadline")
	}
}

func TestPollReportsWhetherTheConditionHeld(t *testing.T) {
	var n atomic.Int32
	if !Poll(time.Minute, func() bool { return n.Add(1) == 3 }) || n.Load() != 3 {
		t.Errorf("Poll of a condition that holds at the third call: polled %d times", n.Load())
	}
	start := time.Now()
	if Poll(20*time.Millisecond, func() bool { return false }) {
		t.Error("Poll of a condition that never holds reported true")
	}
	if d := time.Since(start); d < 20*time.Millisecond {
		t.Errorf("Poll gave up after %v, before its deadline", d)
	}
}
