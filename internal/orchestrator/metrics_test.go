package orchestrator_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/llm"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/telemetry/telemetrytest"
)

func TestMetricsCountQueriesByStatus(t *testing.T) {
	srv := llmtest.New(t,
		llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"ping"}`}), llmtest.Answer("It said ping."),
		llmtest.Answer(`{"plan":[{"tool":"echo","purpose":"ping"}]}`),
		llmtest.Fail(http.StatusBadRequest, "no", nil))
	model, err := llm.New(llm.Config{BaseURL: srv.URL(), Model: "fake-model", BackoffBase: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	m := telemetrytest.New(t)
	tc, catalog := newTools(t)
	f := &fixture{llm: srv, tools: tc, agent: orchestrator.New(model, tc, orchestrator.Config{MeterProvider: m.Provider}, nil),
		req: orchestrator.Request{Connector: orchestrator.NewConnector(orchestrator.Profile{ID: 1, WorkspaceID: "acme", ExternalID: "shop", Name: "Shop"}, catalog),
			Query: "q", MaxTools: 10}}
	if _, err := f.run(t); err != nil {
		t.Fatal(err)
	}
	f.req.PlanOnly = true
	if _, err := f.run(t); err != nil {
		t.Fatal(err)
	}
	f.req.PlanOnly = false
	if _, err := f.run(t); err == nil {
		t.Fatal("a run whose model failed succeeded")
	}
	for _, status := range []string{"completed", "planned", "failed"} {
		attrs := telemetrytest.Attrs("workspace", "acme", "connector", "shop", "status", status)
		if got := m.Value(t, "connector.queries", attrs...); got != 1 {
			t.Errorf("queries %v = %v, want 1", attrs, got)
		}
	}
}
