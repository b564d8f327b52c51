package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/mcptest"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

// TestFrozenServerThroughTheAPI is a server that takes requests and
// answers none, as callers meet it: a call that times out gets
// DEADLINE_EXCEEDED and is logged so; its session is probed and dropped at
// once; the next call fails fast with UNAVAILABLE saying what happened,
// instead of waiting its whole deadline on a reconnect that hangs.
func TestFrozenServerThroughTheAPI(t *testing.T) {
	f := setup(t)
	frozen := mcptest.NewFrozen(t, newTestMCP(t).url())
	f.create(t, "ws", mcpConnector("frozen", frozen.URL("/mcp")))
	f.waitReady(t, "ws", "frozen")
	args, _ := structpb.NewStruct(map[string]any{"text": "x"})
	call := func(d time.Duration) error {
		c, cancel := context.WithTimeout(ctx(t), d)
		defer cancel()
		_, err := f.client.CallTool(c, &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: "frozen", ToolName: "echo", Arguments: args})
		return err
	}

	frozen.Freeze()
	before := len(rpcLines(t, f.logs.String()))
	if err := call(time.Second); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a call to the frozen server: %v, want DEADLINE_EXCEEDED", err)
	}
	if line := nextRPCLine(t, f.logs, before); line["code"] != "DeadlineExceeded" {
		t.Errorf("the RPC's log line says code %v; the caller got DeadlineExceeded", line["code"])
	}
	waitHealth(t, f, "frozen", func(h *connectorv1.ConnectorHealth) bool {
		return strings.Contains(h.GetLastError(), "probe got no answer")
	})

	start := time.Now()
	err := call(15 * time.Second)
	took := time.Since(start)
	wantStatus(t, err, codes.Unavailable, "CONNECTOR_UNAVAILABLE", "")
	msg := status.Convert(err).Message()
	for _, want := range []string{"connection lost", " ago: ", "probe got no answer"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
	// The reconnect is under way, or starts with this call, by timing.
	if !strings.Contains(msg, "a new attempt has been under way for") && !strings.Contains(msg, "a new attempt starts now") {
		t.Errorf("message %q says nothing of the reconnect", msg)
	}
	t.Logf("the next call, with a 15s deadline, failed after %s", took)
}

// TestCallEndsSayingItsConnectorWasDeleted: a call under way when its
// connector is deleted ends NOT_FOUND saying so; deactivated, it ends
// FAILED_PRECONDITION saying so.
func TestCallEndsSayingItsConnectorWasDeleted(t *testing.T) {
	for _, tt := range []struct {
		name   string
		remove func(*fixture) error
		code   codes.Code
		reason string
		msg    string
	}{
		{"deleted", func(f *fixture) error {
			_, err := f.client.DeleteConnector(ctx(t), &connectorv1.DeleteConnectorRequest{WorkspaceId: "ws", ConnectorId: "m"})
			return err
		}, codes.NotFound, "CONNECTOR_NOT_FOUND", "the connector was deleted during the call"},
		{"deactivated", func(f *fixture) error {
			_, err := f.client.DeactivateConnector(ctx(t), &connectorv1.DeactivateConnectorRequest{WorkspaceId: "ws", ConnectorId: "m"})
			return err
		}, codes.FailedPrecondition, "CONNECTOR_INACTIVE", "the connector was deactivated during the call; activate it with ActivateConnector"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := setup(t)
			srv := newTestMCP(t)
			f.create(t, "ws", mcpConnector("m", srv.url()))
			f.waitReady(t, "ws", "m")
			done := make(chan error, 1)
			go func() {
				_, err := f.client.CallTool(ctx(t), &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: "m", ToolName: "block"})
				done <- err
			}()
			testsupport.WaitFor(t, "the call to reach the server", func() bool { return len(srv.toolCallHeaders()) == 1 })
			if err := tt.remove(f); err != nil {
				t.Fatal(err)
			}
			err := <-done
			wantStatus(t, err, tt.code, tt.reason, "")
			if got := status.Convert(err).Message(); got != tt.msg {
				t.Errorf("message = %q, want %q", got, tt.msg)
			}
		})
	}
}

// waitHealth waits until connector id's health meets cond.
func waitHealth(t *testing.T, f *fixture, id string, cond func(*connectorv1.ConnectorHealth) bool) {
	t.Helper()
	testsupport.WaitFor(t, "connector "+id+"'s health", func() bool {
		resp, err := f.client.GetConnector(ctx(t), &connectorv1.GetConnectorRequest{WorkspaceId: "ws", ConnectorId: id})
		if err != nil {
			t.Fatal(err)
		}
		return cond(resp.GetConnector().GetHealth())
	})
}
