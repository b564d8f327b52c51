package registry_test

import (
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

// gateway is a proxy to srv's address, which answers 502 while nothing
// listens there.
func gateway(t *testing.T, srv *mcpServer) *httptest.Server {
	backend, _ := url.Parse("http://" + srv.addr)
	rp := httputil.NewSingleHostReverseProxy(backend)
	rp.FlushInterval = -1 // an SSE stream's events as they come
	rp.ErrorLog = log.New(io.Discard, "", 0)
	proxy := httptest.NewServer(rp)
	t.Cleanup(proxy.Close)
	return proxy
}

// TestGatewayRefusalIsARefusal: an MCP server behind a proxy that answers
// 502 while the server restarts. The 502 stands for a refused connection,
// and is treated as one: once the server is back, the next call joins a
// reconnect and succeeds, instead of failing at once with the stale 502
// until the backoff runs out (issue 27: the registry run's sse-restart
// check failed so in 2 of 2 runs). The backoff and the fail-fast window
// are an hour, so only the refusal's own window lets the call through.
func TestGatewayRefusalIsARefusal(t *testing.T) {
	srv := newMCPServer(t, legacyServer)
	proxy := gateway(t, srv)
	cfg := testConfig()
	cfg.BackoffBase, cfg.BackoffMax = time.Hour, time.Hour
	cfg.ProbeAfter = time.Hour
	src := newSource(httpSpec(1, proxy.URL+"/mcp"))
	reg := run(t, src, cfg)
	testsupport.WaitFor(t, "the connector to be ready", func() bool {
		h, _ := reg.Health(1)
		return h.State == registry.StateReady
	})

	srv.stop()
	testsupport.WaitFor(t, "a health check to see it, and the reconnect to get the proxy's 502", func() bool { return src.healthSaw(1, "502") })
	srv.start(srv.addr)
	time.Sleep(time.Second) // past the refusal's window, far short of the backoff's
	res, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"text": "back"}, registry.CallOptions{})
	if err != nil {
		t.Fatalf("a call after the server came back behind the proxy: %v; want it to join a reconnect", err)
	}
	if got := text(t, res); !strings.Contains(got, "back") {
		t.Errorf("echo = %q", got)
	}
}

// TestGatewayRefusalStillFailsFast: while the proxy keeps answering 502,
// calls fail with the refusal and say when the next attempt is, and the
// attempts they make are a refusal's, not a hang.
func TestGatewayRefusalStillFailsFast(t *testing.T) {
	srv := newMCPServer(t, legacyServer)
	proxy := gateway(t, srv)
	srv.stop()
	cfg := testConfig()
	cfg.BackoffBase, cfg.BackoffMax = time.Hour, time.Hour
	cfg.ProbeAfter = time.Hour
	src := newSource(httpSpec(1, proxy.URL+"/mcp"))
	reg := run(t, src, cfg)
	testsupport.WaitFor(t, "the first connect to get the proxy's 502", func() bool { return src.healthSaw(1, "502") })
	_, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"text": "x"}, registry.CallOptions{})
	if !errors.Is(err, registry.ErrUnavailable) || !strings.Contains(err.Error(), "502") || !strings.Contains(err.Error(), "attempt") {
		t.Errorf("a call while the proxy answers 502: %v, want UNAVAILABLE naming the 502 and the next attempt", err)
	}
}
