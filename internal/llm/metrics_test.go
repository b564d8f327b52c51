package llm_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/llm"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/telemetry/telemetrytest"
)

func TestMetrics(t *testing.T) {
	srv := llmtest.New(t, llmtest.Answer("one"), llmtest.Answer("two"), llmtest.Fail(http.StatusBadRequest, "no such model", nil))
	m := telemetrytest.New(t)
	c, err := llm.New(llm.Config{BaseURL: srv.URL(), Model: "test-model", BackoffBase: time.Millisecond, MeterProvider: m.Provider})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		_, _ = chat(t, c)
	}
	for _, tt := range []struct {
		name  string
		attrs []string
		want  float64
	}{
		{"connector.llm.requests", nil, 3},
		{"connector.llm.request.duration", nil, 3},
		{"connector.llm.request.errors", []string{"status", "400"}, 1},
		{"connector.llm.tokens", []string{"type", "input"}, 200}, // llmtest reports 100 in, 20 out per answer
		{"connector.llm.tokens", []string{"type", "output"}, 40},
	} {
		attrs := telemetrytest.Attrs(append([]string{"model", "test-model"}, tt.attrs...)...)
		if got, ok := m.Point(t, tt.name, attrs...); !ok || got != tt.want {
			t.Errorf("%s%v = %v (present %v), want %v", tt.name, attrs, got, ok, tt.want)
		}
	}
}

// TestMetricsCountRetries: a 429 and a 502 retried before the answer count
// two retries of the model, one per status; the counter is at 0 before.
func TestMetricsCountRetries(t *testing.T) {
	srv := llmtest.New(t, llmtest.Fail(http.StatusTooManyRequests, "slow down", nil),
		llmtest.Fail(http.StatusBadGateway, "upstream", nil), llmtest.Answer("done"))
	m := telemetrytest.New(t)
	c, err := llm.New(llm.Config{BaseURL: srv.URL(), Model: "test-model", BackoffBase: time.Millisecond, MeterProvider: m.Provider})
	if err != nil {
		t.Fatal(err)
	}
	model := telemetrytest.Attrs("model", "test-model")
	if got, ok := m.Point(t, "connector.llm.retries", model...); !ok || got != 0 {
		t.Errorf("connector.llm.retries before any request = %v (present %v), want 0", got, ok)
	}
	if _, err := chat(t, c); err != nil {
		t.Fatal(err)
	}
	for _, status := range []string{"429", "502"} {
		attrs := telemetrytest.Attrs("model", "test-model", "status", status)
		if got, ok := m.Point(t, "connector.llm.retries", attrs...); !ok || got != 1 {
			t.Errorf("connector.llm.retries%v = %v (present %v), want 1", attrs, got, ok)
		}
	}
	if got, _ := m.Point(t, "connector.llm.requests", model...); got != 1 {
		t.Errorf("connector.llm.requests = %v, want 1: a retried request counts once", got)
	}
}
