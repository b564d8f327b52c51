package ask

import (
	"context"
	"errors"
	"sync"
	"testing"
)

func TestBudget(t *testing.T) {
	b := NewBudget(2, 100)
	got, err := b.Reserve(80)
	if err != nil || got != 80 {
		t.Fatalf("Reserve(80) = %d, %v", got, err)
	}
	b.Settle(80, 30) // used less than reserved
	if got, err = b.Reserve(500); err != nil || got != 70 {
		t.Fatalf("Reserve(500) after 30 used = %d, %v; want the 70 left", got, err)
	}
	if _, err = b.Reserve(1); !errors.Is(err, ErrBudget) || err.Error() != "sampling budget exhausted: 2 sampling requests per run" {
		t.Fatalf("third request: %v", err)
	}
	if r, tok := b.Used(); r != 2 || tok != 100 {
		t.Fatalf("Used = %d requests, %d tokens", r, tok)
	}

	tokens := NewBudget(10, 50)
	tokens.Reserve(50)
	if _, err := tokens.Reserve(1); !errors.Is(err, ErrBudget) || err.Error() != "sampling budget exhausted: 50 sampling tokens per run" {
		t.Fatalf("over tokens: %v", err)
	}
}

func TestBudgetConcurrent(t *testing.T) {
	b := NewBudget(5, 1000)
	var wg sync.WaitGroup
	var mu sync.Mutex
	served := 0
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := b.Reserve(10); err == nil {
				mu.Lock()
				served++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if served != 5 {
		t.Fatalf("%d of 32 concurrent requests served, want 5", served)
	}
}

type nobody struct{}

func (nobody) Elicit(context.Context, Call, Input) (Answer, error) { return Answer{}, ErrNobodyToAsk }
func (nobody) Sampling() *Budget                                   { return nil }
func (nobody) Sampled(Call, SamplingRecord)                        {}

func TestWithFrom(t *testing.T) {
	if _, _, ok := From(context.Background()); ok {
		t.Fatal("an empty context carries an Asker")
	}
	ctx := With(context.Background(), nobody{}, Call{ID: "call_1", Tool: "echo"})
	a, call, ok := From(ctx)
	if !ok || a == nil || call != (Call{ID: "call_1", Tool: "echo"}) {
		t.Fatalf("From = %v, %+v, %t", a, call, ok)
	}
}
