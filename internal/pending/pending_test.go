package pending

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/ask"
)

func TestAnswerReachesWait(t *testing.T) {
	var tb Table
	r := tb.Open("run:1", ask.Input{ID: "in_a", Mode: ask.ModeForm})
	if in, ok := tb.Lookup("run:1", "in_a"); !ok || in.Mode != ask.ModeForm {
		t.Fatalf("Lookup = %+v, %v", in, ok)
	}
	if _, ok := tb.Lookup("run:2", "in_a"); ok {
		t.Error("another owner looked up run:1's request")
	}
	go func() {
		if err := tb.Answer("run:1", map[string]ask.Answer{"in_a": {Action: ask.Accept}}); err != nil {
			t.Error(err)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, ok := r.Wait(ctx)
	if !ok || a.Action != ask.Accept {
		t.Fatalf("Wait = %+v, %v; want accept", a, ok)
	}
	if err := tb.Answer("run:1", map[string]ask.Answer{"in_a": {Action: ask.Decline}}); !errors.Is(err, ErrNotOpen) {
		t.Errorf("a second answer = %v, want ErrNotOpen", err)
	}
}

// An answer names requests of its owner only, and is delivered all or
// none.
func TestAnswerAllOrNone(t *testing.T) {
	var tb Table
	a := tb.Open("run:1", ask.Input{ID: "in_a"})
	tb.Open("run:2", ask.Input{ID: "in_b"})
	err := tb.Answer("run:1", map[string]ask.Answer{"in_a": {Action: ask.Accept}, "in_b": {Action: ask.Accept}})
	if !errors.Is(err, ErrNotOpen) {
		t.Fatalf("answering another owner's request = %v, want ErrNotOpen", err)
	}
	if _, ok := tb.Lookup("run:1", "in_a"); !ok {
		t.Fatal("a refused answer closed in_a")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if got, ok := a.Wait(ctx); ok {
		t.Errorf("in_a was answered %+v by a refused answer", got)
	}
	if _, ok := tb.Lookup("run:1", "in_a"); ok {
		t.Error("a request whose wait ended is still open")
	}
}

// A deadline and an answer that race: the answer either counts or is
// refused, never lost.
func TestDeadlineRacesAnswer(t *testing.T) {
	var tb Table
	for i := range 200 {
		r := tb.Open("o", ask.Input{ID: "in"})
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%5)*time.Microsecond)
		var wg sync.WaitGroup
		var answerErr error
		wg.Go(func() { answerErr = tb.Answer("o", map[string]ask.Answer{"in": {Action: ask.Accept}}) })
		a, ok := r.Wait(ctx)
		wg.Wait()
		cancel()
		if ok != (answerErr == nil) {
			t.Fatalf("round %d: answered = %v (%+v) but Answer = %v", i, ok, a, answerErr)
		}
		if ok && a.Action != ask.Accept {
			t.Fatalf("round %d: answer %+v", i, a)
		}
	}
}
