// Package progress routes a session's notifications/progress to the calls
// that asked for them, by progress token, and hands each call's updates to
// its callback on the caller's goroutine, in order, without letting a slow
// callback hold up the connection.
package progress

import (
	"strconv"
	"sync"

	"github.com/mark3labs/mcp-go/mcp"
)

// Progress is one notifications/progress that a server sent for a running
// tool call.
type Progress struct {
	Progress float64 // how far the tool is; rises with every update
	Total    float64 // what Progress counts up to; 0 when the server does not say
	Message  string  // what the tool is doing, if the server says
}

// maxQueuedProgress bounds the updates of one call waiting for its fn.
const maxQueuedProgress = 256

// Routes sends a session's notifications/progress to the calls
// that asked for them, by progress token. Its handler is registered once
// per session; calls come and go. mu guards the map, never I/O or fn.
type Routes struct {
	mu    sync.Mutex
	next  uint64
	calls map[string]*Queue
}

// Add routes a new token to a new queue, until remove.
func (r *Routes) Add() (string, *Queue) {
	q := &Queue{wake: make(chan struct{}, 1)}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.next++
	token := "connector-svc-" + strconv.FormatUint(r.next, 10)
	if r.calls == nil {
		r.calls = map[string]*Queue{}
	}
	r.calls[token] = q
	return token, q
}

// Remove stops routing token.
func (r *Routes) Remove(token string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.calls, token)
}

// Route is the session's notification handler. It runs on the
// transport's reader, so it only queues.
func (r *Routes) Route(n mcp.JSONRPCNotification) {
	if n.Method != string(mcp.MethodNotificationProgress) {
		return
	}
	f := n.Params.AdditionalFields
	token, _ := f["progressToken"].(string) // ours are strings, and JSON keeps them so
	r.mu.Lock()
	q := r.calls[token]
	r.mu.Unlock()
	if q == nil {
		return // not ours, or its call has ended
	}
	p := Progress{Message: stringField(f, "message")}
	p.Progress, _ = f["progress"].(float64)
	p.Total, _ = f["total"].(float64)
	q.push(p)
}

func stringField(f map[string]any, key string) string {
	s, _ := f[key].(string)
	return s
}

// Queue holds one call's updates until its fn takes them.
type Queue struct {
	wake chan struct{} // 1-buffered: updates are waiting

	mu      sync.Mutex
	pending []Progress
	last    float64 // the highest progress queued so far
	any     bool
}

// Wake receives when updates are waiting.
func (q *Queue) Wake() <-chan struct{} { return q.wake }

// push queues p. MCP has progress rise with every update, so one that
// does not is out of date and dropped: a server with calls running at
// once can deliver a request's notifications out of order (mcp-go's
// streamable-HTTP server hands them to whichever request's stream takes
// them first).
func (q *Queue) push(p Progress) {
	q.mu.Lock()
	if q.any && p.Progress <= q.last {
		q.mu.Unlock()
		return
	}
	q.last, q.any = p.Progress, true
	if len(q.pending) < maxQueuedProgress {
		q.pending = append(q.pending, p)
	} else {
		q.pending[len(q.pending)-1] = p
	}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// Deliver hands the waiting updates to fn, in order.
func (q *Queue) Deliver(fn func(Progress)) {
	q.mu.Lock()
	pending := q.pending
	q.pending = nil
	q.mu.Unlock()
	for _, p := range pending {
		fn(p)
	}
}

// Call runs call, which sends a request carrying q's token,
// in a goroutine of its own, and hands q's updates to fn on this one while
// call runs; once it returns, also those that came before its answer (the
// transports deliver a request's notifications before its response).
func Call(q *Queue, fn func(Progress), call func() (*mcp.CallToolResult, error)) (*mcp.CallToolResult, error) {
	type result struct {
		res *mcp.CallToolResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := call()
		done <- result{res, err}
	}()
	for {
		select {
		case <-q.wake:
			q.Deliver(fn)
		case r := <-done:
			q.Deliver(fn)
			return r.res, r.err
		}
	}
}
