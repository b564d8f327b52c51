package registry_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/loudskip"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

// The reference TypeScript server, installed by scripts/install-mcp-everything.sh
// (run by .ci/run) into .tools/npm.
const everythingVersion = "2026.8.31"

// everythingJS returns the server's entry point, skipping the test loudly if
// it is not installed (failing under CI).
func everythingJS(t *testing.T) string {
	t.Helper()
	path := os.Getenv("MCP_EVERYTHING_JS")
	if path == "" {
		path, _ = filepath.Abs("../../.tools/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js")
	}
	_, statErr := os.Stat(path)
	_, nodeErr := exec.LookPath("node")
	if statErr == nil && nodeErr == nil {
		return path
	}
	msg := fmt.Sprintf("the reference MCP server @modelcontextprotocol/server-everything@%s is not installed at %s "+
		"(or node is missing); run scripts/install-mcp-everything.sh", everythingVersion, path)
	loudskip.Skip(t, msg)
	return ""
}

// tsServer runs the TypeScript server over an HTTP transport on a port.
type tsServer struct {
	t         *testing.T
	js, mode  string
	port      int
	cmd       *exec.Cmd
	stderrLog *strings.Builder
}

func startTSServer(t *testing.T, mode string) *tsServer {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := lis.Addr().(*net.TCPAddr).Port
	lis.Close()
	s := &tsServer{t: t, js: everythingJS(t), mode: mode, port: port}
	s.start()
	t.Cleanup(s.stop)
	return s
}

func (s *tsServer) start() {
	s.t.Helper()
	s.cmd = exec.Command("node", s.js, s.mode)
	s.cmd.Env = append(os.Environ(), fmt.Sprint("PORT=", s.port))
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	s.stderrLog = &strings.Builder{}
	s.cmd.Stderr = s.stderrLog
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	testsupport.WaitFor(s.t, "the TypeScript server to listen", func() bool {
		c, err := net.DialTimeout("tcp", fmt.Sprint("127.0.0.1:", s.port), 100*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

func (s *tsServer) stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	_ = s.cmd.Wait()
	s.cmd = nil
}

func (s *tsServer) restart() {
	s.stop()
	s.start()
}

func (s *tsServer) url(path string) string { return fmt.Sprintf("http://127.0.0.1:%d%s", s.port, path) }

func tsEcho(t *testing.T, reg *registry.Registry, id int64, msg string) error {
	t.Helper()
	res, err := reg.CallTool(ctxT(t), id, "echo", map[string]any{"message": msg}, registry.CallOptions{})
	if err != nil {
		return err
	}
	if got := text(t, res); got != "Echo: "+msg {
		t.Fatalf("echo = %q", got)
	}
	return nil
}

func TestInteropTypeScriptStdio(t *testing.T) {
	js := everythingJS(t)
	spec := registry.Spec{ID: 1, WorkspaceID: "ws", ConnectorID: "everything", Transport: registry.TransportStdio,
		Command: "node", Args: []string{js, "stdio"}, ConnectTimeout: 30 * time.Second, CallTimeout: 30 * time.Second}
	src := newSource(spec)
	reg := run(t, src, testConfig())
	for i := range 5 {
		if err := tsEcho(t, reg, 1, fmt.Sprint("stdio ", i)); err != nil {
			t.Fatal(err)
		}
	}
	if tools := src.toolNames(1); len(tools) < 5 || !strings.Contains(strings.Join(tools, ","), "echo") {
		t.Errorf("synced tools = %v", tools)
	}
	if h, _ := reg.Health(1); h.State != registry.StateReady || h.ProtocolVersion == "" {
		t.Errorf("health = %+v", h)
	}
}

func TestInteropTypeScriptStreamableHTTPRestart(t *testing.T) {
	srv := startTSServer(t, "streamableHttp")
	src := newSource(httpSpec(1, srv.url("/mcp")))
	cfg := testConfig()
	cfg.HealthInterval = time.Hour // only calls touch the session
	reg := run(t, src, cfg)
	if err := tsEcho(t, reg, 1, "before"); err != nil {
		t.Fatal(err)
	}
	// A new process knows nothing of our session id: it answers 400 with
	// -32000 "No valid session ID provided", and the call must still work.
	// mcp-go keeps the stale id after a 400 (it clears it only on a 404), so
	// the server refuses a re-initialize on that transport too; the registry
	// then starts one new client on the same connection pool.
	srv.restart()
	if err := tsEcho(t, reg, 1, "after restart"); err != nil {
		t.Fatalf("call after restart: %v", err)
	}
	testsupport.WaitFor(t, "exactly one new session", func() bool {
		src.mu.Lock()
		defer src.mu.Unlock()
		return src.usage[1].Reconnects == 1
	})
	for i := range 5 {
		if err := tsEcho(t, reg, 1, fmt.Sprint("again ", i)); err != nil {
			t.Fatal(err)
		}
	}
	src.mu.Lock()
	defer src.mu.Unlock()
	if u := src.usage[1]; u.Reconnects+u.Reinitializations != 1 {
		t.Errorf("usage = %+v; want one new session in all", u)
	}
}

// The TypeScript server never answers POSTs for a session it does not
// know, so after it restarts only the end of the SSE stream tells: it must
// fail the session at once and reconnect, with no health check to help.
func TestInteropTypeScriptSSERestart(t *testing.T) {
	srv := startTSServer(t, "sse")
	spec := httpSpec(1, srv.url("/sse"))
	spec.Transport = registry.TransportSSE
	cfg := testConfig()
	cfg.HealthInterval = time.Hour
	src := newSource(spec)
	reg := run(t, src, cfg)
	if err := tsEcho(t, reg, 1, "before"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	srv.restart()
	testsupport.WaitFor(t, "the dead stream to be noticed", func() bool { return src.healthSaw(1, "sse stream ended") })
	t.Logf("dead SSE stream noticed %s after the restart began", time.Since(start).Round(time.Millisecond))
	for i := range 5 {
		// Each call has 5s: one that hung on the old session would fail.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := reg.CallTool(ctx, 1, "echo", map[string]any{"message": fmt.Sprint("after ", i)}, registry.CallOptions{})
		cancel()
		if err != nil && !errors.Is(err, registry.ErrUnavailable) {
			t.Fatalf("call %d after the restart: %v (want success or a fast UNAVAILABLE)", i, err)
		}
	}
	testsupport.WaitFor(t, "the SSE connector to work again", func() bool { return tsEcho(t, reg, 1, "after") == nil })
	// Once a call has worked on the new session, nothing the old one
	// left behind (its stream's end, a call that failed on it, a health
	// check) may take the new one down.
	for i := range 5 {
		if err := tsEcho(t, reg, 1, fmt.Sprint("and then ", i)); err != nil {
			t.Fatalf("call %d after the first that worked on the new session: %v", i, err)
		}
	}
}

// A stdio server killed under us is noticed at once, reaped, and replaced.
func TestInteropTypeScriptStdioKilled(t *testing.T) {
	js := everythingJS(t)
	pidfile := filepath.Join(t.TempDir(), "pid")
	spec := registry.Spec{ID: 1, WorkspaceID: "ws", ConnectorID: "everything", Transport: registry.TransportStdio,
		Command: "sh", Args: []string{"-c", `echo $$ >> "$0"; exec node "$1" stdio`, pidfile, js},
		ConnectTimeout: 30 * time.Second, CallTimeout: 30 * time.Second}
	cfg := testConfig()
	cfg.HealthInterval = time.Hour // only the exit can tell
	src := newSource(spec)
	reg := run(t, src, cfg)
	if err := tsEcho(t, reg, 1, "before"); err != nil {
		t.Fatal(err)
	}
	pid := readPIDs(t, pidfile)[0]
	start := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testsupport.WaitFor(t, "the exit to be noticed", func() bool { return src.healthSaw(1, "signal: killed") })
	t.Logf("killed stdio server noticed after %s", time.Since(start).Round(time.Millisecond))
	testsupport.WaitFor(t, "the killed server to be reaped", func() bool { return !running(pid) && !zombie(pid) })
	testsupport.WaitFor(t, "a new server to answer", func() bool { return tsEcho(t, reg, 1, "after") == nil })
	if pids := readPIDs(t, pidfile); len(pids) < 2 {
		t.Errorf("server processes started = %d, want a second one", len(pids))
	}
}

// Per-session connections to the TypeScript server: one node process per
// session, gone when the session closes.
func TestInteropTypeScriptPerSession(t *testing.T) {
	js := everythingJS(t)
	spec := registry.Spec{ID: 1, WorkspaceID: "ws", ConnectorID: "everything", Transport: registry.TransportStdio,
		Command: "node", Args: []string{js, "stdio"}, SessionMode: registry.SessionPerSession,
		ConnectTimeout: 30 * time.Second, CallTimeout: 30 * time.Second}
	reg := run(t, newSource(spec), testConfig())
	for _, s := range []string{"alice", "bob", "alice"} {
		res, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"message": s}, registry.CallOptions{Session: s})
		if err != nil {
			t.Fatalf("session %s: %v", s, err)
		}
		if got := text(t, res); got != "Echo: "+s {
			t.Errorf("session %s: echo = %q", s, got)
		}
	}
	pids := sessionPIDs(t, reg, 1)
	if len(pids) != 2 || pids["alice"] == pids["bob"] || pids["alice"] == 0 {
		t.Fatalf("session processes = %v, want two distinct", pids)
	}
	reg.CloseSession("ws", "alice", 1)
	testsupport.WaitFor(t, "alice's node process to be gone", func() bool { return !running(pids["alice"]) && !zombie(pids["alice"]) })
	if !running(pids["bob"]) {
		t.Error("closing alice's session ended bob's process")
	}
}

// Updates that move a connector between two reference servers while
// callers keep calling lose no call.
func TestInteropTypeScriptUpdateUnderLoad(t *testing.T) {
	a, b := startTSServer(t, "streamableHttp"), startTSServer(t, "streamableHttp")
	reg := run(t, newSource(httpSpec(1, a.url("/mcp"))), testConfig())
	if err := tsEcho(t, reg, 1, "warm"); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var calls, failed atomic.Int64
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				_, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"message": "x"}, registry.CallOptions{})
				calls.Add(1)
				if err != nil {
					failed.Add(1)
					t.Errorf("call during updates: %v", err)
					return
				}
			}
		}()
	}
	for i := range 4 {
		url := a.url("/mcp")
		if i%2 == 0 {
			url = b.url("/mcp")
		}
		reg.Replace(ctxT(t), httpSpec(1, url))
		next := calls.Load() + 20
		testsupport.WaitFor(t, "calls on the new connection", func() bool { return calls.Load() >= next || failed.Load() > 0 })
	}
	stop()
	wg.Wait()
	t.Logf("%d calls across 4 updates between two TypeScript servers, %d failed", calls.Load(), failed.Load())
}
