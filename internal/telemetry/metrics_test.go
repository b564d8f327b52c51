package telemetry_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/connector-svc/connector-svc/internal/telemetry"
)

func TestParseExporters(t *testing.T) {
	for _, tt := range []struct {
		v       string
		admin   bool
		want    []string
		wantErr bool
	}{
		{"", true, []string{"prometheus"}, false},
		{"", false, nil, false},
		{"none", true, nil, false},
		{"otlp", true, []string{"otlp"}, false},
		{" prometheus , otlp ", false, []string{"prometheus", "otlp"}, false},
		{"otlp,otlp", false, []string{"otlp"}, false},
		{"none,otlp", true, nil, true},
		{"console", true, nil, true},
		{"jaeger", false, nil, true},
	} {
		got, err := telemetry.ParseExporters(tt.v, tt.admin)
		if (err != nil) != tt.wantErr || !slices.Equal(got, tt.want) {
			t.Errorf("ParseExporters(%q, %v) = %q, %v; want %q, error %v", tt.v, tt.admin, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestParseProtocol(t *testing.T) {
	for _, tt := range []struct {
		metrics, all, want string
		wantErr            bool
	}{
		{"", "", "http/protobuf", false},
		{"", "grpc", "grpc", false},
		{"http/protobuf", "grpc", "http/protobuf", false},
		{"http/json", "", "", true},
	} {
		got, err := telemetry.ParseProtocol(tt.metrics, tt.all)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseProtocol(%q, %q) = %q, %v; want %q, error %v", tt.metrics, tt.all, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestMetricsOff(t *testing.T) {
	m, err := telemetry.NewMetrics(context.Background(), telemetry.MetricsConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if m.Handler() != nil {
		t.Error("metrics off serve /metrics")
	}
	c, _ := m.MeterProvider().Meter("test").Int64Counter("x")
	c.Add(context.Background(), 1) // a no-op, not a panic
	if err := m.Shutdown(context.Background()); err != nil {
		t.Error(err)
	}
}

func TestPrometheusNames(t *testing.T) {
	m, err := telemetry.NewMetrics(context.Background(), telemetry.MetricsConfig{Exporters: []string{telemetry.ExporterPrometheus},
		Build: []attribute.KeyValue{attribute.String("version", "v1.2.3")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Shutdown(context.Background()) })
	meter := m.MeterProvider().Meter("test")
	calls, _ := meter.Int64Counter("connector.tool.calls", metric.WithUnit("{call}"))
	calls.Add(context.Background(), 3)
	dur, _ := meter.Float64Histogram("connector.tool.call.duration", metric.WithUnit("s"))
	dur.Record(context.Background(), 0.2)

	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{
		"connector_tool_calls_total 3\n",
		"connector_tool_call_duration_seconds_count 1\n",
		`target_info{`, `service_name="connector-svc"`,
		"go_goroutines ", "process_resident_memory_bytes ", `connector_svc_build_info{version="v1.2.3"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("scrape lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, "otel_scope_name") {
		t.Errorf("scrape has scope labels:\n%s", body)
	}
}

// TestOTLPExport pushes metrics to a fake OTLP/HTTP collector at
// OTEL_EXPORTER_OTLP_ENDPOINT, on Shutdown: the service's, the build info,
// and the Go runtime's and process's through the Prometheus bridge.
func TestOTLPExport(t *testing.T) {
	var posts atomic.Int64
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		has := func(s string) bool { return strings.Contains(string(body), s) }
		if r.Method == http.MethodPost && r.URL.Path == "/v1/metrics" && has("connector.tool.calls") &&
			has("connector_svc.build_info") && has("go_goroutines") && has("process_resident_memory_bytes") {
			posts.Add(1)
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	t.Cleanup(collector.Close)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "")
	m, err := telemetry.NewMetrics(context.Background(), telemetry.MetricsConfig{Exporters: []string{telemetry.ExporterOTLP}})
	if err != nil {
		t.Fatal(err)
	}
	if m.Handler() != nil {
		t.Error("otlp alone serves /metrics")
	}
	calls, _ := m.MeterProvider().Meter("test").Int64Counter("connector.tool.calls")
	calls.Add(context.Background(), 1)
	if err := m.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if posts.Load() == 0 {
		t.Error("Shutdown pushed nothing to the collector, or not the runtime's and the build's metrics")
	}
}
