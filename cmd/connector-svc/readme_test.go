package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

// TestREADMECommands runs every grpcurl line of the README, as written,
// against run(): only the service's and the reference MCP server's
// addresses are replaced. The stdio example's npx is a stub that runs the
// test stdio server, so nothing is downloaded; the query examples get a
// scripted fake LLM. The TLS examples run against services serving TLS and
// mutual TLS, with the certificate files they name. The lines that create
// API keys (NAME=$(… keys create …)) run too, with the binary built here in
// place of make run's, and each later line gets their variables; from the
// first key on, auth is on, so every call of the README must carry a key of
// its workspace.
func TestREADMECommands(t *testing.T) {
	grpcurl := needFile(t, "../../.tools/bin/grpcurl", "scripts/tools.sh grpcurl")
	everything := needFile(t, "../../.tools/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
		"scripts/install-mcp-everything.sh")
	t.Setenv("PATH", fakeNPX(t)+string(os.PathListSeparator)+filepath.Dir(grpcurl)+string(os.PathListSeparator)+os.Getenv("PATH"))
	mcpAddr := startEverything(t, everything)
	model := llmtest.New(t,
		llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"message":"hello"}`}), llmtest.Answer("The echo tool said hello."),
		llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"message":"hello"}`}), llmtest.Answer("The echo tool said hello."),
		llmtest.Answer(`{"plan":[{"tool":"echo","purpose":"say hello"}]}`),
		// Approving tool calls: the query pauses, then goes on.
		llmtest.CallToolsSaying("The user wants a hello.", llmtest.Call{Tool: "echo", Args: `{"message":"hello"}`}),
		llmtest.Answer("The echo tool said hello from alice."))
	url := storetest.NewURL(t)
	svc := start(t, url, map[string]string{
		"SECRET_KEY": testKey, "STDIO_ALLOWED_COMMANDS": "npx", "LLM_BASE_URL": model.URL(), "LLM_MODEL": "llama3.1"})
	client := connectorv1.NewConnectorServiceClient(dial(t, svc.addr))
	bin := buildBinary(t)

	lines := readmeCommands(t)
	if len(lines) < 20 {
		t.Fatalf("found only %d grpcurl lines in the README", len(lines))
	}
	env := append(os.Environ(), "DATABASE_URL="+url)
	keys := map[string]string{} // workspace → token
	tlsDir, tlsAddr, mutualAddr := readmeTLS(t)
	for i, line := range lines {
		addr, dir := svc.addr, ""
		if strings.Contains(line, " -cacert ") { // the TLS examples, run beside their certificate files
			addr, dir = tlsAddr, tlsDir
			if strings.Contains(line, " -cert ") {
				addr = mutualAddr
			}
		}
		run := strings.NewReplacer("localhost:50051", addr, "127.0.0.1:3001", mcpAddr, ".dev/bin/connector-svc", bin).Replace(line)
		if m := varLine.FindStringSubmatch(line); m != nil {
			// NAME=$(grpcurl … | sed …): kept for the lines after it.
			val := readmeVar(t, i, line, run, m[1], env)
			if len(val) == 0 {
				t.Fatalf("README line %d printed nothing into %s:\n%s", i+1, m[1], line)
			}
			env = append(env, m[1]+"="+val)
			continue
		}
		if m := keyLine.FindStringSubmatch(line); m != nil {
			name, workspace := m[1], m[2]
			token := readmeVar(t, i, line, run, name, env)
			if !tokenPattern.MatchString(token) {
				t.Fatalf("README line %d printed %q, not a token:\n%s", i+1, token, line)
			}
			env, keys[workspace] = append(env, name+"="+token), token
			waitUnauthenticated(t, "a call without a key, after the README created one", func() error {
				_, err := client.ListConnectors(testCtx(t), &connectorv1.ListConnectorsRequest{WorkspaceId: workspace})
				return err
			})
			continue
		}
		if strings.Contains(line, "connector.v1.ConnectorService/") && !strings.Contains(line, `-H "authorization: Bearer $`) {
			t.Errorf("README line %d calls the service without a key:\n%s", i+1, line)
		}
		cmd := exec.Command("bash", "-c", run)
		cmd.Env, cmd.Dir = env, dir
		out, err := cmd.CombinedOutput()
		wantFail := strings.Contains(line, `"connector_id":"bad"`) // the README's bad-input example
		switch {
		case wantFail && (err == nil || !strings.Contains(string(out), "InvalidArgument")):
			t.Errorf("README line %d should fail with InvalidArgument:\n%s\n%s", i+1, line, out)
		case !wantFail && err != nil:
			t.Errorf("README line %d failed: %v\n%s\n%s", i+1, err, line, out)
		case err == nil && strings.Contains(line, "/CreateConnector"):
			waitConnected(t, client, keys, line) // as a reader would wait a moment
		}
	}
	if len(keys) == 0 {
		t.Error("the README creates no API key")
	}
}

// readmeVar runs README line i (as run), which sets variable name, and
// returns the variable's value; a failing command, in a pipe too, fails
// the test.
func readmeVar(t *testing.T, i int, line, run, name string, env []string) string {
	t.Helper()
	cmd := exec.Command("bash", "-o", "pipefail", "-c", run+"\nprintf %s \"$"+name+"\"")
	cmd.Env, cmd.Stderr = env, os.Stderr
	val, err := cmd.Output()
	if err != nil {
		t.Fatalf("README line %d: %v; printed %q\n%s", i+1, err, val, line)
	}
	return string(val)
}

// varLine is a README line that keeps part of a grpcurl answer in a
// variable for the lines after it.
var varLine = regexp.MustCompile(`^([A-Z_]+)=\$\((grpcurl .*)\)$`)

// keyLine is a README line that creates an API key into a variable.
var keyLine = regexp.MustCompile(`^([A-Z_]+)=\$\(\S*connector-svc keys create --workspace (\S+) .*\)$`)

// buildBinary builds connector-svc, as make run does, and returns its path.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "connector-svc")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// needFile returns the absolute path of a tool the test needs, skipping
// loudly without it (failing under CI).
func needFile(t *testing.T, rel, install string) string {
	t.Helper()
	path, _ := filepath.Abs(rel)
	if _, err := os.Stat(path); err == nil {
		return path
	}
	msg := fmt.Sprintf("%s is missing; run %s", path, install)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	fmt.Fprintln(os.Stderr, "\n!!! SKIPPING: "+msg)
	t.Skip(msg)
	return ""
}

// readmeCommands returns the grpcurl and key lines of the README's bash
// blocks, in order.
func readmeCommands(t *testing.T) []string {
	t.Helper()
	f, err := os.Open("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	inBash := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, "```bash"):
			inBash = true
		case strings.HasPrefix(l, "```"):
			inBash = false
		case inBash && (strings.HasPrefix(l, "grpcurl ") || keyLine.MatchString(l) || varLine.MatchString(l)):
			lines = append(lines, l)
		}
	}
	return lines
}

// fakeNPX puts an npx on PATH that runs the registry's test stdio server.
func fakeNPX(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "stdioserver")
	if out, err := exec.Command("go", "build", "-o", bin, "../../internal/registry/testdata/stdioserver").CombinedOutput(); err != nil {
		t.Fatalf("build the stdio test server: %v\n%s", err, out)
	}
	script := "#!/bin/sh\nexec " + bin + "\n"
	if err := os.WriteFile(filepath.Join(dir, "npx"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// startEverything runs the reference server over streamable HTTP and
// returns its host:port.
func startEverything(t *testing.T, js string) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	cmd := exec.Command("node", js, "streamableHttp")
	cmd.Env = append(os.Environ(), "PORT="+strings.Split(addr, ":")[1])
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatal("the reference MCP server did not listen")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var dataArg = regexp.MustCompile(`-d '(\{.*\})'`)

// waitConnected waits until the connector a CreateConnector line made is
// READY with its tools synced, asking with the README's key of its
// workspace.
func waitConnected(t *testing.T, client connectorv1.ConnectorServiceClient, keys map[string]string, line string) {
	t.Helper()
	m := dataArg.FindStringSubmatch(line)
	var req struct {
		WorkspaceID string `json:"workspace_id"`
		Connector   struct {
			ConnectorID string `json:"connector_id"`
		} `json:"connector"`
	}
	if m == nil || json.Unmarshal([]byte(m[1]), &req) != nil {
		t.Fatalf("cannot read the request of %s", line)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := client.GetConnector(withKey(testCtx(t), keys[req.WorkspaceID]),
			&connectorv1.GetConnectorRequest{WorkspaceId: req.WorkspaceID, ConnectorId: req.Connector.ConnectorID})
		if err == nil && got.GetConnector().GetHealth().GetState() == connectorv1.ConnectorState_CONNECTOR_STATE_READY &&
			got.GetConnector().GetToolCount() > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("connector %s/%s never became READY: %v %v", req.WorkspaceID, req.Connector.ConnectorID, got.GetConnector().GetHealth(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
