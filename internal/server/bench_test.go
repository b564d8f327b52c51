package server_test

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/server"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
	"github.com/connector-svc/connector-svc/internal/telemetry"
	"github.com/connector-svc/connector-svc/internal/telemetry/telemetrytest"
)

// BenchmarkCallToolOverhead compares, against the same MCP server, a raw
// mcp-go call on an initialized client with CallTool through the whole
// service: gRPC over loopback TCP, the store's checks, the registry.
func BenchmarkCallToolOverhead(b *testing.B) {
	t := &testing.T{}
	srv := newTestMCP(t)
	defer srv.http.Close()
	ctx := context.Background()

	b.Run("raw-mcp-go", func(b *testing.B) {
		c, err := client.NewStreamableHttpClient(srv.url())
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		if err := c.Start(ctx); err != nil {
			b.Fatal(err)
		}
		var init mcp.InitializeRequest
		init.Params.ClientInfo = mcp.Implementation{Name: "bench", Version: "1"}
		if _, err := c.Initialize(ctx, init); err != nil {
			b.Fatal(err)
		}
		var req mcp.CallToolRequest
		req.Params.Name = "echo"
		req.Params.Arguments = map[string]any{"text": "hi"}
		lat := make([]time.Duration, 0, b.N)
		for b.Loop() {
			start := time.Now()
			if _, err := c.CallTool(ctx, req); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		reportP50(b, lat)
	})

	b.Run("service-grpc", func(b *testing.B) {
		client, _ := serveOverTCP(b, auth.ModeNone)
		if _, err := client.CreateConnector(ctx, &connectorv1.CreateConnectorRequest{WorkspaceId: "ws",
			Connector: mcpConnector("m", srv.url())}); err != nil {
			b.Fatal(err)
		}
		args, _ := structpb.NewStruct(map[string]any{"text": "hi"})
		req := &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: "m", ToolName: "echo", Arguments: args}
		waitCallable(b, client, ctx, req)
		lat := make([]time.Duration, 0, b.N)
		for b.Loop() {
			start := time.Now()
			if _, err := client.CallTool(ctx, req); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		reportP50(b, lat)
	})
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
	latX, latY = make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)
	timed := func(f func() error) time.Duration {
		start := time.Now()
		if err := f(); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	for i := 0; b.Loop(); i++ {
		if i%2 == 0 {
			latX = append(latX, timed(x))
			latY = append(latY, timed(y))
		} else {
			latY = append(latY, timed(y))
			latX = append(latX, timed(x))
		}
	}
	slices.Sort(latX)
	slices.Sort(latY)
	return latX, latY
}

func reportP50(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// serveOverTCP runs the whole service (store, registry, gRPC) on a loopback
// port, with auth in mode, and returns a client and the service's keys.
func serveOverTCP(b *testing.B, mode auth.Mode) (connectorv1.ConnectorServiceClient, *auth.Keys) {
	return serveTracedOverTCP(b, mode, nil)
}

// serveTracedOverTCP is serveOverTCP with spans made by tp.
func serveTracedOverTCP(b *testing.B, mode auth.Mode, tp trace.TracerProvider) (connectorv1.ConnectorServiceClient, *auth.Keys) {
	db := storetest.NewDB(b)
	keys := auth.NewKeys(db, auth.Config{}, nil)
	reg := registry.New(server.NewSource(db, nil, nil), registry.Config{TracerProvider: tp}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- reg.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done })
	g, _ := server.NewGRPCServer(server.New(server.Deps{DB: db, Registry: reg, Keys: keys, TracerProvider: tp}, server.Config{Auth: mode}))
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
	return connectorv1.NewConnectorServiceClient(conn), keys
}

// BenchmarkAuthOverhead measures what checking an API key adds to a call:
// two services on the same MCP server, one with auth off and one asking for
// keys (answered from the cache, as every call but a key's first is),
// called in turn so that both see the same noise. CallTool goes to the MCP
// server; CloseSession of a session no connector has stays in memory, so
// it shows the guard's cost at its most visible.
func BenchmarkAuthOverhead(b *testing.B) {
	srv := newTestMCP(&testing.T{})
	defer srv.http.Close()
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
	srv := newTestMCP(&testing.T{})
	defer srv.http.Close()
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
