package store_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

// TestSamplingMinute: a minute's sampling takes requests and tokens while
// both stay within the limits, says where it stands when it refuses,
// settles reservations to the tokens used, starts afresh the next minute,
// drops rows of more than a day before, and goes with its connector.
func TestSamplingMinute(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewDB(t)
	c := mustCreate(t, db, newConnector("ws", "a"))
	t0 := time.Date(2026, 11, 25, 12, 0, 10, 0, time.UTC)
	reserve := func(at time.Time, tokens, maxReq, maxTok int) (int, int64, bool) {
		t.Helper()
		m, ok, err := db.ReserveSampling(ctx, c.ID, at, tokens, maxReq, maxTok)
		if err != nil {
			t.Fatal(err)
		}
		if want := at.Truncate(time.Minute); !m.Minute.Equal(want) {
			t.Errorf("minute %v, want %v", m.Minute, want)
		}
		return m.Requests, m.Tokens, ok
	}
	if r, tok, ok := reserve(t0, 100, 3, 250); !ok || r != 1 || tok != 100 {
		t.Fatalf("first reservation: ok=%v requests=%d tokens=%d, want true 1 100", ok, r, tok)
	}
	if _, _, ok := reserve(t0, 200, 3, 250); ok {
		t.Error("a reservation past the token limit was taken")
	}
	if r, tok, ok := reserve(t0.Add(20*time.Second), 150, 3, 250); !ok || r != 2 || tok != 250 {
		t.Fatalf("reservation up to the token limit: ok=%v requests=%d tokens=%d, want true 2 250", ok, r, tok)
	}
	// The first request used 30 tokens of its 100.
	if err := db.SettleSampling(ctx, c.ID, t0, 30-100); err != nil {
		t.Fatal(err)
	}
	if r, tok, ok := reserve(t0, 50, 3, 250); !ok || r != 3 || tok != 230 {
		t.Fatalf("after settling: ok=%v requests=%d tokens=%d, want true 3 230", ok, r, tok)
	}
	if r, tok, ok := reserve(t0, 1, 3, 250); ok || r != 3 || tok != 230 {
		t.Errorf("past the request limit: ok=%v requests=%d tokens=%d, want false 3 230", ok, r, tok)
	}
	if r, tok, ok := reserve(t0.Add(time.Minute), 10, 3, 250); !ok || r != 1 || tok != 10 {
		t.Errorf("next minute: ok=%v requests=%d tokens=%d, want a fresh minute", ok, r, tok)
	}
	if _, _, ok := reserve(t0.Add(2*time.Minute), 300, 3, 250); ok {
		t.Error("a reservation of more tokens than the limit was taken in a fresh minute")
	}
	if _, _, ok := reserve(t0.Add(2*time.Minute), 1, 0, 250); ok {
		t.Error("a limit of 0 requests took one")
	}
	if m, err := db.SamplingUse(ctx, c.ID, t0.Add(2*time.Minute)); err != nil || m.Requests != 0 {
		t.Errorf("refusals left a row: %+v, %v", m, err)
	}
	// A day later the old minutes go.
	reserve(t0.Add(25*time.Hour), 1, 3, 250)
	if m, err := db.SamplingUse(ctx, c.ID, t0); err != nil || m.Requests != 0 {
		t.Errorf("a minute of a day before is still there: %+v, %v", m, err)
	}
	if _, err := db.DeleteConnector(ctx, "ws", "a"); err != nil {
		t.Fatal(err)
	}
	if m, err := db.SamplingUse(ctx, c.ID, t0.Add(25*time.Hour)); err != nil || m.Requests != 0 {
		t.Errorf("a deleted connector's minute is still there: %+v, %v", m, err)
	}
}

// TestSamplingMinuteConcurrent: reservations racing for one minute from
// many connections take exactly the limit.
func TestSamplingMinuteConcurrent(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewDB(t)
	c := mustCreate(t, db, newConnector("ws", "a"))
	at := time.Now()
	var taken atomic.Int64
	var wg sync.WaitGroup
	for range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, ok, err := db.ReserveSampling(ctx, c.ID, at, 10, 7, 1000)
			if err != nil {
				t.Error(err)
			}
			if ok {
				taken.Add(1)
			}
		}()
	}
	wg.Wait()
	if n := taken.Load(); n != 7 {
		t.Errorf("%d reservations taken, want the limit, 7", n)
	}
	if m, err := db.SamplingUse(ctx, c.ID, at); err != nil || m.Requests != 7 || m.Tokens != 70 {
		t.Errorf("minute %+v, %v; want 7 requests, 70 tokens", m, err)
	}
}
