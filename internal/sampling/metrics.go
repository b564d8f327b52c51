package sampling

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/connector-svc/connector-svc/internal/ask"
)

// Metric names (Prometheus: connector_sampling_requests_total and
// connector_sampling_tokens_total).
const (
	metricRequests = "connector.sampling.requests"
	metricTokens   = "connector.sampling.tokens"
)

// instruments are the sampler's counters on a meter provider (nil:
// no-op), labelled with the connector as callers name it and the outcome
// or the kind of token: never the prompt.
type instruments struct {
	requests metric.Int64Counter
	tokens   metric.Int64Counter
}

func newInstruments(mp metric.MeterProvider) instruments {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	m := mp.Meter("github.com/connector-svc/connector-svc/internal/sampling")
	var in instruments
	in.requests, _ = m.Int64Counter(metricRequests, metric.WithUnit("{request}"),
		metric.WithDescription("Sampling requests of connectors' servers, by outcome: served, refused, invalid, budget, declined or failed."))
	in.tokens, _ = m.Int64Counter(metricTokens, metric.WithUnit("{token}"),
		metric.WithDescription("Tokens the connector's model used to answer sampling requests, by kind: prompt or completion."))
	return in
}

func (in instruments) record(ctx context.Context, t Target, outcome string, rec ask.SamplingRecord) {
	ws, conn := attribute.String("workspace", t.Workspace), attribute.String("connector", t.Name)
	in.requests.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(ws, conn, attribute.String("outcome", outcome))))
	if rec.PromptTokens > 0 {
		in.tokens.Add(ctx, rec.PromptTokens, metric.WithAttributeSet(attribute.NewSet(ws, conn, attribute.String("kind", "prompt"))))
	}
	if rec.CompletionTokens > 0 {
		in.tokens.Add(ctx, rec.CompletionTokens, metric.WithAttributeSet(attribute.NewSet(ws, conn, attribute.String("kind", "completion"))))
	}
}
