package progress

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/mark3labs/mcp-go/mcp"
)

func progressNotification(method string, token any, progress float64) mcp.JSONRPCNotification {
	return mcp.JSONRPCNotification{JSONRPC: mcp.JSONRPC_VERSION, Notification: mcp.Notification{
		Method: method,
		Params: mcp.NotificationParams{AdditionalFields: map[string]any{
			"progressToken": token, "progress": progress, "total": 3.0, "message": "m"}},
	}}
}

// Updates that arrive just before the answer are delivered too, however
// the answer and they race: here the callback is busy with the first
// update while the other two and the answer arrive.
func TestCallWithProgressDeliversWhatCameBeforeTheAnswer(t *testing.T) {
	want := []Progress{{1, 3, "m"}, {2, 3, "m"}, {3, 3, "m"}}
	for range 200 {
		var r Routes
		token, q := r.Add()
		other, _ := r.Add()
		busy, answered := make(chan struct{}), make(chan struct{})
		var got []Progress
		fn := func(p Progress) {
			if got = append(got, p); len(got) == 1 {
				close(busy)
				<-answered
			}
		}
		_, err := Call(q, fn, func() (*mcp.CallToolResult, error) {
			defer close(answered)
			for i := 1; i <= 3; i++ {
				r.Route(progressNotification(string(mcp.MethodNotificationProgress), token, float64(i)))
				if i == 1 {
					<-busy
				}
				// Not this call's: another call's, a number token, another method.
				r.Route(progressNotification(string(mcp.MethodNotificationProgress), other, 9))
				r.Route(progressNotification(string(mcp.MethodNotificationProgress), 1.0, 9))
				r.Route(progressNotification(string(mcp.MethodNotificationMessage), token, 9))
			}
			return &mcp.CallToolResult{}, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("(-want +got):\n%s", diff)
		}
	}
}

func TestRemovedTokenGetsNothing(t *testing.T) {
	var r Routes
	token, q := r.Add()
	r.Remove(token)
	r.Route(progressNotification(string(mcp.MethodNotificationProgress), token, 1))
	q.Deliver(func(p Progress) { t.Errorf("delivered %v after remove", p) })
}

// A flood waiting for a slow callback is capped, and keeps the newest.
func TestProgressQueueKeepsTheNewest(t *testing.T) {
	var q Queue
	q.wake = make(chan struct{}, 1)
	for i := 1; i <= maxQueuedProgress+50; i++ {
		q.push(Progress{Progress: float64(i)})
	}
	var got []float64
	q.Deliver(func(p Progress) { got = append(got, p.Progress) })
	if len(got) != maxQueuedProgress || got[0] != 1 || got[len(got)-2] != maxQueuedProgress-1 ||
		got[len(got)-1] != maxQueuedProgress+50 {
		t.Errorf("delivered %d updates, %v … %v", len(got), got[:2], got[len(got)-2:])
	}
}

// An update whose progress does not rise is out of date: dropped.
func TestProgressThatDoesNotRiseIsDropped(t *testing.T) {
	q := &Queue{wake: make(chan struct{}, 1)}
	for _, v := range []float64{1, 3, 2, 3, 4} {
		q.push(Progress{Progress: v})
	}
	var got []float64
	q.Deliver(func(p Progress) { got = append(got, p.Progress) })
	if diff := cmp.Diff([]float64{1, 3, 4}, got); diff != "" {
		t.Errorf("delivered (-want +got):\n%s", diff)
	}
}
