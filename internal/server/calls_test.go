package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/structpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/server"
	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

// testMCP is an mcp-go server over streamable HTTP on loopback that counts
// handshakes: initialize (classic) and server/discover (2026-07).
type testMCP struct {
	mcp        *mcpserver.MCPServer
	http       *httptest.Server
	handshakes atomic.Int64
	cancelled  chan struct{} // closed when a "block" call sees its context end
	// last is the URL and headers of the last request, as the server got them.
	last atomic.Pointer[http.Request]

	mu        sync.Mutex
	toolCalls []http.Header // of each tools/call request
}

// toolCallHeaders returns the headers of each tools/call request so far.
func (s *testMCP) toolCallHeaders() []http.Header {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.toolCalls)
}

func newTestMCP(t testing.TB) *testMCP { t.Helper(); return newTestMCPOn(t, nil) }

// newTestMCPOn serves on lis, or on a new loopback port if lis is nil.
func newTestMCPOn(t testing.TB, lis net.Listener, opts ...mcpserver.StreamableHTTPOption) *testMCP {
	t.Helper()
	m := mcpserver.NewMCPServer("test", "1.0", mcpserver.WithToolCapabilities(true))
	readOnly := true
	echo := mcp.NewTool("echo", mcp.WithDescription("Echoes text"), mcp.WithString("text", mcp.Required()))
	echo.Annotations.ReadOnlyHint = &readOnly
	m.AddTool(echo, func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText(req.GetString("text", "")), nil
	})
	m.AddTool(mcp.NewTool("weather", mcp.WithDescription("Structured weather")),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultStructured(map[string]any{"city": "Oslo", "celsius": 4}, `{"city":"Oslo","celsius":4}`), nil
		})
	m.AddTool(mcp.NewTool("fail", mcp.WithDescription("Always fails")),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultError("it failed"), nil
		})
	m.AddTool(mcp.NewTool("big", mcp.WithDescription("Returns a result of the asked size and kind"),
		mcp.WithString("kind", mcp.Required()), mcp.WithNumber("bytes", mcp.Required())),
		func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return bigResult(req.GetString("kind", ""), req.GetInt("bytes", 0)), nil
		})
	s := &testMCP{mcp: m, cancelled: make(chan struct{})}
	var once sync.Once
	m.AddTool(mcp.NewTool("block", mcp.WithDescription("Blocks until cancelled")),
		func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			<-ctx.Done()
			once.Do(func() { close(s.cancelled) })
			return nil, ctx.Err()
		})
	h := mcpserver.NewStreamableHTTPServer(m, opts...)
	s.http = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			// Requests, not a replaced client's closing DELETE, which may
			// come after the new client's calls.
			u := *r.URL
			s.last.Store(&http.Request{URL: &u, Header: r.Header.Clone()})
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			var msg struct{ Method string }
			if json.Unmarshal(body, &msg) == nil && (msg.Method == "initialize" || msg.Method == "server/discover") {
				s.handshakes.Add(1)
			}
			if msg.Method == "tools/call" {
				s.mu.Lock()
				s.toolCalls = append(s.toolCalls, r.Header.Clone())
				s.mu.Unlock()
			}
		}
		h.ServeHTTP(w, r)
	}))
	if lis != nil {
		s.http.Listener.Close()
		s.http.Listener = lis
	}
	s.http.Start()
	t.Cleanup(s.http.Close)
	return s
}

func (s *testMCP) url() string { return s.http.URL + "/mcp" }

// mcpConnector is a streamable-HTTP connector whose calls wait for no
// approval (tests of approval set their policy).
func mcpConnector(id, url string) *connectorv1.Connector {
	return &connectorv1.Connector{ConnectorId: id, Transport: connectorv1.Transport_TRANSPORT_STREAMABLE_HTTP,
		Connection:     &connectorv1.Connector_Http{Http: &connectorv1.HttpConfig{Url: url}},
		ApprovalPolicy: connectorv1.ApprovalPolicy_APPROVAL_POLICY_NONE}
}

// waitReady waits until the connector is READY with its tools synced.
func (f *fixture) waitReady(t *testing.T, ws, id string) *connectorv1.Connector {
	t.Helper()
	var c *connectorv1.Connector
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := f.client.GetConnector(ctx(t), &connectorv1.GetConnectorRequest{WorkspaceId: ws, ConnectorId: id})
		if err != nil {
			t.Fatal(err)
		}
		c = resp.GetConnector()
		if c.GetHealth().GetState() == connectorv1.ConnectorState_CONNECTOR_STATE_READY && c.GetToolCount() > 0 {
			return c
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("connector %s never became READY with tools; last: %v", id, c.GetHealth())
	return nil
}

func (f *fixture) call(t *testing.T, ws, id, tool string, args map[string]any) (*connectorv1.CallToolResponse, error) {
	st, err := structpb.NewStruct(args)
	if err != nil {
		t.Fatal(err)
	}
	return f.client.CallTool(ctx(t), &connectorv1.CallToolRequest{WorkspaceId: ws, ConnectorId: id, ToolName: tool, Arguments: st})
}

func TestCallToolOverPersistentSession(t *testing.T) {
	f := setup(t)
	srv := newTestMCP(t)
	f.create(t, "ws", mcpConnector("m", srv.url()))
	c := f.waitReady(t, "ws", "m")
	if c.GetToolCount() != 5 || c.GetHealth().GetProtocolVersion() == "" {
		t.Errorf("ready connector: tool_count=%d protocol=%q", c.GetToolCount(), c.GetHealth().GetProtocolVersion())
	}

	for range 20 {
		resp, err := f.call(t, "ws", "m", "echo", map[string]any{"text": "hi"})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetIsError() || resp.GetContent()[0].GetText().GetText() != "hi" {
			t.Fatalf("echo = %v", resp)
		}
	}
	if n := srv.handshakes.Load(); n != 1 {
		t.Errorf("server saw %d handshakes for 20 calls, want 1", n)
	}

	resp, err := f.call(t, "ws", "m", "weather", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetStructuredContent().GetFields()["city"].GetStringValue(); got != "Oslo" {
		t.Errorf("structured content = %v", resp.GetStructuredContent())
	}
	resp, err = f.call(t, "ws", "m", "fail", nil)
	if err != nil || !resp.GetIsError() || resp.GetContent()[0].GetText().GetText() != "it failed" {
		t.Errorf("fail tool = %v, %v; want is_error", resp, err)
	}

	_, err = f.call(t, "ws", "m", "nope", nil)
	wantStatus(t, err, codes.NotFound, server.ReasonToolNotFound, "")

	no := false
	if _, err := f.client.UpdateTool(ctx(t), &connectorv1.UpdateToolRequest{WorkspaceId: "ws", ConnectorId: "m", ToolName: "echo", Enabled: &no}); err != nil {
		t.Fatal(err)
	}
	_, err = f.call(t, "ws", "m", "echo", map[string]any{"text": "x"})
	wantStatus(t, err, codes.FailedPrecondition, server.ReasonToolDisabled, "")

	deadline := time.Now().Add(20 * time.Second)
	for {
		got, _ := f.client.GetConnector(ctx(t), &connectorv1.GetConnectorRequest{WorkspaceId: "ws", ConnectorId: "m"})
		// 20 echo, weather and fail reach the server; the unknown and the
		// disabled tool are refused before.
		if n := got.GetConnector().GetCounters().GetCallCount(); n == 22 {
			if got.GetConnector().GetCounters().GetErrorCount() < 1 || got.GetConnector().GetCounters().GetLastUsedTime() == nil {
				t.Errorf("counters = %v; want the failed call counted and a last-used time", got.GetConnector().GetCounters())
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("call_count never reached 22: %v", got.GetConnector().GetCounters())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestLifecycleDrivesConnections(t *testing.T) {
	f := setup(t)
	srv := newTestMCP(t)
	f.create(t, "ws", mcpConnector("m", srv.url()))
	f.waitReady(t, "ws", "m")

	if _, err := f.client.DeactivateConnector(ctx(t), &connectorv1.DeactivateConnectorRequest{WorkspaceId: "ws", ConnectorId: "m"}); err != nil {
		t.Fatal(err)
	}
	_, err := f.call(t, "ws", "m", "echo", map[string]any{"text": "x"})
	wantStatus(t, err, codes.FailedPrecondition, server.ReasonConnectorInactive, "")
	check, err := f.client.CheckConnector(ctx(t), &connectorv1.CheckConnectorRequest{WorkspaceId: "ws", ConnectorId: "m"})
	if err != nil || check.GetHealth().GetState() != connectorv1.ConnectorState_CONNECTOR_STATE_INACTIVE {
		t.Errorf("CheckConnector on an inactive connector = %v, %v", check, err)
	}

	if _, err := f.client.ActivateConnector(ctx(t), &connectorv1.ActivateConnectorRequest{WorkspaceId: "ws", ConnectorId: "m"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.call(t, "ws", "m", "echo", map[string]any{"text": "back"}); err != nil {
		t.Fatalf("call after activate: %v", err)
	}

	// A new URL: the new server gets the calls.
	other := newTestMCP(t)
	_, err = f.client.UpdateConnector(ctx(t), &connectorv1.UpdateConnectorRequest{WorkspaceId: "ws",
		Connector:  mcpConnector("m", other.url()),
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"http.url"}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.call(t, "ws", "m", "echo", map[string]any{"text": "moved"}); err != nil {
		t.Fatal(err)
	}
	if n := other.handshakes.Load(); n != 1 {
		t.Errorf("the new server saw %d handshakes, want 1", n)
	}

	if _, err := f.client.DeleteConnector(ctx(t), &connectorv1.DeleteConnectorRequest{WorkspaceId: "ws", ConnectorId: "m"}); err != nil {
		t.Fatal(err)
	}
	if f.reg.Has(1) {
		t.Error("the registry still holds the deleted connector")
	}
}

// TestGetConnectorShowsTheLiveCheckTime: health checks that find nothing
// new leave the stored row alone, and GetConnector shows the registry's
// last check, not the row's.
func TestGetConnectorShowsTheLiveCheckTime(t *testing.T) {
	f := setup(t)
	srv := newTestMCP(t)
	f.create(t, "ws", mcpConnector("m", srv.url()))
	f.waitReady(t, "ws", "m")
	// READY is published from memory; the row follows off the call path, so
	// the test waits for it rather than expecting it with READY.
	var row *store.Connector
	testsupport.WaitFor(t, "the stored health row", func() bool {
		var err error
		row, err = f.db.GetConnector(ctx(t), "ws", "m")
		if err != nil {
			t.Fatal(err)
		}
		return row.Health.CheckedAt != nil
	})
	stored := *row.Health.CheckedAt

	var live time.Time
	deadline := time.Now().Add(20 * time.Second)
	for !live.After(stored.Add(time.Second)) { // five health intervals
		if time.Now().After(deadline) {
			t.Fatalf("GetConnector's check time stayed at %v; the stored one is %v", live, stored)
		}
		time.Sleep(20 * time.Millisecond)
		resp, err := f.client.GetConnector(ctx(t), &connectorv1.GetConnectorRequest{WorkspaceId: "ws", ConnectorId: "m"})
		if err != nil {
			t.Fatal(err)
		}
		live = resp.GetConnector().GetHealth().GetCheckTime().AsTime()
	}
	if row, err := f.db.GetConnector(ctx(t), "ws", "m"); err != nil || !row.Health.CheckedAt.Equal(stored) {
		t.Errorf("stored check time moved from %v to %v (%v); checks of a healthy connector need not write it", stored, row.Health.CheckedAt, err)
	}
}

func TestRefreshAndCheck(t *testing.T) {
	f := setup(t)
	srv := newTestMCP(t)
	f.create(t, "ws", mcpConnector("m", srv.url()))
	f.waitReady(t, "ws", "m")

	check, err := f.client.CheckConnector(ctx(t), &connectorv1.CheckConnectorRequest{WorkspaceId: "ws", ConnectorId: "m"})
	if err != nil || check.GetHealth().GetState() != connectorv1.ConnectorState_CONNECTOR_STATE_READY || check.GetHealth().GetCheckTime() == nil {
		t.Fatalf("CheckConnector = %v, %v", check, err)
	}

	// Add a tool without a list_changed notification reaching us first:
	// RefreshTools reports it either way.
	srv.mcp.AddTool(mcp.NewTool("late", mcp.WithDescription("Added later")),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText("ok"), nil
		})
	refresh, err := f.client.RefreshTools(ctx(t), &connectorv1.RefreshToolsRequest{WorkspaceId: "ws", ConnectorId: "m"})
	if err != nil {
		t.Fatal(err)
	}
	if names := toolNames(refresh.GetTools()); !slices.Equal(names, []string{"big", "block", "echo", "fail", "late", "weather"}) {
		t.Errorf("catalog after refresh = %v", names)
	}

	srv.http.CloseClientConnections()
	srv.http.Close()
	start := time.Now()
	_, err = f.call(t, "ws", "m", "fail", nil)
	wantStatus(t, err, codes.Unavailable, server.ReasonConnectorUnavailable, "")
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("a call to a dead server took %v", d)
	}
}

// A call made the moment a connector exists (created, or activated) waits
// for its connect and finds every tool the server lists: never
// TOOL_NOT_FOUND for a listed tool.
func TestCallRightAfterCreateOrActivate(t *testing.T) {
	f := setup(t)
	srv := newTestMCP(t)
	var wg sync.WaitGroup
	for i := range 8 {
		id := fmt.Sprint("m", i)
		f.create(t, "ws", mcpConnector(id, srv.url()))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := f.call(t, "ws", id, "echo", map[string]any{"text": "x"}); err != nil {
				t.Errorf("call right after CreateConnector(%s): %v", id, err)
			}
		}()
	}
	wg.Wait()

	for range 3 {
		if _, err := f.client.DeactivateConnector(ctx(t), &connectorv1.DeactivateConnectorRequest{WorkspaceId: "ws", ConnectorId: "m0"}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.client.ActivateConnector(ctx(t), &connectorv1.ActivateConnectorRequest{WorkspaceId: "ws", ConnectorId: "m0"}); err != nil {
			t.Fatal(err)
		}
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := f.call(t, "ws", "m0", "echo", map[string]any{"text": "x"}); err != nil {
					t.Errorf("call right after ActivateConnector: %v", err)
				}
			}()
		}
		wg.Wait()
	}
}

// The README walkthrough pasted as one block: the connector is created
// before its server listens. Calls say UNAVAILABLE (never NOT_FOUND) and
// work once the server is up.
func TestCallBeforeTheServerListens(t *testing.T) {
	f := setup(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	f.create(t, "ws", mcpConnector("m", "http://"+addr+"/mcp"))
	_, err = f.call(t, "ws", "m", "echo", map[string]any{"text": "x"})
	wantStatus(t, err, codes.Unavailable, server.ReasonConnectorUnavailable, "")

	if lis, err = net.Listen("tcp", addr); err != nil {
		t.Fatal(err)
	}
	newTestMCPOn(t, lis)
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := f.call(t, "ws", "m", "echo", map[string]any{"text": "x"})
		if err == nil {
			break
		}
		wantStatus(t, err, codes.Unavailable, server.ReasonConnectorUnavailable, "")
		if time.Now().After(deadline) {
			t.Fatalf("still failing 20s after the server came up: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
