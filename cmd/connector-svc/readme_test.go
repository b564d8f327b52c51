package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/loudskip"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

// readmeWant is what the output of each README section's blocks must
// contain, by section heading. Every section with a block that runs has an
// entry, and every entry a section.
var readmeWant = map[string][]string{
	"A five-minute tour": {`"state": "CONNECTOR_STATE_CONNECTING"`, `"text": "Echo: hello"`, `"state": "CONNECTOR_STATE_READY"`,
		`"toolCount": 13`, `"protocolVersion"`, `"text": "Echo: after restart"`},
	"Try it with grpcurl": {"connector.v1.ConnectorService\n", `"status": "SERVING"`, "The sum of 2 and 3 is 5",
		`"description": "Echo, add and friends"`, "Code: InvalidArgument", "(refused, as it should be)"},
	// The query sections' answers are the development model's (dev-model).
	"Ask a connector a question": {`"answer": "dev-model (a scripted stand-in, not a real model): echo returned: Echo: Say hello through the echo tool"`,
		`"toolCallFinished"`, `"purpose": "dev-model (a scripted stand-in): the query names it"`},
	"Approving tool calls": {`"status": "QUERY_STATUS_AWAITING_APPROVAL"`, `"status": "QUERY_STATUS_COMPLETED"`,
		`"actorId": "alice"`, `"answer": "dev-model (a scripted stand-in, not a real model): echo returned: Echo: hello from alice"`,
		`"text": "Echo: approved in the chat"`},
	"Connect a server that needs OAuth": {`"reason": "AUTHORIZATION_REQUIRED"`, "(alice has not authorized yet)",
		"Authorized. You can close this window", `"text": "Hello, Alice!"`, `"userId": "alice"`, `"scopes": [`},
	"When a server asks back": {"a scripted stand-in, not a real model) got: Resource trigger-sampling-request context: Say hi in three words",
		`"name": "trigger-url-elicitation"`, `"cancelledInputs": [`,
		`"status": "QUERY_STATUS_AWAITING_INPUT"`, `"mode": "INPUT_MODE_FORM"`, "inputs[0].content", `"status": "QUERY_STATUS_COMPLETED"`,
		`"answer": "dev-model (a scripted stand-in, not a real model): trigger-elicitation-request returned: `, `- Name: Alice`,
		`- Email: alice@example.com`, `"samplingCount": "1"`, `"inputCount": "2"`},
	"Per-session connections": {`"text": "Echo: hello from alice"`, `"text": "Echo: hello from bob"`, `"sessionId": "bob"`, `"closed": 1`},
	"Progress":                {`"progress": 1,`, `"progress": 4,`, `"total": 4`, `"result"`},
	"Resources, prompts and completions": {`"nextPageToken"`, `"subscribeSupported": true`,
		`"uriTemplate": "demo://resource/dynamic/blob/{resourceId}"`, `"text": "Resource 1: This is a plaintext resource created at`,
		`"blob": "`, `"name": "args-prompt"`, `"text": "What's weather in Lyon?"`, `"David"`, `"Frank"`, "Code: NotFound",
		"(refused, as it should be)", `"started": {`, `"updated": {`, `"uri": "demo://resource/dynamic/text/1"`},
	"API keys and TLS": {"chat-backend", "revoked API key", `"token": "csk_`, `"name": "chat backend"`,
		"wrote a CA, a server certificate for localhost, 127.0.0.1 and ::1, and a client certificate into .dev/tls", "client-key.pem\n",
		"connector.v1.ConnectorService\n"},
	"Observability": {`"text": "Echo: traced"`},
	"Several replicas": {`"text": "Echo: hello from b"`, `"text": "Echo: hello from c"`, "connectors_owned", "Code: NotFound",
		"(deleted through c, refused by b)"},
	"Open the console": {"with the key in .dev/console_key", "<title>Connectors · connector-svc</title>"},
	"Use it from an MCP client": {`"text":"Echo: hello over MCP"`, `"name":"everything__echo"`, `"text":"Echo: hello from the workspace"`,
		`401 Bearer realm="connector-svc"`},
	"Call it from your backend": {"CallTool echo: Echo: hello from Go",
		"event answer: dev-model (a scripted stand-in, not a real model): echo returned: Echo: Say hello through the echo tool",
		"resumed query: QUERY_STATUS_COMPLETED: dev-model (a scripted stand-in, not a real model): echo returned: Echo: hello, edited by alice",
		"echo: Echo: hello from TypeScript\n", "event result: COMPLETED\n", "deleted connector ts-example-careful\n", "done\n"},
	// The client examples' own READMEs.
	"examples/go/README.md": {"CallTool echo: Echo: hello from Go", "resumed call echo: Echo: hello, edited by alice (decided by alice)",
		"closed session bob: 1", "done\n"},
	"examples/ts/README.md": {"connecting to ", "(plaintext, with an API key)\n", "echo: Echo: hello from TypeScript\n",
		"event result: COMPLETED\n", "closed 1 session(s): alice\n", "done\n"},
}

// readmeFiles are the Markdown files whose blocks TestREADMECommands runs,
// in order: the README, then the client examples' own. The sections of an
// example's file are named by its path.
var readmeFiles = []string{"README.md", "examples/go/README.md", "examples/ts/README.md"}

// TestREADMECommands runs every sh block of the README, then of the client
// examples' READMEs, as a reader pastes it: the whole block through bash,
// from a directory laid out as the repository is after make run and make
// tools (the repository's files; .dev/bin/connector-svc, the binary built
// here; .tools, the real one), against run() with its database in
// DATABASE_URL. Only addresses change: the service's, and the port of the
// reference MCP server the tour starts itself (the client examples get
// theirs from CONNECTOR_SVC_ADDRS, CONNECTOR_SVC_ADDR and
// CONNECTOR_SVC_MCP_URL). The stdio example's npx is a stub that runs the
// test stdio server, so nothing is downloaded; the service's model is the
// development model (connector-svc dev-model, in-process), as the README
// says to start it; the TLS examples run against services serving TLS and
// mutual TLS with the certificates the README's dev-certs block made. A
// block after <!-- not run: reason --> is skipped. Each block must stop at
// its first failing step, so a block that exits 0 ran every step, and
// together they leave nothing in the repository's root but .dev.
func TestREADMECommands(t *testing.T) {
	tools := filepath.Dir(filepath.Dir(needFile(t, "../../.tools/bin/grpcurl", "make tools")))
	needFile(t, "../../.tools/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js", "make tools")
	if _, err := exec.LookPath("node"); err != nil {
		loudskip.Skip(t, "node is not on PATH; the README's tour runs the reference MCP server with it")
	}
	var blocks []readmeBlock
	for _, f := range readmeFiles {
		blocks = append(blocks, readmeBlocks(t, f)...)
	}
	model, modelOut := startDevModel(t)
	url := storetest.NewURL(t)
	t.Setenv("PATH", fakeNPX(t)+string(os.PathListSeparator)+os.Getenv("PATH")) // for the service's stdio connectors
	callback, endpoint, console := freeAddr(t), freeAddr(t), freeAddr(t)
	_, callbackPort, _ := net.SplitHostPort(callback)
	svc := start(t, url, map[string]string{"MCP_ADDR": endpoint, "CONSOLE_ADDR": console,
		"SECRET_KEY": testKey, "STDIO_ALLOWED_COMMANDS": "npx", "LLM_BASE_URL": model, "LLM_MODEL": "dev-model",
		// What make run sets, on a free port.
		"OAUTH_REDIRECT_URL": "http://localhost:" + callbackPort + "/oauth/callback", "OAUTH_CALLBACK_ADDR": callback})
	client := connectorv1.NewConnectorServiceClient(dial(t, svc.addr))
	root, made := readmeRoot(t, tools)
	addrs := readmeAddrs{svc: svc.addr, endpoint: endpoint, console: console, mcp: freeAddr(t), oauthMCP: freeAddr(t), oauthAS: freeAddr(t),
		replicaB: freeAddr(t), replicaC: freeAddr(t)}
	// The blocks put grpcurl on PATH themselves; the environment is the
	// test's, as a reader's shell is theirs, but for the client examples'
	// settings: their addresses, and no API key but the one a block makes.
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CONNECTOR_SVC_") {
			env = append(env, kv)
		}
	}
	env = append(env, "DATABASE_URL="+url, "CONNECTOR_SVC_ADDRS="+svc.addr, "CONNECTOR_SVC_ADDR="+svc.addr,
		"CONNECTOR_SVC_MCP_URL=http://"+addrs.mcp+"/mcp")

	out := map[string]string{} // section → its blocks' output
	grpcurls, ran := 0, 0
	for _, b := range blocks {
		if b.skip != "" {
			t.Logf("%s:%d (%s) not run: %s", b.file, b.line, b.section, b.skip)
			continue
		}
		checkBlock(t, b)
		if strings.Contains(b.text, " -cacert ") && addrs.tls == "" {
			// The TLS examples: services serving the certificates the
			// README's dev-certs block made, as make run would with them.
			addrs.tls, addrs.mutual = readmeTLS(t, filepath.Join(root, ".dev", "tls"))
		}
		grpcurls += strings.Count(b.text, "\ngrpcurl ")
		script, err := addrs.replace(b.text)
		if err != nil {
			t.Fatalf("%s:%d: %v", b.file, b.line, err)
		}
		got, err := runBlock(t, root, env, script)
		if err != nil {
			t.Fatalf("%s:%d, the block of %q: %v; it printed:\n%s\nthe development model printed:\n%s", b.file, b.line, b.section, err, got, modelOut.String())
		}
		out[b.section] += got
		if ran++; ran == 1 { // the tour created the first key: from now on every call needs one
			waitUnauthenticated(t, "a call without a key, after the README created one", func() error {
				_, err := client.ListConnectors(testCtx(t), &connectorv1.ListConnectorsRequest{WorkspaceId: "demo"})
				return err
			})
		}
	}
	if grpcurls < 20 {
		t.Errorf("the README's blocks run only %d grpcurl lines", grpcurls)
	}
	for section, wants := range readmeWant {
		got, ok := out[section]
		if !ok {
			t.Errorf("the README has no block that runs in section %q", section)
		}
		for _, want := range wants {
			if !strings.Contains(got, want) {
				t.Errorf("section %q printed no %q:\n%s", section, want, got)
			}
		}
	}
	for section := range out {
		if readmeWant[section] == nil {
			t.Errorf("section %q runs a block, but readmeWant says nothing of what it prints", section)
		}
	}
	// "Approving tool calls" names the 4 of the reference server's 13 tools
	// that need approval under the default policy: ListTools and
	// RefreshTools of the grpcurl section's connector (default policy) show
	// which.
	if got, want := readmeApprovalTools(out["Try it with grpcurl"]), []string{"gzip-file-as-resource", "simulate-research-query",
		"toggle-simulated-logging", "toggle-subscriber-updates"}; !slices.Equal(got, want) {
		t.Errorf("the reference server's tools that need approval under the default policy are %q; the README says %q", got, want)
	}
	if !strings.Contains(svc.out.String(), `"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736"`) {
		t.Error("no log line carries the trace id of the README's traceparent")
	}
	// What the blocks wrote is under .dev (git-ignored): nothing in the
	// repository's root, where git would show it and builds say +dirty.
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !made[e.Name()] {
			t.Errorf("the README's blocks left %s in the repository's root", e.Name())
		}
	}
}

// readmeApprovalTools returns the names of the tools that grpcurl's
// output of ListTools or RefreshTools shows with requiresApproval, sorted:
// each is the last tool name before its "requiresApproval": true.
func readmeApprovalTools(out string) []string {
	var names []string
	parts := strings.Split(out, `"requiresApproval": true`)
	for _, before := range parts[:len(parts)-1] {
		if m := toolName.FindAllStringSubmatch(before, -1); len(m) > 0 {
			names = append(names, m[len(m)-1][1])
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

var toolName = regexp.MustCompile(`"name": "([^"]+)"`)

// readmeBlock is one fenced sh block of the README.
type readmeBlock struct {
	file    string // the Markdown file, from the repository's root
	line    int    // of its opening fence
	section string // the ## heading above it
	text    string
	skip    string // the reason of a <!-- not run: … --> just above it
}

var notRun = regexp.MustCompile(`^<!-- not run: (.*\S) -->$`)

// readmeBlocks returns the sh and bash blocks of file (from the
// repository's root), in order. The README's are in the sections of its ##
// headings; another file's are in one section named by its path.
func readmeBlocks(t *testing.T, file string) []readmeBlock {
	t.Helper()
	f, err := os.Open(filepath.Join("../..", file))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		blocks    []readmeBlock
		cur       *readmeBlock
		section   = file
		prev      string // the line before, when outside a block
		inOther   bool   // inside a fence of another language
		lineNo    int
		shellOpen = regexp.MustCompile("^```(sh|bash)$")
	)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		lineNo++
		switch {
		case cur != nil && l == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.text += l + "\n"
		case inOther:
			inOther = l != "```"
		case shellOpen.MatchString(l):
			cur = &readmeBlock{file: file, line: lineNo, section: section}
			if m := notRun.FindStringSubmatch(prev); m != nil {
				cur.skip = m[1]
			} else if strings.HasPrefix(prev, "<!--") {
				t.Fatalf("%s:%d: %q is not <!-- not run: reason -->", file, lineNo-1, prev)
			}
		case strings.HasPrefix(l, "```"):
			inOther = true
		case strings.HasPrefix(l, "## ") && file == "README.md":
			section = strings.TrimPrefix(l, "## ")
		}
		if cur == nil {
			prev = l
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil {
		t.Fatalf("%s:%d: the block is not closed", file, cur.line)
	}
	return blocks
}

// checkBlock fails t unless block b stops at its first failing step (a
// subshell under set -euo pipefail: the reader's shell stays open), pastes
// into an interactive bash as it runs here (no history expansion), and
// every call of the service in it carries an API key.
func checkBlock(t *testing.T, b readmeBlock) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(b.text, "\n"), "\n")
	if !strings.HasPrefix(lines[0], "( set -euo pipefail") || lines[len(lines)-1] != ")" {
		t.Errorf("%s:%d: the block is not ( set -euo pipefail … ): it would go on after a failed step", b.file, b.line)
	}
	for i, l := range lines {
		if historyExpansion.MatchString(l) {
			t.Errorf("%s:%d has a ! that an interactive bash expands from its history when the block is pasted:\n%s", b.file, b.line+1+i, l)
		}
		if strings.Contains(l, "connector.v1.ConnectorService/") && !strings.Contains(l, `-H "authorization: Bearer $`) {
			t.Errorf("%s:%d calls the service without a key:\n%s", b.file, b.line+1+i, l)
		}
	}
}

// historyExpansion is a ! that starts a history expansion in an
// interactive bash (as "!!" or "!x"), also inside double quotes: a pasted
// block would run with the previous command in its place.
var historyExpansion = regexp.MustCompile(`![^\s=(]`)

// readmeAddrs are the addresses the README's blocks are pointed at.
type readmeAddrs struct{ svc, tls, mutual, endpoint, console, mcp, oauthMCP, oauthAS, replicaB, replicaC string }

// replace points a block at the test's addresses: localhost:50051 at the
// service (at the TLS services on lines with -cacert), port 3001 of the
// reference MCP server, port 8090 of the service's MCP endpoint, port 8070 of its console, and ports 3002 and 3003 of the OAuth example, at
// free ports. It fails on a block that names one of them another way
// outside a comment.
func (a readmeAddrs) replace(block string) (string, error) {
	host, port, _ := net.SplitHostPort(a.mcp)
	_, mcpPort, _ := net.SplitHostPort(a.oauthMCP)
	_, asPort, _ := net.SplitHostPort(a.oauthAS)
	mcp := strings.NewReplacer("127.0.0.1:3001", a.mcp, "/dev/tcp/127.0.0.1/3001", "/dev/tcp/"+host+"/"+port, "PORT=3001", "PORT="+port,
		"localhost:3002", "localhost:"+mcpPort, "MCP_PORT=3002", "MCP_PORT="+mcpPort,
		"localhost:3003", "localhost:"+asPort, "MCP_AUTH_PORT=3003", "MCP_AUTH_PORT="+asPort,
		// The service's MCP endpoint (make run's MCP_ADDR).
		"localhost:8090", a.endpoint,
		// The console (make run's CONSOLE_ADDR).
		"localhost:8070", a.console,
		// The replicas section's two extra replicas: 50052 and 50053 are
		// in the ephemeral range, where another test's socket may sit.
		"50052", portOf(a.replicaB), "50053", portOf(a.replicaC))
	lines := strings.Split(block, "\n")
	for i, l := range lines {
		svc := a.svc
		if strings.Contains(l, " -cacert ") {
			svc = a.tls
			if strings.Contains(l, " -cert ") {
				svc = a.mutual
			}
		}
		lines[i] = strings.ReplaceAll(mcp.Replace(l), "localhost:50051", svc)
		comment := strings.HasPrefix(strings.TrimSpace(l), "#")
		if !comment && (strings.Contains(lines[i], "50051") || strings.Contains(lines[i], "3001") ||
			strings.Contains(lines[i], "3002") || strings.Contains(lines[i], "3003") || strings.Contains(lines[i], "8090") ||
			strings.Contains(lines[i], "8070")) {
			return "", fmt.Errorf("line %d names the service or the MCP server in a way the test does not know: %s", i+1, l)
		}
	}
	return strings.Join(lines, "\n"), nil
}

// runBlock runs script through bash in dir and returns what it printed.
// What the script leaves running in the background (the tour's MCP server)
// lives on for the blocks after it, until the test ends.
func runBlock(t *testing.T, dir string, env []string, script string) (string, error) {
	out, err := os.CreateTemp("", "readme-block-")
	if err != nil {
		return "", err
	}
	defer os.Remove(out.Name())
	defer out.Close()
	cmd := exec.Command("bash", "-c", script)
	// A file, not a pipe: a server the block leaves in the background keeps
	// its copy open, and Wait would wait for it.
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = dir, env, out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return "", err
	}
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(5 * time.Minute):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		err = errors.Join(errors.New("still running after 5 minutes"), <-done)
	}
	printed, rerr := os.ReadFile(out.Name())
	return string(printed), errors.Join(err, rerr)
}

// readmeRoot makes the directory the blocks run in, as the repository's
// root is after make run and make tools: a link to each of the
// repository's files and directories (but .git, .dev and .tools), .tools
// the repository's, and .dev/bin/connector-svc built here as make run
// builds it. It returns the directory and the names it made in it.
func readmeRoot(t *testing.T, tools string) (string, map[string]bool) {
	t.Helper()
	root := t.TempDir()
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(repo)
	if err != nil {
		t.Fatal(err)
	}
	made := map[string]bool{".tools": true, ".dev": true}
	for _, e := range entries {
		if made[e.Name()] || e.Name() == ".git" {
			continue
		}
		if err := os.Symlink(filepath.Join(repo, e.Name()), filepath.Join(root, e.Name())); err != nil {
			t.Fatal(err)
		}
		made[e.Name()] = true
	}
	if err := os.Symlink(tools, filepath.Join(root, ".tools")); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, ".dev", "bin", "connector-svc")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	// make run's development key: the service's, which the replicas the
	// README starts must share.
	if err := os.WriteFile(filepath.Join(root, ".dev", "secret_key"), []byte(testKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return root, made
}

// readmeTLS serves TLS, and mutual TLS, for the README's grpcurl lines
// with -cacert, with the certificates in dir as the README's make run
// lines name them, and returns the two services' addresses.
func readmeTLS(t *testing.T, dir string) (tlsAddr, mutualAddr string) {
	t.Helper()
	env := map[string]string{"TLS_CERT_FILE": filepath.Join(dir, "server.pem"), "TLS_KEY_FILE": filepath.Join(dir, "server-key.pem")}
	tlsAddr = start(t, storetest.NewURL(t), env).addr
	env["TLS_CLIENT_CA_FILE"] = filepath.Join(dir, "ca.pem")
	mutualAddr = start(t, storetest.NewURL(t), env).addr
	return tlsAddr, mutualAddr
}

// needFile returns the absolute path of a tool the test needs, skipping
// loudly without it (failing under CI).
func needFile(t *testing.T, rel, install string) string {
	t.Helper()
	path, _ := filepath.Abs(rel)
	if _, err := os.Stat(path); err != nil {
		loudskip.Skip(t, fmt.Sprintf("%s is missing; run %s", path, install))
	}
	return path
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

// freeAddr returns a loopback address nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	return lis.Addr().String()
}
