package registry

import (
	"context"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/ask"
)

type nopAsker struct{ name string }

func (nopAsker) Elicit(context.Context, ask.Call, ask.Input) (ask.Answer, error) {
	return ask.Answer{}, nil
}
func (nopAsker) Sampling() *ask.Budget                { return nil }
func (nopAsker) Sampled(ask.Call, ask.SamplingRecord) {}

// On stdio, a server request goes to the call that started first, or to
// the one running as the task it names.
func TestAsksRouteOnStdio(t *testing.T) {
	a := &asks{elicit: true}
	s := &session{asks: a}
	if asker, _, callCtx, _ := a.route(context.Background(), related{}); asker != nil || callCtx != nil {
		t.Fatalf("no call in flight routed to %v", asker)
	}
	first, second := nopAsker{"first"}, nopAsker{"second"}
	ctx1 := ask.With(context.Background(), first, ask.Call{ID: "1"})
	ctx2 := ask.With(context.Background(), second, ask.Call{ID: "2"})
	done1 := a.track(ctx1)
	done2 := a.track(ctx2)
	defer done2()
	s.relateTask(ctx2, "task-2")
	if asker, call, _, _ := a.route(context.Background(), related{}); asker != first || call.ID != "1" {
		t.Errorf("routed to %v %+v, want the first call", asker, call)
	}
	if asker, call, callCtx, _ := a.route(context.Background(), relatedOf(mcp.WithRelatedTask("task-2"))); asker != second || call.ID != "2" || callCtx != ctx2 {
		t.Errorf("routed to %v %+v, want the call of task-2", asker, call)
	}
	done1()
	if asker, _, _, _ := a.route(context.Background(), related{}); asker != second {
		t.Errorf("routed to %v after the first call ended, want the second", asker)
	}
	// Over streamable HTTP a request without an Asker in its context
	// belongs to a call without one.
	a.byContext = true
	if asker, _, _, _ := a.route(context.Background(), related{}); asker != nil {
		t.Errorf("streamable HTTP routed a request to %v", asker)
	}
}

// Over stdio, a request that names no call goes to the oldest call not
// asking already: while the first call's question waits, the next one is
// the second call's (each used to go to the first call, whose run got
// every question of its session while the others never paused).
func TestAsksRouteSpreadsUnnamedRequests(t *testing.T) {
	a := &asks{elicit: true}
	first, second := nopAsker{"first"}, nopAsker{"second"}
	defer a.track(ask.With(context.Background(), first, ask.Call{ID: "1"}))()
	defer a.track(ask.With(context.Background(), second, ask.Call{ID: "2"}))()
	asker1, _, _, release1, _ := a.routeAsking(context.Background(), related{})
	asker2, _, _, release2, _ := a.routeAsking(context.Background(), related{})
	if asker1 != first || asker2 != second {
		t.Errorf("two questions went to %v and %v, want the first call's, then the second's", asker1, asker2)
	}
	release1()
	if asker3, _, _, release3, _ := a.routeAsking(context.Background(), related{}); asker3 != first {
		t.Errorf("once the first call's question is answered, the next went to %v, want the first call", asker3)
	} else {
		release3()
	}
	release2()
	// A request naming a call goes there, asking or not.
	_, _, _, release4, _ := a.routeAsking(context.Background(), related{})
	defer release4()
	if asker, _, _, _ := a.route(context.Background(), related{}); asker != second {
		t.Errorf("routed to %v while the first asks, want the second", asker)
	}
}
