package mcpserve_test

import (
	"bufio"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/mcpserve/mcpservetest"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/store"
)

// TestConformance runs the official MCP conformance suite (server mode)
// against /mcp/ws/fx, whose connector's server has the suite's fixtures:
// every scenario passes but those testdata/conformance-expected-failures.txt
// lists, each with why it cannot apply yet, and each of those still fails
// (a fixed one must leave the list).
func TestConformance(t *testing.T) {
	mcpservetest.NodeDir(t) // skips loudly without the suite (fails under CI=true)
	e := newEnv(t, false, nil)
	// Per session: a server asks questions on connections of one person
	// only, and each MCP session is one.
	e.add(t, "fx", store.Config{URL: mcpservetest.StartFixture(t), CallTimeout: store.Duration(30 * time.Second),
		Elicitation: true, SessionMode: registry.SessionPerSession})
	url := e.url + "/mcp/ws/fx"
	res := mcpservetest.RunConformance(t, url, nil)
	pending := mcpservetest.RunConformance(t, url, nil, "json-schema-2020-12")
	res.Scenarios = append(res.Scenarios, pending.Scenarios...)
	t.Log(res.Summary())
	expected := expectedFailures(t)
	for _, s := range res.Scenarios {
		why, listed := expected[s.Name]
		switch {
		case !s.Passed && !listed:
			t.Errorf("scenario %s failed:\n%s", s.Name, s.Failure)
		case s.Passed && listed:
			t.Errorf("scenario %s passes now: take it off conformance-expected-failures.txt (it says: %s)", s.Name, why)
		}
	}
	if len(res.Scenarios) < 30 {
		t.Errorf("the suite ran %d scenarios, want the 30 of its active set and json-schema-2020-12", len(res.Scenarios))
	}
}

// expectedFailures reads testdata/conformance-expected-failures.txt:
// "<scenario> <why>" per line, # comments.
func expectedFailures(t *testing.T) map[string]string {
	f, err := os.Open("testdata/conformance-expected-failures.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, why, _ := strings.Cut(line, " ")
		if why = strings.TrimSpace(why); why == "" {
			t.Fatalf("conformance-expected-failures.txt: %s says no why", name)
		}
		out[name] = why
	}
	return out
}
