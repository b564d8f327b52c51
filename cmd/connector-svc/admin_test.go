package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/structpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

const dashboardFile = "../../deploy/grafana/connector-svc.json"

// TestEndToEndMetrics runs the real run() with an HTTP MCP server (shared
// and per_session connectors), a stdio one and a fake LLM, makes a known
// number of calls and two queries (one answered, one whose model fails)
// over gRPC, and scrapes /metrics over HTTP. Every metric the Grafana
// dashboard queries must be in that scrape.
func TestEndToEndMetrics(t *testing.T) {
	m := mcpserver.NewMCPServer("e2e", "1.0")
	m.AddTool(mcp.NewTool("echo", mcp.WithDescription("Echoes text"), mcp.WithString("text", mcp.Required())),
		func(_ context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText("echo: " + r.GetString("text", "")), nil
		})
	m.AddTool(mcp.NewTool("fail", mcp.WithDescription("Always fails")),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultError("it failed"), nil
		})
	mcpSrv := httptest.NewServer(mcpserver.NewStreamableHTTPServer(m))
	t.Cleanup(mcpSrv.Close)
	stdio := filepath.Join(fakeNPX(t), "npx") // runs the registry's test stdio server
	model := llmtest.New(t, llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"q"}`}), llmtest.Answer("It echoed q."),
		llmtest.Fail(http.StatusBadRequest, "no such model", nil))
	svc := start(t, storetest.NewURL(t), map[string]string{
		"LLM_BASE_URL": model.URL(), "LLM_MODEL": "fake-model", "STDIO_ALLOWED_COMMANDS": stdio})
	client := connectorv1.NewConnectorServiceClient(dial(t, svc.addr))
	httpConn := &connectorv1.Connector_Http{Http: &connectorv1.HttpConfig{Url: mcpSrv.URL + "/mcp"}}
	for _, c := range []*connectorv1.Connector{
		{ConnectorId: "echo", Transport: connectorv1.Transport_TRANSPORT_STREAMABLE_HTTP, ApprovalPolicy: noApproval, Connection: httpConn},
		{ConnectorId: "sess", Transport: connectorv1.Transport_TRANSPORT_STREAMABLE_HTTP, ApprovalPolicy: noApproval, Connection: httpConn,
			SessionMode: connectorv1.SessionMode_SESSION_MODE_PER_SESSION},
		{ConnectorId: "local", Transport: connectorv1.Transport_TRANSPORT_STDIO, ApprovalPolicy: noApproval,
			Connection: &connectorv1.Connector_Stdio{Stdio: &connectorv1.StdioConfig{Command: stdio}}},
	} {
		if _, err := client.CreateConnector(testCtx(t), &connectorv1.CreateConnectorRequest{WorkspaceId: "acme", Connector: c}); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"echo", "sess", "local"} {
		waitReady(t, client, "acme", id)
	}

	query := &connectorv1.QueryConnectorRequest{WorkspaceId: "acme", ConnectorId: "echo", Query: "q"}
	if _, err := client.QueryConnector(testCtx(t), query); err != nil {
		t.Fatal(err)
	}
	if _, err := client.QueryConnector(testCtx(t), query); err == nil {
		t.Fatal("a query whose model failed succeeded")
	}
	args, _ := structpb.NewStruct(map[string]any{"text": "hi"})
	call := func(connector, tool, session string) {
		t.Helper()
		if _, err := client.CallTool(testCtx(t), &connectorv1.CallToolRequest{WorkspaceId: "acme", ConnectorId: connector,
			ToolName: tool, Arguments: args, SessionId: session}); err != nil {
			t.Fatal(err)
		}
	}
	const calls = 7
	for range calls {
		call("echo", "echo", "")
	}
	call("echo", "fail", "")
	call("echo", "fail", "")
	call("sess", "echo", "s1")
	call("local", "echo", "")

	fams := scrape(t, svc.admin)
	for _, tt := range []struct {
		metric string
		labels string
		want   float64
	}{
		{"connector_tool_calls_total", `workspace=acme,connector=echo,tool=echo`, calls + 1}, // + the query's call
		{"connector_tool_call_duration_seconds", `workspace=acme,connector=echo,tool=echo`, calls + 1},
		{"connector_tool_calls_total", `workspace=acme,connector=echo,tool=fail`, 2},
		{"connector_tool_call_errors_total", `workspace=acme,connector=echo,tool=fail,kind=tool`, 2},
		{"connector_tool_calls_total", `workspace=acme,connector=sess,tool=echo`, 1},
		{"connector_tool_calls_total", `workspace=acme,connector=local,tool=echo`, 1},
		{"connector_state", `workspace=acme,connector=echo,state=ready`, 1},
		{"connector_state", `workspace=acme,connector=local,state=ready`, 1},
		{"connector_sessions_open", `workspace=acme,connector=sess`, 1},
		{"connector_stdio_processes", `workspace=acme,connector=local`, 1},
		{"connector_reconnects_total", `workspace=acme,connector=echo`, 0},
		{"connector_llm_requests_total", `model=fake-model`, 3},
		{"connector_llm_request_errors_total", `model=fake-model,status=400`, 1},
		{"connector_llm_request_duration_seconds", `model=fake-model`, 3},
		{"connector_llm_tokens_total", `model=fake-model,type=input`, 200},
		{"connector_llm_tokens_total", `model=fake-model,type=output`, 40},
		{"connector_queries_total", `workspace=acme,connector=echo,status=completed`, 1},
		{"connector_queries_total", `workspace=acme,connector=echo,status=failed`, 1},
	} {
		if got, ok := sample(fams, tt.metric, tt.labels); !ok || got != tt.want {
			t.Errorf("%s{%s} = %v (present %v), want %v", tt.metric, tt.labels, got, ok, tt.want)
		}
	}

	names := seriesNames(fams)
	queried := dashboardMetrics(t)
	for _, name := range queried {
		if !names[name] {
			t.Errorf("the dashboard queries %s, which the scrape lacks", name)
		}
	}
	if len(queried) < 10 {
		t.Errorf("the dashboard queries only %d metrics: %v", len(queried), queried)
	}
	if code := getStatus(t, "http://"+svc.admin+"/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("pprof without ADMIN_PPROF = %d, want 404", code)
	}
}

// waitReady waits until a connector is READY: connected, its catalog in
// memory.
func waitReady(t *testing.T, client connectorv1.ConnectorServiceClient, ws, id string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := client.GetConnector(testCtx(t), &connectorv1.GetConnectorRequest{WorkspaceId: ws, ConnectorId: id})
		if err == nil && got.GetConnector().GetHealth().GetState() == connectorv1.ConnectorState_CONNECTOR_STATE_READY {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("connector %s is not READY after 20s: %v %v", id, got.GetConnector().GetHealth(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// scrape GETs /metrics of the admin address and parses it.
func scrape(t *testing.T, admin string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics = %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// sample returns the value (a histogram's count) of metric's series with
// exactly labels ("k=v,k=v").
func sample(fams map[string]*dto.MetricFamily, metric, labels string) (float64, bool) {
	fam := fams[metric]
	if fam == nil {
		return 0, false
	}
	want := map[string]string{}
	for _, kv := range strings.Split(labels, ",") {
		if kv == "" { // no labels
			continue
		}
		k, v, _ := strings.Cut(kv, "=")
		want[k] = v
	}
	for _, m := range fam.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		if !equalMaps(got, want) {
			continue
		}
		switch fam.GetType() {
		case dto.MetricType_COUNTER:
			return m.GetCounter().GetValue(), true
		case dto.MetricType_GAUGE:
			return m.GetGauge().GetValue(), true
		case dto.MetricType_HISTOGRAM:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// seriesNames are the names a PromQL query can select in fams: a
// histogram's _bucket, _sum and _count series, a summary's _sum and
// _count.
func seriesNames(fams map[string]*dto.MetricFamily) map[string]bool {
	out := map[string]bool{}
	for name, fam := range fams {
		out[name] = true
		switch fam.GetType() {
		case dto.MetricType_HISTOGRAM:
			out[name+"_bucket"], out[name+"_sum"], out[name+"_count"] = true, true, true
		case dto.MetricType_SUMMARY:
			out[name+"_sum"], out[name+"_count"] = true, true
		}
	}
	return out
}

// dashboard is the part of a Grafana dashboard the tests read.
type dashboard struct {
	Title  string `json:"title"`
	UID    string `json:"uid"`
	Panels []struct {
		ID      int    `json:"id"`
		Title   string `json:"title"`
		Type    string `json:"type"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s is not valid JSON: %v", dashboardFile, err)
	}
	return d
}

// metricName matches the names of the service's metrics, its RPCs' and
// the Go runtime's and process's in a query whose label matchers and
// grouping clauses are cut (labelClauses): rpc_method is a label.
var (
	metricName   = regexp.MustCompile(`\b(?:connector|rpc|go|process)_[a-z0-9_]+`)
	labelClauses = regexp.MustCompile(`\{[^}]*\}|\b(?:by|without|on|ignoring)\s*\([^)]*\)|,\s*[a-z_]+\)`)
)

// dashboardMetrics are the metric names the dashboard's panels and
// variables query, sorted.
func dashboardMetrics(t *testing.T) []string {
	t.Helper()
	d := readDashboard(t)
	seen := map[string]bool{}
	var exprs []string
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if q, ok := v.Query.(string); ok {
			exprs = append(exprs, q)
		}
	}
	for _, e := range exprs {
		for _, name := range metricName.FindAllString(labelClauses.ReplaceAllString(e, " "), -1) {
			seen[name] = true
		}
	}
	out := make([]string, 0, len(seen))
	for name := range seen {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// TestDashboardJSON checks the dashboard's shape: a uid, panels with
// unique ids, and a query on every panel that is not a row.
func TestDashboardJSON(t *testing.T) {
	d := readDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("dashboard uid %q, title %q; want both", d.UID, d.Title)
	}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d is used twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q has an empty query", p.Title)
			}
		}
	}
	if len(d.Panels) < 8 {
		t.Errorf("the dashboard has %d panels", len(d.Panels))
	}
}

func getStatus(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestEndToEndReadiness runs the real run() on a Postgres reached through
// a TCP proxy, cuts the proxy and restores it: /readyz and gRPC health go
// NOT_SERVING and back; /healthz answers 200 throughout.
func TestEndToEndReadiness(t *testing.T) {
	dbURL, err := url.Parse(storetest.NewURL(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := newTCPProxy(t, dbURL.Host)
	dbURL.Host = proxy.addr
	svc := start(t, dbURL.String(), map[string]string{"ADMIN_PPROF": "true"})
	admin := "http://" + svc.admin
	// The watch lasts the test, not one step's 20 s: on a busy machine
	// the steps together take longer.
	watchCtx, stopWatch := context.WithCancel(context.Background())
	t.Cleanup(stopWatch)
	watch, err := healthpb.NewHealthClient(dial(t, svc.addr)).Watch(watchCtx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	statuses := make(chan healthpb.HealthCheckResponse_ServingStatus, 16)
	go func() {
		defer close(statuses)
		for {
			resp, err := watch.Recv()
			if err != nil {
				return
			}
			statuses <- resp.GetStatus()
		}
	}()
	// next is the next status the watch reports, within a step's time.
	next := func() healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		select {
		case s, ok := <-statuses:
			if !ok {
				t.Fatal("the health watch ended")
			}
			return s
		case <-time.After(testsupport.Within):
			t.Fatalf("no health status within %v", testsupport.Within)
		}
		return 0
	}
	waitStatus := func(what string, want int) {
		t.Helper()
		testsupport.WaitFor(t, fmt.Sprintf("/readyz to answer %d %s", want, what), func() bool {
			return getStatus(t, admin+"/readyz") == want
		})
	}

	for _, step := range []struct {
		name   string
		do     func()
		health healthpb.HealthCheckResponse_ServingStatus
		readyz int
	}{
		{"at start", func() {}, healthpb.HealthCheckResponse_SERVING, http.StatusOK},
		{"with Postgres cut", proxy.cut, healthpb.HealthCheckResponse_NOT_SERVING, http.StatusServiceUnavailable},
		{"with Postgres back", proxy.restore, healthpb.HealthCheckResponse_SERVING, http.StatusOK},
	} {
		step.do()
		if s := next(); s != step.health {
			t.Fatalf("health %s = %v, want %v", step.name, s, step.health)
		}
		waitStatus(step.name, step.readyz)
		if code := getStatus(t, admin+"/healthz"); code != http.StatusOK {
			t.Errorf("/healthz %s = %d, want 200", step.name, code)
		}
	}
	if code := getStatus(t, admin+"/debug/pprof/"); code != http.StatusOK {
		t.Errorf("pprof with ADMIN_PPROF=true = %d, want 200", code)
	}
	if err := svc.stop(); err != nil {
		t.Fatal(err)
	}
}

// tcpProxy forwards TCP connections to target until cut.
type tcpProxy struct {
	t      *testing.T
	target string
	addr   string

	mu    sync.Mutex
	lis   net.Listener
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

func newTCPProxy(t *testing.T, target string) *tcpProxy {
	p := &tcpProxy{t: t, target: target, conns: map[net.Conn]bool{}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = lis.Addr().String()
	p.serve(lis)
	t.Cleanup(func() {
		p.cut()
		p.wg.Wait()
	})
	return p
}

func (p *tcpProxy) serve(lis net.Listener) {
	p.mu.Lock()
	p.lis = lis
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			p.forward(c)
		}
	}()
}

// forward pipes c to a new connection to the target, both ways.
func (p *tcpProxy) forward(c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns[c], p.conns[up] = true, true
	p.mu.Unlock()
	for _, pair := range [][2]net.Conn{{c, up}, {up, c}} {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			_, _ = io.Copy(pair[0], pair[1])
			pair[0].Close()
			pair[1].Close()
		}()
	}
}

// cut closes the listener and every connection: Postgres is unreachable.
func (p *tcpProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lis != nil {
		p.lis.Close()
		p.lis = nil
	}
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// restore listens again on the same address.
func (p *tcpProxy) restore() {
	lis, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatal(err)
	}
	p.serve(lis)
}

// TestRunBadAdminConfig checks that wrong admin and metrics settings stop
// start-up with the setting named, before any database work.
func TestRunBadAdminConfig(t *testing.T) {
	tests := map[string]struct {
		args []string
		env  map[string]string
		want string
	}{
		"non-loopback admin":       {[]string{"-admin-addr", "0.0.0.0:0"}, nil, "ADMIN_ANY_ADDRESS"},
		"all interfaces admin":     {nil, map[string]string{"ADMIN_ADDR": ":9464"}, "ADMIN_ANY_ADDRESS"},
		"bad admin address":        {[]string{"-admin-addr", "nonsense"}, nil, "ADMIN_ADDR"},
		"pprof without admin":      {[]string{"-admin-addr", "off", "-admin-pprof"}, nil, "ADMIN_PPROF"},
		"bad pprof value":          {nil, map[string]string{"ADMIN_PPROF": "sometimes"}, "ADMIN_PPROF"},
		"unknown exporter":         {nil, map[string]string{"OTEL_METRICS_EXPORTER": "zipkin"}, "OTEL_METRICS_EXPORTER"},
		"prometheus without admin": {nil, map[string]string{"ADMIN_ADDR": "off", "OTEL_METRICS_EXPORTER": "prometheus"}, "ADMIN_ADDR"},
		"bad otlp protocol":        {nil, map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "http/json"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			args := append([]string{"-database-url", "postgres://postgres@127.0.0.1:1/x?sslmode=disable"}, tt.args...)
			err := run(testCtx(t), args, getenv(tt.env), io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("run = %v; want an error mentioning %q", err, tt.want)
			}
		})
	}
}

// TestAdminAnyAddress checks that ADMIN_ANY_ADDRESS lets the admin
// listener serve on every interface.
func TestAdminAnyAddress(t *testing.T) {
	svc := start(t, storetest.NewURL(t), map[string]string{"ADMIN_ANY_ADDRESS": "true"}, "-admin-addr", "0.0.0.0:0")
	_, port, _ := net.SplitHostPort(svc.admin)
	if code := getStatus(t, "http://127.0.0.1:"+port+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d", code)
	}
	if !strings.HasPrefix(svc.admin, "0.0.0.0:") && !strings.HasPrefix(svc.admin, "[::]:") {
		t.Errorf("admin listens on %s, want every interface", svc.admin)
	}
}
