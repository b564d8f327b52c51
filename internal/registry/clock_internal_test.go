package registry

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestCallClockStopsWhilePaused(t *testing.T) {
	ctx, cancel := withCallClock(context.Background(), 200*time.Millisecond)
	defer cancel()
	resume, _ := pauseCall(ctx)
	time.Sleep(400 * time.Millisecond)
	if err := ctx.Err(); err != nil {
		t.Fatalf("a paused clock ended: %v", err)
	}
	resume()
	resume() // once only
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the clock did not end after it resumed")
	}
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) || !EndedByDeadline(ctx) {
		t.Errorf("Err = %v, want deadline exceeded", ctx.Err())
	}
	// A context made under it sees the same.
	child, stop := context.WithCancel(ctx)
	defer stop()
	<-child.Done()
	if !errors.Is(child.Err(), context.DeadlineExceeded) {
		t.Errorf("child Err = %v, want deadline exceeded", child.Err())
	}
}

func TestCallClockEndsWithItsParent(t *testing.T) {
	parent, cancelParent := context.WithTimeout(context.Background(), time.Hour)
	ctx, cancel := withCallClock(parent, time.Hour)
	defer cancel()
	resume, callerDeadline := pauseCall(ctx)
	defer resume()
	if d, _ := parent.Deadline(); !callerDeadline.Equal(d) {
		t.Errorf("caller's deadline = %v, want the parent's %v", callerDeadline, d)
	}
	cancelParent()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the clock outlived its parent")
	}
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Errorf("Err = %v, want canceled", ctx.Err())
	}
	if d, ok := ctx.Deadline(); !ok || d.After(time.Now().Add(time.Hour)) {
		t.Errorf("Deadline = %v, %v", d, ok)
	}
}
