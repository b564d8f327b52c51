package server_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/structpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/server"
)

// sessionStore is per-connection state on a test MCP server: what a
// browser profile or a login is on a real one. remember stores a value
// under the caller's MCP session; recall returns it ("" if none).
type sessionStore struct {
	mu     sync.Mutex
	values map[string]string // by MCP session id
	calls  map[string]int    // by MCP session id
}

// newSessionMCP is a test MCP server with remember and recall. Like a real
// stateful server it keeps clients on a session-oriented protocol version
// (the 2026-07 core is sessionless: no MCP session to keep state in).
func newSessionMCP(t *testing.T) (*testMCP, *sessionStore) {
	t.Helper()
	srv := newTestMCPOn(t, nil, mcpserver.WithStreamableHTTPProtocolVersions(mcp.ProtocolVersion20251125))
	return srv, addSessionTools(srv)
}

func addSessionTools(srv *testMCP) *sessionStore {
	st := &sessionStore{values: map[string]string{}, calls: map[string]int{}}
	mcpSession := func(ctx context.Context) string {
		if s := mcpserver.ClientSessionFromContext(ctx); s != nil {
			return s.SessionID()
		}
		return ""
	}
	srv.mcp.AddTool(mcp.NewTool("remember", mcp.WithDescription("Remembers a value for this connection"),
		mcp.WithString("value", mcp.Required())),
		func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			st.mu.Lock()
			defer st.mu.Unlock()
			id := mcpSession(ctx)
			st.values[id] = req.GetString("value", "")
			st.calls[id]++
			return mcp.NewToolResultText("ok"), nil
		})
	srv.mcp.AddTool(mcp.NewTool("recall", mcp.WithDescription("Returns the value remembered on this connection")),
		func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			st.mu.Lock()
			defer st.mu.Unlock()
			id := mcpSession(ctx)
			st.calls[id]++
			return mcp.NewToolResultText(st.values[id]), nil
		})
	return st
}

// mcpSessions returns how many calls each MCP session the server saw got.
func (st *sessionStore) mcpSessions() map[string]int {
	st.mu.Lock()
	defer st.mu.Unlock()
	out := map[string]int{}
	for k, v := range st.calls {
		out[k] = v
	}
	return out
}

func perSessionConnector(id, url string) *connectorv1.Connector {
	c := mcpConnector(id, url)
	c.SessionMode = connectorv1.SessionMode_SESSION_MODE_PER_SESSION
	return c
}

// sessionCall runs a tool in a session and returns its text.
func (f *fixture) sessionCall(t *testing.T, ws, id, session, tool string, args map[string]any) string {
	t.Helper()
	resp, err := f.sessionCallErr(t, ws, id, session, tool, args)
	if err != nil {
		t.Fatalf("CallTool(%s/%s, session %q, %s): %v", ws, id, session, tool, err)
	}
	if resp.GetIsError() || len(resp.GetContent()) != 1 {
		t.Fatalf("CallTool(%s/%s, session %q, %s) = %v", ws, id, session, tool, resp)
	}
	return resp.GetContent()[0].GetText().GetText()
}

func (f *fixture) sessionCallErr(t *testing.T, ws, id, session, tool string, args map[string]any) (*connectorv1.CallToolResponse, error) {
	t.Helper()
	req := &connectorv1.CallToolRequest{WorkspaceId: ws, ConnectorId: id, ToolName: tool, SessionId: session}
	if args != nil {
		req.Arguments = toStructT(t, args)
	}
	return f.client.CallTool(ctx(t), req)
}

func (f *fixture) listSessions(t *testing.T, ws, id string) []*connectorv1.Session {
	t.Helper()
	resp, err := f.client.ListSessions(ctx(t), &connectorv1.ListSessionsRequest{WorkspaceId: ws, ConnectorId: id})
	if err != nil {
		t.Fatalf("ListSessions(%s/%s): %v", ws, id, err)
	}
	return resp.GetSessions()
}

func (f *fixture) closeSession(t *testing.T, ws, id, session string) *connectorv1.CloseSessionResponse {
	t.Helper()
	resp, err := f.client.CloseSession(ctx(t), &connectorv1.CloseSessionRequest{WorkspaceId: ws, ConnectorId: id, SessionId: session})
	if err != nil {
		t.Fatalf("CloseSession(%s/%s, %q): %v", ws, id, session, err)
	}
	if int(resp.GetClosed()) != len(resp.GetSessions()) {
		t.Errorf("closed = %d, but %d sessions listed", resp.GetClosed(), len(resp.GetSessions()))
	}
	return resp
}

// sessionSummary is what a test checks of a listed session.
type sessionSummary struct {
	Session, Connector string
	Calls, Errors      int64
	State              connectorv1.ConnectorState
	PID                int32
}

func summarize(ss []*connectorv1.Session) []sessionSummary {
	var out []sessionSummary
	for _, s := range ss {
		out = append(out, sessionSummary{s.GetSessionId(), s.GetConnectorId(), s.GetCallCount(), s.GetErrorCount(), s.GetState(), s.GetPid()})
	}
	return out
}

func TestPerSessionConnections(t *testing.T) {
	f := setup(t)
	srv, st := newSessionMCP(t)
	f.create(t, "ws", perSessionConnector("p", srv.url()))
	f.waitReady(t, "ws", "p")

	_, err := f.sessionCallErr(t, "ws", "p", "", "recall", nil)
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "session_id")

	// Each session has its own connection: its state is its own, and all
	// of its calls reuse one MCP session (one handshake).
	before := srv.handshakes.Load()
	f.sessionCall(t, "ws", "p", "a", "remember", map[string]any{"value": "apple"})
	perConnect := srv.handshakes.Load() - before
	if perConnect < 1 {
		t.Fatalf("opening session a made %d handshakes", perConnect)
	}
	f.sessionCall(t, "ws", "p", "b", "remember", map[string]any{"value": "banana"})
	for range 3 {
		if got := f.sessionCall(t, "ws", "p", "a", "recall", nil); got != "apple" {
			t.Errorf("session a recalls %q, want apple", got)
		}
		if got := f.sessionCall(t, "ws", "p", "b", "recall", nil); got != "banana" {
			t.Errorf("session b recalls %q, want banana", got)
		}
	}
	if n := srv.handshakes.Load() - before; n != 2*perConnect {
		t.Errorf("8 calls in 2 sessions made %d handshakes, want %d (one connect per session)", n, 2*perConnect)
	}
	if got := st.mcpSessions(); len(got) != 2 || got[""] != 0 {
		t.Errorf("calls by MCP session on the server = %v; want 2 sessions of 4 calls", got)
	}

	want := []sessionSummary{
		{"a", "p", 4, 0, connectorv1.ConnectorState_CONNECTOR_STATE_READY, 0},
		{"b", "p", 4, 0, connectorv1.ConnectorState_CONNECTOR_STATE_READY, 0},
	}
	listed := f.listSessions(t, "ws", "p")
	if diff := cmp.Diff(want, summarize(listed)); diff != "" {
		t.Errorf("ListSessions (-want +got):\n%s", diff)
	}
	for _, s := range listed {
		if s.GetOpenTime() == nil || s.GetLastUsedTime().AsTime().Before(s.GetOpenTime().AsTime()) {
			t.Errorf("session %s: open %v, last used %v", s.GetSessionId(), s.GetOpenTime(), s.GetLastUsedTime())
		}
	}
	got, err := f.client.GetConnector(ctx(t), &connectorv1.GetConnectorRequest{WorkspaceId: "ws", ConnectorId: "p"})
	if err != nil || got.GetConnector().GetOpenSessions() != 2 {
		t.Errorf("GetConnector open_sessions = %d, %v; want 2", got.GetConnector().GetOpenSessions(), err)
	}
	list, err := f.client.ListConnectors(ctx(t), &connectorv1.ListConnectorsRequest{WorkspaceId: "ws"})
	if err != nil || len(list.GetConnectors()) != 1 || list.GetConnectors()[0].GetOpenSessions() != 2 {
		t.Errorf("ListConnectors = %v, %v; want open_sessions 2", list.GetConnectors(), err)
	}

	closed := f.closeSession(t, "ws", "p", "a")
	if diff := cmp.Diff(want[:1], summarize(closed.GetSessions())); diff != "" {
		t.Errorf("CloseSession(a) returned (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want[1:], summarize(f.listSessions(t, "ws", "p"))); diff != "" {
		t.Errorf("ListSessions after closing a (-want +got):\n%s", diff)
	}
	// A closed session starts afresh: a new connection, without the old state.
	if got := f.sessionCall(t, "ws", "p", "a", "recall", nil); got != "" {
		t.Errorf("session a recalls %q after CloseSession, want nothing", got)
	}
	if n := f.closeSession(t, "ws", "", "a").GetClosed(); n != 1 {
		t.Errorf("CloseSession without connector_id closed %d, want 1", n)
	}
	if n := f.closeSession(t, "ws", "p", "a").GetClosed(); n != 0 {
		t.Errorf("closing a closed session closed %d, want 0", n)
	}
}

// A session id belongs to its workspace: another workspace's connector of
// the same id and session of the same id are other connections.
func TestSessionsAreScopedToTheirWorkspace(t *testing.T) {
	f := setup(t)
	srv, _ := newSessionMCP(t)
	for _, ws := range []string{"ws", "other"} {
		f.create(t, ws, perSessionConnector("p", srv.url()))
		f.waitReady(t, ws, "p")
		f.sessionCall(t, ws, "p", "a", "remember", map[string]any{"value": ws})
	}
	if got := f.sessionCall(t, "ws", "p", "a", "recall", nil); got != "ws" {
		t.Errorf("ws's session a recalls %q", got)
	}

	if n := f.closeSession(t, "third", "", "a").GetClosed(); n != 0 {
		t.Errorf("CloseSession from a workspace without connectors closed %d", n)
	}
	resp := f.closeSession(t, "other", "", "a")
	if resp.GetClosed() != 1 || resp.GetSessions()[0].GetConnectorId() != "p" {
		t.Errorf("CloseSession(other, a) = %v; want other's session only", resp)
	}
	if n := len(f.listSessions(t, "ws", "p")); n != 1 {
		t.Errorf("ws's connector has %d sessions after another workspace closed its a; want 1", n)
	}
	if got := f.sessionCall(t, "ws", "p", "a", "recall", nil); got != "ws" {
		t.Errorf("ws's session a recalls %q after another workspace closed its own", got)
	}
}

func TestSessionRequests(t *testing.T) {
	f := setup(t)
	srv, _ := newSessionMCP(t)
	f.create(t, "ws", perSessionConnector("p", srv.url()))
	f.create(t, "ws", mcpConnector("shared", srv.url()))
	f.waitReady(t, "ws", "p")
	f.waitReady(t, "ws", "shared")

	for _, tt := range []struct {
		name  string
		req   *connectorv1.CloseSessionRequest
		field string
	}{
		{"no workspace", &connectorv1.CloseSessionRequest{SessionId: "a"}, "workspace_id"},
		{"no session", &connectorv1.CloseSessionRequest{WorkspaceId: "ws", ConnectorId: "p"}, "session_id"},
		{"session too long", &connectorv1.CloseSessionRequest{WorkspaceId: "ws", SessionId: strings.Repeat("s", 257)}, "session_id"},
		{"bad connector id", &connectorv1.CloseSessionRequest{WorkspaceId: "ws", ConnectorId: "no spaces", SessionId: "a"}, "connector_id"},
	} {
		_, err := f.client.CloseSession(ctx(t), tt.req)
		t.Run(tt.name, func(t *testing.T) { wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, tt.field) })
	}
	_, err := f.client.CloseSession(ctx(t), &connectorv1.CloseSessionRequest{WorkspaceId: "ws", ConnectorId: "missing", SessionId: "a"})
	wantStatus(t, err, codes.NotFound, server.ReasonConnectorNotFound, "")
	_, err = f.client.ListSessions(ctx(t), &connectorv1.ListSessionsRequest{WorkspaceId: "ws", ConnectorId: "missing"})
	wantStatus(t, err, codes.NotFound, server.ReasonConnectorNotFound, "")
	_, err = f.client.ListSessions(ctx(t), &connectorv1.ListSessionsRequest{WorkspaceId: "ws"})
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "connector_id")
	_, err = f.sessionCallErr(t, "ws", "p", strings.Repeat("s", 257), "recall", nil)
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "session_id")

	// Paged by session id.
	for _, s := range []string{"c", "a", "b"} {
		f.sessionCall(t, "ws", "p", s, "recall", nil)
	}
	var ids []string
	token := ""
	for range 5 {
		resp, err := f.client.ListSessions(ctx(t), &connectorv1.ListSessionsRequest{WorkspaceId: "ws", ConnectorId: "p", PageSize: 2, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range resp.GetSessions() {
			ids = append(ids, s.GetSessionId())
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	if diff := cmp.Diff([]string{"a", "b", "c"}, ids); diff != "" {
		t.Errorf("paged session ids (-want +got):\n%s", diff)
	}

	// A shared connector ignores session_id: one connection for all.
	before := srv.handshakes.Load()
	f.sessionCall(t, "ws", "shared", "", "remember", map[string]any{"value": "common"})
	if got := f.sessionCall(t, "ws", "shared", "x", "recall", nil); got != "common" {
		t.Errorf("shared connector, session x recalls %q, want the shared connection's value", got)
	}
	if n := srv.handshakes.Load() - before; n != 0 {
		t.Errorf("calls to a shared connector made %d handshakes", n)
	}
	if n := len(f.listSessions(t, "ws", "shared")); n != 0 {
		t.Errorf("a shared connector lists %d sessions", n)
	}

	// An inactive connector has none: deactivating closed them.
	if _, err := f.client.DeactivateConnector(ctx(t), &connectorv1.DeactivateConnectorRequest{WorkspaceId: "ws", ConnectorId: "p"}); err != nil {
		t.Fatal(err)
	}
	if n := len(f.listSessions(t, "ws", "p")); n != 0 {
		t.Errorf("an inactive connector lists %d sessions", n)
	}
	if n := f.closeSession(t, "ws", "p", "a").GetClosed(); n != 0 {
		t.Errorf("CloseSession on an inactive connector closed %d", n)
	}
}

func TestSessionLimit(t *testing.T) {
	f := setup(t, options{maxSessions: 2})
	srv, _ := newSessionMCP(t)
	f.create(t, "ws", perSessionConnector("p", srv.url()))
	f.waitReady(t, "ws", "p")
	f.sessionCall(t, "ws", "p", "a", "recall", nil)
	f.sessionCall(t, "ws", "p", "b", "recall", nil)

	_, err := f.sessionCallErr(t, "ws", "p", "c", "recall", nil)
	wantStatus(t, err, codes.ResourceExhausted, server.ReasonSessionLimit, "")
	if msg := err.Error(); !strings.Contains(msg, "2") || !strings.Contains(msg, "MAX_SESSIONS_PER_CONNECTOR") {
		t.Errorf("message %q does not name the limit and its setting", msg)
	}
	// Open sessions go on; a closed one makes room.
	f.sessionCall(t, "ws", "p", "a", "recall", nil)
	f.closeSession(t, "ws", "p", "a")
	f.sessionCall(t, "ws", "p", "c", "recall", nil)
}

// A new session_mode replaces the connection: the old sessions close, and
// calls follow the new mode.
func TestUpdateSessionMode(t *testing.T) {
	f := setup(t)
	srv, _ := newSessionMCP(t)
	f.create(t, "ws", perSessionConnector("p", srv.url()))
	f.waitReady(t, "ws", "p")
	f.sessionCall(t, "ws", "p", "a", "remember", map[string]any{"value": "apple"})

	setMode := func(mode connectorv1.SessionMode) {
		t.Helper()
		_, err := f.client.UpdateConnector(ctx(t), &connectorv1.UpdateConnectorRequest{WorkspaceId: "ws",
			Connector: &connectorv1.Connector{ConnectorId: "p", SessionMode: mode}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"session_mode"}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	setMode(connectorv1.SessionMode_SESSION_MODE_SHARED)
	if got := f.sessionCall(t, "ws", "p", "", "recall", nil); got != "" {
		t.Errorf("the shared connection recalls %q, a session's value", got)
	}
	if n := len(f.listSessions(t, "ws", "p")); n != 0 {
		t.Errorf("%d sessions open after switching to shared", n)
	}

	setMode(connectorv1.SessionMode_SESSION_MODE_PER_SESSION)
	_, err := f.sessionCallErr(t, "ws", "p", "", "recall", nil)
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "session_id")
}

func TestQueryInASession(t *testing.T) {
	recall := llmtest.CallTools(llmtest.Call{Tool: "recall", Args: `{}`})
	model := llmtest.New(t, recall, llmtest.Answer("apple"), recall, llmtest.Answer("apple"),
		llmtest.Answer(`{"plan":[{"tool":"recall","purpose":"see what the user has"}]}`))
	f := setup(t, options{llmURL: model.URL()})
	srv, _ := newSessionMCP(t)
	f.create(t, "ws", perSessionConnector("p", srv.url()))
	f.waitReady(t, "ws", "p")
	f.sessionCall(t, "ws", "p", "a", "remember", map[string]any{"value": "apple"})
	f.sessionCall(t, "ws", "p", "b", "remember", map[string]any{"value": "banana"})

	// Refused before the model runs.
	_, err := f.client.QueryConnector(ctx(t), &connectorv1.QueryConnectorRequest{WorkspaceId: "ws", ConnectorId: "p", Query: "what do I have?"})
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "session_id")
	stream, err := f.client.StreamQueryConnector(ctx(t), &connectorv1.StreamQueryConnectorRequest{WorkspaceId: "ws", ConnectorId: "p", Query: "q"})
	if err == nil {
		_, err = stream.Recv()
	}
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "session_id")
	if n := len(model.Requests()); n != 0 {
		t.Errorf("the model was asked %d times for queries without a session", n)
	}

	// The agent's tool calls run on the session's connection.
	res, err := f.query(t, &connectorv1.QueryConnectorRequest{WorkspaceId: "ws", ConnectorId: "p", Query: "what do I have?", SessionId: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if got := res.GetSteps()[0].GetCalls()[0]; got.GetResultExcerpt() != "apple" || got.GetIsError() {
		t.Errorf("the query's recall = %v; want session a's apple", got)
	}
	stream, err = f.client.StreamQueryConnector(ctx(t), &connectorv1.StreamQueryConnectorRequest{WorkspaceId: "ws", ConnectorId: "p", Query: "q", SessionId: "b"})
	if err != nil {
		t.Fatal(err)
	}
	msgs := recvAll(t, stream)
	if got := msgs[len(msgs)-1].GetResult().GetSteps()[0].GetCalls()[0]; got.GetResultExcerpt() != "banana" {
		t.Errorf("the streamed query's recall = %v; want session b's banana", got)
	}
	want := []sessionSummary{
		{"a", "p", 2, 0, connectorv1.ConnectorState_CONNECTOR_STATE_READY, 0},
		{"b", "p", 2, 0, connectorv1.ConnectorState_CONNECTOR_STATE_READY, 0},
	}
	if diff := cmp.Diff(want, summarize(f.listSessions(t, "ws", "p"))); diff != "" {
		t.Errorf("sessions after the queries (-want +got):\n%s", diff)
	}

	// A plan runs no tool: it needs no session.
	res, err = f.query(t, &connectorv1.QueryConnectorRequest{WorkspaceId: "ws", ConnectorId: "p", Query: "plan it", PlanOnly: true})
	if err != nil || len(res.GetPlan()) != 1 {
		t.Errorf("plan_only without a session = %v, %v", res, err)
	}
}

func toStructT(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	st, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return st
}
