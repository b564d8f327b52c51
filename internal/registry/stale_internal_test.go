package registry

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

// TestLateSignalsOfAnOldSessionLeaveTheNewOneAlone delivers, after a
// reconnect, what the old session's watchers and jobs may report late: its
// death, a connect that failed, a connect asked for by someone who saw the
// connector down before the reconnect. None of them may touch the new
// session, or a call running on it.
func TestLateSignalsOfAnOldSessionLeaveTheNewOneAlone(t *testing.T) {
	srv := newStaleTestServer(t)
	src := &oneSource{spec: Spec{ID: 1, WorkspaceID: "ws", ConnectorID: "c1", Transport: TransportStreamableHTTP,
		URL: srv.url, ConnectTimeout: 5 * time.Second, CallTimeout: 5 * time.Second}}
	reg := runInternal(t, src, Config{HealthInterval: time.Hour, BackoffBase: 20 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := reg.CallTool(ctx, 1, "echo", nil, CallOptions{}); err != nil {
		t.Fatal(err)
	}
	c, err := reg.get(1)
	if err != nil {
		t.Fatal(err)
	}
	old := c.current()
	c.drop(old, errors.New("sse stream ended")) // the old session dies; a reconnect follows at once
	if _, err := reg.CallTool(ctx, 1, "echo", nil, CallOptions{}); err != nil {
		t.Fatalf("call after the reconnect: %v", err)
	}
	fresh := c.current()
	if fresh == nil || fresh == old {
		t.Fatal("no new session after the old one died")
	}
	inits := srv.inits.Load()

	running := make(chan error, 1)
	go func() {
		_, err := reg.CallTool(ctx, 1, "block", nil, CallOptions{})
		running <- err
	}()
	<-srv.blocking

	c.drop(old, errors.New("late: sse stream ended"))
	c.fail(errors.New("late: a connect that lost the race"), nil)
	if err := c.connectShared(ctx); err != nil {
		t.Errorf("a late connect on a connector that is up: %v", err)
	}

	if got := c.current(); got != fresh {
		t.Error("a late signal of the old session replaced the new one")
	}
	if h := c.snapshot(); h.State != StateReady {
		t.Errorf("state after late signals = %s (%s), want ready", h.State, h.LastError)
	}
	if n := srv.inits.Load() - inits; n != 0 {
		t.Errorf("late signals opened %d new sessions, want 0", n)
	}
	close(srv.release)
	if err := <-running; err != nil {
		t.Errorf("the call running on the new session: %v", err)
	}
}

// current is c's live session.
func (c *conn) current() *session {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sess
}

// staleTestServer is an mcp-go streamable-HTTP server with an echo tool
// and a tool that blocks until released, counting initialize requests.
type staleTestServer struct {
	url      string
	inits    atomic.Int64
	blocking chan struct{}
	release  chan struct{}
}

func newStaleTestServer(t *testing.T) *staleTestServer {
	s := &staleTestServer{blocking: make(chan struct{}, 1), release: make(chan struct{})}
	m := server.NewMCPServer("stale", "1")
	m.AddTool(mcp.NewTool("echo"), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("echo"), nil
	})
	m.AddTool(mcp.NewTool("block"), func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		s.blocking <- struct{}{}
		select {
		case <-s.release:
			return mcp.NewToolResultText("released"), nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	h := server.NewStreamableHTTPServer(m)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.Header.Get("Mcp-Session-Id") == "" {
			s.inits.Add(1)
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
	})
	s.url = hs.URL + "/mcp"
	return s
}

// oneSource is a ConnectorSource of one connector that keeps nothing.
type oneSource struct{ spec Spec }

func (s *oneSource) ActiveConnectors(context.Context) ([]Spec, error) { return []Spec{s.spec}, nil }
func (s *oneSource) SyncTools(context.Context, int64, []mcp.Tool) (ToolChanges, error) {
	return ToolChanges{}, nil
}
func (s *oneSource) SaveHealth(context.Context, int64, Health) error { return nil }
func (s *oneSource) AddUsage(context.Context, int64, Usage) error    { return nil }
func (s *oneSource) ToolFlags(context.Context, int64) (ToolFlags, error) {
	return ToolFlags{}, nil
}

// runInternal runs a registry until the test ends.
func runInternal(t *testing.T, src ConnectorSource, cfg Config) *Registry {
	t.Helper()
	reg := New(src, cfg, nil)
	if err := reg.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- reg.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("Run did not return within 30s of cancel")
		}
	})
	return reg
}
