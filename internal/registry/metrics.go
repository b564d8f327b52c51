package registry

import (
	"context"
	"errors"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
)

// metrics are the registry's instruments. Every series is labelled with
// the connector as callers name it (workspace, connector) and, for calls,
// the tool, whose names come from the server's catalog: calls of tools it
// does not list are refused before they count. No arguments, no session
// ids.
type metrics struct {
	calls       metric.Int64Counter
	callErrors  metric.Int64Counter
	callTime    metric.Float64Histogram
	reconnects  metric.Int64Counter
	reinits     metric.Int64Counter
	connectErrs metric.Int64Counter
	processes   metric.Int64UpDownCounter
	// serverRefused counts server requests answered with an error
	// because the transport cannot carry them (legacy SSE).
	serverRefused metric.Int64Counter
	state         metric.Int64ObservableGauge
	sessions      metric.Int64ObservableGauge
	gauges        metric.Registration // the gauges' callback
	// zeroStates label the state gauge's zeros: each state, no connector.
	zeroStates []metric.ObserveOption
}

// callBuckets are the bounds, in seconds, of the call duration histogram:
// a local server answers in a millisecond, a remote one in seconds.
var callBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// newMetrics makes the instruments on mp (nil: no-op), and the callback
// of the gauges, which reads the connectors r holds. The names are
// constants, checked by the tests; the SDK returns a working instrument
// with any error, so metrics never stop the registry.
func newMetrics(mp metric.MeterProvider, r *Registry) *metrics {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	m := mp.Meter("github.com/connector-svc/connector-svc/internal/registry")
	var x metrics
	x.calls, _ = m.Int64Counter("connector.tool.calls", metric.WithUnit("{call}"),
		metric.WithDescription("Tool calls that ran, or tried to, on a connector."))
	x.callErrors, _ = m.Int64Counter("connector.tool.call.errors", metric.WithUnit("{call}"),
		metric.WithDescription("Tool calls that failed, by kind: tool (the server answered isError), unavailable, timeout, canceled, other."))
	x.callTime, _ = m.Float64Histogram("connector.tool.call.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of tool calls, waits for a connect and retries included."),
		metric.WithExplicitBucketBoundaries(callBuckets...))
	x.reconnects, _ = m.Int64Counter("connector.reconnects", metric.WithUnit("{connect}"),
		metric.WithDescription("New connections made after the first one of a connector."))
	x.reinits, _ = m.Int64Counter("connector.reinitializations", metric.WithUnit("{handshake}"),
		metric.WithDescription("MCP sessions re-initialized on the same client after the server forgot them."))
	x.connectErrs, _ = m.Int64Counter("connector.connect.errors", metric.WithUnit("{connect}"),
		metric.WithDescription("Connects of a connector that failed."))
	x.processes, _ = m.Int64UpDownCounter("connector.stdio.processes", metric.WithUnit("{process}"),
		metric.WithDescription("stdio server processes started and not yet reaped."))
	x.serverRefused, _ = m.Int64Counter("connector.server_requests.refused", metric.WithUnit("{request}"),
		metric.WithDescription("Requests a connector's server sent (elicitation, sampling, ...) that its transport cannot carry "+
			"(legacy SSE), answered at once with an error; by method."))
	x.state, _ = m.Int64ObservableGauge("connector.state",
		metric.WithDescription("1 for each connector held, labelled with its state: connecting, ready, degraded or error; "+
			"and 0 for each state without a connector label, so that every state is present before the first connector."))
	x.sessions, _ = m.Int64ObservableGauge("connector.sessions.open", metric.WithUnit("{session}"),
		metric.WithDescription("Open per-session connections of a per_session connector."))
	for _, s := range []State{StateConnecting, StateReady, StateDegraded, StateError} {
		x.zeroStates = append(x.zeroStates, metric.WithAttributeSet(attribute.NewSet(attribute.String("state", string(s)))))
	}
	x.gauges, _ = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, zero := range x.zeroStates {
			o.ObserveInt64(x.state, 0, zero)
		}
		for _, c := range r.snapshot() {
			c.mu.Lock()
			state, sessions := c.health.State, len(c.sessions)
			c.mu.Unlock()
			o.ObserveInt64(x.state, 1, metric.WithAttributeSet(labels(c.spec, attribute.String("state", string(state)))))
			if c.spec.ownConnections() {
				o.ObserveInt64(x.sessions, int64(sessions), metric.WithAttributeSet(labels(c.spec)))
			}
		}
		return nil
	}, x.state, x.sessions)
	x.startTotals()
	return &x
}

// startTotals creates each counter at zero without connector labels, so
// that a dashboard or an alert on a fresh service reads 0, not nothing.
func (x *metrics) startTotals() {
	ctx := context.Background()
	for _, c := range []metric.Int64Counter{x.calls, x.callErrors, x.reconnects, x.reinits, x.connectErrs, x.serverRefused} {
		c.Add(ctx, 0)
	}
	x.processes.Add(ctx, 0)
}

// stop unregisters the gauges' callback.
func (x *metrics) stop() {
	if x.gauges != nil {
		_ = x.gauges.Unregister()
	}
}

// labels are the attributes of spec's connector, and more.
func labels(spec Spec, more ...attribute.KeyValue) attribute.Set {
	return attribute.NewSet(append([]attribute.KeyValue{
		attribute.String("workspace", spec.WorkspaceID), attribute.String("connector", spec.ConnectorID)}, more...)...)
}

// startCounters creates c's counters at zero, so that a dashboard shows a
// connector that never reconnected as 0, not as missing.
func (x *metrics) startCounters(c *conn) {
	ctx, set := context.Background(), metric.WithAttributeSet(labels(c.spec))
	x.reconnects.Add(ctx, 0, set)
	x.reinits.Add(ctx, 0, set)
	x.connectErrs.Add(ctx, 0, set)
	if c.spec.Transport == TransportStdio {
		x.processes.Add(ctx, 0, set)
	}
}

// called records a tool call of c that took d.
func (x *metrics) called(ctx context.Context, c *conn, tool string, d time.Duration, res *mcp.CallToolResult, err error) {
	o := c.toolLabels(tool)
	x.calls.Add(ctx, 1, o.add...)
	x.callTime.Record(ctx, d.Seconds(), o.record...)
	if kind := errorKind(ctx, res, err); kind != "" {
		x.callErrors.Add(ctx, 1, metric.WithAttributeSet(labels(c.spec, attribute.String("tool", tool), attribute.String("kind", kind))))
	}
}

// callOptions are the attributes of a connector's calls of one tool, as
// the options of each instrument and of the call's span.
type callOptions struct {
	add    []metric.AddOption
	record []metric.RecordOption
	span   []trace.SpanStartOption
}

// toolLabels are the attributes of c's calls of tool, made once per tool
// of its catalog: a call then allocates nothing for them.
func (c *conn) toolLabels(tool string) *callOptions {
	if o, ok := c.callLabels.Load(tool); ok {
		return o.(*callOptions)
	}
	opt := metric.WithAttributeSet(labels(c.spec, attribute.String("tool", tool)))
	o, _ := c.callLabels.LoadOrStore(tool, &callOptions{add: []metric.AddOption{opt}, record: []metric.RecordOption{opt},
		span: c.callSpanOptions(tool)})
	return o.(*callOptions)
}

// errorKind is the kind label of a failed call made under ctx; "" if it
// did not fail (a call that ended awaiting the user's input has not). A call that ended by its deadline is a timeout even when
// the service saw the caller's cancel first (see EndedByDeadline), as the
// caller got DEADLINE_EXCEEDED.
func errorKind(ctx context.Context, res *mcp.CallToolResult, err error) string {
	switch {
	case err == nil && res != nil && res.IsError:
		return "tool"
	case err == nil, awaitsInput(err):
		return ""
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled) && EndedByDeadline(ctx):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, ErrUnavailable), errors.Is(err, ErrNotLoaded), errors.Is(err, ErrClosed):
		return "unavailable"
	}
	return "other"
}

// count adds one to a counter of c.
func (x *metrics) count(counter metric.Int64Counter, c *conn) {
	counter.Add(context.Background(), 1, metric.WithAttributeSet(labels(c.spec)))
}

// processStarted counts a stdio process of spec about to start; call the
// function it returns once the process is reaped, or failed to start.
func (x *metrics) processStarted(spec Spec) func() {
	set := metric.WithAttributeSet(labels(spec))
	x.processes.Add(context.Background(), 1, set)
	return func() { x.processes.Add(context.Background(), -1, set) }
}
