package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

// TestFreshServiceMetrics scrapes a service that has no connector and has
// served no RPC: the runtime's and the process's metrics, the build info,
// and the connector and LLM counters and gauges at 0 are there. Then a
// call that the auth guard refuses (AUTH=keys, no key) shows in the RPC
// metrics with its method and code.
func TestFreshServiceMetrics(t *testing.T) {
	model := llmtest.New(t)
	svc := start(t, storetest.NewURL(t), map[string]string{"AUTH": "keys", "LLM_BASE_URL": model.URL(), "LLM_MODEL": "fake-model"})
	fams := scrape(t, svc.admin)
	for _, name := range []string{
		"go_goroutines", "go_memstats_heap_alloc_bytes", "go_gc_duration_seconds", "go_threads",
		"process_resident_memory_bytes", "process_open_fds", "process_cpu_seconds_total", "process_start_time_seconds",
		"connector_svc_build_info",
	} {
		if fams[name] == nil {
			t.Errorf("a fresh service's /metrics has no %s; it has %v", name, names(fams))
		}
	}
	b := readBuild()
	if got, ok := sample(fams, "connector_svc_build_info", "version="+b.Version+",revision="+b.revision()+",go_version="+b.GoVersion); !ok || got != 1 {
		t.Errorf("connector_svc_build_info = %v (present %v), want 1 labelled with %+v", got, ok, b)
	}
	for _, tt := range []struct{ metric, labels string }{
		{"connector_state", "state=connecting"}, {"connector_state", "state=ready"},
		{"connector_state", "state=degraded"}, {"connector_state", "state=error"},
		{"connector_tool_calls_total", ""}, {"connector_tool_call_errors_total", ""},
		{"connector_reconnects_total", ""}, {"connector_reinitializations_total", ""},
		{"connector_connect_errors_total", ""}, {"connector_stdio_processes", ""},
		{"connector_llm_requests_total", "model=fake-model"}, {"connector_llm_retries_total", "model=fake-model"},
	} {
		if got, ok := sample(fams, tt.metric, tt.labels); !ok || got != 0 {
			t.Errorf("%s{%s} = %v (present %v), want 0 before the first connector", tt.metric, tt.labels, got, ok)
		}
	}

	client := connectorv1.NewConnectorServiceClient(dial(t, svc.addr))
	for range 2 {
		_, err := client.ListConnectors(testCtx(t), &connectorv1.ListConnectorsRequest{WorkspaceId: "acme"})
		if status.Code(err) != codes.Unauthenticated {
			t.Fatalf("ListConnectors without a key = %v, want UNAUTHENTICATED", err)
		}
	}
	const rpcLabels = "rpc_method=connector.v1.ConnectorService/ListConnectors,rpc_response_status_code=UNAUTHENTICATED,rpc_system_name=grpc"
	// The stats handler records an RPC after its status went out: the
	// second call's may land a moment after the caller has it.
	var got float64
	var ok bool
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		fams = scrape(t, svc.admin)
		if got, ok = sample(fams, "rpc_server_call_duration_seconds", rpcLabels); (ok && got >= 2) || time.Now().After(deadline) {
			break
		}
	}
	if !ok || got != 2 {
		t.Errorf("rpc_server_call_duration_seconds{%s} = %v (present %v), want a count of 2; the family: %v",
			rpcLabels, got, ok, fams["rpc_server_call_duration_seconds"])
	}
}

// names are the metric names of a scrape, sorted.
func names(fams map[string]*dto.MetricFamily) string {
	var out []string
	for name := range fams {
		out = append(out, name)
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}
