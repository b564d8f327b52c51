package orchestrator

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// newQueries makes the counter of runs on mp (nil: no-op), labelled with
// the connector as callers name it and how the run ended: never the query.
// The name is a constant, checked by the tests; the SDK returns a working
// instrument with any error.
func newQueries(mp metric.MeterProvider) metric.Int64Counter {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	c, _ := mp.Meter("github.com/connector-svc/connector-svc/internal/orchestrator").Int64Counter("connector.queries",
		metric.WithUnit("{query}"),
		metric.WithDescription("Query runs, by status: completed, budget_exhausted, planned, timeout, canceled or failed."))
	return c
}

// countQuery counts a run for c that ended with res or err.
func (a *Agent) countQuery(ctx context.Context, c *Connector, res *Result, err error) {
	a.queries.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(attribute.String("workspace", c.WorkspaceID),
		attribute.String("connector", c.ExternalID), attribute.String("status", runStatus(res, err)))))
}

// runStatus is the status label of a run.
func runStatus(res *Result, err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case err != nil || res == nil:
		return "failed"
	}
	switch res.Status {
	case StatusCompleted:
		return "completed"
	case StatusBudgetExhausted:
		return "budget_exhausted"
	case StatusPlanned:
		return "planned"
	}
	return "failed"
}
