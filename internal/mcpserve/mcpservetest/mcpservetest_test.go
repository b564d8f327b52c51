package mcpservetest

import (
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// activeScenarios are the server scenarios of conformance 0.1.16's active
// suite, in the order it runs them. A new pinned version that adds or drops
// one fails TestPlainMCPGoPassesTheActiveSuite, so the numbers in the docs
// get updated.
var activeScenarios = []string{
	"server-initialize", "logging-set-level", "ping", "completion-complete",
	"tools-list", "tools-call-simple-text", "tools-call-image", "tools-call-audio",
	"tools-call-embedded-resource", "tools-call-mixed-content", "tools-call-with-logging",
	"tools-call-error", "tools-call-with-progress", "tools-call-sampling", "tools-call-elicitation",
	"elicitation-sep1034-defaults", "server-sse-multiple-streams", "elicitation-sep1330-enums",
	"resources-list", "resources-read-text", "resources-read-binary", "resources-templates-read",
	"resources-subscribe", "resources-unsubscribe",
	"prompts-list", "prompts-get-simple", "prompts-get-with-args", "prompts-get-embedded-resource",
	"prompts-get-with-image", "dns-rebinding-protection",
}

// TestPlainMCPGoPassesTheActiveSuite is the baseline: a plain mcp-go
// Streamable HTTP server with the fixtures passes every scenario of the
// suite's active set.
func TestPlainMCPGoPassesTheActiveSuite(t *testing.T) {
	res := RunConformance(t, StartFixture(t), nil)
	t.Log(res.Summary())
	var ran []string
	for _, s := range res.Scenarios {
		ran = append(ran, s.Name)
	}
	if !reflect.DeepEqual(ran, activeScenarios) {
		t.Errorf("the active suite ran\n  %v\nnot\n  %v", ran, activeScenarios)
	}
	res.Require(t, activeScenarios...)
	for _, s := range res.Scenarios {
		if s.Passed && s.Successes == 0 {
			t.Errorf("%s passed without a SUCCESS check: %s", s.Name, s.NoSuccess)
		}
	}
}

// TestPendingScenariosAgainstPlainMCPGo runs the two scenarios outside the
// active set by name: json-schema-2020-12 passes; server-sse-polling does
// not apply, since it calls a test_reconnection tool that closes its SSE
// stream mid-call, which mcp-go cannot do, and mcp-go answers the unknown
// tool with JSON.
func TestPendingScenariosAgainstPlainMCPGo(t *testing.T) {
	res := RunConformance(t, StartFixture(t), nil, "json-schema-2020-12", "server-sse-polling")
	t.Log(res.Summary())
	schema, _ := res.Scenario("json-schema-2020-12")
	if !schema.Passed || schema.Successes == 0 {
		t.Errorf("json-schema-2020-12: passed %v with %d successes: %s", schema.Passed, schema.Successes, schema.Failure)
	}
	polling, _ := res.Scenario("server-sse-polling")
	if !polling.Passed || polling.Successes != 0 || !strings.Contains(polling.NoSuccess, "JSON instead of SSE") {
		t.Errorf("server-sse-polling: passed %v, %d successes, %q; want a pass that does not apply", polling.Passed, polling.Successes, polling.NoSuccess)
	}
}

const testKey = "test-api-key-1"

// requireBearer answers 401 to a request without the bearer token, as the
// mcpserve endpoint will.
func requireBearer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+testKey {
			w.Header().Set("WWW-Authenticate", `Bearer realm="mcp"`)
			http.Error(w, "missing or wrong API key", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// startBearerFixture serves the fixture server behind requireBearer at a
// path shaped like mcpserve's.
func startBearerFixture(t *testing.T) string {
	mux := http.NewServeMux()
	mux.Handle("/mcp/ws1/conn1", requireBearer(FixtureHandler()))
	srv := httptest.NewServer(mux)
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	return srv.URL + "/mcp/ws1/conn1"
}

// TestConformanceSendsTheHeaders runs scenarios against an endpoint that
// wants an API key: with the header they pass through the proxy that adds
// it (notifications and a server-to-client request over SSE, concurrent
// SSE streams, and dns-rebinding-protection's own Host and Origin), without
// it they fail with the 401's body, and the key is in no output.
func TestConformanceSendsTheHeaders(t *testing.T) {
	url := startBearerFixture(t)
	scenarios := []string{"server-initialize", "tools-call-with-progress", "tools-call-elicitation",
		"server-sse-multiple-streams", "dns-rebinding-protection"}
	res := RunConformance(t, url, map[string]string{"Authorization": "Bearer " + testKey}, scenarios...)
	t.Log(res.Summary())
	if failed := res.Failed(); len(failed) > 0 {
		t.Errorf("with the API key, failed: %v\n%s", failed, res.Summary())
	}
	if strings.Contains(res.Output, testKey) {
		t.Error("the suite's output shows the API key")
	}

	res = RunConformance(t, url, nil, "tools-list")
	tools, _ := res.Scenario("tools-list")
	if tools.Passed || !strings.Contains(tools.Failure, "missing or wrong API key") {
		t.Errorf("without the API key, tools-list: passed %v, failure %q; want the 401's body", tools.Passed, tools.Failure)
	}
}

// TestScenarioGroupsCoverTheSuite keeps the exported groups in step with
// the suite: every active and pending scenario in exactly one group.
func TestScenarioGroupsCoverTheSuite(t *testing.T) {
	seen := map[string]int{}
	for _, group := range [][]string{EndpointScenarios, ToolScenarios, ResourceScenarios, PromptScenarios, ResumabilityScenarios} {
		for _, name := range group {
			seen[name]++
		}
	}
	all := append(slices.Clone(activeScenarios), PendingScenarios...)
	for _, name := range all {
		if seen[name] != 1 {
			t.Errorf("%s is in %d groups", name, seen[name])
		}
	}
	if len(seen) != len(all) {
		t.Errorf("the groups name %d scenarios, the suite has %d", len(seen), len(all))
	}
}

func TestTSClientListsAndCalls(t *testing.T) {
	url := startBearerFixture(t)
	auth := map[string]string{"Authorization": "Bearer " + testKey}

	out := RunTSClient(t, url, auth, "test_simple_text")
	if out.Error != nil {
		t.Fatalf("client failed: %+v\n%s", out.Error, out.Stderr)
	}
	if !slices.Contains(out.Tools, "test_simple_text") || !slices.Contains(out.Tools, "json_schema_2020_12_tool") {
		t.Errorf("tools %v", out.Tools)
	}
	if got := out.Call.Text(); got != "This is a simple text response for testing." || out.Call.IsError {
		t.Errorf("call: %q (isError %v)", got, out.Call.IsError)
	}
	if out.ServerInfo["name"] != "mcpservetest-fixture" || out.SessionID == "" {
		t.Errorf("serverInfo %v, session %q", out.ServerInfo, out.SessionID)
	}

	out = RunTSClient(t, url, auth, "test_error_handling", "{}")
	if out.Error != nil || !out.Call.IsError {
		t.Errorf("a tool error: error %+v, call %+v; want isError in the result", out.Error, out.Call)
	}

	out = RunTSClient(t, url, auth, "test_tool_with_progress")
	if out.Error != nil || len(out.Notifications) != 3 {
		t.Errorf("progress: error %+v, notifications %v; want 3", out.Error, out.Notifications)
	}

	out = RunTSClient(t, url, nil, "test_simple_text")
	if out.Error == nil || out.Error.Code != float64(401) {
		t.Errorf("without the API key: error %+v; want code 401", out.Error)
	}
	if strings.Contains(out.Stderr, testKey) {
		t.Error("the client's stderr shows the API key")
	}

	out = RunTSClient(t, url, auth, "no_such_tool")
	if out.Error == nil && (out.Call == nil || !out.Call.IsError) {
		t.Errorf("an unknown tool: error %+v, call %+v; want one of them", out.Error, out.Call)
	}
}

func TestTSClientAnswersElicitationAndSampling(t *testing.T) {
	url := startBearerFixture(t)
	auth := map[string]string{"Authorization": "Bearer " + testKey}

	out := RunTSClientWith(t, url, auth, TSClientOptions{ElicitAnswers: []map[string]any{
		{"action": "accept", "content": map[string]any{"username": "ada", "email": "ada@example.com"}},
	}}, "test_elicitation", `{"message":"who are you?"}`)
	if out.Error != nil {
		t.Fatalf("client failed: %+v\n%s", out.Error, out.Stderr)
	}
	if len(out.Elicitations) != 1 || out.Elicitations[0]["message"] != "who are you?" {
		t.Errorf("elicitations %v", out.Elicitations)
	}
	if got := out.Call.Text(); !strings.Contains(got, "action=accept") || !strings.Contains(got, "ada@example.com") {
		t.Errorf("call: %q", got)
	}

	out = RunTSClientWith(t, url, auth, TSClientOptions{ElicitAnswers: []map[string]any{{"action": "decline"}}},
		"test_elicitation", `{"message":"who are you?"}`)
	if got := out.Call.Text(); out.Error != nil || !strings.Contains(got, "action=decline") {
		t.Errorf("declined: error %+v, call %q", out.Error, got)
	}

	// Without the capability the server may not ask: mcp-go refuses, and
	// the fixture turns that into a tool error.
	out = RunTSClient(t, url, auth, "test_elicitation", `{"message":"who are you?"}`)
	if out.Error != nil || !out.Call.IsError || len(out.Elicitations) != 0 {
		t.Errorf("no elicitation capability: error %+v, call %+v, asked %v", out.Error, out.Call, out.Elicitations)
	}

	out = RunTSClientWith(t, url, auth, TSClientOptions{SampleAnswer: "forty-two"}, "test_sampling", `{"prompt":"the answer?"}`)
	if got := out.Call.Text(); out.Error != nil || got != "LLM response: forty-two" || len(out.Samplings) != 1 {
		t.Errorf("sampling: error %+v, call %q, asked %v", out.Error, got, out.Samplings)
	}
}

// TestTSFixtureUpstream runs the whole suite, pending scenarios included,
// against the suite's own TypeScript fixture server, the other upstream a
// gateway test can pass through, and the TypeScript client against it.
func TestTSFixtureUpstream(t *testing.T) {
	url := StartTSFixture(t)
	for _, res := range []ConformanceResult{
		RunConformance(t, url, nil),
		RunConformance(t, url, nil, "json-schema-2020-12", "server-sse-polling"),
	} {
		t.Log(res.Summary())
		if failed := res.Failed(); len(failed) > 0 {
			t.Errorf("failed: %v", failed)
		}
		for _, s := range res.Scenarios {
			// server-sse-polling only warns: the suite asks with protocol
			// version 2025-03-26, for which the SDK's server sends no
			// priming event and no retry field.
			if s.Passed && s.Successes == 0 && s.Name != "server-sse-polling" {
				t.Errorf("%s passed without a SUCCESS check: %s", s.Name, s.NoSuccess)
			}
		}
	}
	out := RunTSClient(t, url, nil, "test_simple_text")
	if out.Error != nil || out.Call.Text() != "This is a simple text response for testing." {
		t.Errorf("client: error %+v, call %+v", out.Error, out.Call)
	}
}
