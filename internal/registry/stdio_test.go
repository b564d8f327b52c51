package registry_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

// stdioServer is the path of the test stdio MCP server, built by TestMain.
var stdioServer string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "registry-test")
	if err != nil {
		panic(err)
	}
	stdioServer = filepath.Join(dir, "stdioserver")
	if out, err := exec.Command("go", "build", "-o", stdioServer, "./testdata/stdioserver").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build the stdio test server: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func stdioSpec(id int64, args ...string) registry.Spec {
	return registry.Spec{ID: id, WorkspaceID: "ws", ConnectorID: fmt.Sprint("stdio", id), Transport: registry.TransportStdio,
		Command: stdioServer, Args: args, ConnectTimeout: 10 * time.Second, CallTimeout: 10 * time.Second}
}

// readPIDs returns the pids the test server wrote, leader first.
func readPIDs(t *testing.T, path string) []int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	return pids
}

// running reports whether pid is a live process. A zombie is dead; one whose
// parent is this test process would be ours to reap, so it counts as alive.
func running(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ppid ...
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(fields) < 2 {
		return syscall.Kill(pid, 0) == nil
	}
	state, ppid := fields[0], fields[1]
	return state != "Z" || ppid == strconv.Itoa(os.Getpid())
}

func TestStdioStubbornServerAndChildAreKilled(t *testing.T) {
	pidfile := filepath.Join(t.TempDir(), "pids")
	spec := stdioSpec(1, "-stubborn", "-child", "-pidfile", pidfile)
	spec.Env = map[string]string{"CONNECTOR_TOKEN": "from-spec"}
	t.Setenv("CONNECTOR_SVC_SERVICE_SECRET", "service-only")
	reg := run(t, newSource(spec), testConfig())

	for i := range 10 {
		res, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"text": fmt.Sprint(i)}, registry.CallOptions{})
		if err != nil || text(t, res) != fmt.Sprint(i) {
			t.Fatalf("echo %d = %v, %v", i, res, err)
		}
	}
	env := func(name string) string {
		res, err := reg.CallTool(ctxT(t), 1, "env", map[string]any{"name": name}, registry.CallOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return text(t, res)
	}
	if got := env("CONNECTOR_TOKEN"); got != "from-spec" {
		t.Errorf("the connector's env reached the server as %q", got)
	}
	if got := env("CONNECTOR_SVC_SERVICE_SECRET"); got != "" {
		t.Errorf("the service's own environment leaked into the stdio server: %q", got)
	}

	pids := readPIDs(t, pidfile)
	if len(pids) != 2 {
		t.Fatalf("pids = %v; want one server (leader and child) for all calls", pids)
	}
	for _, pid := range pids {
		if !running(pid) {
			t.Fatalf("pid %d is not running before close", pid)
		}
	}
	reg.Remove(1)
	for _, pid := range pids {
		testsupport.WaitFor(t, fmt.Sprintf("pid %d to be gone", pid), func() bool { return !running(pid) })
	}
}

func TestStdioShutdownLeavesNoProcess(t *testing.T) {
	pidfile := filepath.Join(t.TempDir(), "pids")
	src := newSource(stdioSpec(1, "-stubborn", "-child", "-pidfile", pidfile), stdioSpec(2, "-child", "-pidfile", pidfile))
	reg := registry.New(src, testConfig(), nil)
	if err := reg.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- reg.Run(ctx) }()
	for _, id := range []int64{1, 2} {
		if _, err := reg.CallTool(ctxT(t), id, "echo", map[string]any{"text": "x"}, registry.CallOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	pids := readPIDs(t, pidfile)
	if len(pids) != 4 {
		t.Fatalf("pids = %v, want 4", pids)
	}
	// Run returned: the servers were reaped, and their children were sent
	// SIGKILL, which lands a moment later.
	for _, pid := range pids {
		testsupport.WaitFor(t, fmt.Sprintf("pid %d to be gone after shutdown", pid), func() bool { return !running(pid) })
	}
}

func TestStdioCrashIsReportedAndRebuilt(t *testing.T) {
	src := newSource(stdioSpec(1))
	reg := run(t, src, testConfig())
	first, err := reg.CallTool(ctxT(t), 1, "pid", nil, registry.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, cerr := reg.CallTool(ctxT(t), 1, "crash", nil, registry.CallOptions{})
	if cerr == nil {
		t.Fatal("a call that crashed the server succeeded")
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("crash call error: %v", cerr)
			src.mu.Lock()
			for _, h := range src.health[1] {
				t.Logf("health: %s %q", h.State, h.LastError)
			}
			src.mu.Unlock()
		}
	})
	// The connector may be back before we look, so search what was persisted.
	testsupport.WaitFor(t, "the server's stderr in a persisted health error", func() bool {
		src.mu.Lock()
		defer src.mu.Unlock()
		for _, h := range src.health[1] {
			if strings.Contains(h.LastError, "asked me to crash") {
				return true
			}
		}
		return false
	})
	testsupport.WaitFor(t, "a new server process", func() bool {
		res, err := reg.CallTool(ctxT(t), 1, "pid", nil, registry.CallOptions{})
		return err == nil && text(t, res) != text(t, first)
	})
	if h, _ := reg.Health(1); h.State != registry.StateReady {
		t.Errorf("state after rebuild = %s, want ready", h.State)
	}
}
