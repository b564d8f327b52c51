// Package orchestrator is the connector agent: for one query it lets an LLM
// pick a connector's tools, runs the calls it asks for (those of one turn
// concurrently) within a budget, feeds the results back, and returns the
// model's answer with a full trace. It knows nothing of gRPC, SQL or MCP
// transports: it uses the ChatModel and ToolCaller it is given.
package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	openai "github.com/sashabaranov/go-openai"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/connector-svc/connector-svc/internal/ask"
)

// ChatModel answers chat completion requests. It is an interface here so
// the agent can be driven by any OpenAI-compatible client.
type ChatModel interface {
	Chat(ctx context.Context, req openai.ChatCompletionRequest) (openai.ChatCompletionResponse, error)
}

// ToolCaller runs a tool of a connector over its persistent session. It is
// an interface here so the agent needs no MCP connection code.
type ToolCaller interface {
	CallTool(ctx context.Context, connectorID int64, name string, args map[string]any, opts CallOptions) (*mcp.CallToolResult, error)
}

// CallOptions are what the agent adds to one tool call, besides the tool
// and its arguments.
type CallOptions struct {
	// Session is the caller's session id (Request.Session): a per_session
	// connector runs the call on that session's own connection.
	Session string
	// UserID is the end user the run is for (Request.UserID): an
	// oauth_user connector runs the call with that user's token.
	UserID string
	// Progress, when set, asks the call's server for progress: every
	// update reaches it, in order, before CallTool returns and never
	// after.
	Progress func(Progress)
	// Retry, when set, sends again a call that ended needing the user's
	// input (ask.InputRequiredError), with the answers.
	Retry *ask.Retry
	// TaskID, when set, receives the id of the task the call ran as, if
	// its server ran it as one.
	TaskID *string
}

// Progress is one progress update that a server sent for a running tool
// call.
type Progress struct {
	Progress float64 // how far the tool is; rises with every update
	Total    float64 // what Progress counts up to; 0 when the server does not say
	Message  string  // what the tool is doing, if the server says
}

// Embedder turns texts into embedding vectors, in order. It is an
// interface here so the agent can use any OpenAI-compatible endpoint's.
type Embedder interface {
	Embed(ctx context.Context, texts []string) ([][]float32, error)
}

// ErrPanic means a run panicked; the service keeps serving.
var ErrPanic = errors.New("the query run panicked")

// ErrBadPlan means the model did not return a plan in the asked format.
var ErrBadPlan = errors.New("the model did not return a plan as JSON")

// Budget limits.
const (
	DefaultMaxTools = 10
	MaxMaxTools     = 50
)

// Narrowing defaults (Config.NarrowAbove, Config.NarrowTo).
const (
	DefaultNarrowAbove = 32
	DefaultNarrowTo    = 24
)

// Config tunes the agent; zero fields take defaults.
type Config struct {
	MaxTurns    int // model turns with tools before a forced answer; 8
	ResultLimit int // characters of one tool result sent to the model; 8000
	ExcerptSize int // characters of a result kept in the trace; 500
	// NarrowAbove is how many enabled tools a connector may have before a
	// query is offered only the NarrowTo best-ranked for it (and
	// search_tools to find the others); 32. A connector's Profile may
	// override it.
	NarrowAbove int
	NarrowTo    int // 24
	// SearchResults is how many tools one search_tools call finds; 8.
	SearchResults int
	// Embedder, when set, adds a semantic ranking to narrowing: the
	// query's embedding against the tools' (Connector.WithVectors).
	Embedder Embedder
	// MeterProvider records the runs (see metrics.go); nil records none.
	MeterProvider metric.MeterProvider
	// TracerProvider makes the spans of queries and model calls; nil means
	// otel's global one.
	TracerProvider trace.TracerProvider
}

// Tool is an enabled tool of the connector, as the model sees it.
type Tool struct {
	Name        string
	Description string
	InputSchema json.RawMessage
	// Annotations are the server's hints, shown with a pending call.
	Annotations mcp.ToolAnnotation
	// RequiresApproval makes a run pause before calling the tool, until a
	// person decides (Agent.Resume).
	RequiresApproval bool
}

// Request is one query.
type Request struct {
	Connector *Connector // the connector's live agent (NewConnector)
	Query     string
	Context   string
	MaxTools  int // 1..MaxMaxTools
	PlanOnly  bool
	// Session is the caller's session id, passed with every tool call of
	// the run (CallOptions.Session); empty for none.
	Session string
	// UserID is the end user the run is for, passed with every tool call
	// of the run (CallOptions.UserID); empty for none.
	UserID string
	// Throttle, when set, is called before each tool call of the run
	// reaches the ToolCaller, and may wait (the connector's rate limit);
	// an error fails that call as the ToolCaller's would.
	Throttle func(ctx context.Context) error
	// Inputs answers what a server asks the user while a tool call is
	// open (see inputs.go); nil: nobody can be asked, and the server gets
	// an error.
	Inputs InputBroker
	// SamplingBudget is the run's sampling budget (ask.Asker.Sampling);
	// nil for none.
	SamplingBudget *ask.Budget
}

// Status is how a run ended.
type Status int

// Statuses.
const (
	StatusCompleted        Status = iota + 1 // the model answered on its own
	StatusBudgetExhausted                    // the answer was forced after the budget or turn limit
	StatusPlanned                            // plan_only
	StatusAwaitingApproval                   // paused before calls that need approval (Result.Pending)
	// StatusAwaitingAuthorization: paused because calls of the last step
	// met an AuthorizationError (Result.Authorization says why); they run
	// again when the run is resumed (State.Authorized).
	StatusAwaitingAuthorization
	// StatusAwaitingInput: paused because a server asked the user for
	// input (Result.Inputs). A durable pause (the calls ended, State says
	// how to retry them) goes on with State.Answered and Resume; a live
	// one is still running, its tool call open, until the InputBroker
	// answers.
	StatusAwaitingInput
)

// AuthorizationError is what a ToolCaller returns for a call that cannot
// run until the run's user authorizes the connector (again, or for more
// scopes): the run pauses with StatusAwaitingAuthorization instead of
// telling the model the call failed.
type AuthorizationError struct {
	Err    error
	Reason string   // why, as the authorization layer says it
	Scopes []string // what to ask for
}

func (e *AuthorizationError) Error() string { return e.Err.Error() }
func (e *AuthorizationError) Unwrap() error { return e.Err }

// AuthorizationNeed is why a run awaits its user's authorization.
type AuthorizationNeed struct {
	Reason string
	Scopes []string `json:",omitempty"`
}

// Call is one tool call of a run.
type Call struct {
	ID             string
	Tool           string
	Arguments      map[string]any
	ResultExcerpt  string
	IsError        bool
	RejectedReason string // set when the call never ran
	Duration       time.Duration
	// Pending marks a call that waits for a person's decision.
	Pending bool
	// Decision is the decision a call that needed approval got.
	Decision *Decision
	// AwaitsAuthorization marks a pending call that met an
	// AuthorizationError: it runs again when the run is resumed.
	AwaitsAuthorization bool `json:",omitempty"`
	// AwaitsInput marks a pending call that ended needing the user's
	// input: it runs again, with the answers, when the run is resumed.
	AwaitsInput bool `json:",omitempty"`
	// Inputs are what its server asked the user during the call, with
	// the answers; Samplings, the sampling requests it made.
	Inputs    []Input              `json:",omitempty"`
	Samplings []ask.SamplingRecord `json:",omitempty"`
	// TaskID is the server's id of the task the call ran as, if it did.
	TaskID string `json:",omitempty"`
}

// Step is one model turn with tool calls.
type Step struct {
	Index int
	Calls []Call
	// Reasoning is what the model said with its calls, if anything.
	Reasoning string
}

// PlannedTool is one entry of a plan.
type PlannedTool struct {
	Tool, Purpose string
}

// Context is structured material from a tool result.
type Context struct {
	Tool              string
	StructuredContent map[string]any
	ResourceLinks     []mcp.ResourceLink
}

// Usage counts tokens: the model's own and those of the sampling
// requests it answered for the run's servers (SamplingRequests of them).
type Usage struct {
	PromptTokens, CompletionTokens, TotalTokens int64
	SamplingRequests                            int64 `json:",omitempty"`
}

// Result is the outcome of a run.
type Result struct {
	Status    Status
	Answer    string
	ToolsUsed []string
	// ToolsTotal is how many enabled tools the connector has; ToolsOffered
	// are the ones the model was offered (those search_tools found
	// included), all of them unless Narrowed.
	ToolsTotal   int
	ToolsOffered []string
	Narrowed     bool
	Steps        []Step
	Plan         []PlannedTool
	Contexts     []Context
	Usage        Usage
	Duration     time.Duration
	// Pending are the calls a paused run (StatusAwaitingApproval) waits
	// on, and State what Resume needs to go on with it.
	Pending []PendingCall
	State   *State
	// Authorization says why a run awaits authorization
	// (StatusAwaitingAuthorization).
	Authorization *AuthorizationNeed `json:",omitempty"`
	// Inputs are the requests a run awaiting input waits on
	// (StatusAwaitingInput).
	Inputs []Input `json:",omitempty"`
}

// EventKind says what an Event reports.
type EventKind int

// Event kinds, in the order a run emits them.
const (
	EventStepPlanned EventKind = iota + 1
	EventToolCallStarted
	EventToolCallProgress // per progress notification of a running call, in order
	EventToolCallFinished
	EventAnswer
	EventApprovalRequired // the run paused; Event.Pending says for what
	EventInputRequired    // a server asks the user; Event.Inputs says what
)

// Event is progress of a run, for streaming.
type Event struct {
	Kind   EventKind
	Step   Step // EventStepPlanned
	Index  int  // the step of a tool call event
	Call   Call // tool call events
	Answer string

	// Progress is the update of an EventToolCallProgress.
	Progress Progress

	// Pending are the calls of an EventApprovalRequired.
	Pending []PendingCall

	// Inputs are the requests of an EventInputRequired.
	Inputs []Input
}

// Agent runs queries. Safe for concurrent use.
type Agent struct {
	model  ChatModel
	tools  ToolCaller
	cfg    Config
	logger *slog.Logger
	tracer trace.Tracer
	// counters count runs, on Config.MeterProvider.
	counters counters
}

// New returns an Agent.
func New(model ChatModel, tools ToolCaller, cfg Config, logger *slog.Logger) *Agent {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxTurns <= 0 {
		cfg.MaxTurns = 8
	}
	if cfg.ResultLimit <= 0 {
		cfg.ResultLimit = 8000
	}
	if cfg.ExcerptSize <= 0 {
		cfg.ExcerptSize = 500
	}
	if cfg.NarrowAbove <= 0 {
		cfg.NarrowAbove = DefaultNarrowAbove
	}
	if cfg.NarrowTo <= 0 {
		cfg.NarrowTo = DefaultNarrowTo
	}
	if cfg.SearchResults <= 0 {
		cfg.SearchResults = 8
	}
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = otel.GetTracerProvider()
	}
	return &Agent{model: model, tools: tools, cfg: cfg, logger: logger, tracer: cfg.TracerProvider.Tracer("connector-svc/orchestrator"),
		counters: newCounters(cfg.MeterProvider)}
}

// Run answers one query. emit, if not nil, receives progress events one at
// a time, and then the tool calls ask their servers for progress
// (CallOptions.Progress): each update is an EventToolCallProgress between
// the call's started and finished events. The context bounds everything:
// cancelling it cancels the tool calls in flight. A tool that fails is not
// an error of the run: the model sees the failure and may recover. Errors
// are the ChatModel's, the context's, ErrBadPlan or ErrPanic; with an
// error, the result is still there, with what the run did and spent
// (steps, usage) before it failed.
func (a *Agent) Run(ctx context.Context, req Request, emit func(Event)) (res *Result, err error) {
	r := &run{agent: a, req: req, conn: req.Connector, emit: serialize(emit), res: &Result{}, progress: emit != nil}
	return a.execute(ctx, "connector.query", r, func(ctx context.Context) (*Result, error) {
		r.selectTools(ctx)
		if req.PlanOnly {
			return r.plan(ctx)
		}
		return r.loop(ctx, r.start(), 0)
	})
}

// execute runs body, the work of run r, in its span: it recovers a panic,
// keeps the partial result of a failed run, times the run (a resumed
// run's duration adds up) and counts it.
func (a *Agent) execute(ctx context.Context, spanName string, r *run, body func(context.Context) (*Result, error)) (res *Result, err error) {
	c, req := r.conn, r.req
	ctx, span := a.tracer.Start(ctx, spanName, trace.WithAttributes(
		attribute.String("connector.workspace_id", c.WorkspaceID), attribute.String("connector.id", c.ExternalID),
		attribute.Int64("connector.row_id", c.ID), attribute.Int("query.max_tools", req.MaxTools),
		attribute.Bool("query.plan_only", req.PlanOnly)))
	start, before := time.Now(), r.res.Duration
	defer func() {
		if p := recover(); p != nil {
			a.logger.ErrorContext(ctx, "query run panicked", slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
			err = ErrPanic
		}
		if err != nil {
			res = r.res
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		res.Duration = before + time.Since(start)
		span.End()
		a.countQuery(ctx, c, res, err)
	}()
	return body(ctx)
}

// serialize makes emit safe to call from the concurrent tool calls.
func serialize(emit func(Event)) func(Event) {
	if emit == nil {
		return func(Event) {}
	}
	var mu sync.Mutex
	return func(e Event) {
		mu.Lock()
		defer mu.Unlock()
		emit(e)
	}
}

// run is the state of one query.
type run struct {
	agent *Agent
	req   Request
	conn  *Connector
	emit  func(Event)
	res   *Result
	used  int // tool calls run so far

	// The tools offered (see narrow.go): the prompt's head and the
	// definitions the model gets; offered is nil when all are.
	head    string
	defs    []openai.Tool
	offered map[string]bool

	// progress asks tool calls for progress: someone listens to events.
	progress bool

	// mu guards what the calls of a step record while they run (their
	// inputs, samplings, contexts, the usage they add) and the step
	// itself while it runs (current), so that a live pause can take a
	// snapshot.
	mu        sync.Mutex
	current   *Step
	inputs    map[string][]Input
	samplings map[string][]ask.SamplingRecord
	timedOut  map[string]bool
	durable   map[string]DurableCall
	// retries are the calls of the paused step to send again with the
	// user's answers (State.Answered), by call id.
	retries map[string]*ask.Retry
}

// chat sends one request to the model in its own span and counts tokens.
// With tools, the connector's tools are offered, if it has any (a
// tool_choice without tools is an error for some endpoints); without, none
// is offered at all: a model that ignores tool_choice (Ollama) cannot
// call one then.
func (r *run) chat(ctx context.Context, msgs []openai.ChatCompletionMessage, withTools bool) (openai.ChatCompletionMessage, error) {
	ctx, span := r.agent.tracer.Start(ctx, "llm.chat", trace.WithAttributes(attribute.Int("llm.messages", len(msgs))))
	defer span.End()
	creq := openai.ChatCompletionRequest{Model: r.conn.Model, Messages: msgs}
	if withTools && len(r.defs) > 0 {
		creq.Tools = r.defs
		creq.ToolChoice = "auto"
	}
	resp, err := r.agent.model.Chat(ctx, creq)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		return openai.ChatCompletionMessage{}, err
	}
	r.mu.Lock()
	r.res.Usage.PromptTokens += int64(resp.Usage.PromptTokens)
	r.res.Usage.CompletionTokens += int64(resp.Usage.CompletionTokens)
	r.res.Usage.TotalTokens += int64(resp.Usage.TotalTokens)
	r.mu.Unlock()
	span.SetAttributes(attribute.Int("llm.prompt_tokens", resp.Usage.PromptTokens), attribute.Int("llm.completion_tokens", resp.Usage.CompletionTokens))
	return resp.Choices[0].Message, nil
}

// start is a run's first messages: the system prompt and the query.
func (r *run) start() []openai.ChatCompletionMessage {
	return []openai.ChatCompletionMessage{
		{Role: openai.ChatMessageRoleSystem, Content: systemPrompt(r.head, r.conn, r.req.MaxTools)},
		{Role: openai.ChatMessageRoleUser, Content: userMessage(r.req)},
	}
}

// loop runs model turns from turn on, after msgs, until the model answers,
// the budget or turn limit forces an answer, or a call needs approval.
func (r *run) loop(ctx context.Context, msgs []openai.ChatCompletionMessage, turn int) (*Result, error) {
	for ; ; turn++ {
		if turn >= r.agent.cfg.MaxTurns || r.used >= r.req.MaxTools {
			return r.synthesize(ctx, msgs)
		}
		msg, err := r.chat(ctx, msgs, true)
		if err != nil {
			return nil, err
		}
		if len(msg.ToolCalls) == 0 {
			return r.finish(ctx, msg.Content, StatusCompleted), nil
		}
		uniqueCallIDs(msg.ToolCalls, turn)
		msgs = append(msgs, msg)
		outputs, pending, err := r.step(ctx, turn, msg)
		if err != nil {
			return nil, err
		}
		if len(pending) > 0 {
			return r.pause(ctx, msgs, turn, outputs), nil
		}
		msgs = append(msgs, toolMessages(msg.ToolCalls, outputs)...)
	}
}

// synthesize makes one last call that offers no tools: the answer from
// the results so far. Tool calls that come back anyway are not run.
func (r *run) synthesize(ctx context.Context, msgs []openai.ChatCompletionMessage) (*Result, error) {
	msgs = append(msgs, openai.ChatCompletionMessage{Role: openai.ChatMessageRoleUser,
		Content: "The tool budget for this query is used up. Answer the original question now from the tool results above, without calling tools."})
	msg, err := r.chat(ctx, msgs, false)
	if err != nil {
		return nil, err
	}
	return r.finish(ctx, msg.Content, StatusBudgetExhausted), nil
}

// finish ends a run with the model's answer. An answer the model left
// empty is never passed on as if it were one: the caller gets a note that
// says so, with the tool results the run got.
func (r *run) finish(ctx context.Context, answer string, status Status) *Result {
	if status != StatusPlanned && strings.TrimSpace(answer) == "" {
		r.agent.logger.WarnContext(ctx, "the model gave an empty answer; answering with the tool results",
			slog.String("workspace_id", r.conn.WorkspaceID), slog.String("connector_id", r.conn.ExternalID), slog.Int("steps", len(r.res.Steps)))
		answer = noAnswer(r.res.Steps)
	}
	r.res.Answer, r.res.Status = answer, status
	r.emit(Event{Kind: EventAnswer, Answer: answer})
	return r.res
}

// noAnswer is the answer of a run whose model answered with no text.
func noAnswer(steps []Step) string {
	var b strings.Builder
	b.WriteString("[no answer: the model returned no text]")
	n := 0
	for _, st := range steps {
		for _, c := range st.Calls {
			if c.RejectedReason != "" {
				continue
			}
			if n == 0 {
				b.WriteString(" The tool results were:")
			}
			n++
			status := "result"
			if c.IsError {
				status = "error"
			}
			fmt.Fprintf(&b, "\n- %s (%s): %s", c.Tool, status, c.ResultExcerpt)
		}
	}
	if n == 0 {
		b.WriteString(" No tool was called.")
	}
	return b.String()
}

// plan asks which tools the query needs, in order, and runs nothing.
func (r *run) plan(ctx context.Context) (*Result, error) {
	msgs := []openai.ChatCompletionMessage{
		{Role: openai.ChatMessageRoleSystem, Content: systemPrompt(r.head, r.conn, r.req.MaxTools) + "\n\n" + planInstructions},
		{Role: openai.ChatMessageRoleUser, Content: userMessage(r.req)},
	}
	msg, err := r.chat(ctx, msgs, false)
	if err != nil {
		return nil, err
	}
	plan, err := parsePlan(msg.Content)
	if err != nil {
		return nil, err
	}
	for _, p := range plan {
		if _, ok := r.conn.tools[p.Tool]; !ok {
			r.agent.logger.WarnContext(ctx, "plan names an unknown tool; dropped", slog.String("tool", p.Tool))
			continue
		}
		r.res.Plan = append(r.res.Plan, p)
	}
	return r.finish(ctx, "", StatusPlanned), nil
}

// maxPlanCandidates bounds how many '{' of a reply parsePlan tries.
const maxPlanCandidates = 16

// parsePlan reads the plan out of a plan_only reply: the first JSON object
// with a "plan" list, wherever it starts (prose or a code fence around it
// may hold braces of their own) and whatever follows it.
func parsePlan(content string) ([]PlannedTool, error) {
	lastErr := errors.New("no JSON object in the reply")
	rest, tries := content, 0
	for tries < maxPlanCandidates {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			break
		}
		rest, tries = rest[i:], tries+1
		var out struct {
			Plan *[]planEntry `json:"plan"`
		}
		err := json.NewDecoder(strings.NewReader(rest)).Decode(&out)
		if err == nil && out.Plan != nil {
			return plannedTools(*out.Plan), nil
		}
		if err == nil {
			err = errors.New(`a JSON object without a "plan" list`)
		}
		lastErr, rest = err, rest[1:]
	}
	if plan, ok := bareArrayPlan(content); ok {
		return plan, nil
	}
	return nil, fmt.Errorf("%w: %v", ErrBadPlan, lastErr)
}

// planEntry is a step of a plan as the model writes it.
type planEntry struct {
	Tool    string `json:"tool"`
	Purpose string `json:"purpose"`
}

func plannedTools(entries []planEntry) []PlannedTool {
	plan := make([]PlannedTool, 0, len(entries))
	for _, e := range entries {
		plan = append(plan, PlannedTool{Tool: e.Tool, Purpose: e.Purpose})
	}
	return plan
}

// bareArrayPlan reads a plan a model gave as a bare JSON array of steps,
// without the object around it: the first array whose every entry names a
// tool, or a reply that is just "[]".
func bareArrayPlan(content string) ([]PlannedTool, bool) {
	if strings.TrimSpace(content) == "[]" {
		return []PlannedTool{}, true
	}
	rest := content
	for tries := 0; tries < maxPlanCandidates; tries++ {
		i := strings.IndexByte(rest, '[')
		if i < 0 {
			break
		}
		rest = rest[i:]
		var steps []planEntry
		if json.NewDecoder(strings.NewReader(rest)).Decode(&steps) == nil && len(steps) > 0 &&
			!slices.ContainsFunc(steps, func(e planEntry) bool { return e.Tool == "" }) {
			return plannedTools(steps), true
		}
		rest = rest[1:]
	}
	return nil, false
}
