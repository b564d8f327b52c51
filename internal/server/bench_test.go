package server_test

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/server"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
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
		client := serveOverTCP(b)
		if _, err := client.CreateConnector(ctx, &connectorv1.CreateConnectorRequest{WorkspaceId: "ws",
			Connector: mcpConnector("m", srv.url())}); err != nil {
			b.Fatal(err)
		}
		args, _ := structpb.NewStruct(map[string]any{"text": "hi"})
		req := &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: "m", ToolName: "echo", Arguments: args}
		deadline := time.Now().Add(20 * time.Second)
		for { // until connected and the catalog is synced
			if _, err := client.CallTool(ctx, req); err == nil {
				break
			} else if time.Now().After(deadline) {
				b.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond)
		}
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

func reportP50(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// serveOverTCP runs the whole service (store, registry, gRPC) on a loopback
// port and returns a client.
func serveOverTCP(b *testing.B) connectorv1.ConnectorServiceClient {
	db := storetest.NewDB(b)
	reg := registry.New(server.NewSource(db, nil, nil), registry.Config{}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- reg.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done })
	g, _ := server.NewGRPCServer(server.New(server.Deps{DB: db, Registry: reg}, server.Config{}))
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
	return connectorv1.NewConnectorServiceClient(conn)
}
