// Package pending holds the questions MCP servers ask in the middle of a
// tool call (an elicitation, a sampling request put to a person) while they
// wait on this replica for an answer. Direct tool calls and query runs keep
// theirs in the same Table and are answered the same way: Answer delivers
// one caller's answers to the requests it owns, all or none, and a request
// waits in Wait until it is answered or its caller's context ends.
//
// What a request means (its schema, whether an answer is valid) is the
// caller's business: the table checks only that the request is open and
// belongs to whoever answers it.
package pending

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/connector-svc/connector-svc/internal/ask"
)

// Owner names who may answer a request: the use case that opened it makes
// it (a query run's id, or a direct call's workspace, connector, session
// and user). The table compares owners, nothing else.
type Owner string

// ErrNotOpen is what Answer's error Is when an answer names a request
// that is not open for its owner: answered already, past its deadline, or
// never asked of them.
var ErrNotOpen = errors.New("input request not open")

// NotOpenError names the request an answer could not reach.
type NotOpenError struct{ ID string }

func (e *NotOpenError) Error() string { return fmt.Sprintf("input request %q is not open", e.ID) }

// Is makes a NotOpenError match ErrNotOpen.
func (e *NotOpenError) Is(target error) bool { return target == ErrNotOpen }

// Table is the open requests of this replica. The zero value is ready;
// safe for concurrent use.
type Table struct {
	mu   sync.Mutex
	open map[string]*Request
}

// Request is one question that waits for an answer.
type Request struct {
	owner  Owner
	input  ask.Input
	answer chan ask.Answer
	table  *Table
}

// Input is the question, as it was opened.
func (r *Request) Input() ask.Input { return r.input }

// Open puts in, which must have a unique ID, in the table for owner.
func (t *Table) Open(owner Owner, in ask.Input) *Request {
	r := &Request{owner: owner, input: in, answer: make(chan ask.Answer, 1), table: t}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.open == nil {
		t.open = map[string]*Request{}
	}
	t.open[in.ID] = r
	return r
}

// Lookup returns the open request id of owner, to check an answer against
// it before Answer delivers it.
func (t *Table) Lookup(owner Owner, id string) (ask.Input, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.open[id]
	if !ok || r.owner != owner {
		return ask.Input{}, false
	}
	return r.input, true
}

// Answer delivers answers (by request id) to owner's open requests: all of
// them, or none if one is not open (a *NotOpenError naming it, which Is
// ErrNotOpen). A delivered request is closed; its Wait returns the answer.
func (t *Table) Answer(owner Owner, answers map[string]ask.Answer) error {
	t.mu.Lock()
	for id := range answers {
		if r, ok := t.open[id]; !ok || r.owner != owner {
			t.mu.Unlock()
			return &NotOpenError{ID: id}
		}
	}
	targets := make([]*Request, 0, len(answers))
	for id := range answers {
		targets = append(targets, t.open[id])
		delete(t.open, id)
	}
	t.mu.Unlock()
	for _, r := range targets {
		r.answer <- answers[r.input.ID]
	}
	return nil
}

// Close takes r off the table without an answer. It reports false if an
// answer took it first: Wait then returns that answer.
func (r *Request) Close() bool {
	t := r.table
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.open[r.input.ID] != r {
		return false
	}
	delete(t.open, r.input.ID)
	return true
}

// Wait waits for r's answer until ctx ends (the caller gives ctx the
// request's deadline). An answer delivered as ctx ended still counts:
// answered reports whether one came. Without one, r is closed.
func (r *Request) Wait(ctx context.Context) (a ask.Answer, answered bool) {
	select {
	case a := <-r.answer:
		return a, true
	case <-ctx.Done():
	}
	if !r.Close() {
		return <-r.answer, true
	}
	return ask.Answer{}, false
}
