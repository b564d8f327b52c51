package telemetry

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Tracing is the service's tracer provider and how to flush it.
type Tracing struct {
	// Provider makes the service's spans: a no-op one when traces are not
	// exported. Pass it to whatever makes spans.
	Provider trace.TracerProvider
	// Exporter is the OTEL_TRACES_EXPORTER in effect, "none" by default.
	Exporter string
	shutdown func(context.Context) error
}

// TraceExporters are the values OTEL_TRACES_EXPORTER takes: the span
// exporters autoexport registers (console writes spans to stdout, as
// JSON, between the log lines).
func TraceExporters() []string { return []string{"otlp", "console", "none"} }

// TracingConfig is what the service's own settings say of traces: the
// standard variables, read by the caller's configuration.
type TracingConfig struct {
	// Exporter is OTEL_TRACES_EXPORTER: otlp, console or none; none when
	// empty, unlike the SDK's own default.
	Exporter string
	// Protocol is OTEL_EXPORTER_OTLP_PROTOCOL, named in errors.
	Protocol string
	// Disabled is OTEL_SDK_DISABLED=true: nothing is exported.
	Disabled bool
}

// SetupTracing builds the tracer provider cfg asks for. Called without a
// cfg (benchmarks of other packages do), it leaves the choice to
// autoexport's reading of the process environment, and Exporter says
// "environment" unless that chose none. With traces on, the
// exporter is built by the OpenTelemetry SDK's autoexport, which reads the
// standard variables from the process environment itself, with no way to
// pass them in: OTEL_TRACES_EXPORTER (the same value as cfg.Exporter, as
// main reads the process environment), OTEL_EXPORTER_OTLP_PROTOCOL
// (http/protobuf, the default, or grpc), OTEL_EXPORTER_OTLP_ENDPOINT and
// the other OTEL_EXPORTER_OTLP_* settings, OTEL_TRACES_SAMPLER, OTEL_BSP_*,
// OTEL_SERVICE_NAME (connector-svc by default) and
// OTEL_RESOURCE_ATTRIBUTES. That is the one place the service's settings
// are read outside its configuration. The resource has no process
// attributes: a command line may carry secrets.
//
// It sets otel's global propagator to W3C trace context and baggage, so
// that a caller's trace continues here. It leaves otel's global tracer
// provider alone: pass Provider to what makes spans.
//
// Shutdown flushes the spans still buffered.
func SetupTracing(ctx context.Context, cfgs ...TracingConfig) (*Tracing, error) {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	cfg := TracingConfig{Exporter: "environment"}
	if len(cfgs) > 0 {
		cfg = cfgs[0]
	}
	if cfg.Disabled || cfg.Exporter == "" || cfg.Exporter == "none" {
		return &Tracing{Provider: noop.NewTracerProvider(), Exporter: "none"}, nil
	}
	unset := false
	exp, err := autoexport.NewSpanExporter(ctx, autoexport.WithFallbackSpanExporter(
		func(context.Context) (sdktrace.SpanExporter, error) {
			unset = true
			return nil, nil
		}))
	if err != nil {
		return nil, fmt.Errorf("traces exporter (OTEL_TRACES_EXPORTER %q, OTEL_EXPORTER_OTLP_PROTOCOL %q): %w; want one of %s, and %s or %s",
			cfg.Exporter, cfg.Protocol, err,
			strings.Join(TraceExporters(), ", "), ProtocolHTTP, ProtocolGRPC)
	}
	if unset || autoexport.IsNoneSpanExporter(exp) {
		return &Tracing{Provider: noop.NewTracerProvider(), Exporter: "none"}, nil
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "connector-svc")),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv())
	if err != nil {
		_ = exp.Shutdown(ctx)
		return nil, fmt.Errorf("OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &Tracing{Provider: tp, Exporter: cfg.Exporter, shutdown: tp.Shutdown}, nil
}

// Shutdown exports the spans still buffered, within ctx, and stops the
// provider. Safe to call more than once.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t.shutdown == nil {
		return nil
	}
	if err := t.shutdown(ctx); err != nil {
		return fmt.Errorf("flush traces: %w", err)
	}
	return nil
}

// Traceparent returns next sending the W3C trace context of each request's
// context (traceparent, tracestate) to the server, so that its spans join
// the caller's trace. It sends no baggage: the servers the service calls
// (MCP servers, the LLM) are not the caller's to tell. It makes no span:
// the caller's own span (a tool call, a model call) stands for the
// request, and HTTP client spans would record URLs, whose query values may
// be secrets. A nil next means http.DefaultTransport.
func Traceparent(next http.RoundTripper) http.RoundTripper {
	if next == nil {
		next = http.DefaultTransport
	}
	return traceparent{next: next}
}

type traceparent struct{ next http.RoundTripper }

func (t traceparent) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return t.next.RoundTrip(req)
	}
	req = req.Clone(ctx) // a RoundTripper must not change the request it was given
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(req.Header))
	return t.next.RoundTrip(req)
}
