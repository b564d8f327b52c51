package orchestrator

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// counters are the agent's instruments on a meter provider (nil: no-op),
// labelled with the connector as callers name it and, for queries, how the
// run ended: never the query. The names are constants, checked by the
// tests; the SDK returns a working instrument with any error.
type counters struct {
	queries   metric.Int64Counter
	narrowed  metric.Int64Counter
	searches  metric.Int64Counter
	decisions metric.Int64Counter
}

func newCounters(mp metric.MeterProvider) counters {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	m := mp.Meter("github.com/connector-svc/connector-svc/internal/orchestrator")
	var c counters
	c.queries, _ = m.Int64Counter("connector.queries", metric.WithUnit("{query}"),
		metric.WithDescription("Query runs and resumes of paused runs, by how they ended: completed, budget_exhausted, planned, "+
			"awaiting_approval, awaiting_authorization, awaiting_input, timeout, canceled or failed."))
	c.narrowed, _ = m.Int64Counter("connector.queries.narrowed", metric.WithUnit("{query}"),
		metric.WithDescription("Query runs that offered the model a selection of the connector's tools, not all of them."))
	c.searches, _ = m.Int64Counter("connector.search_tools.calls", metric.WithUnit("{call}"),
		metric.WithDescription("Calls of the search_tools meta-tool by the model, in narrowed runs."))
	c.decisions, _ = m.Int64Counter("connector.approval.decisions", metric.WithUnit("{call}"),
		metric.WithDescription("People's decisions about calls that waited for approval, by decision: approve, approve_edited or deny."))
	return c
}

func connectorAttrs(c *Connector) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(attribute.String("workspace", c.WorkspaceID), attribute.String("connector", c.ExternalID)))
}

// countQuery counts a run for c that ended with res or err.
func (a *Agent) countQuery(ctx context.Context, c *Connector, res *Result, err error) {
	a.counters.queries.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(attribute.String("workspace", c.WorkspaceID),
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
	case StatusAwaitingApproval:
		return "awaiting_approval"
	case StatusAwaitingAuthorization:
		return "awaiting_authorization"
	case StatusAwaitingInput:
		return "awaiting_input"
	}
	return "failed"
}
