package registry_test

import (
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/connector-svc/connector-svc/internal/egress"
	"github.com/connector-svc/connector-svc/internal/egress/egresstest"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

// wantRefused checks that err is ErrUnavailable with the egress refusal's
// text: the address dialed and the rule. (mcp-go keeps the text of a
// transport error, not always its chain.)
func wantRefused(t *testing.T, err error, addr, rule string) {
	t.Helper()
	if !errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("err = %v, want ErrUnavailable", err)
	}

	if msg := err.Error(); !strings.Contains(msg, addr) || !strings.Contains(msg, "denied by rule "+rule) {
		t.Errorf("err = %q, want it to name %s and rule %s", msg, addr, rule)
	}
}

func TestEgressDenyListBlocksTheDial(t *testing.T) {
	for _, tt := range []struct {
		name string
		opts []serverOption
	}{{"streamable http", nil}, {"sse", []serverOption{sseServer}}} {
		t.Run(tt.name, func(t *testing.T) {
			srv := newMCPServer(t, tt.opts...)
			spec := httpSpec(1, srv.url())
			if srv.sse {
				spec.Transport = registry.TransportSSE
			}
			src := newSource(spec)
			cfg := testConfig()
			cfg.Egress = egress.New(egress.Config{Deny: egresstest.Prefixes(t, "127.0.0.0/8")})
			reg := run(t, src, cfg)

			wantRefused(t, reg.Ready(ctxT(t), 1), "127.0.0.1", "127.0.0.0/8")
			_, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"text": "hi"}, registry.CallOptions{})
			wantRefused(t, err, "127.0.0.1", "127.0.0.0/8")
			if h := src.lastHealth(1); !strings.Contains(h.LastError, "denied by rule 127.0.0.0/8") {
				t.Errorf("health = %+v, want the refusal as last error", h)
			}
			if n := srv.requests.Load(); n != 0 {
				t.Errorf("the server got %d requests from a refused connector, want 0", n)
			}
		})
	}
}

// TestEgressRefusesWhenDNSChangesLater: a connector whose name resolved to
// an allowed address at first is refused at its next dial once the name
// answers with the metadata address, and its health says why. It comes
// back when the name does.
func TestEgressRefusesWhenDNSChangesLater(t *testing.T) {
	srv := newMCPServer(t, legacyServer, anyHost)
	_, port, _ := net.SplitHostPort(srv.addr)
	dns := egresstest.NewResolver()
	dns.Set("mcp.test", "127.0.0.1")
	src := newSource(httpSpec(1, "http://"+net.JoinHostPort("mcp.test", port)+"/mcp"))
	cfg := testConfig()
	cfg.Egress = egress.New(egress.Config{Resolver: dns})
	reg := run(t, src, cfg)
	echo(t, reg, 1, "before")

	dns.Set("mcp.test", "169.254.169.254")
	srv.restart() // drops our connections: the next request dials again
	testsupport.WaitFor(t, "the health error to show the refusal", func() bool {
		return src.healthSaw(1, "egress to mcp.test (169.254.169.254) denied by rule 169.254.0.0/16")
	})
	_, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"text": "after"}, registry.CallOptions{})
	wantRefused(t, err, "mcp.test (169.254.169.254)", "169.254.0.0/16")

	dns.Set("mcp.test", "127.0.0.1")
	testsupport.WaitFor(t, "the connector to come back", func() bool { return src.lastHealth(1).State == registry.StateReady })
	echo(t, reg, 1, "back")
}

// TestEgressAllowListOpensARange uses 0.0.0.0, refused by default, which
// the kernel connects to this host: an operator who allows it reaches the
// server listening on loopback.
func TestEgressAllowListOpensARange(t *testing.T) {
	srv := newMCPServer(t, legacyServer, anyHost)
	_, port, _ := net.SplitHostPort(srv.addr)
	url := "http://" + net.JoinHostPort("0.0.0.0", port) + "/mcp"

	reg := run(t, newSource(httpSpec(1, url)), testConfig())
	wantRefused(t, reg.Ready(ctxT(t), 1), "0.0.0.0", "0.0.0.0/8")

	cfg := testConfig()
	cfg.Egress = egress.New(egress.Config{Allow: egresstest.Prefixes(t, "0.0.0.0/32")})
	reg = run(t, newSource(httpSpec(1, url)), cfg)
	echo(t, reg, 1, "allowed")
}
