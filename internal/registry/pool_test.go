package registry_test

import (
	"fmt"
	"sync"
	"testing"

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
				if _, err := reg.CallTool(ctxT(t), id, "echo", map[string]any{"text": fmt.Sprint(i, j)}); err != nil {
					t.Errorf("call: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// TestPoolReusesConnectionsUnderConcurrency runs 32 callers on one
// connector, 20 calls each: its connection pool keeps a connection per
// concurrent caller, so the server accepts about one connection per
// caller (and a few for the connect and the health checks), not one for
// most calls.
func TestPoolReusesConnectionsUnderConcurrency(t *testing.T) {
	const callers, calls = 32, 20
	srv := newMCPServer(t)
	reg := run(t, newSource(httpSpec(1, srv.url())), testConfig())
	callsFrom(t, reg, 1, callers, calls)
	if n := srv.accepted.Load(); n > callers+8 {
		t.Errorf("%d callers made %d calls over %d new connections, want at most %d", callers, callers*calls, n, callers+8)
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
