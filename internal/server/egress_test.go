package server_test

import (
	"net"
	"strings"
	"testing"

	mcpserver "github.com/mark3labs/mcp-go/server"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/egress"
	"github.com/connector-svc/connector-svc/internal/egress/egresstest"
	"github.com/connector-svc/connector-svc/internal/server"
)

func TestEgressRefusedAtCreate(t *testing.T) {
	dns := egresstest.NewResolver()
	dns.Set("metadata.test", "169.254.169.254")
	dns.Set("mixed.test", "10.0.0.7", "fd00:ec2::254")
	f := setup(t, options{egress: egress.New(egress.Config{Resolver: dns, Deny: egresstest.Prefixes(t, "10.9.0.0/16")})})
	for _, tt := range []struct {
		name, url, want string
		transport       connectorv1.Transport
		defaultRule     bool
	}{
		{"metadata address", "http://169.254.169.254/", "egress to 169.254.169.254 denied by rule 169.254.0.0/16", 0, true},
		{"metadata over sse", "http://169.254.169.254/sse", "169.254.0.0/16", connectorv1.Transport_TRANSPORT_SSE, true},
		{"IPv4-mapped", "http://[::ffff:169.254.169.254]:80/mcp", "169.254.0.0/16", 0, true},
		{"AWS IPv6 metadata", "http://[fd00:ec2::254]/latest", "fd00:ec2::254/128", 0, true},
		{"a name for the metadata address", "https://metadata.test/mcp?key=v", "egress to metadata.test (169.254.169.254) denied", 0, true},
		{"a name with one bad address", "http://mixed.test:8080/mcp", "mixed.test (fd00:ec2::254)", 0, true},
		{"the operator's deny list", "http://10.9.1.1:3001/mcp", "10.9.0.0/16: on the operator's egress deny list", 0, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := mcpConnector("c", tt.url)
			if tt.transport != 0 {
				c.Transport = tt.transport
			}
			_, err := f.client.CreateConnector(ctx(t), &connectorv1.CreateConnectorRequest{WorkspaceId: "ws", Connector: c})
			wantStatus(t, err, codes.FailedPrecondition, server.ReasonEgressDenied, "")
			msg := status.Convert(err).Message()
			if !strings.HasPrefix(msg, "connector.http.url: ") || !strings.Contains(msg, tt.want) {
				t.Errorf("message %q, want it to name connector.http.url and contain %q", msg, tt.want)
			}
			if hint := strings.Contains(msg, "EGRESS_ALLOW_CIDRS"); hint != tt.defaultRule {
				t.Errorf("message %q: names EGRESS_ALLOW_CIDRS = %v, want %v", msg, hint, tt.defaultRule)
			}
		})
	}
	resp, err := f.client.ListConnectors(ctx(t), &connectorv1.ListConnectorsRequest{WorkspaceId: "ws"})
	if err != nil || len(resp.GetConnectors()) != 0 {
		t.Fatalf("after refused creates: %v, %v; want nothing stored", resp.GetConnectors(), err)
	}

	// A host that does not resolve is not refused: its server may not
	// exist yet, and each dial is checked.
	f.create(t, "ws", mcpConnector("later", "http://not-yet.test:3001/mcp"))
	if dns.Lookups("not-yet.test") == 0 {
		t.Error("create did not look the host up")
	}
}

func TestEgressRefusedAtUpdate(t *testing.T) {
	dns := egresstest.NewResolver()
	dns.Set("metadata.test", "169.254.169.254")
	f := setup(t, options{egress: egress.New(egress.Config{Resolver: dns})})
	f.create(t, "ws", mcpConnector("c", "http://127.0.0.1:9/mcp"))
	for _, tt := range []struct {
		path string
		c    *connectorv1.Connector
	}{
		{"http.url", mcpConnector("c", "http://169.254.169.254/mcp")},
		{"http", mcpConnector("c", "http://metadata.test/mcp")},
	} {
		_, err := update(f, t, tt.c, tt.path)
		wantStatus(t, err, codes.FailedPrecondition, server.ReasonEgressDenied, "")
	}
	got, err := f.client.GetConnector(ctx(t), &connectorv1.GetConnectorRequest{WorkspaceId: "ws", ConnectorId: "c"})
	if err != nil || got.GetConnector().GetHttp().GetUrl() != "http://127.0.0.1:9/mcp" {
		t.Errorf("after refused updates: %v, %v; want the URL unchanged", got.GetConnector().GetHttp().GetUrl(), err)
	}
	if _, err := update(f, t, mcpConnector("c", "http://127.0.0.1:10/mcp"), "http.url"); err != nil {
		t.Errorf("update to an allowed URL: %v", err)
	}
}

// TestEgressRefusedWhenDNSChangesLater: the name passes at create, then
// answers with the metadata address (DNS rebinding). The next dial is
// refused: calls fail UNAVAILABLE and the health says why.
func TestEgressRefusedWhenDNSChangesLater(t *testing.T) {
	dns := egresstest.NewResolver()
	dns.Set("mcp.test", "127.0.0.1")
	f := setup(t, options{egress: egress.New(egress.Config{Resolver: dns})})
	srv := newTestMCPOn(t, nil, mcpserver.WithDisableLocalhostProtection(true))
	_, port, _ := net.SplitHostPort(srv.http.Listener.Addr().String())
	f.create(t, "ws", mcpConnector("m", "http://"+net.JoinHostPort("mcp.test", port)+"/mcp"))
	f.waitReady(t, "ws", "m")
	if _, err := f.call(t, "ws", "m", "echo", map[string]any{"text": "before"}); err != nil {
		t.Fatal(err)
	}

	dns.Set("mcp.test", "169.254.169.254")
	srv.http.CloseClientConnections() // the next request dials again
	const refusal = "egress to mcp.test (169.254.169.254) denied by rule 169.254.0.0/16"
	c := f.waitError(t, "ws", "m")
	if !strings.Contains(c.GetHealth().GetLastError(), refusal) {
		t.Errorf("health = %v, want the refusal as last error", c.GetHealth())
	}
	_, err := f.call(t, "ws", "m", "echo", map[string]any{"text": "after"})
	wantStatus(t, err, codes.Unavailable, server.ReasonConnectorUnavailable, "")
	if msg := status.Convert(err).Message(); !strings.Contains(msg, refusal) {
		t.Errorf("message %q, want the refusal", msg)
	}
}
