// Package orchestrator is the connector agent: for one query it lets an LLM
// pick a connector's tools, runs the calls it asks for (those of one turn
// concurrently) within a budget, feeds the results back, and returns the
// model's answer with a full trace. It knows nothing of gRPC, SQL or MCP
// transports: it uses the ChatModel and ToolCaller it is given.
package orchestrator

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	openai "github.com/sashabaranov/go-openai"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/connector-svc/connector-svc/internal/ask"
)

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
		r.offerRead(ctx)
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
	// read is the name of the read_resource tool, "" when the run offers
	// none (resources.go).
	read string

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
