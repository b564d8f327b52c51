package llm_test

import (
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
)

// TestConcurrentRequestsReuseConnections: 32 concurrent requests, five
// rounds, over the client's own pool. A pool of Go's default 2 idle
// connections per host opens most of the later rounds' connections anew
// (about 30 a round); this one keeps the first round's.
func TestConcurrentRequestsReuseConnections(t *testing.T) {
	const callers, rounds = 32, 5
	var accepted atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			accepted.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	c := newClient(t, srv.URL+"/v1")
	for range rounds {
		var wg sync.WaitGroup
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := chat(t, c); err != nil {
					t.Errorf("chat: %v", err)
				}
			}()
		}
		wg.Wait()
	}
	if n := accepted.Load(); n > 2*callers {
		t.Errorf("%d rounds of %d concurrent requests opened %d connections, want at most %d", rounds, callers, n, 2*callers)
	}
}
