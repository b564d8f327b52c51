// Package ask carries what an MCP server asks of the service in the middle
// of a tool call — an elicitation for the user (a form or a URL) and a
// sampling request for the connector's model — from the connection that
// received it to whoever made the call: a query run, or a StreamCallTool.
//
// The caller puts an Asker in the call's context (With). The registry's
// request handlers find it there (From); on a transport whose server
// requests do not carry the call's context (stdio), the registry keeps the
// Askers of the calls in flight on the connection and picks one. Neither
// the registry nor the orchestrator import each other: both speak this
// package's types.
package ask

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Modes of an Input.
const (
	ModeForm     = "form"
	ModeURL      = "url"
	ModeSampling = "sampling" // a sampling request put to the user (policy approve)
)

// Input is one request for the user's input.
type Input struct {
	// ID is what the answer names: unique within the call's run. For a
	// durable input it is the server's key in inputRequests.
	ID      string
	Mode    string // ModeForm, ModeURL or ModeSampling
	Message string
	// Schema is a form's requested schema, as the server sent it.
	Schema map[string]any `json:",omitempty"`
	// Defaulted names the form's fields whose schema gives a default
	// (SEP-1034): an accept that leaves one out sends its default.
	Defaulted []string `json:",omitempty"`
	// URL is where a URL-mode input sends the user (never fetched here);
	// ElicitationID is the server's id for it (classic protocol).
	URL           string `json:",omitempty"`
	ElicitationID string `json:",omitempty"`
	// Sampling is what a sampling request put to the user would send to
	// the model.
	Sampling *SamplingSummary `json:",omitempty"`
	// Deadline is when an input whose server waits on an open call is
	// answered "cancel"; zero for a durable one.
	Deadline time.Time `json:",omitempty"`
	// Durable says the call ended and is retried with the answer
	// (Retry): the pause may outlive this process.
	Durable bool `json:",omitempty"`
}

// SamplingSummary is a sampling request as a person sees it.
type SamplingSummary struct {
	SystemPrompt string   `json:",omitempty"`
	Messages     []string `json:",omitempty"` // text excerpts
	MaxTokens    int      `json:",omitempty"`
	Tools        []string `json:",omitempty"`
}

// Actions of an Answer, as MCP names them.
const (
	Accept  = "accept"
	Decline = "decline"
	Cancel  = "cancel"
)

// Answer is the user's answer to an Input.
type Answer struct {
	Action  string         // Accept, Decline or Cancel
	Content map[string]any `json:",omitempty"` // a form's accepted content, checked against its schema
	Actor   string         `json:",omitempty"`
	At      time.Time      `json:",omitempty"`
}

// Asker is who answers the server requests of one call. Its methods may be
// called from several goroutines at once (calls of a turn run
// concurrently, and a server may ask several things of one call).
type Asker interface {
	// Elicit asks the user and waits for the answer, until ctx ends or
	// in.Deadline passes: then it returns a Cancel answer (and says so to
	// whoever it reports to). An error means nobody can be asked; the
	// server then gets an error.
	Elicit(ctx context.Context, call Call, in Input) (Answer, error)
	// Sampling is the call's sampling budget, nil for none (the
	// connector's own budgets still apply).
	Sampling() *Budget
	// Sampled records a sampling request served (or refused) during the
	// call.
	Sampled(call Call, rec SamplingRecord)
}

// Call names the tool call a server request belongs to.
type Call struct {
	ID   string // the run's call id; empty for a direct call
	Tool string
}

// SamplingRecord is one sampling request, as the run's record and counters
// keep it.
type SamplingRecord struct {
	Model            string
	Messages         int
	PromptTokens     int64
	CompletionTokens int64
	StopReason       string
	ToolUses         []string
	Err              string // why it was refused or failed; empty when answered
	Duration         time.Duration
	ResultExcerpt    string
}

type askerKey struct{}
type callKey struct{}

// With returns ctx carrying a and the call it asks for.
func With(ctx context.Context, a Asker, call Call) context.Context {
	ctx = context.WithValue(ctx, askerKey{}, a)
	return context.WithValue(ctx, callKey{}, call)
}

// From returns the Asker and call ctx carries, if any.
func From(ctx context.Context) (Asker, Call, bool) {
	a, ok := ctx.Value(askerKey{}).(Asker)
	if !ok || a == nil {
		return nil, Call{}, false
	}
	c, _ := ctx.Value(callKey{}).(Call)
	return a, c, true
}

// InputRequiredError is a sessionless (2026-07-28) server's answer that a
// call needs the user's input: the call has ended, and is retried with
// the answers and the server's RequestState (CallOptions' Retry).
type InputRequiredError struct {
	Inputs       []Input
	RequestState string
	// Served are the answers to the round's other input requests that
	// need nobody (sampling, served by the model at once), by the server's
	// key: the retry sends them back with the user's answers.
	Served map[string]json.RawMessage `json:",omitempty"`
}

func (e *InputRequiredError) Error() string {
	return fmt.Sprintf("the server needs the user's input (%d request(s)) before the call can go on", len(e.Inputs))
}

// Retry is what a call that ended with an InputRequiredError is sent again
// with.
type Retry struct {
	RequestState string
	Answers      map[string]Answer          // by Input.ID
	Served       map[string]json.RawMessage // InputRequiredError.Served, sent back as they are
}

// URLRequiredError is a classic server's -32042: the user must open the
// URLs (Inputs, URL mode) before the call is tried again.
type URLRequiredError struct {
	Inputs []Input
}

func (e *URLRequiredError) Error() string {
	return fmt.Sprintf("the server needs the user to open %d URL(s) before the call can go on", len(e.Inputs))
}

// ErrNobodyToAsk is Elicit's error when the call has nobody behind it who
// could answer (a unary CallTool answers Cancel instead, and says so).
var ErrNobodyToAsk = errors.New("nobody can answer this server's request on this call")

// Budget is a run's (or a direct call's) sampling budget: requests and
// tokens left. Safe for concurrent use.
type Budget struct {
	mu                     sync.Mutex
	requests, tokens       int
	maxRequests, maxTokens int
}

// NewBudget returns a budget of maxRequests requests and maxTokens tokens.
func NewBudget(maxRequests, maxTokens int) *Budget {
	return &Budget{maxRequests: maxRequests, maxTokens: maxTokens}
}

// ErrBudget is wrapped by every refusal of a sampling budget.
var ErrBudget = errors.New("sampling budget exhausted")

// Reserve takes one request and up to tokens tokens from b, or says which
// budget is spent. It returns how many tokens were reserved (less than
// asked when fewer are left).
func (b *Budget) Reserve(tokens int) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.requests >= b.maxRequests {
		return 0, fmt.Errorf("%w: %d sampling requests per run", ErrBudget, b.maxRequests)
	}
	left := b.maxTokens - b.tokens
	if left <= 0 {
		return 0, fmt.Errorf("%w: %d sampling tokens per run", ErrBudget, b.maxTokens)
	}
	tokens = min(tokens, left)
	b.requests++
	b.tokens += tokens
	return tokens, nil
}

// Settle replaces a reservation of reserved tokens by the used ones.
func (b *Budget) Settle(reserved, used int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tokens += used - reserved
}

// Used returns the requests and tokens spent so far.
func (b *Budget) Used() (requests, tokens int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.requests, b.tokens
}
