package server_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
	"google.golang.org/grpc"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/benchgoal"
	"github.com/connector-svc/connector-svc/internal/mcptest"
)

// BenchmarkReadResourceServiceWork measures what ReadResource adds to a
// read, in one run and in turn: a bare gRPC echo of the same response, a
// direct read on an mcp-go client, and ReadResource through the service
// (production middleware, loopback TCP), all of a 1 KiB text resource of
// an mcp-go server. Its own work is the service's p50 less the two others'.
func BenchmarkReadResourceServiceWork(b *testing.B) {
	m := mcpserver.NewMCPServer("bench", "1", mcpserver.WithResourceCapabilities(false, false))
	m.AddTool(mcp.NewTool("noop"), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("ok"), nil
	})
	body := strings.Repeat("x", 1024)
	m.AddResource(mcp.NewResource("mem://doc", "doc"), func(_ context.Context, r mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
		return []mcp.ResourceContents{mcp.TextResourceContents{URI: r.Params.URI, MIMEType: "text/plain", Text: body}}, nil
	})
	up := httptest.NewServer(mcpserver.NewStreamableHTTPServer(m))
	b.Cleanup(up.Close)
	svc := serveInProduction(b)
	ctx := svc.ctx
	if _, err := svc.client.CreateConnector(ctx, &connectorv1.CreateConnectorRequest{WorkspaceId: "ws",
		Connector: mcpConnector("m", up.URL+"/mcp")}); err != nil {
		b.Fatal(err)
	}
	req := &connectorv1.ReadResourceRequest{WorkspaceId: "ws", ConnectorId: "m", Uri: "mem://doc"}
	var resp *connectorv1.ReadResourceResponse
	deadline := time.Now().Add(20 * time.Second)
	for {
		var err error
		if resp, err = svc.client.ReadResource(ctx, req); err == nil {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("ReadResource never worked: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	got, err := svc.client.GetConnector(ctx, &connectorv1.GetConnectorRequest{WorkspaceId: "ws", ConnectorId: "m"})
	if err != nil {
		b.Fatal(err)
	}
	direct, err := mcptest.Dial(context.Background(), up.URL+"/mcp", got.GetConnector().GetHealth().GetProtocolVersion(), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { direct.Close() })
	var dreq mcp.ReadResourceRequest
	dreq.Params.URI = "mem://doc"
	echo := serveReadEcho(b, resp)

	lat := inTurnN(b, func() error { return echo(req) }, func() error {
		_, err := direct.ReadResource(context.Background(), dreq)
		return err
	}, func() error {
		_, err := svc.client.ReadResource(ctx, req)
		return err
	})
	p50 := func(l []time.Duration) float64 { return float64(l[len(l)/2].Nanoseconds()) / 1e3 }
	b.ReportMetric(p50(lat[0]), "p50-grpc-echo-µs")
	b.ReportMetric(p50(lat[1]), "p50-direct-µs")
	b.ReportMetric(p50(lat[2]), "p50-service-µs")
	work := p50(lat[2]) - p50(lat[0]) - p50(lat[1])
	b.ReportMetric(work, "service-µs")
	b.Logf("p50 grpc echo %.1f µs, direct mcp-go read %.1f µs, ReadResource %.1f µs", p50(lat[0]), p50(lat[1]), p50(lat[2]))
	benchgoal.Report(b, "readresource-service-work-share-p50", work/(p50(lat[0])+p50(lat[1])), "of-echo+direct", benchgoal.AtMost, 0.25)
}

// serveReadEcho is serveEcho for ReadResource.
func serveReadEcho(b *testing.B, resp *connectorv1.ReadResourceResponse) func(*connectorv1.ReadResourceRequest) error {
	g := grpc.NewServer()
	g.RegisterService(&grpc.ServiceDesc{
		ServiceName: "bench.ReadEcho",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Read",
			Handler: func(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
				if err := dec(new(connectorv1.ReadResourceRequest)); err != nil {
					return nil, err
				}
				return resp, nil
			}}},
	}, struct{}{})
	conn := serveLoopback(b, g)
	return func(req *connectorv1.ReadResourceRequest) error {
		return conn.Invoke(context.Background(), "/bench.ReadEcho/Read", req, new(connectorv1.ReadResourceResponse))
	}
}
