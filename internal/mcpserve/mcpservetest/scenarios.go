package mcpservetest

import (
	"strings"
	"testing"
)

// The server scenarios of the pinned conformance suite (0.1.16), grouped
// by what an endpoint needs to pass them. The scenarios that call fixtures
// call them by exact name (test_simple_text, test://static-text,
// test_simple_prompt, …: NewFixtureServer has them all), so through a
// gateway they apply only where it exposes an upstream with those fixtures
// under the same names.
var (
	// EndpointScenarios test the endpoint itself, whatever it serves:
	// the handshake, ping, logging/setLevel, a tools/list whose every tool
	// has a name, a description and an inputSchema, concurrent POST SSE
	// streams in one session, and a 4xx for a non-localhost Host/Origin
	// (2xx for a localhost one).
	EndpointScenarios = []string{
		"server-initialize", "ping", "logging-set-level", "tools-list",
		"server-sse-multiple-streams", "dns-rebinding-protection",
	}
	// ToolScenarios call the fixture tools: results of each content type
	// and isError passed through; notifications/message and progress
	// relayed during the call; sampling/createMessage and elicitation/create
	// relayed to the client and its answer back, with the requested schema
	// intact (defaults, the five enum forms); and an inputSchema listed with
	// $schema, $defs and additionalProperties kept (json-schema-2020-12).
	ToolScenarios = []string{
		"tools-call-simple-text", "tools-call-image", "tools-call-audio",
		"tools-call-embedded-resource", "tools-call-mixed-content", "tools-call-error",
		"tools-call-with-logging", "tools-call-with-progress",
		"tools-call-sampling", "tools-call-elicitation",
		"elicitation-sep1034-defaults", "elicitation-sep1330-enums",
		"json-schema-2020-12",
	}
	// ResourceScenarios read, list and subscribe to the fixture resources.
	ResourceScenarios = []string{
		"resources-list", "resources-read-text", "resources-read-binary",
		"resources-templates-read", "resources-subscribe", "resources-unsubscribe",
	}
	// PromptScenarios get the fixture prompts and complete an argument of
	// one (completion-complete).
	PromptScenarios = []string{
		"prompts-list", "prompts-get-simple", "prompts-get-with-args",
		"prompts-get-embedded-resource", "prompts-get-with-image", "completion-complete",
	}
	// ResumabilityScenarios: server-sse-polling calls test_reconnection,
	// which closes its SSE stream mid-call, and wants a priming event with
	// an id and a retry field, then the result after a GET with
	// Last-Event-ID. An endpoint that answers the call with JSON passes it
	// without a SUCCESS check (ScenarioResult.NoSuccess says so); so does
	// one that streams without priming events, with warnings.
	ResumabilityScenarios = []string{"server-sse-polling"}
)

// PendingScenarios are outside the suite's active set: RunConformance runs
// them only by name.
var PendingScenarios = []string{"json-schema-2020-12", "server-sse-polling"}

// Require fails t, with the summary, unless every named scenario ran and
// passed.
func (r ConformanceResult) Require(t testing.TB, names ...string) {
	t.Helper()
	var bad []string
	for _, name := range names {
		s, ok := r.Scenario(name)
		switch {
		case !ok:
			bad = append(bad, name+" (did not run)")
		case !s.Passed:
			bad = append(bad, name)
		}
	}
	if len(bad) > 0 {
		t.Errorf("conformance scenarios failed: %s\n%s", strings.Join(bad, ", "), r.Summary())
	}
}
