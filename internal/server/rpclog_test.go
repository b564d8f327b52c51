package server_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
)

// TestRPCLogLine checks what the one line per RPC says: the names the
// request gives, status code, reason and message, peer and trace id, at
// info for the caller's faults and warn for the service's.
func TestRPCLogLine(t *testing.T) {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	f := setup(t)
	srv := newTestMCP(t)
	f.create(t, "ws", mcpConnector("m", srv.url()))
	slow := mcpConnector("slow", srv.url())
	slow.CallTimeout = durationpb.New(200 * time.Millisecond)
	f.create(t, "ws", slow)
	f.create(t, "ws", mcpConnector("down", "http://127.0.0.1:9/mcp"))
	f.waitReady(t, "ws", "m")
	f.waitReady(t, "ws", "slow")
	f.waitError(t, "ws", "down")
	traced := func() context.Context {
		return metadata.AppendToOutgoingContext(ctx(t), "traceparent", "00-"+callerTraceID+"-"+callerSpanID+"-01")
	}
	short := func() context.Context {
		c, cancel := context.WithTimeout(ctx(t), 300*time.Millisecond)
		t.Cleanup(cancel)
		return c
	}

	for _, tt := range []struct {
		name string
		ctx  func() context.Context
		rpc  func(context.Context) error
		want map[string]string
	}{
		{"unknown tool: the caller's", traced, func(ctx context.Context) error {
			_, err := f.client.CallTool(ctx, &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: "m", ToolName: "nope"})
			return err
		}, map[string]string{"level": "INFO", "code": "NotFound", "reason": "TOOL_NOT_FOUND", "workspace_id": "ws",
			"connector_id": "m", "tool": "nope", "error": `"nope" is not in the tool list`, "trace_id": callerTraceID, "peer": "bufconn"}},
		{"connector down: the service's", func() context.Context { return ctx(t) }, func(ctx context.Context) error {
			_, err := f.client.CallTool(ctx, &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: "down", ToolName: "echo"})
			return err
		}, map[string]string{"level": "WARN", "code": "Unavailable", "reason": "CONNECTOR_UNAVAILABLE", "connector_id": "down",
			"tool": "echo", "error": "127.0.0.1:9"}},
		{"the connector's call timeout: the service's", func() context.Context { return ctx(t) }, func(ctx context.Context) error {
			_, err := f.client.CallTool(ctx, &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: "slow", ToolName: "block"})
			return err
		}, map[string]string{"level": "WARN", "code": "DeadlineExceeded", "connector_id": "slow", "tool": "block"}},
		// The service may see the caller's cancel before its own copy of
		// the deadline expires; the caller got DeadlineExceeded.
		{"the caller's deadline", short, func(ctx context.Context) error {
			_, err := f.client.CallTool(ctx, &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: "m", ToolName: "block"})
			return err
		}, map[string]string{"level": "INFO", "code": "DeadlineExceeded", "connector_id": "m", "tool": "block"}},
		{"a create names its connector", func() context.Context { return ctx(t) }, func(ctx context.Context) error {
			_, err := f.client.CreateConnector(ctx, &connectorv1.CreateConnectorRequest{WorkspaceId: "ws", Connector: &connectorv1.Connector{ConnectorId: "bad"}})
			return err
		}, map[string]string{"level": "INFO", "code": "InvalidArgument", "workspace_id": "ws", "connector_id": "bad", "error": "transport"}},
		{"a stream names what its request names", func() context.Context { return ctx(t) }, func(ctx context.Context) error {
			stream, err := f.client.StreamQueryConnector(ctx, &connectorv1.StreamQueryConnectorRequest{WorkspaceId: "ws", ConnectorId: "m", Query: "q"})
			if err == nil {
				_, err = stream.Recv()
			}
			return err
		}, map[string]string{"level": "INFO", "code": "FailedPrecondition", "reason": "LLM_NOT_CONFIGURED", "workspace_id": "ws", "connector_id": "m"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := len(rpcLines(t, f.logs.String()))
			if err := tt.rpc(tt.ctx()); err == nil {
				t.Fatal("the RPC succeeded; want it to fail")
			}
			line := nextRPCLine(t, f.logs, before)
			for k, want := range tt.want {
				if got, _ := line[k].(string); !strings.Contains(got, want) {
					t.Errorf("%s = %q; want %q in the line %v", k, got, want, line)
				}
			}
		})
	}
}

// nextRPCLine waits for the rpc line after the first n: the line of an RPC
// whose caller gave up comes when the service gives up too.
func nextRPCLine(t *testing.T, logs *syncBuffer, n int) map[string]any {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if lines := rpcLines(t, logs.String()); len(lines) > n {
			return lines[n]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no rpc line after the first %d within 10s", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// rpcLines are the "rpc" lines of a JSON log.
func rpcLines(t *testing.T, logs string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(logs), "\n") {
		var line map[string]any
		if err := json.Unmarshal([]byte(l), &line); err != nil {
			t.Fatalf("a log line is not JSON: %s", l)
		}
		if line["msg"] == "rpc" {
			out = append(out, line)
		}
	}
	return out
}
