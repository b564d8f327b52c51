package server_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace/noop"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/server"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
	"github.com/connector-svc/connector-svc/internal/telemetry"
)

// BenchmarkRPCMetrics measures what the RPC metrics (otelgrpc's handler
// recording rpc.server.call.duration on the Prometheus meter provider) add
// to a call: two services, without and with a MeterProvider, no traces,
// called in turn. CloseSession of a session no connector has stays in
// memory, so it shows the cost at its most visible.
func BenchmarkRPCMetrics(b *testing.B) {
	meters, err := telemetry.NewMetrics(context.Background(), telemetry.MetricsConfig{Exporters: []string{telemetry.ExporterPrometheus}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = meters.Shutdown(context.Background()) })
	serve := func(mp metric.MeterProvider) connectorv1.ConnectorServiceClient {
		db := storetest.NewDB(b)
		src := live.NewSource(db, nil, nil)
		reg := registry.New(src, registry.Config{}, nil)
		g, hs := server.NewGRPCServer(server.New(server.Deps{DB: db, Registry: reg, Live: live.New(db, src, reg, nil, live.Config{}),
			TracerProvider: noop.NewTracerProvider(),
			MeterProvider:  mp}, server.Config{}))
		server.SetServing(hs, true)
		return connectorv1.NewConnectorServiceClient(serveLoopback(b, g))
	}
	off, on := serve(nil), serve(meters.MeterProvider())
	req := &connectorv1.CloseSessionRequest{WorkspaceId: "ws", SessionId: "nobody"}
	call := func(c connectorv1.ConnectorServiceClient) func() error {
		return func() error {
			_, err := c.CloseSession(context.Background(), req)
			return err
		}
	}
	latOff, latOn := inTurn(b, call(off), call(on))
	b.ReportMetric(float64(latOff[len(latOff)/2].Nanoseconds())/1e3, "p50-off-µs")
	b.ReportMetric(float64(latOn[len(latOn)/2].Nanoseconds())/1e3, "p50-metrics-µs")
	b.ReportMetric(float64(latOff[len(latOff)*99/100].Nanoseconds())/1e3, "p99-off-µs")
	b.ReportMetric(float64(latOn[len(latOn)*99/100].Nanoseconds())/1e3, "p99-metrics-µs")
}
