package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/loudskip"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
	"github.com/connector-svc/connector-svc/internal/tlsfiles/tlsfilestest"
)

// goExampleServiceConfig is the documented client service config, which
// the Go example's built-in one must equal.
const goExampleServiceConfig = "../../examples/service-config.json"

// TestGoExample runs examples/go as a user would, built and run as its own
// process, against two replicas of the service on one database (TLS from a
// CA file, an API key of the workspace), the reference MCP server and the
// scripted fake LLM, and checks what it prints: every step of its tour, and
// that round robin spread its calls over both replicas.
func TestGoExample(t *testing.T) {
	bin, mcpURL := goExampleSetup(t)
	model := llmtest.New(t,
		// The streamed query.
		llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"message":"hello from the stream"}`}),
		llmtest.Answer("The echo tool said hello from the stream."),
		// The query that pauses (APPROVAL_POLICY_ALL), then goes on with
		// alice's edit.
		llmtest.CallToolsSaying("The user wants a hello.", llmtest.Call{Tool: "echo", Args: `{"message":"hello"}`}),
		llmtest.Answer("The echo tool said what alice wrote."))

	url := storetest.NewURL(t)
	var key bytes.Buffer
	if err := run(testCtx(t), []string{"-database-url", url, "keys", "create", "--workspace", "demo", "--scope", "admin", "--name", "go-example"},
		getenv(map[string]string{"SECRET_KEY": testKey}), &key); err != nil {
		t.Fatalf("keys create: %v", err)
	}
	ca := tlsfilestest.NewCA(t, "ca")
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	tlsfilestest.WriteFile(t, caFile, ca.PEM)
	tlsEnv := tlsFiles(t, t.TempDir(), ca, "server", nil) // both replicas serve the same certificate
	var replicas []*service
	for _, id := range []string{"a", "b"} {
		env := map[string]string{"SECRET_KEY": testKey, "REPLICA_ID": id, "INTERNAL_ADDR": "127.0.0.1:0",
			"LLM_BASE_URL": model.URL(), "LLM_MODEL": "fake-model", "HEALTH_INTERVAL": "1s"}
		for k, v := range tlsEnv {
			env[k] = v
		}
		replicas = append(replicas, start(t, url, env))
	}

	apiKey := strings.TrimSpace(key.String())
	env := []string{"CONNECTOR_SVC_ADDRS=" + replicas[0].addr + "," + replicas[1].addr, "CONNECTOR_SVC_API_KEY=" + apiKey,
		"CONNECTOR_SVC_CA_FILE=" + caFile, "CONNECTOR_SVC_MCP_URL=" + mcpURL, "CONNECTOR_SVC_WORKSPACE=demo"}
	if _, err := os.Stat(goExampleServiceConfig); err == nil { // run with the documented file itself
		env = append(env, "CONNECTOR_SVC_SERVICE_CONFIG="+goExampleServiceConfig)
	}
	out := goExampleRun(t, bin, env)
	if strings.Contains(out, apiKey) {
		t.Error("the Go example printed its API key")
	}
	for _, want := range []string{
		"connector go-example: CONNECTOR_STATE_READY, 13 tools",
		"CallTool echo: Echo: hello from Go",
		"event step_planned: step 0, 1 calls",
		"event tool_call_started: echo",
		"event tool_call_finished: echo: Echo: hello from the stream",
		"event answer: The echo tool said hello from the stream.",
		"event result: QUERY_STATUS_COMPLETED, tools used [echo]",
		"connector go-example-careful: CONNECTOR_STATE_READY",
		": QUERY_STATUS_AWAITING_APPROVAL\n",
		"echo map[message:hello]\n", // the pending call, as the model asked
		"resumed call echo: Echo: hello, edited by alice (decided by alice)",
		"resumed query: QUERY_STATUS_COMPLETED: The echo tool said what alice wrote.",
		"connector go-example-sessions: CONNECTOR_STATE_READY",
		"session alice: Echo: hello from alice",
		"session bob: Echo: hello from bob",
		"listed session alice: CONNECTOR_STATE_READY, 1 calls",
		"listed session bob: CONNECTOR_STATE_READY, 1 calls",
		"closed session alice: 1",
		"closed session bob: 1",
		"GetConnector no-such-connector: code NotFound, reason CONNECTOR_NOT_FOUND",
		"done\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the Go example printed no %q", want)
		}
	}
	// Round robin: the example's first calls took turns, and each replica
	// served a fair share of all its calls.
	for _, r := range replicas {
		if !strings.Contains(goExampleLine(out, "ListConnectors served by: "), r.addr) {
			t.Errorf("no ListConnectors call reached replica %s", r.addr)
		}
	}
	// The example's calls are the ones with its key: auth is on, so a call
	// without one is refused (the lines without one are the replicas' own
	// fan-outs of ListSessions and CloseSession).
	var counts []int
	for _, r := range replicas {
		counts = append(counts, goExampleRPCs(r.out.String()))
	}
	if total := counts[0] + counts[1]; total < 20 || counts[0]*4 < total || counts[1]*4 < total {
		t.Errorf("RPCs per replica = %v; want each at least a quarter of the example's calls, and at least 20 calls with its key in all", counts)
	}

	// Without the key it fails once, saying what to set, and tries nothing
	// else: no DeleteConnector of connectors it never made.
	noKey := slices.DeleteFunc(slices.Clone(env), func(kv string) bool { return strings.HasPrefix(kv, "CONNECTOR_SVC_API_KEY=") })
	out, err := goExampleExec(t, bin, noKey)
	if code := tsExampleExitCode(err); code != 1 {
		t.Errorf("the Go example without an API key exited with %v (code %d); want code 1. It printed:\n%s", err, code, out)
	}
	want := "error: no API key: set CONNECTOR_SVC_API_KEY to a key of workspace demo with scope admin, e.g. " +
		"export CONNECTOR_SVC_API_KEY=$(.dev/bin/connector-svc keys create --workspace demo --scope admin --name go-example) (the service answered API_KEY_MISSING)\n"
	if out != want {
		t.Errorf("the Go example without an API key printed:\n%s\nwant only:\n%s", out, want)
	}
}

// TestGoExamplePlaintext runs examples/go as against `make run`: one
// address, plaintext, no API key (the service has none yet), and no LLM:
// it says it skips the queries and does the rest.
func TestGoExamplePlaintext(t *testing.T) {
	bin, mcpURL := goExampleSetup(t)
	svc := start(t, storetest.NewURL(t), map[string]string{"SECRET_KEY": testKey, "HEALTH_INTERVAL": "1s"})
	out := goExampleRun(t, bin, []string{"CONNECTOR_SVC_ADDRS=" + svc.addr, "CONNECTOR_SVC_MCP_URL=" + mcpURL})
	for _, want := range []string{
		"ListConnectors served by: " + strings.Repeat(svc.addr+" ", 5) + svc.addr + "\n",
		"CallTool echo: Echo: hello from Go",
		"the service has no LLM (LLM_NOT_CONFIGURED): skipping the queries",
		"session bob: Echo: hello from bob",
		"closed session bob: 1",
		"GetConnector no-such-connector: code NotFound, reason CONNECTOR_NOT_FOUND",
		"done\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the Go example printed no %q", want)
		}
	}
	if strings.Contains(out, "go-example-careful") {
		t.Error("the Go example made the approval connector without an LLM")
	}
	// It deleted its connectors, so it runs again.
	if again := goExampleRun(t, bin, []string{"CONNECTOR_SVC_ADDRS=" + svc.addr, "CONNECTOR_SVC_MCP_URL=" + mcpURL}); !strings.HasSuffix(again, "done\n") {
		t.Errorf("the Go example's second run printed:\n%s", again)
	}
}

// goExampleSetup builds examples/go and starts the reference MCP server;
// it returns the example's binary and the server's MCP URL.
func goExampleSetup(t *testing.T) (bin, mcpURL string) {
	t.Helper()
	js := needFile(t, "../../.tools/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js", "make tools")
	if _, err := exec.LookPath("node"); err != nil {
		loudskip.Skip(t, "node is not on PATH; the Go example's test runs the reference MCP server with it")
	}
	bin = filepath.Join(t.TempDir(), "go-example")
	if out, err := exec.Command("go", "build", "-o", bin, "../../examples/go/client").CombinedOutput(); err != nil {
		t.Fatalf("go build ./examples/go/client: %v\n%s", err, out)
	}
	return bin, goExampleEverything(t, js)
}

// goExampleRun runs the example with env added to the test's environment
// (and every CONNECTOR_SVC_ setting of it cleared first) and returns what it
// printed; it fails the test if the example fails.
func goExampleRun(t *testing.T, bin string, env []string) string {
	t.Helper()
	out, err := goExampleExec(t, bin, env)
	if err != nil {
		t.Fatalf("the Go example: %v; it printed:\n%s", err, out)
	}
	return out
}

// goExampleExec runs the example as goExampleRun does, and returns what it
// printed and how it exited.
func goExampleExec(t *testing.T, bin string, env []string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CONNECTOR_SVC_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	t.Logf("the Go example printed:\n%s", out)
	return string(out), err
}

// goExampleEverything starts the reference MCP server (streamable HTTP) on
// a free port, waits until it listens, and returns its MCP URL.
func goExampleEverything(t *testing.T, js string) string {
	t.Helper()
	addr := freeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command("node", js, "streamableHttp")
	cmd.Env = append(os.Environ(), "PORT="+port)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // node's children die with it
	var log lockedBuffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			return "http://" + addr + "/mcp"
		}
		if time.Now().After(deadline) {
			t.Fatalf("the reference MCP server does not listen on %s after 30s:\n%s", addr, log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// goExampleLine returns the line of out that starts with prefix, "" if none.
func goExampleLine(out, prefix string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// goExampleRPCs counts the ConnectorService calls a replica's log shows
// that came with an API key.
func goExampleRPCs(log string) (keyed int) {
	for _, l := range strings.Split(log, "\n") {
		var line struct {
			Msg, Method string
			KeyID       string `json:"key_id"`
		}
		if json.Unmarshal([]byte(l), &line) == nil && line.Msg == "rpc" && strings.HasPrefix(line.Method, "/connector.v1.ConnectorService/") {
			if line.KeyID != "" {
				keyed++
			}
		}
	}
	return keyed
}

// TestGoExampleServiceConfig checks that the service config built into the
// Go example is the documented one, examples/service-config.json, so that a
// user who copies the example gets what the docs describe.
func TestGoExampleServiceConfig(t *testing.T) {
	doc, err := os.ReadFile(goExampleServiceConfig)
	if err != nil {
		loudskip.Skip(t, fmt.Sprintf("%s: %v", goExampleServiceConfig, err))
	}
	builtIn := goExampleConst(t, "../../examples/go/client/main.go", "defaultServiceConfig")
	var want, got any
	if err := json.Unmarshal(doc, &want); err != nil {
		t.Fatalf("%s: %v", goExampleServiceConfig, err)
	}
	if err := json.Unmarshal([]byte(builtIn), &got); err != nil {
		t.Fatalf("examples/go/client's defaultServiceConfig: %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("examples/go/client's defaultServiceConfig differs from %s (-want +got):\n%s", goExampleServiceConfig, diff)
	}
}

// goExampleConst returns the value of the string constant name in file.
func goExampleConst(t *testing.T, file, name string) string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, decl := range f.Decls {
		gen, ok := decl.(*ast.GenDecl)
		if !ok || gen.Tok != token.CONST {
			continue
		}
		for _, spec := range gen.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, id := range vs.Names {
				if lit, ok := vs.Values[i].(*ast.BasicLit); ok && id.Name == name && lit.Kind == token.STRING {
					v, err := strconv.Unquote(lit.Value)
					if err != nil {
						t.Fatal(err)
					}
					return v
				}
			}
		}
	}
	t.Fatalf("%s has no string constant %s", file, name)
	return ""
}
