package registry_test

import (
	"bufio"
	"context"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/benchgoal"
	"github.com/connector-svc/connector-svc/internal/registry"
)

// Benchmarks of the registry at scale: thousands of streamable-HTTP
// connectors spread over several test server processes, so that the
// servers are not the bottleneck.

// BenchmarkStartup loads 1,000 and 10,000 streamable-HTTP connectors, in
// turn with each connector on a transport of its own (own-transports, as
// before they were shared) and on the transports they share by origin
// (shared), and reports the time until all are READY and what each idle
// connector costs: the process's resident memory (RSS) and Go heap, after
// a GC that returns free memory to the OS, and goroutines.
func BenchmarkStartup(b *testing.B) {
	urls := startHTTPServers(b, 8)
	for _, n := range []int{1_000, 10_000} {
		specs := make([]registry.Spec, n)
		for i := range specs {
			specs[i] = httpSpec(int64(i+1), urls[i%len(urls)])
		}
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			modes := []struct {
				name string
				cfg  registry.Config
			}{
				{"own-transports", registry.OwnTransports(registry.Config{HealthInterval: time.Hour})},
				{"shared", registry.Config{HealthInterval: time.Hour}},
			}
			var got [2]startup
			for i := 0; b.Loop(); i++ {
				for j := range modes {
					k := (i + j) % len(modes)
					got[k].add(measureStartup(b, specs, modes[k].cfg))
				}
			}
			for k, m := range modes {
				r := got[k].mean()
				b.ReportMetric(float64(r.elapsed.Milliseconds()), m.name+"-ms-to-all-ready")
				b.ReportMetric(r.rss/1024, m.name+"-KiB-RSS/connector")
				b.ReportMetric(r.heap/1024, m.name+"-KiB-heap/connector")
				b.ReportMetric(r.goroutines, m.name+"-goroutines/connector")
				b.Logf("%d connectors, %s: all READY in %s; per connector %.1f KiB RSS, %.1f KiB heap, %.1f goroutines",
					n, m.name, r.elapsed.Round(time.Millisecond), r.rss/1024, r.heap/1024, r.goroutines)
			}
			if n == 10_000 {
				r := got[1].mean()
				benchgoal.Report(b, "startup-10000-all-ready", float64(r.elapsed.Milliseconds()), "ms-to-all-ready", benchgoal.AtMost, 10_000)
				benchgoal.Report(b, "startup-10000-rss-per-connector", r.rss/1024, "KiB-RSS/connector", benchgoal.AtMost, 40)
			}
		})
	}
}

// startup is what loading the connectors cost, per connector, added up
// over runs.
type startup struct {
	runs                  int
	elapsed               time.Duration
	rss, heap, goroutines float64
}

func (s *startup) add(r startup) {
	s.runs++
	s.elapsed += r.elapsed
	s.rss += r.rss
	s.heap += r.heap
	s.goroutines += r.goroutines
}

func (s startup) mean() startup {
	n := float64(max(s.runs, 1))
	return startup{elapsed: s.elapsed / time.Duration(max(s.runs, 1)), rss: s.rss / n, heap: s.heap / n, goroutines: s.goroutines / n}
}

// measureStartup loads specs into a new registry, waits until all are
// READY, measures, and stops it.
func measureStartup(b *testing.B, specs []registry.Spec, cfg registry.Config) startup {
	n := float64(len(specs))
	heap0, rss0 := settledMemory(b)
	goroutines0 := runtime.NumGoroutine()
	reg, stop := startRegistry(b, newSource(specs...), cfg)
	start := time.Now()
	waitAllReady(b, reg, specs, 2*time.Minute)
	elapsed := time.Since(start)
	heap1, rss1 := settledMemory(b)
	goroutines := runtime.NumGoroutine() - goroutines0
	stop()
	return startup{runs: 1, elapsed: elapsed, rss: float64(rss1-rss0) / n, heap: float64(heap1-heap0) / n,
		goroutines: float64(goroutines) / n}
}

// BenchmarkCallDuringSweeps calls one connector back to back while 1,000
// others are loaded, in turn with health checks every 5 s (sweeps) and
// with none (quiet), and compares the call latency of the two. It also
// counts the health rows the sweeps write.
func BenchmarkCallDuringSweeps(b *testing.B) {
	const (
		n        = 1_000
		interval = 5 * time.Second
		window   = 2 * interval // calls measured per turn
		rounds   = 3
	)
	target := startHTTPServerProcess(b) // the called connector has a server to itself
	urls := startHTTPServers(b, 4)
	specs := []registry.Spec{httpSpec(1, target)}
	for i := range n {
		specs = append(specs, httpSpec(int64(i+2), urls[i%len(urls)]))
	}
	for b.Loop() {
		var sweeps, quiet []time.Duration
		var writes int64
		for range rounds {
			lat, w := callsDuring(b, specs, interval, window)
			sweeps, writes = append(sweeps, lat...), writes+w
			lat, _ = callsDuring(b, specs, time.Hour, window)
			quiet = append(quiet, lat...)
		}
		p50s, p99s := percentiles(sweeps)
		p50q, p99q := percentiles(quiet)
		b.ReportMetric(float64(p50q.Microseconds()), "quiet-p50-µs")
		b.ReportMetric(float64(p99q.Microseconds()), "quiet-p99-µs")
		b.ReportMetric(float64(p50s.Microseconds()), "sweeps-p50-µs")
		b.ReportMetric(float64(p99s.Microseconds()), "sweeps-p99-µs")
		b.ReportMetric(float64(p50s)/float64(p50q), "p50-ratio")
		benchgoal.Report(b, "calltool-p99-during-sweeps", float64(p99s)/float64(p99q), "p99-ratio", benchgoal.AtMost, 1.25)
		sweepsRun := float64(rounds) * float64(window) / float64(interval)
		b.ReportMetric(float64(writes)/sweepsRun, "health-writes/sweep")
	}
}

// callsDuring loads specs into a new registry checking every interval,
// waits until all are READY, then calls the first one back to back for
// window. It returns the calls' latencies and how many health rows were
// written meanwhile.
func callsDuring(b *testing.B, specs []registry.Spec, interval, window time.Duration) ([]time.Duration, int64) {
	src := &countingSource{fakeSource: newSource(specs...)}
	reg, stop := startRegistry(b, src, registry.Config{HealthInterval: interval})
	defer stop()
	waitAllReady(b, reg, specs, time.Minute)
	// Let the connects' garbage and the last turn's closes settle.
	time.Sleep(time.Second)
	runtime.GC()
	ctx := context.Background()
	args := map[string]any{"text": "hi"}
	writes0 := src.saves.Load()
	var lat []time.Duration
	for end := time.Now().Add(window); time.Now().Before(end); {
		start := time.Now()
		if _, err := reg.CallTool(ctx, specs[0].ID, "echo", args, registry.CallOptions{}); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	return lat, src.saves.Load() - writes0
}

// countingSource counts the health rows the registry writes.
type countingSource struct {
	*fakeSource
	saves atomic.Int64
}

func (s *countingSource) SaveHealth(ctx context.Context, id int64, h registry.Health) error {
	s.saves.Add(1)
	return s.fakeSource.SaveHealth(ctx, id, h)
}

// SyncTools does not keep every connector's tools: at this scale the
// fake's memory would be counted as the registry's.
func (s *countingSource) SyncTools(context.Context, int64, []mcp.Tool) (registry.ToolChanges, error) {
	return registry.ToolChanges{}, nil
}

// startHTTPServers starts n test server processes and returns their URLs.
func startHTTPServers(b *testing.B, n int) []string {
	urls := make([]string, n)
	for i := range urls {
		urls[i] = startHTTPServerProcess(b)
	}
	return urls
}

// startRegistry runs a registry over src; stop ends Run and waits for it.
func startRegistry(b *testing.B, src registry.ConnectorSource, cfg registry.Config) (*registry.Registry, func()) {
	reg := registry.New(src, cfg, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- reg.Run(ctx) }()
	return reg, func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("Run: %v", err)
		}
	}
}

// waitAllReady polls until every connector of specs is READY.
func waitAllReady(b *testing.B, reg *registry.Registry, specs []registry.Spec, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for {
		ready := 0
		for _, s := range specs {
			if h, err := reg.Health(s.ID); err == nil && h.State == registry.StateReady {
				ready++
			}
		}
		if ready == len(specs) {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("only %d of %d connectors READY after %s", ready, len(specs), limit)
		}
		time.Sleep(50 * time.Millisecond) // polling 10,000 connectors costs CPU the connects need
	}
}

// settledMemory returns the live heap and the process's resident memory
// after a GC that hands free memory back to the OS.
func settledMemory(b *testing.B) (heap, rss int64) {
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc), vmRSS(b)
}

// vmRSS reads this process's resident set size from /proc/self/status.
func vmRSS(b *testing.B) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		b.Skipf("no /proc: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb * 1024
		}
	}
	b.Fatal("no VmRSS in /proc/self/status")
	return 0
}

func percentiles(lat []time.Duration) (p50, p99 time.Duration) {
	if len(lat) == 0 {
		return 0, 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	return s[len(s)/2], s[int(0.99*float64(len(s)-1))]
}
