package registry_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

// sessionSpec is a per_session stdio connector whose server locks its
// profile directory at start-up, as Playwright MCP locks its browser
// profile: a second process on the same profile exits with "profile
// already in use". Each session's server locks its own subdirectory (it
// is told its session in CONNECTOR_SESSION_ID).
func sessionSpec(id int64, profile string, args ...string) registry.Spec {
	spec := stdioSpec(id, append([]string{"-profile", profile}, args...)...)
	spec.SessionMode = registry.SessionPerSession
	return spec
}

func inSession(session string) registry.CallOptions {
	return registry.CallOptions{Session: session}
}

func sessionCall(t *testing.T, reg *registry.Registry, id int64, session, tool string, args map[string]any) string {
	t.Helper()
	res, err := reg.CallTool(ctxT(t), id, tool, args, inSession(session))
	if err != nil {
		t.Fatalf("session %q: %s: %v", session, tool, err)
	}
	return text(t, res)
}

// sessionPIDs returns the stdio server pid of each open session of id.
func sessionPIDs(t *testing.T, reg *registry.Registry, id int64) map[string]int {
	t.Helper()
	infos, err := reg.Sessions(id)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, in := range infos {
		out[in.SessionID] = in.PID
	}
	return out
}

func TestSessionsKeepTheirStateApart(t *testing.T) {
	reg := run(t, newSource(sessionSpec(1, t.TempDir())), testConfig())

	if _, err := reg.CallTool(ctxT(t), 1, "recall", nil, registry.CallOptions{}); !errors.Is(err, registry.ErrSessionRequired) {
		t.Fatalf("call without a session: %v, want ErrSessionRequired", err)
	}
	sessionCall(t, reg, 1, "alice", "remember", map[string]any{"value": "alice's page"})
	sessionCall(t, reg, 1, "bob", "remember", map[string]any{"value": "bob's page"})
	for range 5 {
		if got := sessionCall(t, reg, 1, "alice", "recall", nil); got != "alice's page" {
			t.Fatalf("alice recalls %q", got)
		}
		if got := sessionCall(t, reg, 1, "bob", "recall", nil); got != "bob's page" {
			t.Fatalf("bob recalls %q", got)
		}
	}
	alicePID := sessionCall(t, reg, 1, "alice", "pid", nil)
	bobPID := sessionCall(t, reg, 1, "bob", "pid", nil)
	if alicePID == bobPID {
		t.Fatalf("alice and bob share process %s", alicePID)
	}
	pids := sessionPIDs(t, reg, 1)
	if fmt.Sprint(pids["alice"]) != alicePID || fmt.Sprint(pids["bob"]) != bobPID || len(pids) != 2 {
		t.Errorf("Sessions pids = %v; want alice %s, bob %s", pids, alicePID, bobPID)
	}
	infos, _ := reg.Sessions(1)
	for _, in := range infos {
		if in.Calls != 7 || in.State != registry.StateReady || in.WorkspaceID != "ws" {
			t.Errorf("session %+v; want 7 calls (remember, 5 recalls, pid), ready", in)
		}
	}
	if n := reg.SessionCount(1); n != 2 {
		t.Errorf("SessionCount = %d, want 2", n)
	}
}

func TestConcurrentFirstUseOpensOneConnection(t *testing.T) {
	pidfile := filepath.Join(t.TempDir(), "pids")
	reg := run(t, newSource(sessionSpec(1, t.TempDir(), "-pidfile", pidfile)), testConfig())
	var wg sync.WaitGroup
	got := make(chan string, 16)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got <- sessionCall(t, reg, 1, "carol", "pid", nil)
		}()
	}
	wg.Wait()
	close(got)
	seen := map[string]bool{}
	for pid := range got {
		seen[pid] = true
	}
	if len(seen) != 1 {
		t.Errorf("16 first calls of one session ran in %d processes, want 1", len(seen))
	}
	// The connector's own short-lived listing process, then carol's.
	if pids := readPIDs(t, pidfile); len(pids) != 2 {
		t.Errorf("server processes started = %d (%v), want 2: one to list the tools, one for the session", len(pids), pids)
	}
}

func TestCloseSessionKillsItsProcessGroup(t *testing.T) {
	pidfile := filepath.Join(t.TempDir(), "pids")
	reg := run(t, newSource(sessionSpec(1, t.TempDir(), "-child", "-pidfile", pidfile)), testConfig())
	sessionCall(t, reg, 1, "dave", "pid", nil)
	sessionCall(t, reg, 1, "erin", "pid", nil)
	pids := sessionPIDs(t, reg, 1)

	if closed := reg.CloseSession("other-workspace", "dave", 0); len(closed) != 0 {
		t.Fatalf("another workspace closed %v", closed)
	}
	closed := reg.CloseSession("ws", "dave", 0)
	if len(closed) != 1 || closed[0].SessionID != "dave" || closed[0].PID != pids["dave"] {
		t.Fatalf("CloseSession = %+v, want dave (pid %d)", closed, pids["dave"])
	}
	// dave's server and its child are gone, reaped; erin's live on.
	all := readPIDs(t, pidfile)
	for _, pid := range all {
		if pid == pids["erin"] {
			continue
		}
		if pid == pids["dave"] || isChildOf(pid, pids["dave"], all) {
			testsupport.WaitFor(t, fmt.Sprintf("dave's process %d to be gone", pid), func() bool { return !running(pid) && !zombie(pid) })
		}
	}
	if !running(pids["erin"]) {
		t.Error("closing dave's session killed erin's server")
	}
	if got := sessionPIDs(t, reg, 1); len(got) != 1 || got["erin"] == 0 {
		t.Errorf("sessions after closing dave = %v, want erin only", got)
	}
	// dave comes back with a new process and a clean slate.
	if got := sessionCall(t, reg, 1, "dave", "recall", nil); got != "" {
		t.Errorf("a reopened session recalls %q, want nothing", got)
	}
}

// isChildOf reports whether pid follows parent in the pidfile: the test
// server writes its own pid, then its child's.
func isChildOf(pid, parent int, all []int) bool {
	for i := 1; i < len(all); i++ {
		if all[i] == pid && all[i-1] == parent {
			return true
		}
	}
	return false
}

func TestIdleSessionsCloseAndTheCapHolds(t *testing.T) {
	cfg := testConfig()
	cfg.MaxSessions = 2
	// Long enough that s1 is still open when s3 tries, however long s2's
	// server takes to start.
	cfg.SessionIdleTTL = 2 * time.Second
	reg := run(t, newSource(sessionSpec(1, t.TempDir())), cfg)
	sessionCall(t, reg, 1, "s1", "pid", nil)
	sessionCall(t, reg, 1, "s2", "pid", nil)
	_, err := reg.CallTool(ctxT(t), 1, "pid", nil, inSession("s3"))
	var limit *registry.SessionLimitError
	if !errors.As(err, &limit) || limit.Limit != 2 {
		t.Fatalf("a third session: %v, want SessionLimitError{2}", err)
	}
	pid := sessionPIDs(t, reg, 1)["s1"]
	testsupport.WaitFor(t, "idle sessions to close", func() bool { return reg.SessionCount(1) == 0 })
	testsupport.WaitFor(t, "the idle session's server to be gone", func() bool { return !running(pid) && !zombie(pid) })
	sessionCall(t, reg, 1, "s3", "pid", nil)
}

func TestLifecycleClosesEverySession(t *testing.T) {
	profile := t.TempDir()
	pidfile := filepath.Join(t.TempDir(), "pids")
	src := newSource(sessionSpec(1, profile, "-pidfile", pidfile))
	reg := registry.New(src, testConfig(), nil)
	if err := reg.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- reg.Run(ctx) }()
	regRunning := true
	defer func() {
		if regRunning {
			stop()
			<-done
		}
	}()
	open := func(names ...string) []int {
		var pids []int
		for _, n := range names {
			sessionCall(t, reg, 1, n, "pid", nil)
			pids = append(pids, sessionPIDs(t, reg, 1)[n])
		}
		return pids
	}
	gone := func(what string, pids []int) {
		t.Helper()
		for _, pid := range pids {
			testsupport.WaitFor(t, fmt.Sprintf("%s: process %d gone", what, pid), func() bool { return !running(pid) && !zombie(pid) })
		}
	}

	pids := open("a", "b", "c")
	reg.Replace(ctxT(t), sessionSpec(1, profile, "-pidfile", pidfile)) // an update of the connection
	gone("update", pids)
	if n := reg.SessionCount(1); n != 0 {
		t.Errorf("sessions after an update = %d, want 0", n)
	}

	pids = open("a", "b")
	reg.Remove(1) // deactivate or delete
	gone("remove", pids)

	reg.Add(sessionSpec(1, profile, "-pidfile", pidfile))
	pids = open("x", "y")
	stop()
	regRunning = false
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	gone("shutdown", pids)
}

// A shared connection to such a server is one process for every user: a
// second connector on the same profile cannot even start. This is why
// per_session exists.
func TestSharedConnectorsCollideOnTheProfile(t *testing.T) {
	profile := t.TempDir()
	first, second := stdioSpec(1, "-profile", profile), stdioSpec(2, "-profile", profile)
	src := newSource(first, second)
	reg := run(t, src, testConfig())
	_, err1 := reg.CallTool(ctxT(t), 1, "pid", nil, registry.CallOptions{})
	_, err2 := reg.CallTool(ctxT(t), 2, "pid", nil, registry.CallOptions{})
	if (err1 == nil) == (err2 == nil) {
		t.Fatalf("two shared connectors on one profile: errors %v and %v; want exactly one to fail", err1, err2)
	}
	loser := int64(2)
	if err1 != nil {
		loser = 1
	}
	testsupport.WaitFor(t, "the profile lock in the loser's health", func() bool { return src.healthSaw(loser, "profile already in use") })
}

func TestSessionConnectionsRecoverOnTheirOwn(t *testing.T) {
	srv := newMCPServer(t, legacyServer)
	spec := httpSpec(1, srv.url())
	spec.SessionMode = registry.SessionPerSession
	src := newSource(spec, sessionSpec(2, t.TempDir()))
	reg := run(t, src, testConfig())

	// HTTP: each session is an MCP session of its own over the
	// connector's pool; a forgotten one is renewed and the call retried.
	sessionCall(t, reg, 1, "a", "echo", map[string]any{"text": "x"})
	sessionCall(t, reg, 1, "b", "echo", map[string]any{"text": "x"})
	// The listing connection is closed in the background.
	testsupport.WaitFor(t, "2 MCP sessions on the server (the listing one closed)", func() bool { return srv.sessions.count() == 2 })
	srv.expireSessions()
	var restarted bool
	res, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"text": "after expiry"}, registry.CallOptions{Session: "a", Restarted: &restarted})
	if err != nil || text(t, res) != "after expiry" || !restarted {
		t.Errorf("echo after expiry = %v, %v, restarted %v; want it run on a restarted session", res, err, restarted)
	}
	restarted = false
	if _, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"text": "x"}, registry.CallOptions{Session: "a", Restarted: &restarted}); err != nil || restarted {
		t.Errorf("the next echo: %v, restarted %v; want no second restart", err, restarted)
	}

	// stdio: a session whose server crashed gets a new one on next use.
	first := sessionCall(t, reg, 2, "c", "pid", nil)
	if _, err := reg.CallTool(ctxT(t), 2, "crash", nil, inSession("c")); err == nil {
		t.Fatal("a call that crashed the session's server succeeded")
	}
	restarted = false
	testsupport.WaitFor(t, "a new server for the session", func() bool {
		res, err := reg.CallTool(ctxT(t), 2, "pid", nil, registry.CallOptions{Session: "c", Restarted: &restarted})
		return err == nil && text(t, res) != first
	})
	if !restarted {
		t.Error("the first call on the session's new server did not report the restart")
	}
	testsupport.WaitFor(t, "session calls in the connector's counters", func() bool {
		src.mu.Lock()
		defer src.mu.Unlock()
		return src.usage[1].Calls == 4 && src.usage[2].Calls >= 3 && src.usage[2].Errors >= 1
	})
}

func TestUpdateDrainsSessionCalls(t *testing.T) {
	a, b := newMCPServer(t, legacyServer), newMCPServer(t, legacyServer)
	spec := func(url string) registry.Spec {
		s := httpSpec(1, url)
		s.SessionMode = registry.SessionPerSession
		return s
	}
	reg := run(t, newSource(spec(a.url())), testConfig())
	errs := make(chan error, 4)
	for i := range 4 {
		go func() {
			_, err := reg.CallTool(ctxT(t), 1, "block", nil, inSession(fmt.Sprint("s", i%2)))
			errs <- err
		}()
	}
	for range 4 {
		<-a.blocking
	}
	reg.Replace(ctxT(t), spec(b.url()))
	sessionCall(t, reg, 1, "s0", "echo", map[string]any{"text": "on b"})
	if b.calls.Load() != 1 {
		t.Errorf("server b saw %d calls after the update, want 1", b.calls.Load())
	}
	close(a.release)
	for range 4 {
		if err := <-errs; err != nil {
			t.Errorf("a session call in flight during the update: %v", err)
		}
	}
}
