package store_test

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

// TestRateBucket: a shared bucket starts full, refuses when empty, refills
// at its rate up to its burst, goes into debt only when owed, never
// refills backwards for a clock behind, and goes with its connector.
func TestRateBucket(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewDB(t)
	c := mustCreate(t, db, newConnector("ws", "a"))
	t0 := time.Now()
	take := func(at time.Time) bool {
		t.Helper()
		ok, _, err := db.TakeRateToken(ctx, c.ID, 2, 3, at)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	level := func(at time.Time) float64 {
		t.Helper()
		n, err := db.RateTokens(ctx, c.ID, 2, 3, at)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := level(t0); n != 3 {
		t.Errorf("an unused bucket has %v tokens, want 3 (full)", n)
	}
	for i := range 3 {
		if !take(t0) {
			t.Fatalf("take %d of a full bucket of 3 refused", i+1)
		}
	}
	if take(t0) {
		t.Error("an empty bucket gave a token")
	}
	if take(t0.Add(-time.Second)) {
		t.Error("a clock behind the last take refilled the bucket")
	}
	if n := level(t0.Add(250 * time.Millisecond)); math.Abs(n-0.5) > 1e-6 {
		t.Errorf("after 250 ms at 2/s: %v tokens, want 0.5", n)
	}
	if !take(t0.Add(500*time.Millisecond)) || take(t0.Add(500*time.Millisecond)) {
		t.Error("after 500 ms at 2/s the bucket should give exactly one token")
	}
	if n := level(t0.Add(time.Hour)); n != 3 {
		t.Errorf("after an hour: %v tokens, want the burst, 3", n)
	}
	at := t0.Add(500 * time.Millisecond)
	for _, want := range []float64{-1, -2} {
		left, err := db.OweRateToken(ctx, c.ID, 2, 3, at)
		if err != nil || math.Abs(left-want) > 1e-6 {
			t.Errorf("OweRateToken = %v, %v; want %v left", left, err, want)
		}
	}
	if take(at.Add(time.Second)) {
		t.Error("a bucket 2 in debt gave a token after refilling 2")
	}
	if !take(at.Add(1500 * time.Millisecond)) {
		t.Error("a bucket back to 1 refused")
	}

	if _, err := db.DeleteConnector(ctx, "ws", "a"); err != nil {
		t.Fatal(err)
	}
	if n := level(t0); n != 3 {
		t.Errorf("a deleted connector's bucket is left with %v tokens", n)
	}
}

// TestRateBucketConcurrent: concurrent takes at one instant from a bucket
// of 5 get exactly 5 tokens, the first take of each racing to create it.
func TestRateBucketConcurrent(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewDB(t)
	c := mustCreate(t, db, newConnector("ws", "a"))
	at := time.Now()
	var taken atomic.Int32
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			ok, _, err := db.TakeRateToken(ctx, c.ID, 0.001, 5, at)
			if err != nil {
				t.Error(err)
			}
			if ok {
				taken.Add(1)
			}
		})
	}
	wg.Wait()
	if n := taken.Load(); n != 5 {
		t.Errorf("%d tokens taken from a bucket of 5", n)
	}
}
