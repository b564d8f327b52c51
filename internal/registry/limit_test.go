package registry_test

import (
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/registry"
)

// TestOverLongResultIsRefusedUnread asks a real mcp-go server, in a process
// of its own, for a 50 MB text over each transport. The call fails with
// ErrResultTooLarge; the registry's heap grows by a fraction of the result,
// as reading stopped at the limit (an HTTP body) or the rest was drained
// (an SSE event, a stdio line); and the connector goes on: a result just
// under the limit comes whole, and so does the next small one.
func TestOverLongResultIsRefusedUnread(t *testing.T) {
	const size = 50 << 20
	httpProc := func(t *testing.T) registry.Spec { return httpSpec(1, startServerProcess(t, "-http", "/mcp")) }
	for _, tt := range []struct {
		name   string
		spec   func(t *testing.T) registry.Spec
		stream bool // the server sends a notification first: a streamable-HTTP answer is an SSE stream
	}{
		{"streamable HTTP, JSON answer", httpProc, false},
		{"streamable HTTP, SSE answer", httpProc, true},
		{"SSE", func(t *testing.T) registry.Spec {
			spec := httpSpec(1, startServerProcess(t, "-sse", "/sse"))
			spec.Transport = registry.TransportSSE
			return spec
		}, false},
		{"stdio", func(*testing.T) registry.Spec { return stdioSpec(1) }, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			spec := tt.spec(t)
			// Time enough to drain 50 MB under the race detector on a
			// loaded machine; no health check meanwhile.
			spec.CallTimeout = time.Minute
			cfg := testConfig()
			cfg.HealthInterval = time.Hour
			reg := run(t, newSource(spec), cfg)
			echo(t, reg, 1, "first")
			growth := heapGrowth(func() {
				_, err := reg.CallTool(ctxT(t), 1, "big", map[string]any{"bytes": size, "stream": tt.stream}, registry.CallOptions{})
				if !errors.Is(err, registry.ErrResultTooLarge) {
					t.Errorf("a %d-byte result: %v, want ErrResultTooLarge", size, err)
				}
			})
			t.Logf("heap grew by at most %d MiB while a %d MiB result was refused", growth>>20, size>>20)
			if growth > 64<<20 {
				t.Errorf("the heap grew by %d MiB while a %d MiB result was refused, want under 64 MiB", growth>>20, size>>20)
			}
			const fits = 3 << 20
			res, err := reg.CallTool(ctxT(t), 1, "big", map[string]any{"bytes": fits, "stream": tt.stream}, registry.CallOptions{})
			if err != nil {
				t.Fatalf("a %d-byte result after the refused one: %v", fits, err)
			}
			if got := text(t, res); len(got) != fits || strings.Trim(got, "x") != "" {
				t.Errorf("a %d-byte result came as %d bytes", fits, len(got))
			}
			echo(t, reg, 1, "after")
		})
	}
}

// heapGrowth runs fn and returns the most the heap grew above what was live
// before it, sampled every millisecond.
func heapGrowth(fn func()) uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc
	done := make(chan struct{})
	var peak uint64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var ms runtime.MemStats
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapAlloc)
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	fn()
	close(done)
	wg.Wait()
	if peak < base {
		return 0
	}
	return peak - base
}
