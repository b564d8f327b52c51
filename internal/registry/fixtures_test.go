package registry_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/connector-svc/connector-svc/internal/mcptest"
	"github.com/connector-svc/connector-svc/internal/registry"
)

// mcpServer is a real mcp-go MCP server over streamable HTTP (or SSE) on
// loopback that counts what clients send and can misbehave on demand.
type mcpServer struct {
	t        *testing.T
	sse      bool
	legacy   bool // answer server/discover with method-not-found
	silent   bool // never answer server/discover
	anyHost  bool // serve any Host header (mcp-go refuses non-loopback ones on loopback)
	quiet    bool // send no notifications/tools/list_changed
	counter  bool // serve the "count" tool (see addCounter)
	addr     string
	requests atomic.Int64 // every HTTP request
	inits    atomic.Int64
	lists    atomic.Int64
	sessions *sessionIDs
	release  chan struct{} // closes to release "block" calls
	hang     atomic.Bool   // take requests but never answer them
	calls    atomic.Int64  // tools/call requests
	accepted atomic.Int64  // TCP connections accepted
	blocking chan struct{} // receives once per "block" call under way

	// progress, if set, serves mcptest's progress tool and sees what it writes.
	progress *mcptest.Written

	mu   sync.Mutex
	mcp  *server.MCPServer
	http *httptest.Server
	// counters are the "count" tool's counts, by MCP session id: state
	// the server keeps per session.
	counters map[string]int
	// deleted are the MCP session ids of the DELETEs received;
	// callSessions those of the tools/call requests.
	deleted, callSessions []string
}

type serverOption func(*mcpServer)

func legacyServer(s *mcpServer) { s.legacy = true }
func silentProbe(s *mcpServer)  { s.silent = true }
func sseServer(s *mcpServer)    { s.sse = true }
func anyHost(s *mcpServer)      { s.anyHost = true }
func quietServer(s *mcpServer)  { s.quiet = true }

// counterServer serves the "count" tool too, which counts per MCP session.
func counterServer(s *mcpServer) { s.counter = true }

// progressServer serves mcptest.ProgressTool too, without MCP sessions
// (see start).
func progressServer(s *mcpServer) { s.progress = mcptest.NewWritten() }

func newMCPServer(t *testing.T, opts ...serverOption) *mcpServer {
	t.Helper()
	s := &mcpServer{t: t, release: make(chan struct{}), blocking: make(chan struct{}, 16)}
	for _, o := range opts {
		o(s)
	}
	s.counters = map[string]int{}
	s.start("127.0.0.1:0")
	t.Cleanup(func() {
		select {
		case <-s.release:
		default:
			close(s.release)
		}
		s.stop()
	})
	return s
}

func (s *mcpServer) url() string {
	if s.sse {
		return "http://" + s.addr + "/sse"
	}
	return "http://" + s.addr + "/mcp"
}

// start serves a fresh MCP server (new sessions) on addr.
func (s *mcpServer) start(addr string) {
	var lis net.Listener
	var err error
	for range 50 { // the old socket may linger briefly after a restart
		if lis, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		s.t.Fatalf("listen %s: %v", addr, err)
	}
	s.addr = lis.Addr().String()
	m := server.NewMCPServer("test", "1.0", server.WithToolCapabilities(!s.quiet))
	s.addTools(m)
	s.sessions = &sessionIDs{live: map[string]bool{}}
	opts := []server.StreamableHTTPOption{server.WithSessionIdManager(s.sessions)}
	if s.progress != nil {
		// mcp-go's stateful streamable-HTTP server (v1.2.1) queues a
		// session's notifications on one channel, which every request of
		// the session reads from, and a request that has ended (its
		// goroutine not yet gone) discards what it takes
		// (mark3labs/mcp-go#969): a tool's progress goes out on another
		// request's response, or not at all, and the progress tool waits
		// for it until the call times out. Stateless, every request has a
		// session, and so a channel, of its own.
		opts = []server.StreamableHTTPOption{server.WithStateLess(true)}
	}
	if s.anyHost {
		opts = append(opts, server.WithDisableLocalhostProtection(true))
	}
	var h http.Handler
	if s.sse {
		h = server.NewSSEServer(m, server.WithBaseURL("http://"+s.addr))
	} else {
		h = server.NewStreamableHTTPServer(m, opts...)
	}
	if s.progress != nil {
		mcptest.AddProgressTool(m, s.progress)
		h = s.progress.Handler(h)
	}
	hs := httptest.NewUnstartedServer(s.inspect(h))
	hs.Listener.Close()
	hs.Listener = &countingListener{Listener: lis, n: &s.accepted}
	hs.Start()
	s.mu.Lock()
	s.mcp, s.http = m, hs
	s.mu.Unlock()
}

// stop closes the server and every connection to it. httptest's Close
// waits for active requests and closes only idle connections, so a client
// that reconnects meanwhile (an SSE stream, which never ends on its own)
// would hold it forever: connections are cut until Close returns.
func (s *mcpServer) stop() {
	s.mu.Lock()
	hs := s.http
	s.mu.Unlock()
	closed := make(chan struct{})
	go func() {
		hs.Close()
		close(closed)
	}()
	for {
		hs.CloseClientConnections()
		select {
		case <-closed:
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// restart stops the server and starts a new one, with no memory of old
// sessions, on the same address.
func (s *mcpServer) restart() {
	s.stop()
	s.start(s.addr)
}

// expireSessions makes the server forget every session, as after an idle
// expiry: requests with an old session id get 404.
func (s *mcpServer) expireSessions() { s.sessions.expire() }

func (s *mcpServer) server() *server.MCPServer {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mcp
}

func (s *mcpServer) addTools(m *server.MCPServer) {
	readOnly := true
	echo := mcp.NewTool("echo", mcp.WithDescription("Echoes text"), mcp.WithString("text", mcp.Required()))
	echo.Annotations.ReadOnlyHint = &readOnly
	m.AddTool(echo, func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText(req.GetString("text", "")), nil
	})
	if s.counter {
		s.addCounter(m)
	}
	m.AddTool(mcp.NewTool("fail", mcp.WithDescription("Always fails")),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultError("it failed"), nil
		})
	m.AddTool(mcp.NewTool("block", mcp.WithDescription("Blocks until released")),
		func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			s.blocking <- struct{}{}
			select {
			case <-s.release:
				return mcp.NewToolResultText("released"), nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		})
}

// addCounter adds the "count" tool, whose count is per MCP session.
func (s *mcpServer) addCounter(m *server.MCPServer) {
	m.AddTool(mcp.NewTool("count", mcp.WithDescription("Counts the calls of its MCP session")),
		func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			id := ""
			if cs := server.ClientSessionFromContext(ctx); cs != nil {
				id = cs.SessionID()
			}
			s.mu.Lock()
			s.counters[id]++
			n := s.counters[id]
			s.mu.Unlock()
			return mcp.NewToolResultText(fmt.Sprint(n)), nil
		})
}

// inspect counts requests by JSON-RPC method and fakes legacy servers.
func (s *mcpServer) inspect(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		if r.Method == http.MethodDelete {
			s.mu.Lock()
			s.deleted = append(s.deleted, r.Header.Get("Mcp-Session-Id"))
			s.mu.Unlock()
		}
		if r.Method != http.MethodPost {
			next.ServeHTTP(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		var msg struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		_ = json.Unmarshal(body, &msg)
		if s.hang.Load() {
			<-r.Context().Done()
			return
		}
		switch msg.Method {
		case "tools/call":
			s.calls.Add(1)
			s.mu.Lock()
			s.callSessions = append(s.callSessions, r.Header.Get("Mcp-Session-Id"))
			s.mu.Unlock()
		case "initialize":
			s.inits.Add(1)
		case "tools/list":
			s.lists.Add(1)
		case "server/discover":
			if s.silent {
				<-r.Context().Done()
				return
			}
			if s.legacy {
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"error":{"code":-32601,"message":"Method not found"}}`, msg.ID)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// countingListener counts the connections it accepts in n.
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// sessionIDs is a SessionIdManager whose sessions can all be expired.
type sessionIDs struct {
	mu   sync.Mutex
	live map[string]bool
}

func (m *sessionIDs) Generate() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	m.mu.Lock()
	m.live[id] = true
	m.mu.Unlock()
	return id
}

func (m *sessionIDs) Validate(id string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.live[id] {
		return true, nil // unknown or expired: 404
	}
	return false, nil
}

func (m *sessionIDs) Terminate(id string) (bool, error) {
	m.mu.Lock()
	delete(m.live, id)
	m.mu.Unlock()
	return false, nil
}

// count is how many sessions the server holds.
func (m *sessionIDs) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.live)
}

func (m *sessionIDs) expire() {
	m.mu.Lock()
	clear(m.live)
	m.mu.Unlock()
}

// fakeSource is an in-memory ConnectorSource that records what the registry
// reports.
type fakeSource struct {
	// syncGate, if set, holds every SyncTools until it is closed;
	// syncing then receives once per SyncTools waiting at the gate.
	syncGate chan struct{}
	syncing  chan struct{}

	mu     sync.Mutex
	specs  []registry.Spec
	tools  map[int64][]string
	syncs  map[int64]int
	health map[int64][]registry.Health
	usage  map[int64]registry.Usage
	// flags, if set for a connector, is what ToolFlags answers for it;
	// else every tool SyncTools stored is enabled. flagReads counts
	// ToolFlags calls.
	flags     map[int64]registry.ToolFlags
	flagReads map[int64]int
}

func newSource(specs ...registry.Spec) *fakeSource {
	return &fakeSource{specs: specs, tools: map[int64][]string{}, syncs: map[int64]int{},
		health: map[int64][]registry.Health{}, usage: map[int64]registry.Usage{},
		flags: map[int64]registry.ToolFlags{}, flagReads: map[int64]int{}}
}

func (f *fakeSource) ActiveConnectors(context.Context) ([]registry.Spec, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.specs), nil
}

func (f *fakeSource) SyncTools(ctx context.Context, id int64, tools []mcp.Tool) (registry.ToolChanges, error) {
	if f.syncGate != nil {
		select {
		case f.syncing <- struct{}{}:
		default:
		}
		select {
		case <-f.syncGate:
		case <-ctx.Done():
			return registry.ToolChanges{}, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var names []string
	for _, t := range tools {
		names = append(names, t.Name)
	}
	var ch registry.ToolChanges
	for _, n := range names {
		if !slices.Contains(f.tools[id], n) {
			ch.Added = append(ch.Added, n)
		}
	}
	f.tools[id] = names
	f.syncs[id]++
	return ch, nil
}

func (f *fakeSource) ToolFlags(_ context.Context, id int64) (registry.ToolFlags, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.flagReads[id]++
	if fl, ok := f.flags[id]; ok {
		return fl, nil
	}
	fl := registry.ToolFlags{Enabled: map[string]bool{}}
	for _, n := range f.tools[id] {
		fl.Enabled[n] = true
	}
	return fl, nil
}

func (f *fakeSource) SaveHealth(_ context.Context, id int64, h registry.Health) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.health[id] = append(f.health[id], h)
	return nil
}

func (f *fakeSource) AddUsage(_ context.Context, id int64, u registry.Usage) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	sum := f.usage[id]
	sum.Calls += u.Calls
	sum.Errors += u.Errors
	sum.Reconnects += u.Reconnects
	sum.Reinitializations += u.Reinitializations
	f.usage[id] = sum
	return nil
}

func (f *fakeSource) toolNames(id int64) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.tools[id])
}

func (f *fakeSource) healthCount(id int64) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.health[id])
}

// healthSaw reports whether any persisted health of id has an error
// containing s.
func (f *fakeSource) healthSaw(id int64, s string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, h := range f.health[id] {
		if strings.Contains(h.LastError, s) {
			return true
		}
	}
	return false
}

func (f *fakeSource) lastHealth(id int64) registry.Health {
	f.mu.Lock()
	defer f.mu.Unlock()
	hs := f.health[id]
	if len(hs) == 0 {
		return registry.Health{}
	}
	return hs[len(hs)-1]
}

// testConfig reacts quickly so tests wait on conditions, not on clocks.
func testConfig() registry.Config {
	return registry.Config{
		HealthInterval:  100 * time.Millisecond,
		HealthTimeout:   2 * time.Second,
		BackoffBase:     20 * time.Millisecond,
		BackoffMax:      200 * time.Millisecond,
		DiscoverTimeout: 300 * time.Millisecond,
		CloseGrace:      500 * time.Millisecond,
		UsageInterval:   20 * time.Millisecond,
	}
}

func httpSpec(id int64, url string) registry.Spec {
	return registry.Spec{ID: id, WorkspaceID: "ws", ConnectorID: fmt.Sprint("c", id), Transport: registry.TransportStreamableHTTP,
		URL: url, ConnectTimeout: 5 * time.Second, CallTimeout: 5 * time.Second}
}

// run starts the registry's Run and stops it when the test ends.
func run(t testing.TB, src registry.ConnectorSource, cfg registry.Config) *registry.Registry {
	t.Helper()
	reg := registry.New(src, cfg, nil)
	start(t, reg)
	return reg
}

// start loads reg and runs it until stop is called or the test ends.
func start(t testing.TB, reg *registry.Registry) (stop func()) {
	t.Helper()
	if err := reg.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- reg.Run(ctx) }()
	stop = sync.OnceFunc(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("Run did not return within 30s of cancel")
		}
	})
	t.Cleanup(stop)
	return stop
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func text(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	if res == nil || len(res.Content) == 0 {
		t.Fatalf("empty tool result %v", res)
	}
	tc, ok := res.Content[0].(mcp.TextContent)
	if !ok {
		t.Fatalf("first content is %T, want text", res.Content[0])
	}
	return tc.Text
}
