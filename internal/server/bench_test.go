package server_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/benchgoal"
	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/llm"
	"github.com/connector-svc/connector-svc/internal/mcptest"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/server"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
	"github.com/connector-svc/connector-svc/internal/telemetry"
	"github.com/connector-svc/connector-svc/internal/telemetry/telemetrytest"
)

// BenchmarkCallToolServiceWork measures what the service itself adds to a
// CallTool. In turn, against the same upstream mcp-go streamable-HTTP
// server, it times (a) a bare grpc-go round trip: a trivial service that
// answers a CallTool-sized request with the response CallTool gives, over
// loopback TCP without credentials, like the service here; (b) the direct
// mcp-go call of the tool, on the protocol generation the service
// negotiated; (c) CallTool through the service as it runs in production:
// auth on with a key, default telemetry (no traces exported, Prometheus
// metrics), JSON logs. The service's own work is (c) - (a) - (b) at p50,
// and the goal is its share of (a) + (b).
func BenchmarkCallToolServiceWork(b *testing.B) {
	srv := newTestMCP(b)
	svc := serveInProduction(b)
	ctx := svc.ctx
	if _, err := svc.client.CreateConnector(ctx, &connectorv1.CreateConnectorRequest{WorkspaceId: "ws",
		Connector: mcpConnector("m", srv.url())}); err != nil {
		b.Fatal(err)
	}
	args, _ := structpb.NewStruct(map[string]any{"text": "hi"})
	req := &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: "m", ToolName: "echo", Arguments: args}
	waitCallable(b, svc.client, ctx, req)
	resp, err := svc.client.CallTool(ctx, req)
	if err != nil {
		b.Fatal(err)
	}
	got, err := svc.client.GetConnector(ctx, &connectorv1.GetConnectorRequest{WorkspaceId: "ws", ConnectorId: "m"})
	if err != nil {
		b.Fatal(err)
	}
	version := got.GetConnector().GetHealth().GetProtocolVersion()
	echo := serveEcho(b, resp)
	direct := directCaller(b, srv.url(), version)

	lat := inTurnN(b, func() error { return echo(req) }, direct, func() error {
		_, err := svc.client.CallTool(ctx, req)
		return err
	})
	p50 := func(l []time.Duration) float64 { return float64(l[len(l)/2].Nanoseconds()) / 1e3 }
	b.ReportMetric(p50(lat[0]), "p50-grpc-echo-µs")
	b.ReportMetric(p50(lat[1]), "p50-direct-µs")
	b.ReportMetric(p50(lat[2]), "p50-service-µs")
	b.Logf("protocol %s: p50 grpc echo %.1f µs, direct mcp-go %.1f µs, CallTool %.1f µs", version,
		p50(lat[0]), p50(lat[1]), p50(lat[2]))
	work := p50(lat[2]) - p50(lat[0]) - p50(lat[1])
	b.ReportMetric(work, "service-µs")
	// As a share of the parts, measured in the same run: absolute times
	// move with the machine's load, the share much less.
	benchgoal.Report(b, "calltool-service-work-share-p50", work/(p50(lat[0])+p50(lat[1])), "of-echo+direct", benchgoal.AtMost, 0.25)
}

// BenchmarkProtocolGenerations compares the two protocol generations
// against one upstream that offers both, in turn: direct mcp-go calls
// with the classic handshake (2025-11-25) and sessionless (2026-07-28), and
// CallTool through the service on a connector preferring each.
func BenchmarkProtocolGenerations(b *testing.B) {
	srv := newTestMCP(b)
	svc := serveInProduction(b)
	args, _ := structpb.NewStruct(map[string]any{"text": "hi"})
	service := func(pref connectorv1.ProtocolPreference) func() error {
		id := strings.ToLower(strings.TrimPrefix(pref.String(), "PROTOCOL_PREFERENCE_"))
		c := mcpConnector(id, srv.url())
		c.ProtocolPreference = pref
		if _, err := svc.client.CreateConnector(svc.ctx, &connectorv1.CreateConnectorRequest{WorkspaceId: "ws", Connector: c}); err != nil {
			b.Fatal(err)
		}
		req := &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: id, ToolName: "echo", Arguments: args}
		waitCallable(b, svc.client, svc.ctx, req)
		return func() error {
			_, err := svc.client.CallTool(svc.ctx, req)
			return err
		}
	}
	lat := inTurnN(b,
		directCaller(b, srv.url(), mcp.ProtocolVersion20251125),
		directCaller(b, srv.url(), mcp.ProtocolVersion20260728),
		service(connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_CLASSIC),
		service(connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_SESSIONLESS))
	p50 := make([]float64, len(lat))
	for i, l := range lat {
		p50[i] = float64(l[len(l)/2].Nanoseconds()) / 1e3
	}
	b.ReportMetric(p50[0], "p50-direct-classic-µs")
	b.ReportMetric(p50[1], "p50-direct-sessionless-µs")
	b.ReportMetric(p50[2], "p50-service-classic-µs")
	b.ReportMetric(p50[3], "p50-service-sessionless-µs")
	b.ReportMetric(p50[1]/p50[0], "direct-sessionless/classic")
	b.ReportMetric(p50[2]/p50[0], "service/direct-classic")
	b.ReportMetric(p50[3]/p50[1], "service/direct-sessionless")
}

// directCaller returns a call of the echo tool on an mcp-go client of its
// own, initialized at version (the classic handshake for a version before
// 2026-07-28).
func directCaller(b *testing.B, url, version string) func() error {
	ctx := context.Background()
	c, err := mcptest.Dial(ctx, url, version, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	var req mcp.CallToolRequest
	req.Params.Name = "echo"
	req.Params.Arguments = map[string]any{"text": "hi"}
	return func() error {
		_, err := c.CallTool(ctx, req)
		return err
	}
}

// serveEcho serves a bare gRPC service on loopback TCP, without
// interceptors or stats handlers, whose one method takes a CallToolRequest
// and answers resp; it returns a call of it.
func serveEcho(b *testing.B, resp *connectorv1.CallToolResponse) func(*connectorv1.CallToolRequest) error {
	g := grpc.NewServer()
	g.RegisterService(&grpc.ServiceDesc{
		ServiceName: "bench.Echo",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Call",
			Handler: func(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
				if err := dec(new(connectorv1.CallToolRequest)); err != nil {
					return nil, err
				}
				return resp, nil
			}}},
	}, struct{}{})
	conn := serveLoopback(b, g)
	return func(req *connectorv1.CallToolRequest) error {
		return conn.Invoke(context.Background(), "/bench.Echo/Call", req, new(connectorv1.CallToolResponse))
	}
}

// serveLoopback serves g on a loopback TCP port, as the service listens
// without TLS, and returns a client connection to it.
func serveLoopback(b *testing.B, g *grpc.Server) *grpc.ClientConn {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = g.Serve(lis) }()
	b.Cleanup(g.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return conn
}

// production is the service as main runs it, on a loopback port, and a
// client with a context that carries an API key of workspace "ws".
type production struct {
	client connectorv1.ConnectorServiceClient
	ctx    context.Context
}

// serveInProduction runs the whole service as main wires it by default:
// AUTH=keys, tracing from telemetry.SetupTracing with no OTEL_* settings
// (nothing exported), the Prometheus meter provider, JSON logs at info
// level through the redacting handler (to io.Discard: formatted, not
// written).
func serveInProduction(b *testing.B) production {
	ctx := context.Background()
	tracing, err := telemetry.SetupTracing(ctx)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = tracing.Shutdown(context.Background()) })
	meters, err := telemetry.NewMetrics(ctx, telemetry.MetricsConfig{Exporters: []string{telemetry.ExporterPrometheus}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = meters.Shutdown(context.Background()) })
	logger := slog.New(secret.NewRedactingHandler(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo})))
	conn, keys := serveService(b, benchService{auth: auth.ModeKeys, tracer: tracing.Provider,
		meters: meters.MeterProvider(), logger: logger})
	_, token, err := keys.Create(ctx, "ws", []auth.Scope{auth.ScopeAdmin, auth.ScopeQuery}, "bench")
	if err != nil {
		b.Fatal(err)
	}
	return production{client: connectorv1.NewConnectorServiceClient(conn),
		ctx: metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)}
}

// benchService says how serveService runs the service.
type benchService struct {
	auth    auth.Mode
	tracer  trace.TracerProvider // nil: otel's global one
	meters  metric.MeterProvider // nil: no metrics
	logger  *slog.Logger         // nil: no logs
	llmURL  string               // set: an agent on the fake model there
	llmHTTP *http.Client         // the agent's HTTP client; nil: llm's default
}

// serveService runs the whole service (store, registry, gRPC, and an
// agent if o.llmURL is set) as o says on a loopback port, reported
// serving, and returns a client connection to it and the service's keys.
func serveService(b *testing.B, o benchService) (*grpc.ClientConn, *auth.Keys) {
	db := storetest.NewDB(b)
	keys := auth.NewKeys(db, auth.Config{}, o.logger)
	src := live.NewSource(db, nil, o.logger)
	reg := registry.New(src, registry.Config{MeterProvider: o.meters, TracerProvider: o.tracer}, o.logger)
	lv := live.New(db, src, reg, nil, live.Config{Logger: o.logger})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 3)
	go func() { done <- reg.Run(ctx) }()
	go func() { done <- keys.Run(ctx) }() // as in main: the key cache is trusted while it runs
	go func() { done <- lv.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done; <-done; <-done })
	var agent *orchestrator.Agent
	if o.llmURL != "" {
		model, err := llm.New(llm.Config{BaseURL: o.llmURL, Model: "fake-model", HTTPClient: o.llmHTTP})
		if err != nil {
			b.Fatal(err)
		}
		agent = orchestrator.New(model, server.ToolCaller{Registry: reg}, orchestrator.Config{TracerProvider: o.tracer}, o.logger)
	}
	g, hs := server.NewGRPCServer(server.New(server.Deps{DB: db, Registry: reg, Live: lv, Agent: agent, Keys: keys,
		Logger: o.logger, TracerProvider: o.tracer}, server.Config{Auth: o.auth}))
	server.SetServing(hs, true)
	return serveLoopback(b, g), keys
}

// waitCallable waits until req succeeds: the connector is connected and
// its catalog synced.
func waitCallable(b *testing.B, c connectorv1.ConnectorServiceClient, ctx context.Context, req *connectorv1.CallToolRequest) {
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := c.CallTool(ctx, req); err == nil {
			return
		} else if time.Now().After(deadline) {
			b.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// inTurn runs x and y once per b.Loop iteration, each first every other
// time so that both see the same noise, and returns their latencies,
// sorted.
func inTurn(b *testing.B, x, y func() error) (latX, latY []time.Duration) {
	lat := inTurnN(b, x, y)
	return lat[0], lat[1]
}

// inTurnN runs each of fs once per b.Loop iteration, starting with a
// different one each time so that all see the same noise, and returns
// their latencies, each sorted.
func inTurnN(b *testing.B, fs ...func() error) [][]time.Duration {
	lat := make([][]time.Duration, len(fs))
	for i := range lat {
		lat[i] = make([]time.Duration, 0, b.N)
	}
	for i := 0; b.Loop(); i++ {
		for j := range fs {
			k := (i + j) % len(fs)
			start := time.Now()
			if err := fs[k](); err != nil {
				b.Fatal(err)
			}
			lat[k] = append(lat[k], time.Since(start))
		}
	}
	for _, l := range lat {
		slices.Sort(l)
	}
	return lat
}

// serveOverTCP runs the whole service (store, registry, gRPC) on a loopback
// port, with auth in mode, and returns a client and the service's keys.
func serveOverTCP(b *testing.B, mode auth.Mode) (connectorv1.ConnectorServiceClient, *auth.Keys) {
	return serveTracedOverTCP(b, mode, nil)
}

// serveTracedOverTCP is serveOverTCP with spans made by tp.
func serveTracedOverTCP(b *testing.B, mode auth.Mode, tp trace.TracerProvider) (connectorv1.ConnectorServiceClient, *auth.Keys) {
	conn, keys := serveService(b, benchService{auth: mode, tracer: tp})
	return connectorv1.NewConnectorServiceClient(conn), keys
}

// BenchmarkAuthOverhead measures what checking an API key adds to a call:
// two services on the same MCP server, one with auth off and one asking for
// keys (answered from the cache, as every call but a key's first is),
// called in turn so that both see the same noise. CallTool goes to the MCP
// server; CloseSession of a session no connector has stays in memory, so
// it shows the guard's cost at its most visible.
func BenchmarkAuthOverhead(b *testing.B) {
	srv := newTestMCP(b)
	off, _ := serveOverTCP(b, auth.ModeNone)
	on, keys := serveOverTCP(b, auth.ModeKeys)
	_, token, err := keys.Create(context.Background(), "ws", []auth.Scope{auth.ScopeAdmin}, "bench")
	if err != nil {
		b.Fatal(err)
	}
	ctxOff := context.Background()
	ctxOn := metadata.AppendToOutgoingContext(ctxOff, "authorization", "Bearer "+token)
	args, _ := structpb.NewStruct(map[string]any{"text": "hi"})
	callTool := &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: "m", ToolName: "echo", Arguments: args}
	for _, c := range []struct {
		client connectorv1.ConnectorServiceClient
		ctx    context.Context
	}{{off, ctxOff}, {on, ctxOn}} {
		if _, err := c.client.CreateConnector(c.ctx, &connectorv1.CreateConnectorRequest{WorkspaceId: "ws",
			Connector: mcpConnector("m", srv.url())}); err != nil {
			b.Fatal(err)
		}
		waitCallable(b, c.client, c.ctx, callTool)
	}
	closeSession := &connectorv1.CloseSessionRequest{WorkspaceId: "ws", SessionId: "nobody"}
	for _, rpc := range []struct {
		name string
		call func(connectorv1.ConnectorServiceClient, context.Context) error
	}{
		{"CallTool", func(c connectorv1.ConnectorServiceClient, ctx context.Context) error {
			_, err := c.CallTool(ctx, callTool)
			return err
		}},
		{"CloseSession", func(c connectorv1.ConnectorServiceClient, ctx context.Context) error {
			_, err := c.CloseSession(ctx, closeSession)
			return err
		}},
	} {
		b.Run(rpc.name, func(b *testing.B) {
			latOff, latOn := inTurn(b, func() error { return rpc.call(off, ctxOff) }, func() error { return rpc.call(on, ctxOn) })
			b.ReportMetric(float64(latOff[len(latOff)/2].Nanoseconds())/1e3, "p50-off-µs")
			b.ReportMetric(float64(latOn[len(latOn)/2].Nanoseconds())/1e3, "p50-auth-µs")
			b.ReportMetric(float64(latOff[len(latOff)*99/100].Nanoseconds())/1e3, "p99-off-µs")
			b.ReportMetric(float64(latOn[len(latOn)*99/100].Nanoseconds())/1e3, "p99-auth-µs")
		})
	}
}

// BenchmarkTracingOverhead measures what tracing adds to CallTool: two
// services on the same MCP server, set up by telemetry.SetupTracing from
// OTEL_TRACES_EXPORTER=none and =otlp (batched, over OTLP/HTTP to a fake
// collector on loopback), called in turn, each call in the caller's trace
// (traceparent). Traced, a call makes two spans (the gRPC server span and
// mcp.tools/call) and sends traceparent to the MCP server; untraced, it
// only passes the caller's trace context on.
func BenchmarkTracingOverhead(b *testing.B) {
	srv := newTestMCP(b)
	setup := func(exporter string) *telemetry.Tracing {
		b.Setenv("OTEL_TRACES_EXPORTER", exporter)
		tr, err := telemetry.SetupTracing(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = tr.Shutdown(context.Background()) })
		return tr
	}
	b.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	b.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", telemetrytest.NewHTTP(b).Endpoint)
	none, otlp := setup("none"), setup("otlp")
	off, _ := serveTracedOverTCP(b, auth.ModeNone, none.Provider)
	on, _ := serveTracedOverTCP(b, auth.ModeNone, otlp.Provider)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	args, _ := structpb.NewStruct(map[string]any{"text": "hi"})
	req := &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: "m", ToolName: "echo", Arguments: args}
	for _, c := range []connectorv1.ConnectorServiceClient{off, on} {
		if _, err := c.CreateConnector(ctx, &connectorv1.CreateConnectorRequest{WorkspaceId: "ws", Connector: mcpConnector("m", srv.url())}); err != nil {
			b.Fatal(err)
		}
		waitCallable(b, c, ctx, req)
	}
	callTool := func(c connectorv1.ConnectorServiceClient) func() error {
		return func() error {
			_, err := c.CallTool(ctx, req)
			return err
		}
	}
	latOff, latOn := inTurn(b, callTool(off), callTool(on))
	p50Off, p50On := latOff[len(latOff)/2], latOn[len(latOn)/2]
	b.ReportMetric(float64(p50Off.Nanoseconds())/1e3, "p50-none-µs")
	b.ReportMetric(float64(p50On.Nanoseconds())/1e3, "p50-otlp-µs")
	b.ReportMetric(float64(latOff[len(latOff)*99/100].Nanoseconds())/1e3, "p99-none-µs")
	b.ReportMetric(float64(latOn[len(latOn)*99/100].Nanoseconds())/1e3, "p99-otlp-µs")
	b.ReportMetric(100*(float64(p50On)/float64(p50Off)-1), "p50-overhead-%")
}
