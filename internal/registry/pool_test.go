package registry_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/registry"
)

// callsFrom makes calls echo calls from each of callers goroutines on
// connector id.
func callsFrom(t *testing.T, reg *registry.Registry, id int64, callers, calls int) {
	t.Helper()
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range calls {
				if _, err := reg.CallTool(ctxT(t), id, "echo", map[string]any{"text": fmt.Sprint(i, j)}, registry.CallOptions{}); err != nil {
					t.Errorf("call: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// TestPoolReusesConnectionsUnderConcurrency runs 32 callers on one
// connector, 20 calls each: its origin's transports keep a connection per
// concurrent caller, so the server accepts a connection or two per caller
// (calls take the transports in turn, and each transport's share of the
// callers varies from moment to moment), and a few for the connect and
// the health checks, not one for most calls.
func TestPoolReusesConnectionsUnderConcurrency(t *testing.T) {
	const callers, calls = 32, 20
	srv := newMCPServer(t)
	reg := run(t, newSource(httpSpec(1, srv.url())), testConfig())
	callsFrom(t, reg, 1, callers, calls)
	if n := srv.accepted.Load(); n > 2*callers+8 {
		t.Errorf("%d callers made %d calls over %d new connections, want at most %d", callers, callers*calls, n, 2*callers+8)
	}
}

// TestPoolIdleLimitIsConfigurable: a pool that keeps only 4 idle
// connections closes the others after a burst of 32 callers, so the next
// burst opens new ones.
func TestPoolIdleLimitIsConfigurable(t *testing.T) {
	srv := newMCPServer(t)
	cfg := testConfig()
	cfg.MaxIdleConnsPerConnector = 4
	reg := run(t, newSource(httpSpec(1, srv.url())), cfg)
	callsFrom(t, reg, 1, 32, 5)
	before := srv.accepted.Load()
	callsFrom(t, reg, 1, 32, 5)
	if srv.accepted.Load() == before {
		t.Errorf("a second burst of 32 callers opened no connection, though the pool keeps only 4 idle")
	}
}

// TestConnectorsOfOneOriginShareConnections loads 64 connectors of one
// server: they share their origin's transports, so the server accepts
// far fewer connections than there are connectors (each kept its own idle
// connection before). Their calls stay their own: while one connector's
// call hangs on the server, another's call answers, and removing
// connectors leaves the others' calls working.
func TestConnectorsOfOneOriginShareConnections(t *testing.T) {
	const n = 64
	srv := newMCPServer(t)
	specs := make([]registry.Spec, n)
	for i := range specs {
		specs[i] = httpSpec(int64(i+1), srv.url())
	}
	cfg := testConfig()
	cfg.HealthInterval = time.Hour
	reg := run(t, newSource(specs...), cfg)
	for i := range specs {
		echo(t, reg, int64(i+1), "hi")
	}
	if got := srv.accepted.Load(); got >= n/2 {
		t.Errorf("%d connectors of one server opened %d connections, want fewer than %d", n, got, n/2)
	}

	done := make(chan error, 1)
	go func() {
		_, err := reg.CallTool(ctxT(t), 1, "block", nil, registry.CallOptions{})
		done <- err
	}()
	select {
	case <-srv.blocking:
	case <-time.After(20 * time.Second):
		t.Fatal("the blocking call never reached the server")
	}
	for i := range specs[1:] {
		echo(t, reg, int64(i+2), "while connector 1 waits")
	}
	close(srv.release)
	if err := <-done; err != nil {
		t.Errorf("the blocking call: %v", err)
	}
	for id := int64(1); id < n; id++ {
		reg.Remove(id)
	}
	echo(t, reg, n, "alone")
}

// TestSequentialCallsKeepToOneConnection: a connector's requests, one
// after another, go over one transport and so one connection. Spread over
// several, each arrives before the server has finished the last, and
// mcp-go's stateful server then loses the session's progress
// notifications (see transportsPerOrigin).
func TestSequentialCallsKeepToOneConnection(t *testing.T) {
	srv := newMCPServer(t)
	cfg := testConfig()
	cfg.HealthInterval = time.Hour // nothing runs beside the calls
	reg := run(t, newSource(httpSpec(1, srv.url())), cfg)
	callsFrom(t, reg, 1, 1, 20)
	if n := srv.accepted.Load(); n != 1 {
		t.Errorf("a connect and 20 calls, one after another, took %d connections, want 1", n)
	}
}
