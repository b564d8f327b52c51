package mcpservetest

import (
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// ConformanceVersion is the pinned @modelcontextprotocol/conformance
// (testdata/node/package.json).
const ConformanceVersion = "0.1.16"

// The suite's server mode runs one scenario per --scenario, or its whole
// active suite without it; each run gets a node process and these bounds.
// They are generous: the machine running the tests may be loaded, and the
// SSE scenarios wait up to 10 s for a stream on their own.
const (
	scenarioTimeout = 2 * time.Minute
	suiteTimeout    = 10 * time.Minute
)

// Check is one entry of the suite's checks.json for a scenario.
type Check struct {
	ID          string `json:"id"`
	Name        string `json:"name"`
	Description string `json:"description"`
	// Status is SUCCESS, FAILURE, WARNING or INFO (INFO entries log the
	// requests and responses the scenario saw).
	Status       string          `json:"status"`
	ErrorMessage string          `json:"errorMessage,omitempty"`
	Details      json.RawMessage `json:"details,omitempty"`
}

// ScenarioResult is the outcome of one conformance scenario.
type ScenarioResult struct {
	Name string
	// Passed is what the suite's exit status counts: no check FAILED. A
	// scenario the server opts out of (e.g. server-sse-polling against a
	// server that answers with JSON, not SSE) passes with no SUCCESS check;
	// Successes tells.
	Passed    bool
	Successes int
	// Failure is the failed checks, one "Name: error" a line.
	Failure string
	// Warnings are the WARNING checks, "Name: error" each.
	Warnings []string
	// NoSuccess says why a passed scenario has no SUCCESS check: its
	// warnings, or the message of its last check (e.g. "Server returned
	// JSON instead of SSE stream - priming event tests not applicable").
	NoSuccess string
	Checks    []Check
}

// ConformanceResult is what RunConformance found, per scenario in the order
// they ran.
type ConformanceResult struct {
	Scenarios []ScenarioResult
	// Output is the suite's stdout and stderr, for a failure message.
	Output string
}

// Scenario returns the result of the named scenario.
func (r ConformanceResult) Scenario(name string) (ScenarioResult, bool) {
	for _, s := range r.Scenarios {
		if s.Name == name {
			return s, true
		}
	}
	return ScenarioResult{}, false
}

// Passed and Failed name the scenarios that passed and failed.
func (r ConformanceResult) Passed() []string { return r.names(true) }
func (r ConformanceResult) Failed() []string { return r.names(false) }

func (r ConformanceResult) names(passed bool) []string {
	var names []string
	for _, s := range r.Scenarios {
		if s.Passed == passed {
			names = append(names, s.Name)
		}
	}
	return names
}

// Summary is a few lines for a test log: the count, then each failed
// scenario with its failed checks.
func (r ConformanceResult) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "MCP conformance %s: %d/%d server scenarios passed", ConformanceVersion, len(r.Passed()), len(r.Scenarios))
	for _, s := range r.Scenarios {
		switch {
		case !s.Passed:
			fmt.Fprintf(&b, "\n  FAIL %s:\n      %s", s.Name, strings.ReplaceAll(s.Failure, "\n", "\n      "))
		case s.Successes == 0:
			fmt.Fprintf(&b, "\n  pass %s (no check succeeded: %s)", s.Name, s.NoSuccess)
		default:
			fmt.Fprintf(&b, "\n  pass %s", s.Name)
		}
	}
	return b.String()
}

// RunConformance runs the official MCP conformance suite's server mode
// against the Streamable HTTP endpoint at url: the named scenarios, one
// suite process each, or, with none named, the suite's whole active set in
// one process. headers are added to every request the suite sends (it has
// no option for them: a proxy in front of url adds them, and maps its own
// Host and Origin back to url's, so the dns-rebinding-protection scenario
// still sees a localhost Host and an attacker's Host passes through).
// headers never reach the suite's output.
//
// A scenario that fails is reported in the result, not as a test failure;
// a suite that cannot run (unknown scenario, node crashing) fails t.
func RunConformance(t testing.TB, url string, headers map[string]string, scenarios ...string) ConformanceResult {
	t.Helper()
	dir := NodeDir(t)
	target := url
	if len(headers) > 0 {
		target = headerProxy(t, url, headers)
	}
	var res ConformanceResult
	if len(scenarios) == 0 {
		out := t.TempDir()
		run := runNode(t, dir, suiteTimeout, nil, suiteArgs(target, out)...)
		res.Output = run.stdout + run.stderr
		ran := regexp.MustCompile(`(?m)^=== Running scenario: (\S+) ===$`).FindAllStringSubmatch(run.stdout, -1)
		if len(ran) == 0 {
			t.Fatalf("mcpservetest: the conformance suite ran no scenario (exit %d, timed out %v):\n%s", run.exitCode, run.timedOut, res.Output)
		}
		found := readResults(t, out)
		for _, m := range ran {
			res.Scenarios = append(res.Scenarios, resultOf(m[1], found, run))
		}
	} else {
		var output strings.Builder
		for _, name := range scenarios {
			out := t.TempDir()
			run := runNode(t, dir, scenarioTimeout, nil, append(suiteArgs(target, out), "--scenario", name)...)
			fmt.Fprintf(&output, "=== %s (exit %d)\n%s%s", name, run.exitCode, run.stdout, run.stderr)
			if strings.Contains(run.stderr, "Validation error") {
				t.Fatalf("mcpservetest: the conformance suite rejected scenario %q:\n%s", name, run.stderr)
			}
			res.Scenarios = append(res.Scenarios, resultOf(name, readResults(t, out), run))
		}
		res.Output = output.String()
	}
	return res
}

// suiteArgs runs the pinned suite's server mode. Under Node 20 the suite
// needs fs.globSync, which fs-globsync.mjs provides.
func suiteArgs(url, outDir string) []string {
	return []string{
		"--import", "./fs-globsync.mjs",
		"node_modules/@modelcontextprotocol/conformance/dist/index.js",
		"server", "--url", url, "--output-dir", outDir,
	}
}

// resultDir is the directory the suite writes a server scenario's
// checks.json to: server-<scenario>-<ISO time with - for : and .>.
var resultDir = regexp.MustCompile(`^server-(.+)-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}(?:-\d{3})?Z$`)

// readResults reads every checks.json under dir, by scenario.
func readResults(t testing.TB, dir string) map[string][]Check {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("mcpservetest: reading the conformance results: %v", err)
	}
	found := map[string][]Check{}
	for _, e := range entries {
		m := resultDir.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(dir, e.Name(), "checks.json"))
		if err != nil {
			t.Fatalf("mcpservetest: conformance scenario %s: %v", m[1], err)
		}
		var checks []Check
		if err := json.Unmarshal(raw, &checks); err != nil {
			t.Fatalf("mcpservetest: conformance scenario %s: checks.json: %v", m[1], err)
		}
		found[m[1]] = checks
	}
	return found
}

// resultOf judges one scenario from its checks; one without a checks.json
// threw inside the suite (or the suite timed out) and failed.
func resultOf(name string, found map[string][]Check, run nodeRun) ScenarioResult {
	checks, ok := found[name]
	if !ok {
		why := fmt.Sprintf("the suite wrote no results for it (exit %d)", run.exitCode)
		if run.timedOut {
			why = "the suite timed out before writing its results"
		}
		return ScenarioResult{Name: name, Failure: why + "; see ConformanceResult.Output"}
	}
	s := ScenarioResult{Name: name, Checks: checks}
	var failures []string
	for _, c := range checks {
		switch c.Status {
		case "SUCCESS":
			s.Successes++
		case "FAILURE":
			failures = append(failures, checkText(c))
		case "WARNING":
			s.Warnings = append(s.Warnings, checkText(c))
		}
	}
	s.Passed = len(failures) == 0
	s.Failure = strings.Join(failures, "\n")
	if s.Passed && s.Successes == 0 {
		s.NoSuccess = noSuccess(s)
	}
	return s
}

// noSuccess explains a scenario that passed without a SUCCESS check.
func noSuccess(s ScenarioResult) string {
	if len(s.Warnings) > 0 {
		return strings.Join(s.Warnings, "; ")
	}
	if len(s.Checks) == 0 {
		return "the scenario made no checks"
	}
	last := s.Checks[len(s.Checks)-1]
	var details struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(last.Details, &details) == nil && details.Message != "" {
		return last.Name + ": " + details.Message
	}
	return checkText(last)
}

func checkText(c Check) string {
	msg := c.ErrorMessage
	if msg == "" {
		msg = c.Description
	}
	return c.Name + ": " + msg
}

// headerProxy starts a reverse proxy to rawURL that adds headers to every
// request, and returns the URL with the proxy's host and rawURL's path.
// The suite's dns-rebinding-protection scenario sends Host and Origin of
// its own: the proxy's own host becomes rawURL's host in both, any other
// value passes unchanged, so the endpoint judges what the suite meant.
func headerProxy(t testing.TB, rawURL string, headers map[string]string) string {
	t.Helper()
	target, err := url.Parse(rawURL)
	if err != nil {
		t.Fatalf("mcpservetest: the MCP URL %q: %v", rawURL, err)
	}
	transport := &http.Transport{DisableCompression: true}
	var proxyHost string
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = target.Scheme, target.Host
			pr.Out.Host = pr.In.Host
			if pr.In.Host == proxyHost {
				pr.Out.Host = target.Host
			}
			if pr.In.Header.Get("Origin") == "http://"+proxyHost {
				pr.Out.Header.Set("Origin", target.Scheme+"://"+target.Host)
			}
			for k, v := range headers {
				pr.Out.Header.Set(k, v)
			}
		},
		// Server-sent events go through as they come.
		FlushInterval: -1,
		Transport:     transport,
		// A client that goes away mid-stream is normal for the suite.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	// proxyHost is set before the server starts, so no request reads it
	// before it is written.
	srv := httptest.NewUnstartedServer(proxy)
	proxyHost = srv.Listener.Addr().String()
	srv.Start()
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		transport.CloseIdleConnections()
	})
	u := *target
	u.Scheme, u.Host = "http", proxyHost
	return u.String()
}
