package registry_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/benchgoal"
	"github.com/connector-svc/connector-svc/internal/registry"
)

// Benchmarks compare, in one run, what a chat backend pays today (a fresh
// MCP client per call) with the registry's persistent session, and measure
// the registry under concurrency and at start-up. Run them with `make bench`.

// freshCall is today's pattern: connect, initialize, call, close.
func freshCall(ctx context.Context, tr transport.Interface) error {
	c := client.NewClient(tr, client.WithLegacyProtocolOnly())
	defer c.Close()
	if err := c.Start(ctx); err != nil {
		return err
	}
	var init mcp.InitializeRequest
	init.Params.ClientInfo = mcp.Implementation{Name: "bench", Version: "1"}
	if _, err := c.Initialize(ctx, init); err != nil {
		return err
	}
	var req mcp.CallToolRequest
	req.Params.Name = "echo"
	req.Params.Arguments = map[string]any{"text": "hi"}
	_, err := c.CallTool(ctx, req)
	return err
}

func benchPersistent(b *testing.B, spec registry.Spec) {
	reg := run(b, newSource(spec), registry.Config{HealthInterval: time.Hour})
	ctx := context.Background()
	args := map[string]any{"text": "hi"}
	if _, err := reg.CallTool(ctx, spec.ID, "echo", args, registry.CallOptions{}); err != nil { // connect outside the timer
		b.Fatal(err)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		if _, err := reg.CallTool(ctx, spec.ID, "echo", args, registry.CallOptions{}); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	reportPercentiles(b, lat)
}

func reportPercentiles(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	p := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) }
	b.ReportMetric(p(0.50), "p50-µs")
	b.ReportMetric(p(0.99), "p99-µs")
}

// startHTTPServerProcess runs the test server's streamable-HTTP mode in its
// own process, so its memory and CPU are not the registry's.
func startHTTPServerProcess(b testing.TB) string { return startServerProcess(b, "-http", "/mcp") }

// startServerProcess runs the test server in its own process, serving HTTP
// in the mode named by flag (-http or -sse), and returns its URL.
func startServerProcess(b testing.TB, flag, path string) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	cmd := exec.Command(stdioServer, flag, addr)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return "http://" + addr + path
		}
		if time.Now().After(deadline) {
			b.Fatalf("the HTTP test server did not listen: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func BenchmarkCallStdio(b *testing.B) {
	b.Run("fresh-client-per-call", func(b *testing.B) {
		ctx := context.Background()
		for b.Loop() {
			if err := freshCall(ctx, transport.NewStdio(stdioServer, nil)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("persistent", func(b *testing.B) { benchPersistent(b, stdioSpec(1)) })
}

func BenchmarkCallStreamableHTTP(b *testing.B) {
	url := startHTTPServerProcess(b)
	b.Run("fresh-client-per-call", func(b *testing.B) {
		ctx := context.Background()
		for b.Loop() {
			// A fresh client has its own connections, as a per-query client does.
			hc := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
			tr, err := transport.NewStreamableHTTP(url, transport.WithHTTPBasicClient(hc))
			if err != nil {
				b.Fatal(err)
			}
			if err := freshCall(ctx, tr); err != nil {
				b.Fatal(err)
			}
			hc.CloseIdleConnections()
		}
	})
	b.Run("persistent", func(b *testing.B) { benchPersistent(b, httpSpec(1, url)) })
}

// BenchmarkConcurrentCallers compares, in turn against one server
// process, 64 callers on one connector of the registry with 64 direct
// mcp-go sessions (each on a connection pool of its own) of the protocol
// generation the registry negotiated. Each iteration runs a block of
// 25,000 calls on each side, the first side alternating. Both sides first
// run one unmeasured burst, as the direct sessions' handshakes warm their
// connections. It reports both throughputs and their ratio (the goal),
// errors, the registry's latency percentiles and the new TCP connections
// the server accepted per block.
func BenchmarkConcurrentCallers(b *testing.B) {
	const callers, block = 64, 25000
	url := startHTTPServerProcess(b)
	reg := run(b, newSource(httpSpec(1, url)), registry.Config{HealthInterval: time.Hour})
	ctx := context.Background()
	args := map[string]any{"text": "hi"}
	if _, err := reg.CallTool(ctx, 1, "echo", args, registry.CallOptions{}); err != nil {
		b.Fatal(err)
	}
	h, err := reg.Health(1)
	if err != nil {
		b.Fatal(err)
	}
	sides := []func(int) error{
		func(int) error { _, err := reg.CallTool(ctx, 1, "echo", args, registry.CallOptions{}); return err },
		directSessions(b, url, h.ProtocolVersion, callers),
	}
	for _, side := range sides {
		new(callerBlocks).callBlock(b, url, callers, 4*callers, side)
	}
	var got [2]callerBlocks
	for i := 0; b.Loop(); i++ {
		for j := range sides {
			k := (i + j) % len(sides)
			got[k].callBlock(b, url, callers, block, sides[k])
		}
	}
	b.StopTimer()
	registryRate, directRate := got[0].callsPerSecond(), got[1].callsPerSecond()
	b.ReportMetric(registryRate, "calls/s")
	b.ReportMetric(directRate, "direct-calls/s")
	b.ReportMetric(float64(got[0].errs), "errors")
	b.ReportMetric(float64(got[1].errs), "direct-errors")
	b.ReportMetric(got[0].connsPer(block), "conns/block")
	b.ReportMetric(got[1].connsPer(block), "direct-conns/block")
	reportPercentiles(b, got[0].lat)
	b.Logf("protocol %s: registry %.0f calls/s, direct %.0f calls/s; new connections per %d calls: registry %.1f, direct %.1f",
		h.ProtocolVersion, registryRate, directRate, block, got[0].connsPer(block), got[1].connsPer(block))
	benchgoal.Report(b, "concurrent-callers-vs-direct", registryRate/directRate, "x-direct", benchgoal.AtLeast, 0.8)
	if got[0].errs+got[1].errs != 0 {
		b.Errorf("%d registry calls and %d direct calls failed", got[0].errs, got[1].errs)
	}
}

// BenchmarkStartup200 loads 200 streamable-HTTP connectors (each its own
// session on one server process) and reports the time until all are READY
// and the registry's heap per idle connector.
func BenchmarkStartup200(b *testing.B) {
	const n = 200
	url := startHTTPServerProcess(b)
	specs := make([]registry.Spec, n)
	for i := range specs {
		specs[i] = httpSpec(int64(i+1), url)
	}
	for b.Loop() {
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)

		reg := registry.New(newSource(specs...), registry.Config{HealthInterval: time.Hour}, nil)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		start := time.Now()
		go func() { done <- reg.Run(ctx) }()
		for ready := 0; ready < n; {
			ready = 0
			for i := range specs {
				if h, err := reg.Health(specs[i].ID); err == nil && h.State == registry.StateReady {
					ready++
				}
			}
			if time.Since(start) > time.Minute {
				b.Fatalf("only %d of %d connectors READY after a minute", ready, n)
			}
			time.Sleep(time.Millisecond)
		}
		b.ReportMetric(float64(time.Since(start).Milliseconds()), "ms-to-all-ready")

		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/n/1024, "KiB-heap/connector")
		b.ReportMetric(float64(runtime.NumGoroutine()), "goroutines")
		cancel()
		<-done
	}
}

// BenchmarkSessionOpen opens per-session connections, one new session per
// iteration, and closes them: the time to open one and the heap each
// holds while open (stdio: plus one server process per session).
func BenchmarkSessionOpen(b *testing.B) {
	for _, tc := range []struct {
		name string
		spec func() registry.Spec
	}{
		{"stdio", func() registry.Spec { return sessionSpec(1, b.TempDir()) }},
		{"streamable_http", func() registry.Spec {
			s := httpSpec(1, startHTTPServerProcess(b))
			s.SessionMode = registry.SessionPerSession
			return s
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			cfg := testConfig()
			cfg.MaxSessions = 1 << 20
			cfg.HealthInterval = time.Hour
			reg := run(b, newSource(tc.spec()), cfg)
			if err := reg.Ready(context.Background(), 1); err != nil {
				b.Fatal(err)
			}
			runtime.GC()
			var before runtime.MemStats
			runtime.ReadMemStats(&before)
			var lat []time.Duration
			n := 0
			for b.Loop() {
				start := time.Now()
				opts := registry.CallOptions{Session: fmt.Sprint("s", n)}
				if _, err := reg.CallTool(context.Background(), 1, "echo", map[string]any{"text": "x"}, opts); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
				n++
			}
			b.StopTimer()
			runtime.GC()
			var after runtime.MemStats
			runtime.ReadMemStats(&after)
			reportPercentiles(b, lat)
			b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(n)/1024, "KiB-heap/session")
			b.ReportMetric(float64(reg.SessionCount(1)), "sessions-held")
			reg.CloseSession("ws", "", 0)
		})
	}
}
