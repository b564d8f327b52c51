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
