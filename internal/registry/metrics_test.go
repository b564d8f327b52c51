package registry_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/telemetry"
	"github.com/connector-svc/connector-svc/internal/telemetry/telemetrytest"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

// conn are the attributes of connector id of workspace ws.
func conn(id string) []attribute.KeyValue {
	return telemetrytest.Attrs("workspace", "ws", "connector", id)
}

// with is base and more attributes.
func with(base []attribute.KeyValue, kv ...string) []attribute.KeyValue {
	return append(append([]attribute.KeyValue(nil), base...), telemetrytest.Attrs(kv...)...)
}

func TestMetricsCountCallsAndReinitializations(t *testing.T) {
	srv := newMCPServer(t, legacyServer)
	m := telemetrytest.New(t)
	cfg := testConfig()
	cfg.HealthInterval = time.Hour // only calls touch the session
	cfg.MeterProvider = m.Provider
	reg := run(t, newSource(httpSpec(1, srv.url())), cfg)
	c1 := conn("c1")

	for range 5 {
		echo(t, reg, 1, "hi")
	}
	for range 2 {
		if res, err := reg.CallTool(ctxT(t), 1, "fail", nil, registry.CallOptions{}); err != nil || !res.IsError {
			t.Fatalf("fail = %v, %v; want an isError result", res, err)
		}
	}
	if _, err := reg.CallTool(ctxT(t), 1, "nope", nil, registry.CallOptions{}); !errors.Is(err, registry.ErrToolNotFound) {
		t.Fatalf("nope: %v", err)
	}
	for _, tt := range []struct {
		name  string
		attrs []attribute.KeyValue
		want  float64
	}{
		{"connector.tool.calls", with(c1, "tool", "echo"), 5},
		{"connector.tool.calls", with(c1, "tool", "fail"), 2},
		{"connector.tool.call.duration", with(c1, "tool", "echo"), 5},
		{"connector.tool.call.errors", with(c1, "tool", "fail", "kind", "tool"), 2},
		{"connector.state", with(c1, "state", "ready"), 1},
		{"connector.reconnects", c1, 0},
		{"connector.reinitializations", c1, 0},
		{"connector.connect.errors", c1, 0},
	} {
		if got, ok := m.Point(t, tt.name, tt.attrs...); !ok || got != tt.want {
			t.Errorf("%s%v = %v (present %v), want %v", tt.name, tt.attrs, got, ok, tt.want)
		}
	}
	if _, ok := m.Point(t, "connector.tool.calls", with(c1, "tool", "nope")...); ok {
		t.Error("a tool the server does not list was counted")
	}
	if _, ok := m.Point(t, "connector.tool.call.errors", with(c1, "tool", "echo", "kind", "tool")...); ok {
		t.Error("successful calls were counted as errors")
	}

	srv.expireSessions()
	echo(t, reg, 1, "after expiry")
	if got := m.Value(t, "connector.reinitializations", c1...); got != 1 {
		t.Errorf("re-initializations = %v, want 1", got)
	}
}

func TestMetricsStdioProcessesAndReconnects(t *testing.T) {
	m := telemetrytest.New(t)
	cfg := testConfig()
	cfg.MeterProvider = m.Provider
	reg := run(t, newSource(stdioSpec(1)), cfg)
	s1 := conn("stdio1")
	if _, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"text": "hi"}, registry.CallOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := m.Value(t, "connector.stdio.processes", s1...); got != 1 {
		t.Errorf("live processes = %v, want 1", got)
	}

	if _, err := reg.CallTool(ctxT(t), 1, "crash", nil, registry.CallOptions{}); err == nil {
		t.Fatal("a call that crashed the server succeeded")
	}
	testsupport.WaitFor(t, "a reconnect after the crash, with one live process", func() bool {
		return m.Value(t, "connector.reconnects", s1...) == 1 && m.Value(t, "connector.stdio.processes", s1...) == 1
	})
	if got := m.Value(t, "connector.tool.call.errors", with(s1, "tool", "crash", "kind", "unavailable")...); got != 1 {
		t.Errorf("crash errors of kind unavailable = %v, want 1", got)
	}

	reg.Remove(1)
	testsupport.WaitFor(t, "no live process after Remove", func() bool { return m.Value(t, "connector.stdio.processes", s1...) == 0 })
	if _, ok := m.Point(t, "connector.state", with(s1, "state", "ready")...); ok {
		t.Error("a removed connector still has a state")
	}
}

func TestMetricsConnectErrorsAndState(t *testing.T) {
	m := telemetrytest.New(t)
	cfg := testConfig()
	cfg.MeterProvider = m.Provider
	run(t, newSource(httpSpec(1, "http://127.0.0.1:1/mcp")), cfg)
	c1 := conn("c1")
	testsupport.WaitFor(t, "three failed connects and state error", func() bool {
		return m.Value(t, "connector.connect.errors", c1...) >= 3 && m.Value(t, "connector.state", with(c1, "state", "error")...) == 1
	})
}

func TestMetricsSessionsOpen(t *testing.T) {
	srv := newMCPServer(t, legacyServer)
	m := telemetrytest.New(t)
	cfg := testConfig()
	cfg.MeterProvider = m.Provider
	spec := httpSpec(1, srv.url())
	spec.SessionMode = registry.SessionPerSession
	reg := run(t, newSource(spec), cfg)
	c1 := conn("c1")
	for _, s := range []string{"a", "b", "a"} {
		if _, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"text": s}, inSession(s)); err != nil {
			t.Fatal(err)
		}
	}
	if got := m.Value(t, "connector.sessions.open", c1...); got != 2 {
		t.Errorf("sessions open = %v, want 2", got)
	}
	if got := m.Value(t, "connector.tool.calls", with(c1, "tool", "echo")...); got != 3 {
		t.Errorf("calls in sessions = %v, want 3", got)
	}
	reg.CloseSession("ws", "a", 1)
	if got := m.Value(t, "connector.sessions.open", c1...); got != 1 {
		t.Errorf("sessions open after closing one = %v, want 1", got)
	}
}

// BenchmarkCallToolMetrics measures what metrics add to a call: two
// registries on the same server process, one recording on the service's
// Prometheus exporter and one on none, called in turn (each iteration
// makes one call on each, alternating which goes first) so that both see
// the same noise.
func BenchmarkCallToolMetrics(b *testing.B) {
	url := startHTTPServerProcess(b)
	on, err := telemetry.NewMetrics(context.Background(), telemetry.MetricsConfig{Exporters: []string{telemetry.ExporterPrometheus}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = on.Shutdown(context.Background()) })
	off := registry.Config{HealthInterval: time.Hour}
	with := off
	with.MeterProvider = on.MeterProvider()
	regs := [2]*registry.Registry{run(b, newSource(httpSpec(1, url)), off), run(b, newSource(httpSpec(1, url)), with)}
	ctx := context.Background()
	args := map[string]any{"text": "hi"}
	for _, reg := range regs { // connect outside the timer
		if _, err := reg.CallTool(ctx, 1, "echo", args, registry.CallOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	var lat [2][]time.Duration
	n := 0
	for b.Loop() {
		for k := range 2 {
			i := (n + k) % 2
			start := time.Now()
			if _, err := regs[i].CallTool(ctx, 1, "echo", args, registry.CallOptions{}); err != nil {
				b.Fatal(err)
			}
			lat[i] = append(lat[i], time.Since(start))
		}
		n++
	}
	b.StopTimer()
	for i, name := range []string{"off", "on"} {
		slices.Sort(lat[i])
		p := func(q float64) float64 { return float64(lat[i][int(q*float64(len(lat[i])-1))].Nanoseconds()) / 1e3 }
		b.ReportMetric(p(0.50), "p50-"+name+"-µs")
		b.ReportMetric(p(0.99), "p99-"+name+"-µs")
	}
}
