package main

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	mcpserver "github.com/mark3labs/mcp-go/server"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

// TestEndToEndEgressSettings checks EGRESS_DENY_CIDRS and
// EGRESS_ALLOW_CIDRS reach both checks: creates are refused, and a
// connector stored before the operator denied its range is refused where
// it dials, with the rule in its health.
func TestEndToEndEgressSettings(t *testing.T) {
	mcpSrv := httptest.NewServer(mcpserver.NewStreamableHTTPServer(mcpserver.NewMCPServer("e2e", "1.0")))
	t.Cleanup(mcpSrv.Close)
	url := storetest.NewURL(t)
	svc := start(t, url, nil)
	client := connectorv1.NewConnectorServiceClient(dial(t, svc.addr))
	create := func(id, u string) error {
		_, err := client.CreateConnector(testCtx(t), &connectorv1.CreateConnectorRequest{WorkspaceId: "acme",
			Connector: &connectorv1.Connector{ConnectorId: id, Transport: connectorv1.Transport_TRANSPORT_STREAMABLE_HTTP, ApprovalPolicy: noApproval,
				Connection: &connectorv1.Connector_Http{Http: &connectorv1.HttpConfig{Url: u}}}})
		return err
	}
	if err := create("local", mcpSrv.URL+"/mcp"); err != nil {
		t.Fatal(err)
	}
	if err := svc.stop(); err != nil {
		t.Fatal(err)
	}

	svc = start(t, url, map[string]string{"EGRESS_DENY_CIDRS": "127.0.0.0/8", "EGRESS_ALLOW_CIDRS": "0.0.0.0/32"})
	client = connectorv1.NewConnectorServiceClient(dial(t, svc.addr))
	for _, tt := range []struct{ id, url, reason string }{
		{"denied", "http://127.0.0.1:9/mcp", "EGRESS_DENIED"},    // the deny list
		{"metadata", "http://169.254.169.254/", "EGRESS_DENIED"}, // a default rule
		{"opened", "http://0.0.0.0:9/mcp", ""},                   // a default rule the allow list opens
	} {
		err := create(tt.id, tt.url)
		if reasonOf(err) != tt.reason || (tt.reason == "") != (err == nil) {
			t.Errorf("create %s: %v, want reason %q", tt.url, err, tt.reason)
		}
		if tt.reason != "" && status.Code(err) != codes.FailedPrecondition {
			t.Errorf("create %s: code %v, want FAILED_PRECONDITION", tt.url, status.Code(err))
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := client.GetConnector(testCtx(t), &connectorv1.GetConnectorRequest{WorkspaceId: "acme", ConnectorId: "local"})
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(got.GetConnector().GetHealth().GetLastError(), "denied by rule 127.0.0.0/8") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stored connector's health never showed the refusal: %v", got.GetConnector().GetHealth())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
