// Package sampling answers an MCP server's sampling/createMessage with the
// connector's model, under budgets: tokens per request, requests and
// tokens per run (the caller's ask.Budget), and requests and tokens per
// connector per minute over all replicas (a Postgres row per minute).
//
// The request's messages, system prompt, capped maxTokens, temperature,
// stop sequences, tools and tool choice go to the chat API; the answer
// comes back as text, or as tool uses when the model asked for tools —
// which are never run here: the server runs them and asks again with
// their results. includeContext is always treated as "none", and model
// preferences are ignored: the model is the connector's.
package sampling

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/mark3labs/mcp-go/mcp"
	openai "github.com/sashabaranov/go-openai"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/llm"
	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/store"
)

// Target is a live connector as sampling sees it.
type Target struct {
	Workspace, Name string // the connector's workspace and id, as callers name them (metric labels, messages)
	Model           string // the connector's own model; empty: Config.Model
	Sampling        *store.SamplingConfig
}

// Config configures a Sampler.
type Config struct {
	// Chat sends a request to the model (llm.Client.Chat); nil: no model
	// is configured, and every request is refused.
	Chat func(ctx context.Context, req openai.ChatCompletionRequest) (openai.ChatCompletionResponse, error)
	// Timeout bounds one model request (a stdio server's request has no
	// deadline of its own); default 2 minutes.
	Timeout time.Duration
	// Model is the default model (LLM_MODEL); a connector's own wins.
	Model string
	// Connector returns live connector id; false if there is none.
	Connector func(id int64) (Target, bool)
	// Minutes counts the per-minute budgets over all replicas; nil: no
	// per-minute budgets.
	Minutes MinuteStore
	// Defaults are the limits of a connector that sets none; its zeros
	// are DefaultLimits'.
	Defaults Limits
	// OnUsage is told of every request, served or refused (the
	// connector's counters).
	OnUsage func(id int64, rec ask.SamplingRecord)
	// MeterProvider records the metrics (see metrics.go); TracerProvider
	// makes an llm.sampling span per request. nil: none.
	MeterProvider  metric.MeterProvider
	TracerProvider trace.TracerProvider
	Logger         *slog.Logger
	// Now is the clock of the per-minute budgets; default time.Now.
	Now func() time.Time
}

// Sampler answers sampling requests. Safe for concurrent use.
type Sampler struct {
	cfg      Config
	defaults Limits
	log      *slog.Logger
	tracer   trace.Tracer
	metrics  instruments
}

// New returns a Sampler.
func New(cfg Config) *Sampler {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Minute
	}
	tp := cfg.TracerProvider
	if tp == nil {
		tp = tracenoop.NewTracerProvider()
	}
	return &Sampler{cfg: cfg, defaults: cfg.Defaults.or(DefaultLimits), log: cfg.Logger,
		tracer: tp.Tracer("github.com/connector-svc/connector-svc/internal/sampling"), metrics: newInstruments(cfg.MeterProvider)}
}

// Outcomes of a request, as Error and the metrics name them.
const (
	OutcomeServed   = "served"
	OutcomeRefused  = "refused"  // the connector is unknown or does not sample
	OutcomeInvalid  = "invalid"  // the request's shape
	OutcomeBudget   = "budget"   // over a budget
	OutcomeDeclined = "declined" // the user declined (policy approve)
	OutcomeFailed   = "failed"   // the model failed, or the budgets could not be checked
)

// Error is why a request was not served: a message fit for the server
// (no secrets, no prompt), the JSON-RPC code MCP gives such an error
// (-32602 for a malformed request, -1 for the user's refusal) and the
// outcome. mcp-go answers every handler error with -32603 and this
// message; a transport that can send the code may use it.
type Error struct {
	Code    int
	Outcome string
	Msg     string
	err     error // wrapped: ask.ErrBudget, a context's error
}

func (e *Error) Error() string { return e.Msg }
func (e *Error) Unwrap() error { return e.err }

// CodeUserRejected is MCP's code for a sampling request the user
// rejected.
const CodeUserRejected = -1

// Sample answers connector id's server's sampling request, made during
// call, whose caller is a (nil: nobody; then only the connector's budgets
// apply and policy approve refuses). Errors are *Error, or a context's
// error when ctx ended.
func (s *Sampler) Sample(ctx context.Context, id int64, a ask.Asker, call ask.Call, req mcp.CreateMessageRequest) (res *mcp.CreateMessageResult, err error) {
	start := time.Now()
	t, known := s.cfg.Connector(id)
	ctx, span := s.tracer.Start(ctx, "llm.sampling", trace.WithAttributes(attribute.String("connector", t.Name),
		attribute.Int("llm.messages", len(req.Messages))))
	defer span.End()
	rec := ask.SamplingRecord{Messages: len(req.Messages)}
	defer func() { s.record(ctx, span, id, t, a, call, &rec, time.Since(start), err) }()

	if err := s.accepts(id, t, known); err != nil {
		return nil, err
	}
	lim := s.Limits(t.Sampling)
	rec.Model = s.model(t)
	creq, names, err := chatRequest(req, rec.Model)
	if err != nil {
		return nil, err
	}
	if req.MaxTokens <= 0 {
		return nil, invalidf("maxTokens must be positive")
	}
	// The run's budget, then the connector's minute: nothing goes to the
	// model when either is spent.
	held, err := s.reserve(ctx, id, t, lim, a, min(req.MaxTokens, lim.MaxTokensPerRequest, lim.MaxTokensPerMinute))
	if err != nil {
		return nil, err
	}
	defer held.settle(ctx)
	creq.MaxTokens = held.tokens

	if t.Sampling.Policy == store.SamplingApprove {
		if err := s.approve(ctx, t, a, call, req, creq); err != nil {
			return nil, err
		}
	}
	return s.answer(ctx, creq, names, held, &rec)
}

// record tells the span, the log, the metrics, the caller and the
// connector's counters how a request ended: served, or why not.
func (s *Sampler) record(ctx context.Context, span trace.Span, id int64, t Target, a ask.Asker, call ask.Call,
	rec *ask.SamplingRecord, took time.Duration, err error) {
	rec.Duration = took
	outcome := OutcomeServed
	if err != nil {
		rec.Err = err.Error()
		outcome = OutcomeFailed
		var e *Error
		if errors.As(err, &e) {
			outcome = e.Outcome
		}
		span.SetStatus(codes.Error, rec.Err)
		s.log.Info("sampling request not served", "connector", t.Name, "connector_id", id, "tool", call.Tool,
			"outcome", outcome, "reason", rec.Err)
	}
	span.SetAttributes(attribute.String("outcome", outcome), attribute.Int64("llm.prompt_tokens", rec.PromptTokens),
		attribute.Int64("llm.completion_tokens", rec.CompletionTokens))
	s.metrics.record(ctx, t, outcome, *rec)
	if a != nil {
		a.Sampled(call, *rec)
	}
	if s.cfg.OnUsage != nil {
		s.cfg.OnUsage(id, *rec)
	}
}

// accepts refuses a request of a connector that is not known here, does
// not sample, or has no model to sample with.
func (s *Sampler) accepts(id int64, t Target, known bool) error {
	if !known {
		return &Error{Code: mcp.INVALID_REQUEST, Outcome: OutcomeRefused, Msg: fmt.Sprintf("sampling refused: connector %d is not known", id)}
	}
	if t.Sampling == nil || !t.Sampling.Enabled {
		return &Error{Code: mcp.INVALID_REQUEST, Outcome: OutcomeRefused, Msg: fmt.Sprintf("sampling refused: sampling is not enabled on connector %q", t.Name)}
	}
	if s.cfg.Chat == nil {
		return &Error{Code: mcp.INTERNAL_ERROR, Outcome: OutcomeRefused, Msg: "sampling refused: no model is configured"}
	}
	return nil
}

// model is the model that answers t's requests: its own, or the default.
func (s *Sampler) model(t Target) string {
	if t.Model != "" {
		return t.Model
	}
	return s.cfg.Model
}

// chatRequest is req as the chat API takes it, for model, without its
// maximum tokens (the budgets set it); names are the function names its
// tools got.
func chatRequest(req mcp.CreateMessageRequest, model string) (openai.ChatCompletionRequest, *functionNames, error) {
	creq := openai.ChatCompletionRequest{Model: model, Stop: req.StopSequences, Temperature: float32(req.Temperature)}
	names := newFunctionNames()
	var err error
	if creq.Messages, err = messages(req, names); err != nil {
		return creq, nil, err
	}
	var choice any
	if creq.Tools, choice, err = tools(req, names); err != nil {
		return creq, nil, err
	}
	if len(creq.Tools) > 0 {
		creq.ToolChoice = choice
	}
	return creq, names, nil
}

// answer sends creq to the model and makes its answer the server's
// result, counting the tokens it used in held and rec.
func (s *Sampler) answer(ctx context.Context, creq openai.ChatCompletionRequest, names *functionNames, held *reservation,
	rec *ask.SamplingRecord) (*mcp.CreateMessageResult, error) {
	resp, err := s.chat(ctx, creq)
	if err != nil {
		return nil, err
	}
	if len(resp.Choices) == 0 {
		return nil, &Error{Code: mcp.INTERNAL_ERROR, Outcome: OutcomeFailed, Msg: "sampling failed: the connector's model gave no answer"}
	}
	held.used = resp.Usage.TotalTokens
	if held.used == 0 {
		held.used = resp.Usage.PromptTokens + resp.Usage.CompletionTokens
	}
	rec.PromptTokens, rec.CompletionTokens = int64(resp.Usage.PromptTokens), int64(resp.Usage.CompletionTokens)
	res, uses, err := result(resp, creq.Model, len(creq.Tools) > 0, names)
	if err != nil {
		return nil, err
	}
	rec.Model, rec.StopReason, rec.ToolUses = res.Model, res.StopReason, uses
	if text, ok := firstText(res.Content); ok {
		rec.ResultExcerpt = excerpt(text, 200)
	}
	return res, nil
}

// chat sends creq to the model within the timeout.
func (s *Sampler) chat(ctx context.Context, creq openai.ChatCompletionRequest) (openai.ChatCompletionResponse, error) {
	cctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	resp, err := s.cfg.Chat(cctx, creq)
	if err == nil {
		return resp, nil
	}
	if ctx.Err() != nil {
		return resp, ctx.Err()
	}
	if cctx.Err() != nil {
		return resp, &Error{Code: mcp.INTERNAL_ERROR, Outcome: OutcomeFailed,
			Msg: fmt.Sprintf("sampling failed: the connector's model did not answer within %s", s.cfg.Timeout)}
	}
	return resp, modelError(err)
}

// approve puts the request to the user (policy approve) and says whether
// it may go to the model.
func (s *Sampler) approve(ctx context.Context, t Target, a ask.Asker, call ask.Call, req mcp.CreateMessageRequest, creq openai.ChatCompletionRequest) error {
	if a == nil {
		return &Error{Code: CodeUserRejected, Outcome: OutcomeDeclined,
			Msg: "sampling refused: the connector's sampling needs the user's approval, and nobody can approve it on this call"}
	}
	in := ask.Input{ID: inputID(), Mode: ask.ModeSampling, Sampling: summary(req, creq.MaxTokens),
		Message: fmt.Sprintf("The server of connector %q asks its model for a completion of up to %d tokens.", t.Name, creq.MaxTokens)}
	// The server waits on the open call: the answer must come while it
	// does (on streamable HTTP, mcp-go gives a request 30 s).
	if d, ok := ctx.Deadline(); ok {
		in.Deadline = d
	}
	ans, err := a.Elicit(ctx, call, in)
	switch {
	case err != nil && ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, ask.ErrNobodyToAsk):
		return &Error{Code: CodeUserRejected, Outcome: OutcomeDeclined,
			Msg: "sampling refused: the connector's sampling needs the user's approval, and nobody can approve it on this call"}
	case err != nil:
		return &Error{Code: CodeUserRejected, Outcome: OutcomeDeclined, Msg: "sampling refused: the user's approval could not be asked"}
	case ans.Action == ask.Decline:
		return &Error{Code: CodeUserRejected, Outcome: OutcomeDeclined, Msg: "the user declined the sampling request"}
	case ans.Action != ask.Accept && !in.Deadline.IsZero() && !time.Now().Before(in.Deadline):
		return &Error{Code: CodeUserRejected, Outcome: OutcomeDeclined,
			Msg: "sampling refused: nobody approved the request before its deadline"}
	case ans.Action != ask.Accept:
		return &Error{Code: CodeUserRejected, Outcome: OutcomeDeclined, Msg: "the user cancelled the sampling request"}
	}
	return nil
}

// inputID names an approval input: unique in its run, and in any other.
func inputID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "sampling_" + hex.EncodeToString(b[:])
}

// summary is the request as the user approving it sees it.
func summary(req mcp.CreateMessageRequest, maxTokens int) *ask.SamplingSummary {
	sum := &ask.SamplingSummary{SystemPrompt: excerpt(req.SystemPrompt, 2000), MaxTokens: maxTokens}
	for _, m := range req.Messages {
		bs, _ := blocks(m.Content)
		var parts []string
		for _, b := range bs {
			switch c := b.(type) {
			case mcp.TextContent:
				parts = append(parts, c.Text)
			case mcp.ImageContent:
				parts = append(parts, "[image "+c.MIMEType+"]")
			case mcp.ToolUseContent:
				parts = append(parts, "[uses tool "+c.Name+"]")
			case mcp.ToolResultContent:
				parts = append(parts, "[tool result] "+resultText(c))
			default:
				parts = append(parts, "["+contentType(b)+"]")
			}
		}
		sum.Messages = append(sum.Messages, string(m.Role)+": "+excerpt(strings.Join(parts, " "), 500))
	}
	if req.ToolChoice == nil || req.ToolChoice.Mode != mcp.ToolChoiceModeNone {
		for _, t := range req.Tools {
			sum.Tools = append(sum.Tools, t.Name)
		}
	}
	return sum
}

// modelError is the model's failure as the server is told it: the
// endpoint's status and message (llm.Error keeps keys out).
func modelError(err error) error {
	msg := "sampling failed: the connector's model failed"
	var le *llm.Error
	if errors.As(err, &le) {
		msg += ": " + le.Error()
	} else if errors.Is(err, llm.ErrNotConfigured) {
		msg = "sampling refused: no model is configured"
	} else {
		msg += ": " + secret.RedactText(err.Error())
	}
	return &Error{Code: mcp.INTERNAL_ERROR, Outcome: OutcomeFailed, Msg: msg}
}

func firstText(content any) (string, bool) {
	switch c := content.(type) {
	case mcp.TextContent:
		return c.Text, true
	case []mcp.Content:
		for _, b := range c {
			if t, ok := b.(mcp.TextContent); ok {
				return t.Text, true
			}
		}
	}
	return "", false
}

// excerpt is s cut to n runes at most, marked when cut.
func excerpt(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n]) + "…"
}
