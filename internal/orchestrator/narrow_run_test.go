package orchestrator_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/llm"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/telemetry/telemetrytest"
)

// recorder is a ToolCaller that answers every call with the tool's name.
type recorder struct {
	mu    sync.Mutex
	calls []string
}

func (r *recorder) CallTool(_ context.Context, _ int64, name string, _ map[string]any, _ orchestrator.CallOptions) (*mcp.CallToolResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, name)
	return mcp.NewToolResultText("ran " + name), nil
}

// bigCatalog is n tools on n subjects, with one about invoices.
func bigCatalog(n int) []orchestrator.Tool {
	tools := []orchestrator.Tool{{Name: "send_invoice", Description: "Sends an invoice to a customer by email.",
		InputSchema: []byte(`{"type":"object","properties":{"customer":{"type":"string","description":"The customer's id"}}}`)}}
	for i := range n - 1 {
		tools = append(tools, orchestrator.Tool{Name: fmt.Sprintf("manage_widget_%02d", i),
			Description: fmt.Sprintf("Manages widget number %d of the factory floor.", i)})
	}
	return tools
}

func narrowFixture(t *testing.T, tools []orchestrator.Tool, steps ...llmtest.Step) (*llmtest.Server, *recorder, *orchestrator.Agent, orchestrator.Request, *telemetrytest.Meters) {
	t.Helper()
	srv := llmtest.New(t, steps...)
	model, err := llm.New(llm.Config{BaseURL: srv.URL(), Model: "fake-model", BackoffBase: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	meters := telemetrytest.New(t)
	agent := orchestrator.New(model, rec, orchestrator.Config{MeterProvider: meters.Provider}, nil)
	req := orchestrator.Request{Connector: orchestrator.NewConnector(orchestrator.Profile{ID: 1, WorkspaceID: "acme", ExternalID: "shop", Name: "Shop"}, tools),
		Query: "Send the March invoice to ACME.", MaxTools: 10}
	return srv, rec, agent, req, meters
}

// A connector above the threshold offers the best-fitting tools and
// search_tools; a tool found by search_tools is callable from the next
// turn; one that is neither offered nor found is refused, so the model can
// search.
func TestNarrowedRunAndSearchTools(t *testing.T) {
	srv, rec, agent, req, meters := narrowFixture(t, bigCatalog(40),
		llmtest.CallTools(llmtest.Call{Tool: "manage_widget_30", Args: `{}`}),
		llmtest.CallTools(llmtest.Call{Tool: "search_tools", Args: `{"query":"widget 30 of the factory"}`}),
		llmtest.CallTools(llmtest.Call{Tool: "manage_widget_30", Args: `{}`}, llmtest.Call{Tool: "send_invoice", Args: `{"customer":"acme"}`}),
		llmtest.Answer("Done."))
	res, err := agent.Run(context.Background(), req, nil)
	if err != nil {
		t.Fatal(err)
	}
	reqs := srv.Requests()
	var first []string
	for _, tool := range reqs[0].Tools {
		first = append(first, tool.Function.Name)
	}
	if len(first) != orchestrator.DefaultNarrowTo+1 || first[0] != "search_tools" || !slices.Contains(first, "send_invoice") ||
		slices.Contains(first, "manage_widget_30") {
		t.Errorf("first request offers %v", first)
	}
	if p := reqs[0].Messages[0].Content; !strings.Contains(p, "It has 40") || !strings.Contains(p, "search_tools") || strings.Contains(p, "manage_widget_30") {
		t.Errorf("prompt = %q", p)
	}
	if call := res.Steps[0].Calls[0]; !strings.Contains(call.RejectedReason, "search_tools") {
		t.Errorf("a call to a tool not offered: %+v", call)
	}
	if found := res.Steps[1].Calls[0]; found.Tool != "search_tools" || !strings.Contains(found.ResultExcerpt, "manage_widget_30") {
		t.Errorf("search call: %+v", found)
	}
	var third []string
	for _, tool := range reqs[2].Tools {
		third = append(third, tool.Function.Name)
	}
	if !slices.Contains(third, "manage_widget_30") {
		t.Errorf("after the search, offered %v", third)
	}
	if !slices.Equal(rec.calls, []string{"manage_widget_30", "send_invoice"}) && !slices.Equal(rec.calls, []string{"send_invoice", "manage_widget_30"}) {
		t.Errorf("ran %v", rec.calls)
	}
	if !res.Narrowed || res.ToolsTotal != 40 || !slices.Contains(res.ToolsOffered, "manage_widget_30") ||
		len(res.ToolsOffered) <= orchestrator.DefaultNarrowTo || !slices.Equal(res.ToolsUsed, []string{"manage_widget_30", "send_invoice"}) {
		t.Errorf("result: narrowed %v, total %d, offered %v, used %v", res.Narrowed, res.ToolsTotal, res.ToolsOffered, res.ToolsUsed)
	}
	attrs := telemetrytest.Attrs("workspace", "acme", "connector", "shop")
	if n, s := meters.Value(t, "connector.queries.narrowed", attrs...), meters.Value(t, "connector.search_tools.calls", attrs...); n != 1 || s != 1 {
		t.Errorf("counted %v narrowed queries and %v searches, want 1 and 1", n, s)
	}
}

// At or below the threshold nothing changes: every tool, no search_tools.
// A connector's own threshold overrides the agent's.
func TestNoNarrowingAtTheThreshold(t *testing.T) {
	srv, _, agent, req, _ := narrowFixture(t, bigCatalog(orchestrator.DefaultNarrowAbove), llmtest.Answer("a"), llmtest.Answer("b"))
	res, err := agent.Run(context.Background(), req, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Narrowed || res.ToolsTotal != 32 || len(res.ToolsOffered) != 32 || len(srv.Requests()[0].Tools) != 32 {
		t.Errorf("narrowed %v, offered %d of %d, sent %d", res.Narrowed, len(res.ToolsOffered), res.ToolsTotal, len(srv.Requests()[0].Tools))
	}
	req.Connector = orchestrator.NewConnector(orchestrator.Profile{ID: 1, NarrowAbove: 10}, bigCatalog(orchestrator.DefaultNarrowAbove))
	res, err = agent.Run(context.Background(), req, nil)
	if err != nil || !res.Narrowed || len(srv.Requests()[1].Tools) != orchestrator.DefaultNarrowTo+1 {
		t.Errorf("with the connector's threshold of 10: %+v, %v", res, err)
	}
}

// plan_only plans with the same selection and says which tools it was.
func TestNarrowedPlan(t *testing.T) {
	srv, _, agent, req, _ := narrowFixture(t, bigCatalog(40),
		llmtest.Answer(`{"plan":[{"tool":"send_invoice","purpose":"send it"}]}`))
	req.PlanOnly = true
	res, err := agent.Run(context.Background(), req, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Narrowed || len(res.ToolsOffered) != orchestrator.DefaultNarrowTo || len(res.Plan) != 1 {
		t.Errorf("plan result: %+v", res)
	}
	if p := srv.Requests()[0].Messages[0].Content; strings.Count(p, "manage_widget_") >= 39 {
		t.Error("the plan prompt lists every tool")
	}
}
