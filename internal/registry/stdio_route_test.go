package registry_test

import (
	"context"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/registry"
)

// TestAsksStdioRoutesByProgressToken: two calls of one caller session
// share a stdio process; the one that started first (hold) asks nothing,
// the second (askmine) elicits naming its request's progress token. The
// request reaches the second call's Asker, not the first call's (the
// oldest call in flight, where every request used to go: its run got a
// question that was not its own, and the run that asked never paused).
func TestAsksStdioRoutesByProgressToken(t *testing.T) {
	reg := run(t, newSource(askStdioSpec(1, registry.SessionPerSession, true, false)), testConfig())
	opts := registry.CallOptions{Session: "s1"}
	// The session is open before the two calls race.
	if _, err := reg.CallTool(ctxT(t), 1, "hold", map[string]any{"ms": 1}, opts); err != nil {
		t.Fatal(err)
	}
	first, second := &fakeAsker{}, &fakeAsker{}
	held := make(chan error, 1)
	go func() {
		ctx := ask.With(ctxT(t), first, ask.Call{ID: "first", Tool: "hold"})
		_, err := reg.CallTool(ctx, 1, "hold", map[string]any{"ms": 1500}, opts)
		held <- err
	}()
	time.Sleep(200 * time.Millisecond) // the first call is in flight
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := reg.CallTool(ask.With(ctx, second, ask.Call{ID: "second", Tool: "askmine"}), 1, "askmine", nil, opts)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := text(t, res), `action=accept content={"name":"Ada"}`; got != want {
		t.Errorf("askmine = %s, want %s", got, want)
	}
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	if ins, _ := first.asked(); len(ins) != 0 {
		t.Errorf("the first call's Asker was asked %+v", ins)
	}
	if ins, calls := second.asked(); len(ins) != 1 || calls[0].ID != "second" {
		t.Errorf("the second call's Asker saw %+v for %+v, want its own input", ins, calls)
	}
}
