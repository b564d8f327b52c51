package rpcmw

import (
	"context"
	"maps"
	"slices"

	grpcmw "github.com/grpc-ecosystem/go-grpc-middleware/v2"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	noopmetric "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// makesSpans reports whether tp makes spans: false for the no-op provider
// that telemetry.SetupTracing gives when traces are not exported.
func makesSpans(tp trace.TracerProvider) bool {
	_, off := tp.(noop.TracerProvider)
	return !off
}

// recordsMetrics reports whether mp records metrics: false for nil and the
// no-op provider that telemetry.NewMetrics gives when metrics are off.
func recordsMetrics(mp metric.MeterProvider) bool {
	_, off := mp.(noopmetric.MeterProvider)
	return mp != nil && !off
}

// continueTrace is what otelgrpc's server handler does for an RPC when no
// span is made: it puts the caller's trace context (W3C, by otel's global
// propagator) into the RPC's context, so that the log line carries the
// caller's trace id and the MCP servers called get its traceparent. It
// reads only the metadata the propagator asks for: a stats handler costs
// every RPC a copy of all its metadata, before any span.
type continueTrace struct{ prop propagation.TextMapPropagator }

func newContinueTrace() continueTrace { return continueTrace{prop: otel.GetTextMapPropagator()} }

func (t continueTrace) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	return next(t.prop.Extract(ctx, incomingCarrier{ctx}), req)
}

func (t continueTrace) stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, next grpc.StreamHandler) error {
	w := grpcmw.WrapServerStream(ss)
	w.WrappedContext = t.prop.Extract(w.WrappedContext, incomingCarrier{w.WrappedContext})
	return next(srv, w)
}

// incomingCarrier is the incoming metadata of ctx, read key by key.
type incomingCarrier struct{ ctx context.Context }

func (c incomingCarrier) Get(key string) string {
	if v := metadata.ValueFromIncomingContext(c.ctx, key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (incomingCarrier) Set(string, string) {}

func (c incomingCarrier) Keys() []string {
	md, _ := metadata.FromIncomingContext(c.ctx)
	return slices.Collect(maps.Keys(md))
}
