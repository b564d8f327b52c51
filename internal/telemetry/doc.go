// Package telemetry is the service's OpenTelemetry set-up and its admin
// HTTP listener. It imports no other package of the service, so that any
// of them may use it.
//   - metrics.go and admin.go: the meter provider built from
//     OTEL_METRICS_EXPORTER (Prometheus, OTLP or none), and /metrics,
//     /healthz, /readyz and, when switched on, pprof on the admin address.
//     The packages that record metrics take a metric.MeterProvider and know
//     nothing of exporters.
//   - traces.go: the tracer provider from OTEL_TRACES_EXPORTER and the
//     standard OTEL_* environment (SetupTracing), and the W3C trace context
//     sent to the HTTP servers the service calls (Traceparent). The
//     packages that make spans take a trace.TracerProvider.
//
// Every exporter also gets the Go runtime's and the process's metrics,
// from Prometheus's own collectors (go_*, process_*: bridged into OTLP),
// and connector_svc.build_info. The gRPC server has one otelgrpc stats
// handler (server.NewGRPCServer), for its spans and its RPC metrics
// (rpc.server.call.duration by method and status code), not a second one.
package telemetry
