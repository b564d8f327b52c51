package telemetry_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/trace"

	"github.com/connector-svc/connector-svc/internal/telemetry"
	"github.com/connector-svc/connector-svc/internal/telemetry/telemetrytest"
)

// setenv sets the OpenTelemetry environment for one test, every variable
// the SDK reads unset unless given, and returns the TracingConfig the
// service's configuration reads from it.
func setenv(t *testing.T, env map[string]string) telemetry.TracingConfig {
	for _, k := range []string{"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
		"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES",
		"OTEL_SDK_DISABLED"} {
		t.Setenv(k, env[k])
	}
	return telemetry.TracingConfig{Exporter: env["OTEL_TRACES_EXPORTER"], Protocol: env["OTEL_EXPORTER_OTLP_PROTOCOL"],
		Disabled: env["OTEL_SDK_DISABLED"] == "true"}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestSetupTracingExportsNothingByDefault(t *testing.T) {
	for _, env := range []map[string]string{{}, {"OTEL_TRACES_EXPORTER": "none"},
		{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}} {
		cfg := setenv(t, env)
		tr, err := telemetry.SetupTracing(ctxT(t), cfg)
		if err != nil {
			t.Fatal(err)
		}
		_, span := tr.Provider.Tracer("test").Start(ctxT(t), "s")
		if span.IsRecording() || tr.Exporter != "none" {
			t.Errorf("%v: recording %t, exporter %q; want a no-op provider, exporter none", env, span.IsRecording(), tr.Exporter)
		}
		span.End()
		if err := tr.Shutdown(ctxT(t)); err != nil {
			t.Error(err)
		}
	}
}

func TestSetupTracingOTLP(t *testing.T) {
	for protocol, collector := range map[string]func(testing.TB) *telemetrytest.Collector{
		"http/protobuf": telemetrytest.NewHTTP, "grpc": telemetrytest.NewGRPC} {
		t.Run(protocol, func(t *testing.T) {
			c := collector(t)
			spans := exportOne(t, c, map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
				"OTEL_EXPORTER_OTLP_ENDPOINT": c.Endpoint, "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=test"})
			if len(spans) != 1 || spans[0].Name != "work" {
				t.Fatalf("collector got %+v; want the one span", spans)
			}
			if res := spans[0].Resource; res["service.name"] != "connector-svc" || res["deployment.environment.name"] != "test" {
				t.Errorf("resource = %v; want service.name connector-svc and OTEL_RESOURCE_ATTRIBUTES", res)
			}
		})
	}
}

func TestSetupTracingServiceName(t *testing.T) {
	c := telemetrytest.NewHTTP(t)
	spans := exportOne(t, c, map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": c.Endpoint,
		"OTEL_SERVICE_NAME": "connectors-eu"})
	if len(spans) != 1 || spans[0].Resource["service.name"] != "connectors-eu" {
		t.Errorf("collector got %+v; want one span of service connectors-eu", spans)
	}
}

// exportOne sets tracing up from env, ends one span, "work", shuts
// tracing down and returns what c got.
func exportOne(t *testing.T, c *telemetrytest.Collector, env map[string]string) []telemetrytest.Span {
	t.Helper()
	cfg := setenv(t, env)
	tr, err := telemetry.SetupTracing(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, span := tr.Provider.Tracer("test").Start(ctxT(t), "work")
	span.End()
	// The batcher holds the span: only Shutdown sends it.
	if err := tr.Shutdown(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	return c.Spans()
}

func TestSetupTracingBadEnvironment(t *testing.T) {
	for _, env := range []map[string]string{
		{"OTEL_TRACES_EXPORTER": "zipkin"},
		{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"},
		{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_RESOURCE_ATTRIBUTES": "team"},
	} {
		cfg := setenv(t, env)
		if _, err := telemetry.SetupTracing(ctxT(t), cfg); err == nil || !strings.Contains(err.Error(), "OTEL_") {
			t.Errorf("%v: SetupTracing = %v; want an error naming the setting", env, err)
		}
	}
}

func TestTraceparent(t *testing.T) {
	got := make(chan http.Header, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { got <- r.Header.Clone() }))
	t.Cleanup(srv.Close)
	hc := &http.Client{Transport: telemetry.Traceparent(nil)}

	traceID, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	spanID, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: traceID, SpanID: spanID, TraceFlags: trace.FlagsSampled})
	member, _ := baggage.NewMember("user", "alice")
	bag, _ := baggage.New(member)
	for name, tt := range map[string]struct {
		ctx  context.Context
		want string
	}{
		"in a trace":  {baggage.ContextWithBaggage(trace.ContextWithSpanContext(ctxT(t), sc), bag), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		"no trace":    {ctxT(t), ""},
		"no sampling": {trace.ContextWithSpanContext(ctxT(t), sc.WithTraceFlags(0)), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"},
	} {
		req, err := http.NewRequestWithContext(tt.ctx, http.MethodGet, srv.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		h := <-got
		if h.Get("Traceparent") != tt.want || h.Get("Baggage") != "" {
			t.Errorf("%s: server got traceparent %q, baggage %q; want %q and no baggage", name, h.Get("Traceparent"), h.Get("Baggage"), tt.want)
		}
		if req.Header.Get("Traceparent") != "" {
			t.Errorf("%s: the caller's request was changed", name)
		}
	}
}

// TestTraceExportersAreAccepted: every value TraceExporters lists (the
// help's list) is one SetupTracing takes, and its error names them all.
func TestTraceExportersAreAccepted(t *testing.T) {
	for _, name := range telemetry.TraceExporters() {
		cfg := setenv(t, map[string]string{"OTEL_TRACES_EXPORTER": name, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
		tr, err := telemetry.SetupTracing(ctxT(t), cfg)
		if err != nil {
			t.Errorf("OTEL_TRACES_EXPORTER=%s: %v", name, err)
			continue
		}
		if want := name; tr.Exporter != want {
			t.Errorf("OTEL_TRACES_EXPORTER=%s: exporter %q", name, tr.Exporter)
		}
		_ = tr.Shutdown(ctxT(t))
	}
	cfg := setenv(t, map[string]string{"OTEL_TRACES_EXPORTER": "jaeger"})
	_, err := telemetry.SetupTracing(ctxT(t), cfg)
	if err == nil || !strings.Contains(err.Error(), "otlp, console, none") {
		t.Errorf("OTEL_TRACES_EXPORTER=jaeger: %v; want an error naming otlp, console, none", err)
	}
}
