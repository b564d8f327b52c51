package registry_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/connector-svc/connector-svc/internal/registry"
)

// generationServer is an mcp-go server over streamable HTTP that offers
// both protocol generations, or, if sessionlessOnly, refuses the
// initialize handshake as a server of the 2026-07-28 generation only does.
// It records the handshakes it sees and the protocol version and MCP
// session of each tools/call.
type generationServer struct {
	url             string
	sessionlessOnly bool

	mu       sync.Mutex
	methods  map[string]int // handshake requests by method
	versions []string       // Mcp-Protocol-Version of each tools/call
	sessions []string       // Mcp-Session-Id of each tools/call
}

func newGenerationServer(t *testing.T, sessionlessOnly bool) *generationServer {
	t.Helper()
	s := &generationServer{sessionlessOnly: sessionlessOnly, methods: map[string]int{}}
	m := server.NewMCPServer("test", "1.0", server.WithToolCapabilities(true))
	m.AddTool(mcp.NewTool("echo", mcp.WithString("text", mcp.Required())),
		func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText(req.GetString("text", "")), nil
		})
	next := server.NewStreamableHTTPServer(m)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		var msg struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		_ = json.Unmarshal(body, &msg)
		s.mu.Lock()
		switch msg.Method {
		case "initialize", "server/discover":
			s.methods[msg.Method]++
		case "tools/call":
			s.versions = append(s.versions, r.Header.Get("Mcp-Protocol-Version"))
			s.sessions = append(s.sessions, r.Header.Get("Mcp-Session-Id"))
		}
		s.mu.Unlock()
		if msg.Method == "initialize" && s.sessionlessOnly {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"error":{"code":-32601,"message":"Method not found: initialize"}}`, msg.ID)
			return
		}
		next.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	s.url = hs.URL + "/mcp"
	return s
}

// seen returns the handshakes so far, and the protocol versions and MCP
// sessions of the tools/call requests.
func (s *generationServer) seen() (map[string]int, []string, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.methods), slices.Clone(s.versions), slices.Clone(s.sessions)
}

func TestProtocolPreference(t *testing.T) {
	for _, tc := range []struct {
		pref       string
		version    string
		handshakes map[string]int
	}{
		{"", mcp.ProtocolVersion20251125, map[string]int{"initialize": 1}},
		{registry.ProtocolAuto, mcp.ProtocolVersion20251125, map[string]int{"initialize": 1}},
		{registry.ProtocolClassic, mcp.ProtocolVersion20251125, map[string]int{"initialize": 1}},
		{registry.ProtocolSessionless, mcp.ProtocolVersion20260728, map[string]int{"server/discover": 1}},
	} {
		t.Run(cmp.Or(tc.pref, "empty"), func(t *testing.T) {
			srv := newGenerationServer(t, false)
			spec := httpSpec(1, srv.url)
			spec.Protocol = tc.pref
			reg := run(t, newSource(spec), testConfig())
			echo(t, reg, 1, "a")
			echo(t, reg, 1, "b")
			h, err := reg.Health(1)
			if err != nil || h.ProtocolVersion != tc.version {
				t.Errorf("health = %+v, %v; want protocol version %s", h, err, tc.version)
			}
			handshakes, versions, _ := srv.seen()
			if diff := gocmp.Diff(tc.handshakes, handshakes); diff != "" {
				t.Errorf("handshakes (-want +got):\n%s", diff)
			}
			if want := []string{tc.version, tc.version}; !slices.Equal(versions, want) {
				t.Errorf("the server saw tools/call at versions %v, want %v", versions, want)
			}
		})
	}
}

// A server that refuses the classic handshake is served sessionless, and
// every later connection (here: per-session ones) goes there at once.
func TestClassicRefusedFallsBackToSessionless(t *testing.T) {
	srv := newGenerationServer(t, true)
	spec := httpSpec(1, srv.url)
	spec.SessionMode = registry.SessionPerSession
	reg := run(t, newSource(spec), testConfig())
	for _, sid := range []string{"a", "b"} {
		res, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"text": sid}, registry.CallOptions{Session: sid})
		if err != nil {
			t.Fatal(err)
		}
		if got := text(t, res); got != sid {
			t.Fatalf("echo = %q, want %q", got, sid)
		}
	}
	if h, _ := reg.Health(1); h.ProtocolVersion != mcp.ProtocolVersion20260728 {
		t.Errorf("protocol version = %q, want %s", h.ProtocolVersion, mcp.ProtocolVersion20260728)
	}
	// The connector's own connection tried initialize once, then discover;
	// the two session connections went straight to discover.
	handshakes, versions, _ := srv.seen()
	if diff := gocmp.Diff(map[string]int{"initialize": 1, "server/discover": 3}, handshakes); diff != "" {
		t.Errorf("handshakes (-want +got):\n%s", diff)
	}
	if want := []string{mcp.ProtocolVersion20260728, mcp.ProtocolVersion20260728}; !slices.Equal(versions, want) {
		t.Errorf("the server saw tools/call at versions %v, want %v", versions, want)
	}
}

// A per_session connector of a server that offers both generations gets
// the classic one by default, so each caller session is an MCP session of
// its own.
func TestPerSessionGetsMCPSessions(t *testing.T) {
	srv := newGenerationServer(t, false)
	spec := httpSpec(1, srv.url)
	spec.SessionMode = registry.SessionPerSession
	reg := run(t, newSource(spec), testConfig())
	for _, sid := range []string{"a", "b", "a"} {
		if _, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"text": sid}, registry.CallOptions{Session: sid}); err != nil {
			t.Fatal(err)
		}
	}
	_, _, sessions := srv.seen()
	if len(sessions) != 3 || sessions[0] == "" || sessions[1] == "" || sessions[0] == sessions[1] || sessions[2] != sessions[0] {
		t.Errorf("MCP sessions of the calls of sessions a, b, a = %q; want two distinct sessions, a's reused", sessions)
	}
}
