package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/loudskip"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
	"github.com/connector-svc/connector-svc/internal/tlsfiles/tlsfilestest"
)

// tsExampleDir is the TypeScript client example; CI installs its
// node_modules with `npm ci --prefix examples/ts` before the tests.
const tsExampleDir = "../../examples/ts"

// TestTSExample runs examples/ts as a user would, compiled with its pinned
// tsc and run with node as its own process, against the service over TLS
// (the CA from a file) with an API key of the workspace, the reference MCP
// server and the scripted fake LLM. It checks every step the example
// prints, that the model's script was used up, that the key never shows,
// and that the same example without the key fails as it should.
func TestTSExample(t *testing.T) {
	main, mcpURL := tsExampleSetup(t)
	model := llmtest.New(t,
		// The streamed query.
		llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"message":"hello from the stream"}`}),
		llmtest.Answer("The echo tool said hello from the stream."),
		// The query that pauses (APPROVAL_POLICY_ALL), then goes on with
		// alice's edit.
		llmtest.CallToolsSaying("The user wants a hello.", llmtest.Call{Tool: "echo", Args: `{"message":"hello"}`}),
		llmtest.Answer("The echo tool said what alice approved."))

	url := storetest.NewURL(t)
	var key bytes.Buffer
	if err := run(testCtx(t), []string{"-database-url", url, "keys", "create", "--workspace", "demo", "--scope", "admin", "--name", "ts-example"},
		getenv(map[string]string{"SECRET_KEY": testKey}), &key); err != nil {
		t.Fatalf("keys create: %v", err)
	}
	apiKey := strings.TrimSpace(key.String())
	ca := tlsfilestest.NewCA(t, "ca")
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	tlsfilestest.WriteFile(t, caFile, ca.PEM)
	env := map[string]string{"SECRET_KEY": testKey, "LLM_BASE_URL": model.URL(), "LLM_MODEL": "fake-model", "HEALTH_INTERVAL": "1s"}
	for k, v := range tlsFiles(t, t.TempDir(), ca, "server", nil) {
		env[k] = v
	}
	svc := start(t, url, env)

	settings := []string{"CONNECTOR_SVC_ADDR=" + svc.addr, "CONNECTOR_SVC_CA_FILE=" + caFile,
		"CONNECTOR_SVC_MCP_URL=" + mcpURL, "CONNECTOR_SVC_WORKSPACE=demo"}
	out, err := tsExampleRun(t, main, append(settings, "CONNECTOR_SVC_API_KEY="+apiKey))
	if err != nil {
		t.Fatalf("the TypeScript example: %v; it printed:\n%s", err, out)
	}
	if strings.Contains(out, apiKey) {
		t.Error("the TypeScript example printed its API key")
	}
	tsExampleWant(t, out, []string{
		"connecting to " + svc.addr + " (TLS, with an API key)\n",
		"created connector ts-example: CONNECTING\n",
		"connector ts-example is READY with 13 tools\n",
		"echo: Echo: hello from TypeScript\n",
		"event stepPlanned: echo\n",
		`event toolCallStarted: echo {"message":"hello from the stream"}` + "\n",
		"event toolCallFinished: echo: Echo: hello from the stream\n",
		"event answer: The echo tool said hello from the stream.\n",
		"event result: COMPLETED\n",
		"connector ts-example-careful is READY",
		// The pending call, as the model asked, then the run resumed with
		// alice's edit: the MCP server echoed the edited message.
		`: echo {"message":"hello"}` + "\n",
		": COMPLETED: The echo tool said what alice approved.\n",
		"ran echo: Echo: hello (approved by alice)\n",
		"session alice: Echo: hello from alice\n",
		"session bob: Echo: hello from bob\n",
		"alice (1 calls)", "bob (1 calls)",
		"closed 1 session(s): alice\n",
		"expected error: code NotFound, reason CONNECTOR_NOT_FOUND\n",
		"deleted connector ts-example\n", "deleted connector ts-example-careful\n", "deleted connector ts-example-sessions\n",
		"done\n",
	})
	if got := len(model.Requests()); got != 4 {
		t.Errorf("the fake LLM got %d requests; want the 4 of its script", got)
	}

	// Without the key the service refuses the first call: the example says
	// why on stderr and exits 1.
	out, err = tsExampleRun(t, main, settings)
	if code := tsExampleExitCode(err); code != 1 {
		t.Errorf("the example without an API key exited with %v (code %d); want code 1. It printed:\n%s", err, code, out)
	}
	tsExampleWant(t, out, []string{"(TLS, without an API key)\n", "error: [unauthenticated] ", "(API_KEY_MISSING)\n"})
	if strings.Contains(out, "done\n") {
		t.Errorf("the example without an API key printed done:\n%s", out)
	}
}

// TestTSExamplePlaintext runs examples/ts as against `make run` before any
// key exists: plaintext, no API key, no LLM. It skips the queries, saying
// why, does the rest, and runs a second time (it deleted its connectors).
func TestTSExamplePlaintext(t *testing.T) {
	main, mcpURL := tsExampleSetup(t)
	svc := start(t, storetest.NewURL(t), map[string]string{"SECRET_KEY": testKey, "HEALTH_INTERVAL": "1s"})
	settings := []string{"CONNECTOR_SVC_ADDR=" + svc.addr, "CONNECTOR_SVC_MCP_URL=" + mcpURL}
	for i := range 2 {
		out, err := tsExampleRun(t, main, settings)
		if err != nil {
			t.Fatalf("run %d of the TypeScript example: %v; it printed:\n%s", i+1, err, out)
		}
		tsExampleWant(t, out, []string{
			"connecting to " + svc.addr + " (plaintext, without an API key)\n",
			"echo: Echo: hello from TypeScript\n",
			"the service has no LLM (LLM_NOT_CONFIGURED): skipping the queries\n",
			"session bob: Echo: hello from bob\n",
			"closed 1 session(s): alice\n",
			"expected error: code NotFound, reason CONNECTOR_NOT_FOUND\n",
			"deleted connector ts-example-sessions\n",
			"done\n",
		})
		if strings.Contains(out, "ts-example-careful") {
			t.Errorf("run %d made the approval connector without an LLM:\n%s", i+1, out)
		}
	}
}

// tsExampleSetup compiles examples/ts with its own tsc into
// examples/ts/dist (git-ignored; node resolves its packages from
// examples/ts/node_modules) and starts the reference MCP server; it returns
// the compiled main.js and the server's MCP URL. Without node_modules it
// skips loudly (failing under CI=true).
func tsExampleSetup(t *testing.T) (mainJS, mcpURL string) {
	t.Helper()
	js := needFile(t, "../../.tools/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js", "make tools")
	tsc := needFile(t, tsExampleDir+"/node_modules/.bin/tsc", "npm ci --prefix examples/ts")
	if _, err := exec.LookPath("node"); err != nil {
		loudskip.Skip(t, "node is not on PATH; the TypeScript example runs with it")
	}
	dir, _ := filepath.Abs(tsExampleDir)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, tsc, "-p", dir).CombinedOutput(); err != nil {
		t.Fatalf("tsc -p examples/ts: %v\n%s", err, out)
	}
	return filepath.Join(dir, "dist", "src", "main.js"), tsExampleEverything(t, js)
}

// tsExampleRun runs the compiled example with node, with env added to the
// test's environment (every CONNECTOR_SVC_ setting of it cleared first), and
// returns what it printed, stdout and stderr together.
func tsExampleRun(t *testing.T, mainJS string, env []string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", mainJS)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CONNECTOR_SVC_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	t.Logf("the TypeScript example printed:\n%s", out)
	return string(out), err
}

// tsExampleWant fails t for each of wants that out does not contain.
func tsExampleWant(t *testing.T, out string, wants []string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(out, want) {
			t.Errorf("the TypeScript example printed no %q", want)
		}
	}
}

// tsExampleExitCode is the exit code of a command that failed with err; 0 for nil,
// -1 when it did not exit (it did not start, or was killed).
func tsExampleExitCode(err error) int {
	var exit *exec.ExitError
	if err == nil {
		return 0
	}
	if errors.As(err, &exit) {
		return exit.ExitCode()
	}
	return -1
}

// tsExampleEverything starts the reference MCP server (streamable HTTP) on
// a free port, waits until it listens, and returns its MCP URL.
func tsExampleEverything(t *testing.T, js string) string {
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
