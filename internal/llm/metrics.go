package llm

import (
	"context"
	"errors"
	"strconv"
	"time"

	openai "github.com/sashabaranov/go-openai"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// metrics are the client's instruments, labelled with the model (the
// operator's default or a connector's override): never the prompt.
type metrics struct {
	requests metric.Int64Counter
	errors   metric.Int64Counter
	duration metric.Float64Histogram
	tokens   metric.Int64Counter
	retries  metric.Int64Counter
}

// requestBuckets are the bounds, in seconds, of the request duration
// histogram: a model answers in a second or in minutes.
var requestBuckets = []float64{0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300}

// newMetrics makes the instruments on mp (nil: no-op), with the requests
// and retries of model (the default one) at 0. The names are constants,
// checked by the tests; the SDK returns a working instrument with any
// error.
func newMetrics(mp metric.MeterProvider, model string) *metrics {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	m := mp.Meter("github.com/connector-svc/connector-svc/internal/llm")
	var x metrics
	x.requests, _ = m.Int64Counter("connector.llm.requests", metric.WithUnit("{request}"),
		metric.WithDescription("Chat completion requests, each counted once however often it was retried."))
	x.errors, _ = m.Int64Counter("connector.llm.request.errors", metric.WithUnit("{request}"),
		metric.WithDescription("Chat completion requests that failed, by status: the HTTP status, unreachable, timeout or canceled."))
	x.duration, _ = m.Float64Histogram("connector.llm.request.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of chat completion requests, retries included."),
		metric.WithExplicitBucketBoundaries(requestBuckets...))
	x.tokens, _ = m.Int64Counter("connector.llm.tokens", metric.WithUnit("{token}"),
		metric.WithDescription("Tokens the endpoint reported, by type: input (prompt) or output (completion)."))
	x.retries, _ = m.Int64Counter("connector.llm.retries", metric.WithUnit("{request}"),
		metric.WithDescription("Requests to the endpoint sent again, by the status of the answer retried: 429, a 5xx, or unreachable."))
	zero := metric.WithAttributeSet(attribute.NewSet(attribute.String("model", model)))
	x.requests.Add(context.Background(), 0, zero)
	x.retries.Add(context.Background(), 0, zero)
	return &x
}

// modelKey is the context key of the model a request is for.
type modelKey struct{}

// retried counts a retry of a request made under ctx (see withModel)
// whose answer was status (0: unreachable).
func (x *metrics) retried(ctx context.Context, status int) {
	model, _ := ctx.Value(modelKey{}).(string)
	label := "unreachable"
	if status != 0 {
		label = strconv.Itoa(status)
	}
	x.retries.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(attribute.String("model", model), attribute.String("status", label))))
}

// withModel tells the retrying HTTP client which model ctx's request is
// for: it sees only the HTTP request.
func withModel(ctx context.Context, model string) context.Context {
	return context.WithValue(ctx, modelKey{}, model)
}

// record records one request for model that started at start.
func (x *metrics) record(ctx context.Context, model string, start time.Time, resp openai.ChatCompletionResponse, err error) {
	m := attribute.String("model", model)
	set := metric.WithAttributeSet(attribute.NewSet(m))
	x.requests.Add(ctx, 1, set)
	x.duration.Record(ctx, time.Since(start).Seconds(), set)
	if in := resp.Usage.PromptTokens; in > 0 {
		x.tokens.Add(ctx, int64(in), metric.WithAttributeSet(attribute.NewSet(m, attribute.String("type", "input"))))
	}
	if out := resp.Usage.CompletionTokens; out > 0 {
		x.tokens.Add(ctx, int64(out), metric.WithAttributeSet(attribute.NewSet(m, attribute.String("type", "output"))))
	}
	if err != nil {
		x.errors.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(m, attribute.String("status", errorStatus(err)))))
	}
}

// errorStatus is the status label of a failed request.
func errorStatus(err error) string {
	var e *Error
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.As(err, &e) && e.Status != 0:
		return strconv.Itoa(e.Status)
	}
	return "unreachable"
}
