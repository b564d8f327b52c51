package registry_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/telemetry/telemetrytest"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

// The connection edges a new user hits: a call right after connecting, a
// server that dies or goes silent, an update under load, recovery after an
// outage, and secrets in what comes back.

func TestReadyOnlyOnceTheCatalogIsKnown(t *testing.T) {
	srv := newMCPServer(t, legacyServer)
	src := newSource(httpSpec(1, srv.url()))
	gate := make(chan struct{})
	src.syncGate, src.syncing = gate, make(chan struct{}, 1)
	reg := run(t, src, testConfig())

	done := make(chan error, 1)
	go func() {
		_, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"text": "x"}, registry.CallOptions{})
		done <- err
	}()
	<-src.syncing // the session is up and its tools listed; the catalog is not synced yet
	if h, _ := reg.Health(1); h.State != registry.StateConnecting {
		t.Errorf("state while the catalog syncs = %s, want connecting", h.State)
	}
	select {
	case err := <-done:
		t.Fatalf("a call returned while the catalog was still being synced (err=%v)", err)
	default:
	}
	close(gate)
	if err := <-done; err != nil {
		t.Fatalf("the call that waited for the connect: %v", err)
	}
	if _, err := reg.CallTool(ctxT(t), 1, "nope", nil, registry.CallOptions{}); !errors.Is(err, registry.ErrToolNotFound) {
		t.Errorf("unknown tool: err = %v, want ErrToolNotFound", err)
	}
}

func TestCallsRightAfterAddNeverMissATool(t *testing.T) {
	srv := newMCPServer(t, legacyServer)
	src := newSource()
	reg := run(t, src, testConfig())
	var wg sync.WaitGroup
	var failed atomic.Int64
	for id := range int64(16) {
		reg.Add(httpSpec(id+1, srv.url()))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := reg.CallTool(ctxT(t), id+1, "echo", map[string]any{"text": "x"}, registry.CallOptions{}); err != nil {
				failed.Add(1)
				t.Errorf("connector %d: call right after Add: %v", id+1, err)
			}
		}()
	}
	wg.Wait()
	t.Logf("calls right after Add that failed: %d of 16", failed.Load())
}

func TestDownConnectorIsUnavailableAndRecoversOnDemand(t *testing.T) {
	srv := newMCPServer(t, legacyServer)
	addr := srv.addr
	srv.stop()
	cfg := testConfig()
	// The backoff alone would not retry within the test: only the
	// on-demand probe can bring it back.
	cfg.BackoffBase, cfg.BackoffMax = time.Hour, time.Hour
	cfg.ProbeAfter = 200 * time.Millisecond
	m := telemetrytest.New(t)
	cfg.MeterProvider = m.Provider
	reg := run(t, newSource(httpSpec(1, srv.url())), cfg)

	_, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"text": "x"}, registry.CallOptions{})
	if !errors.Is(err, registry.ErrUnavailable) || errors.Is(err, registry.ErrToolNotFound) {
		t.Fatalf("call to a connector whose server is not listening: %v, want ErrUnavailable", err)
	}
	// Calls in the same moment fail fast and share at most one probe.
	testsupport.WaitFor(t, "the probe interval to pass", func() bool {
		h, _ := reg.Health(1)
		return time.Since(h.CheckedAt) > cfg.ProbeAfter
	})
	before := m.Value(t, "connector.connect.errors", conn("c1")...)
	if before == 0 {
		t.Fatal("the failed connect was not counted")
	}
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = reg.CallTool(ctxT(t), 1, "echo", map[string]any{"text": "x"}, registry.CallOptions{})
		}()
	}
	wg.Wait()
	if n := m.Value(t, "connector.connect.errors", conn("c1")...) - before; n > 1 {
		t.Errorf("20 calls to a down connector made %v connect attempts, want at most 1", n)
	}

	srv.start(addr)
	start := time.Now()
	testsupport.WaitFor(t, "a call to reach the server that came back", func() bool {
		_, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"text": "x"}, registry.CallOptions{})
		return err == nil
	})
	t.Logf("back %s after the server returned (backoff: 1h)", time.Since(start).Round(time.Millisecond))
}

func TestSSEStreamEndIsNoticedAtOnce(t *testing.T) {
	srv := newMCPServer(t, sseServer)
	spec := httpSpec(1, srv.url())
	spec.Transport = registry.TransportSSE
	cfg := testConfig()
	cfg.HealthInterval = time.Hour // only the stream's end can tell
	src := newSource(spec)
	reg := run(t, src, cfg)
	echo(t, reg, 1, "before")

	start := time.Now()
	srv.restart()
	testsupport.WaitFor(t, "the dead stream to be noticed", func() bool { return src.healthSaw(1, "sse stream ended") })
	t.Logf("dead SSE stream noticed after %s", time.Since(start).Round(time.Millisecond))
	testsupport.WaitFor(t, "a reconnect without any call", func() bool { return src.lastHealth(1).State == registry.StateReady })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := reg.CallTool(ctx, 1, "echo", map[string]any{"text": "after"}, registry.CallOptions{}); err != nil {
		t.Fatalf("call after the SSE server restarted: %v", err)
	}
}

func TestSilentServerIsProbedAfterATimeout(t *testing.T) {
	srv := newMCPServer(t, legacyServer)
	spec := httpSpec(1, srv.url())
	spec.CallTimeout = 300 * time.Millisecond
	spec.ConnectTimeout = time.Second
	cfg := testConfig()
	cfg.HealthInterval = time.Hour
	cfg.ProbeTimeout = 300 * time.Millisecond
	src := newSource(spec)
	reg := run(t, src, cfg)
	echo(t, reg, 1, "before")

	srv.hang.Store(true)
	_, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"text": "x"}, registry.CallOptions{})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("call to a silent server: %v, want a deadline error", err)
	}
	start := time.Now()
	testsupport.WaitFor(t, "the silent server to be found out", func() bool { return src.healthSaw(1, "probe got no answer") })
	t.Logf("silent server found out %s after the timed-out call", time.Since(start).Round(time.Millisecond))

	srv.hang.Store(false)
	testsupport.WaitFor(t, "the connector to be back", func() bool {
		_, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"text": "x"}, registry.CallOptions{})
		return err == nil
	})
}

func TestStdioExitIsNoticedAndReaped(t *testing.T) {
	pidfile := filepath.Join(t.TempDir(), "pids")
	spec := stdioSpec(1, "-exit-after", "400ms", "-pidfile", pidfile)
	spec.Env = map[string]string{"TOKEN": "stdio-secret-3f9a"}
	cfg := testConfig()
	cfg.HealthInterval = time.Hour // only the exit can tell
	src := newSource(spec)
	reg := run(t, src, cfg)
	res, err := reg.CallTool(ctxT(t), 1, "pid", nil, registry.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	first := text(t, res)

	testsupport.WaitFor(t, "the exit to be noticed", func() bool { return src.healthSaw(1, "exit status 7") })
	if !src.healthSaw(1, "leaving on purpose") {
		t.Errorf("health errors lack the server's stderr: %+v", src.lastHealth(1))
	}
	if src.healthSaw(1, "stdio-secret-3f9a") {
		t.Error("a health error carries the connector's env value")
	}
	var pid int
	fmt.Sscan(first, &pid)
	testsupport.WaitFor(t, fmt.Sprintf("exited server %d to be reaped", pid), func() bool { return !running(pid) && !zombie(pid) })
	testsupport.WaitFor(t, "a new server process", func() bool {
		res, err := reg.CallTool(ctxT(t), 1, "pid", nil, registry.CallOptions{})
		return err == nil && text(t, res) != first
	})
}

// zombie reports whether pid is a zombie, whoever its parent.
func zombie(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return len(fields) > 0 && fields[0] == "Z"
}

func TestReplaceDrainsCallsInFlight(t *testing.T) {
	a, b := newMCPServer(t, legacyServer), newMCPServer(t, legacyServer)
	src := newSource(httpSpec(1, a.url()))
	reg := run(t, src, testConfig())
	echo(t, reg, 1, "on a")

	const blocked = 8
	errs := make(chan error, blocked)
	for range blocked {
		go func() {
			_, err := reg.CallTool(ctxT(t), 1, "block", nil, registry.CallOptions{})
			errs <- err
		}()
	}
	for range blocked {
		<-a.blocking
	}
	reg.Replace(ctxT(t), httpSpec(1, b.url()))
	echo(t, reg, 1, "on b")
	if b.calls.Load() != 1 {
		t.Errorf("server b saw %d calls after the update, want 1", b.calls.Load())
	}
	close(a.release)
	for range blocked {
		if err := <-errs; err != nil {
			t.Errorf("a call in flight during the update: %v", err)
		}
	}
}

func TestUpdatesUnderLoadLoseNoCall(t *testing.T) {
	a, b := newMCPServer(t, legacyServer), newMCPServer(t, legacyServer)
	src := newSource(httpSpec(1, a.url()))
	reg := run(t, src, testConfig())
	echo(t, reg, 1, "warm")

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var calls, failed atomic.Int64
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				_, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"text": "x"}, registry.CallOptions{})
				calls.Add(1)
				if err != nil {
					failed.Add(1)
					t.Errorf("call during updates: %v", err)
					return
				}
			}
		}()
	}
	for i := range 6 {
		url := a.url()
		if i%2 == 0 {
			url = b.url()
		}
		reg.Replace(ctxT(t), httpSpec(1, url))
		// Let the callers run on the new connection before the next update.
		next := calls.Load() + 50
		testsupport.WaitFor(t, "calls on the new connection", func() bool { return calls.Load() >= next || failed.Load() > 0 })
	}
	stop()
	wg.Wait()
	t.Logf("%d calls across 6 updates, %d failed", calls.Load(), failed.Load())
}

func TestSecretsStayOutOfErrorsAndHealth(t *testing.T) {
	const secret = "query-secret-8d1c"
	spec := httpSpec(1, "http://127.0.0.1:1/mcp?api_key="+secret)
	spec.Headers = map[string]string{"Authorization": "Bearer header-secret-77aa"}
	src := newSource(spec)
	reg := run(t, src, testConfig())
	_, err := reg.CallTool(ctxT(t), 1, "echo", nil, registry.CallOptions{})
	if err == nil {
		t.Fatal("a call to a closed port succeeded")
	}
	for _, s := range []string{secret, "header-secret-77aa"} {
		if strings.Contains(err.Error(), s) {
			t.Errorf("call error carries a secret: %v", err)
		}
		if src.healthSaw(1, s) {
			t.Errorf("health carries a secret: %+v", src.lastHealth(1))
		}
	}
	if !src.healthSaw(1, "REDACTED") {
		t.Errorf("health error = %q; want the URL with its query value REDACTED", src.lastHealth(1).LastError)
	}
}
