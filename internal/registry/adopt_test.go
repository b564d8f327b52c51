package registry_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

// startStoppable runs a registry over src until stop, which returns once
// Run has.
func startStoppable(t *testing.T, src registry.ConnectorSource, cfg registry.Config) (reg *registry.Registry, stop func()) {
	t.Helper()
	reg = registry.New(src, cfg, nil)
	return reg, start(t, reg)
}

// sessionHooks records what Config.OnSessionOpened and OnSessionClosed
// hear.
type sessionHooks struct {
	mu     sync.Mutex
	opened []registry.SessionHandle
	closed []string
}

func (h *sessionHooks) install(cfg registry.Config) registry.Config {
	cfg.OnSessionOpened = func(_ int64, _ string, sh registry.SessionHandle) {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.opened = append(h.opened, sh)
	}
	cfg.OnSessionClosed = func(_ int64, sessionID string) {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.closed = append(h.closed, sessionID)
	}
	return cfg
}

func (h *sessionHooks) snapshot() ([]registry.SessionHandle, []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.opened), slices.Clone(h.closed)
}

func (s *mcpServer) deletedIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.deleted)
}

func (s *mcpServer) lastCallSession() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.callSessions) == 0 {
		return ""
	}
	return s.callSessions[len(s.callSessions)-1]
}

func perSessionHTTP(url string) registry.Spec {
	spec := httpSpec(1, url)
	spec.SessionMode = registry.SessionPerSession
	return spec
}

// count calls the "count" tool in session alice and returns its count and
// whether the call reported a restart.
func count(t *testing.T, reg *registry.Registry) (string, bool) {
	t.Helper()
	var restarted bool
	res, err := reg.CallTool(ctxT(t), 1, "count", nil, registry.CallOptions{Session: "alice", Restarted: &restarted})
	if err != nil {
		t.Fatalf("count: %v", err)
	}
	return text(t, res), restarted
}

// A registry that shuts down with DetachSessions leaves its per-session
// HTTP session open at the server, and another registry adopts it: the
// count the server keeps for it goes on, over the same Mcp-Session-Id,
// with no DELETE and no second initialize.
func TestAdoptedSessionContinuesOnAnotherRegistry(t *testing.T) {
	srv := newMCPServer(t, counterServer)
	var hooksA sessionHooks
	cfgA := testConfig()
	cfgA.DetachSessions = true
	a, stopA := startStoppable(t, newSource(perSessionHTTP(srv.url())), hooksA.install(cfgA))
	for _, want := range []string{"1", "2"} {
		if got, restarted := count(t, a); got != want || restarted {
			t.Fatalf("count on A = %q (restarted %v), want %q", got, restarted, want)
		}
	}
	h, ok := a.SessionHandle(1, "alice")
	if !ok || h.MCPSessionID == "" || h.ProtocolVersion == "" {
		t.Fatalf("SessionHandle on A = %+v, %v", h, ok)
	}
	if opened, _ := hooksA.snapshot(); len(opened) != 1 || opened[0] != h {
		t.Errorf("OnSessionOpened on A heard %+v, want [%+v]", opened, h)
	}
	stopA()
	if slices.Contains(srv.deletedIDs(), h.MCPSessionID) {
		t.Fatal("A sent a DELETE for the detached session")
	}
	if _, closed := hooksA.snapshot(); len(closed) != 0 {
		t.Errorf("OnSessionClosed heard %v of a detached session", closed)
	}

	var hooksB sessionHooks
	b := run(t, newSource(perSessionHTTP(srv.url())), hooksB.install(testConfig()))
	if err := b.Ready(ctxT(t), 1); err != nil {
		t.Fatal(err)
	}
	inits := srv.inits.Load()
	if !b.Adopt(1, "alice", h) {
		t.Fatal("B refused to adopt a streamable-HTTP session")
	}
	if got, restarted := count(t, b); got != "3" || restarted {
		t.Fatalf("count on B = %q (restarted %v), want 3: the session's count goes on", got, restarted)
	}
	if got := srv.inits.Load(); got != inits {
		t.Errorf("the server saw %d initialize requests for the adopted session, want none", got-inits)
	}
	if got := srv.lastCallSession(); got != h.MCPSessionID {
		t.Errorf("B's call went out on session %q, want %q", got, h.MCPSessionID)
	}
	if got, ok := b.SessionHandle(1, "alice"); !ok || got != h {
		t.Errorf("SessionHandle on B = %+v, %v; want %+v", got, ok, h)
	}
	if opened, _ := hooksB.snapshot(); len(opened) != 1 || opened[0] != h {
		t.Errorf("OnSessionOpened on B heard %+v, want [%+v]", opened, h)
	}
	if slices.Contains(srv.deletedIDs(), h.MCPSessionID) {
		t.Error("the adopted session was ended")
	}
	// B adopted it without DetachSessions: CloseSession ends it.
	b.CloseSession("ws", "alice", 1)
	testsupport.WaitFor(t, "the DELETE of the closed session", func() bool { return slices.Contains(srv.deletedIDs(), h.MCPSessionID) })
	if _, closed := hooksB.snapshot(); !slices.Equal(closed, []string{"alice"}) {
		t.Errorf("OnSessionClosed on B heard %v, want [alice]", closed)
	}
}

// detachedAfterOneCount runs a registry that counts once in session alice
// on srv and shuts down detaching it, and returns its handle.
func detachedAfterOneCount(t *testing.T, srv *mcpServer) registry.SessionHandle {
	t.Helper()
	cfgA := testConfig()
	cfgA.DetachSessions = true
	a, stopA := startStoppable(t, newSource(perSessionHTTP(srv.url())), cfgA)
	count(t, a)
	h, ok := a.SessionHandle(1, "alice")
	if !ok {
		t.Fatal("no handle on A")
	}
	stopA()
	return h
}

// An adopted session the server no longer knows (404) is replaced by a
// new one: the call runs, and reports the restart; the next does not.
func TestAdoptedSessionTheServerForgotRestarts(t *testing.T) {
	srv := newMCPServer(t, counterServer)
	h := detachedAfterOneCount(t, srv)
	srv.expireSessions()

	var hooksB sessionHooks
	b := run(t, newSource(perSessionHTTP(srv.url())), hooksB.install(testConfig()))
	if !b.Adopt(1, "alice", h) {
		t.Fatal("B refused to adopt")
	}
	if got, restarted := count(t, b); got != "1" || !restarted {
		t.Fatalf("count on B = %q (restarted %v), want 1 on a restarted session", got, restarted)
	}
	if got, restarted := count(t, b); got != "2" || restarted {
		t.Fatalf("next count on B = %q (restarted %v), want 2, not restarted", got, restarted)
	}
	renewed, ok := b.SessionHandle(1, "alice")
	if !ok || renewed.MCPSessionID == h.MCPSessionID {
		t.Errorf("handle after the restart = %+v, %v; want a new session id", renewed, ok)
	}
	if opened, _ := hooksB.snapshot(); len(opened) != 2 || opened[0] != h || opened[1] != renewed {
		t.Errorf("OnSessionOpened on B heard %+v, want the adopted handle, then %+v", opened, renewed)
	}
}

// Without DetachSessions, shutdown ends per-session HTTP sessions as
// before (a DELETE each), and tells OnSessionClosed.
func TestShutdownWithoutDetachEndsSessions(t *testing.T) {
	srv := newMCPServer(t, counterServer)
	var hooks sessionHooks
	a, stopA := startStoppable(t, newSource(perSessionHTTP(srv.url())), hooks.install(testConfig()))
	count(t, a)
	h, ok := a.SessionHandle(1, "alice")
	if !ok {
		t.Fatal("no handle")
	}
	stopA()
	testsupport.WaitFor(t, "the session's DELETE", func() bool { return slices.Contains(srv.deletedIDs(), h.MCPSessionID) })
	if _, closed := hooks.snapshot(); !slices.Equal(closed, []string{"alice"}) {
		t.Errorf("OnSessionClosed heard %v, want [alice]", closed)
	}
}

// Only a per-session connector of classic streamable HTTP can adopt, and
// only a handle with a session id.
func TestAdoptRefusesWhatCannotBeAdopted(t *testing.T) {
	h := registry.SessionHandle{MCPSessionID: "abc", ProtocolVersion: "2025-06-18"}
	sse := perSessionHTTP(newMCPServer(t, sseServer).url())
	sse.ID, sse.ConnectorID, sse.Transport = 2, "sse", registry.TransportSSE
	stdio := stdioSpec(3)
	stdio.SessionMode = registry.SessionPerSession
	shared := httpSpec(4, newMCPServer(t).url())
	reg := run(t, newSource(perSessionHTTP(newMCPServer(t).url()), sse, stdio, shared), testConfig())
	for _, tt := range []struct {
		name string
		id   int64
		h    registry.SessionHandle
	}{
		{"sse", 2, h},
		{"stdio", 3, h},
		{"shared", 4, h},
		{"not held", 5, h},
		{"no session id", 1, registry.SessionHandle{ProtocolVersion: "2025-06-18"}},
		{"sessionless protocol", 1, registry.SessionHandle{MCPSessionID: "abc", ProtocolVersion: "2026-07-28"}},
	} {
		if reg.Adopt(tt.id, "alice", tt.h) {
			t.Errorf("%s: Adopt = true, want false", tt.name)
		}
	}
	if n := reg.SessionCount(1) + reg.SessionCount(2) + reg.SessionCount(3); n != 0 {
		t.Errorf("refused adoptions left %d sessions open", n)
	}
	if !reg.Adopt(1, "alice", h) {
		t.Error("a per-session streamable-HTTP connector refused a classic handle")
	}
}

// An adopted session keeps the open time of the caller session, from the
// replica that opened it, in ListSessions (issue 27: it was reset to the
// adoption's).
func TestAdoptedSessionKeepsItsOpenTime(t *testing.T) {
	srv := newMCPServer(t, counterServer)
	h := detachedAfterOneCount(t, srv)
	opened := time.Now().Add(-time.Hour).Round(time.Millisecond)
	h.OpenedAt = opened

	b := run(t, newSource(perSessionHTTP(srv.url())), testConfig())
	if err := b.Ready(ctxT(t), 1); err != nil {
		t.Fatal(err)
	}
	if !b.Adopt(1, "alice", h) {
		t.Fatal("B refused to adopt the session")
	}
	if got, _ := count(t, b); got != "2" {
		t.Fatalf("count on B = %q, want 2", got)
	}
	infos, err := b.Sessions(1)
	if err != nil || len(infos) != 1 {
		t.Fatalf("Sessions on B = %+v, %v", infos, err)
	}
	if !infos[0].OpenedAt.Equal(opened) {
		t.Errorf("the adopted session opened at %v, want %v (when the caller session was opened)", infos[0].OpenedAt, opened)
	}
	if got, ok := b.SessionHandle(1, "alice"); !ok || !got.OpenedAt.IsZero() || got.MCPSessionID != h.MCPSessionID {
		t.Errorf("SessionHandle on B = %+v, %v", got, ok)
	}
}
