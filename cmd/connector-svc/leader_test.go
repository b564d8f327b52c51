package main

import (
	"context"
	"testing"
	"time"
)

// leaderWork runs a term's jobs handed over by the elector's hook; the
// hook returns once they have, whether the term ends or the service
// stops; a term handed over after Run returned ends the hook with it.
func TestLeaderWorkRunsEachTerm(t *testing.T) {
	started := make(chan struct{}, 2)
	w := newLeaderWork(func(ctx context.Context) {
		started <- struct{}{}
		<-ctx.Done()
	})
	svc, stopService := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- w.Run(svc) }()

	// A term that ends: the hook returns once its jobs have.
	term, endTerm := context.WithCancel(context.Background())
	hooked := make(chan struct{})
	go func() { w.onLead(term); close(hooked) }()
	<-started
	endTerm()
	waitClosed(t, hooked, "the hook after its term ended")

	// The service stops during a term: its jobs stop, the hook returns.
	term2, endTerm2 := context.WithCancel(context.Background())
	defer endTerm2()
	hooked2 := make(chan struct{})
	go func() { w.onLead(term2); close(hooked2) }()
	<-started
	stopService()
	waitClosed(t, hooked2, "the hook after the service stopped")
	if err := <-ran; err != nil {
		t.Errorf("Run = %v; want nil", err)
	}

	// Run has returned: a new term's hook returns when the term ends.
	term3, endTerm3 := context.WithCancel(context.Background())
	hooked3 := make(chan struct{})
	go func() { w.onLead(term3); close(hooked3) }()
	endTerm3()
	waitClosed(t, hooked3, "the hook of a term after Run returned")
}

func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: did not return", what)
	}
}
