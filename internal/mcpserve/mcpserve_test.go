package mcpserve_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	mcpclient "github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/live/livetest"
	"github.com/connector-svc/connector-svc/internal/llm"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/mcpserve"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/server"
	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

func TestMain(m *testing.M) { storetest.Main(m) }

// upstream is a real mcp-go server: echo (read-only), wipe (destructive:
// needs approval under the default policy, and records what it was
// called with) and kinds (one content of every type, and structured
// content).
type upstream struct {
	url string

	mu    sync.Mutex
	wiped []map[string]any
	// opened and closed count the MCP sessions the server saw start and
	// end.
	opened, closed int
}

// pngPixel is a 1x1 PNG, as bytes a client must get back exactly.
var pngPixel = []byte{0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 0x0d, 'I', 'H', 'D', 'R', 0, 0, 0, 1, 0, 0, 0, 1, 8, 6}

func newUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{}
	hooks := &mcpserver.Hooks{}
	hooks.AddOnRegisterSession(func(context.Context, mcpserver.ClientSession) { u.mu.Lock(); u.opened++; u.mu.Unlock() })
	hooks.AddOnUnregisterSession(func(context.Context, mcpserver.ClientSession) { u.mu.Lock(); u.closed++; u.mu.Unlock() })
	m := mcpserver.NewMCPServer("up", "1.0", mcpserver.WithToolCapabilities(true), mcpserver.WithElicitation(), mcpserver.WithHooks(hooks))
	m.AddTool(mcp.NewTool("who", mcp.WithReadOnlyHintAnnotation(true)), func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		res, err := mcpserver.ServerFromContext(ctx).RequestElicitation(ctx, mcp.ElicitationRequest{Params: mcp.ElicitationParams{
			Message: "Who are you?", RequestedSchema: map[string]any{"type": "object",
				"properties": map[string]any{"name": map[string]any{"type": "string"}}}}})
		if err != nil {
			return nil, err
		}
		b, _ := json.Marshal(res.Content)
		return mcp.NewToolResultText(string(res.Action) + " " + string(b)), nil
	})
	m.AddTool(mcp.NewTool("echo", mcp.WithString("message"), mcp.WithReadOnlyHintAnnotation(true)),
		func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText(req.GetString("message", "")), nil
		})
	m.AddTool(mcp.NewTool("wipe", mcp.WithString("what"), mcp.WithDestructiveHintAnnotation(true), mcp.WithReadOnlyHintAnnotation(false)),
		func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			u.mu.Lock()
			u.wiped = append(u.wiped, req.GetArguments())
			u.mu.Unlock()
			return mcp.NewToolResultText("wiped " + req.GetString("what", "")), nil
		})
	m.AddTool(mcp.NewTool("kinds", mcp.WithReadOnlyHintAnnotation(true)),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			b64 := base64.StdEncoding.EncodeToString(pngPixel)
			return &mcp.CallToolResult{Content: []mcp.Content{
				mcp.NewTextContent("text"),
				mcp.NewImageContent(b64, "image/png"),
				mcp.NewAudioContent(b64, "audio/wav"),
				mcp.NewResourceLink("file:///a.txt", "a", "a file", "text/plain"),
				mcp.NewEmbeddedResource(mcp.TextResourceContents{URI: "file:///b.txt", MIMEType: "text/plain", Text: "bee"}),
				mcp.NewEmbeddedResource(mcp.BlobResourceContents{URI: "file:///c.bin", MIMEType: "application/octet-stream", Blob: b64}),
			}, StructuredContent: map[string]any{"n": 42.0, "ok": true}}, nil
		})
	hs := httptest.NewServer(mcpserver.NewStreamableHTTPServer(m))
	t.Cleanup(hs.Close)
	u.url = hs.URL + "/mcp"
	return u
}

// env is one replica's service with its MCP endpoint.
type env struct {
	url string // the MCP listener's base URL
	// newHandler makes another MCP endpoint over the same use cases, as a
	// second replica's would be.
	newHandler func(relay mcpserve.Relay) *mcpserve.Handler
	lv         *live.Connectors
	reg        *registry.Registry
	db         *store.DB
	keys       *auth.Keys
	up         *upstream
}

// newEnv runs the live state and the gRPC server's use cases over a test
// database with connectors "alpha" and "my.beta" of workspace "ws" on
// one upstream, and the MCP endpoint over them. With keys, AUTH=keys.
func newEnv(t *testing.T, withKeys bool, tune func(*mcpserve.Config), model ...llmtest.Step) *env {
	t.Helper()
	db := storetest.NewDB(t)
	reg, lv := livetest.Run(t, db)
	ctx := context.Background()
	up := newUpstream(t)
	for _, id := range []string{"alpha", "my.beta"} {
		row, err := db.CreateConnector(ctx, &store.Connector{WorkspaceID: "ws", ExternalID: id, Name: id, Active: true,
			Transport: store.TransportStreamableHTTP, Config: store.Config{URL: up.url, CallTimeout: store.Duration(20 * time.Second),
				ApprovalPolicy: "destructive", Elicitation: true}})
		if err != nil {
			t.Fatal(err)
		}
		lv.Apply(ctx, row)
	}
	mode := auth.ModeNone
	var keys *auth.Keys
	if withKeys {
		mode = auth.ModeKeys
		keys = auth.NewKeys(db, auth.Config{}, nil)
		if err := keys.Load(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var agent *orchestrator.Agent
	if len(model) > 0 {
		m, err := llm.New(llm.Config{BaseURL: llmtest.New(t, model...).URL(), APIKey: "k", Model: "fake-model", MaxRetries: 1,
			BackoffBase: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		agent = orchestrator.New(m, server.ToolCaller{Registry: reg}, orchestrator.Config{}, nil)
	}
	srv := server.New(server.Deps{DB: db, Registry: reg, Live: lv, Keys: keys, Agent: agent}, server.Config{Auth: mode})
	uc := srv.UseCases()
	cfg := mcpserve.Config{Auth: mode, SessionKey: []byte("test session key"), ListInterval: 100 * time.Millisecond, Agents: agent != nil,
		SessionIdleTTL: time.Second}
	if tune != nil {
		tune(&cfg)
	}
	h := mcpserve.New(mcpserve.Deps{Calls: uc.Calls, Resources: uc.Resources, Watches: uc.Watches, Queries: uc.Queries, Placer: uc.Placer, Sessions: uc.Sessions,
		Authorizations: uc.Authorizations, Live: lv, Registry: reg, Tools: db, Keys: keys}, cfg)
	rctx, cancel := context.WithCancel(ctx)
	go func() { _ = h.Run(rctx) }()
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Run(rctx, time.Second) }()
	t.Cleanup(func() { cancel(); <-srvDone })
	mux := http.NewServeMux()
	mux.Handle("/mcp/", h)
	hs := httptest.NewServer(mux)
	t.Cleanup(func() { cancel(); hs.Close() })
	testsupport.WaitFor(t, "both connectors READY", func() bool {
		for _, id := range []string{"alpha", "my.beta"} {
			rid, ok := reg.Lookup("ws", id)
			if !ok {
				return false
			}
			if h, err := reg.Health(rid); err != nil || h.State != registry.StateReady {
				return false
			}
		}
		return true
	})
	newHandler := func(relay mcpserve.Relay) *mcpserve.Handler {
		return mcpserve.New(mcpserve.Deps{Calls: uc.Calls, Resources: uc.Resources, Watches: uc.Watches, Queries: uc.Queries, Placer: uc.Placer, Sessions: uc.Sessions,
			Authorizations: uc.Authorizations, Live: lv, Registry: reg, Tools: db, Keys: keys, Relay: relay}, cfg)
	}
	return &env{url: hs.URL, newHandler: newHandler, lv: lv, reg: reg, db: db, keys: keys, up: up}
}

// add creates an active connector of workspace ws and waits until it is
// READY.
func (e *env) add(t *testing.T, id string, cfg store.Config) {
	t.Helper()
	ctx := context.Background()
	row, err := e.db.CreateConnector(ctx, &store.Connector{WorkspaceID: "ws", ExternalID: id, Name: id, Active: true,
		Transport: store.TransportStreamableHTTP, Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	e.lv.Apply(ctx, row)
	testsupport.WaitFor(t, id+" READY", func() bool {
		rid, ok := e.reg.Lookup("ws", id)
		h, err := e.reg.Health(rid)
		return ok && err == nil && h.State == registry.StateReady
	})
}

// generations are the two protocol generations a client may speak.
var generations = []struct {
	name string
	opts []mcpclient.ClientOption
}{
	{"2025-11-25", []mcpclient.ClientOption{mcpclient.WithLegacyProtocolOnly()}},
	{"2026-07-28", nil},
}

func connect(t *testing.T, url string, headers map[string]string, opts ...mcpclient.ClientOption) *mcpclient.Client {
	t.Helper()
	return connectWith(t, url, []transport.StreamableHTTPCOption{transport.WithHTTPHeaders(headers)}, opts...)
}

func connectWith(t *testing.T, url string, topts []transport.StreamableHTTPCOption, opts ...mcpclient.ClientOption) *mcpclient.Client {
	t.Helper()
	tr, err := transport.NewStreamableHTTP(url, topts...)
	if err != nil {
		t.Fatal(err)
	}
	c := mcpclient.NewClient(tr, opts...)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.Start(context.Background()); err != nil { // the GET stream lives as long as the client
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := c.Initialize(ctx, mcp.InitializeRequest{Params: mcp.InitializeParams{ProtocolVersion: mcp.LATEST_PROTOCOL_VERSION,
		ClientInfo: mcp.Implementation{Name: "test", Version: "1"}}}); err != nil {
		t.Fatalf("initialize %s: %v", url, err)
	}
	return c
}

func toolNames(t *testing.T, c *mcpclient.Client) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := c.ListTools(ctx, mcp.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
	}
	slices.Sort(names)
	return names
}

func call(t *testing.T, c *mcpclient.Client, name string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := c.CallTool(ctx, mcp.CallToolRequest{Params: mcp.CallToolParams{Name: name, Arguments: args}})
	if err != nil {
		t.Fatalf("call %s: %v", name, err)
	}
	return res
}

func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// TestListAndCall lists and calls tools on both endpoints, in both
// protocol generations, with mcp-go's client.
func TestListAndCall(t *testing.T) {
	e := newEnv(t, false, nil)
	for _, g := range generations {
		t.Run(g.name, func(t *testing.T) {
			one := connect(t, e.url+"/mcp/ws/alpha", nil, g.opts...)
			if got, want := toolNames(t, one), []string{"echo", "kinds", "who", "wipe"}; !slices.Equal(got, want) {
				t.Errorf("/mcp/ws/alpha tools = %v, want %v", got, want)
			}
			if got := text(call(t, one, "echo", map[string]any{"message": "hi"})); got != "hi" {
				t.Errorf("echo = %q, want hi", got)
			}
			ws := connect(t, e.url+"/mcp/ws", nil, g.opts...)
			got := toolNames(t, ws)
			beta := "my-beta-"
			var betaEcho string
			for _, n := range got {
				if strings.HasPrefix(n, beta) && strings.HasSuffix(n, "__echo") {
					betaEcho = n
				}
			}
			if !slices.Contains(got, "alpha__echo") || !slices.Contains(got, "alpha__wipe") || betaEcho == "" || len(got) != 8 {
				t.Fatalf("/mcp/ws tools = %v, want alpha__echo, alpha__kinds, alpha__who, alpha__wipe and my.beta's four, hashed", got)
			}
			if got := text(call(t, ws, betaEcho, map[string]any{"message": "beta"})); got != "beta" {
				t.Errorf("%s = %q, want beta", betaEcho, got)
			}
		})
	}
}

// TestEveryContentTypePassesThrough checks that a result's content of
// every type, and its structured content, reach the client as the server
// sent them.
func TestEveryContentTypePassesThrough(t *testing.T) {
	e := newEnv(t, false, nil)
	c := connect(t, e.url+"/mcp/ws/alpha", nil)
	res := call(t, c, "kinds", nil)
	if len(res.Content) != 6 {
		t.Fatalf("kinds: %d contents, want 6: %+v", len(res.Content), res.Content)
	}
	b64 := base64.StdEncoding.EncodeToString(pngPixel)
	img, ok1 := res.Content[1].(mcp.ImageContent)
	audio, ok2 := res.Content[2].(mcp.AudioContent)
	link, ok3 := res.Content[3].(mcp.ResourceLink)
	emb, ok4 := res.Content[4].(mcp.EmbeddedResource)
	blob, ok5 := res.Content[5].(mcp.EmbeddedResource)
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || img.Data != b64 || img.MIMEType != "image/png" || audio.Data != b64 ||
		link.URI != "file:///a.txt" || link.Name != "a" {
		t.Fatalf("kinds content = %+v", res.Content)
	}
	if tr, ok := emb.Resource.(mcp.TextResourceContents); !ok || tr.Text != "bee" {
		t.Errorf("embedded text resource = %+v", emb.Resource)
	}
	if br, ok := blob.Resource.(mcp.BlobResourceContents); !ok || br.Blob != b64 {
		t.Errorf("embedded blob resource = %+v", blob.Resource)
	}
	sc, _ := json.Marshal(res.StructuredContent)
	if string(sc) != `{"n":42,"ok":true}` {
		t.Errorf("structured content = %s", sc)
	}
}

// TestNamesAreStableAndUnambiguous checks the workspace endpoint's names:
// the same for the same pair, within 64 characters of [a-zA-Z0-9_-], and
// never one connector's tool under another's name.
func TestNamesAreStableAndUnambiguous(t *testing.T) {
	pairs := [][2]string{{"a", "b__c"}, {"a__b", "c"}, {"a_", "_b"}, {"a", "__b"}, {"a.b", "c"}, {"a-b", "c"},
		{"gh", "create_issue"}, {"gh", strings.Repeat("x", 80)}, {"gh", strings.Repeat("x", 81)}, {"gh", "dots.and/slashes"},
		{strings.Repeat("c", 60), "t"}}
	seen := map[string][2]string{}
	for _, p := range pairs {
		name := mcpserve.PrefixedName(p[0], p[1])
		if name != mcpserve.PrefixedName(p[0], p[1]) {
			t.Errorf("%v: not stable", p)
		}
		if len(name) > 64 || strings.IndexFunc(name, func(r rune) bool {
			return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '_' || r == '-')
		}) >= 0 {
			t.Errorf("%v: name %q is not 1-64 characters of [a-zA-Z0-9_-]", p, name)
		}
		if other, dup := seen[name]; dup {
			t.Errorf("%v and %v share the name %q", p, other, name)
		}
		seen[name] = p
	}
	if got := mcpserve.PrefixedName("gh", "create_issue"); got != "gh__create_issue" {
		t.Errorf("gh's create_issue = %q, want gh__create_issue", got)
	}
}

// TestWhoMayCall checks keys, workspaces, scopes, the user header and
// Origin.
func TestWhoMayCall(t *testing.T) {
	e := newEnv(t, true, nil)
	ctx := context.Background()
	_, callKey, err := e.keys.Create(ctx, "ws", []auth.Scope{auth.ScopeCall}, "call")
	if err != nil {
		t.Fatal(err)
	}
	_, adminKey, _ := e.keys.Create(ctx, "ws", []auth.Scope{auth.ScopeAdmin}, "admin")
	_, otherKey, _ := e.keys.Create(ctx, "other", []auth.Scope{auth.ScopeCall}, "other")
	revoked, revokedKey, _ := e.keys.Create(ctx, "ws", []auth.Scope{auth.ScopeCall}, "revoked")
	if _, err := e.keys.Revoke(ctx, "ws", revoked.ID); err != nil {
		t.Fatal(err)
	}
	initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	post := func(path string, headers map[string]string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, e.url+path, strings.NewReader(initialize))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	for _, c := range []struct {
		name      string
		path      string
		headers   map[string]string
		status    int
		challenge bool
	}{
		{"no key", "/mcp/ws", nil, 401, true},
		{"unknown key", "/mcp/ws", map[string]string{"Authorization": "Bearer csk_nope_nope"}, 401, true},
		{"revoked key", "/mcp/ws", map[string]string{"Authorization": "Bearer " + revokedKey}, 401, true},
		{"another workspace's key", "/mcp/ws", map[string]string{"Authorization": "Bearer " + otherKey}, 403, false},
		{"a user header without scope users", "/mcp/ws", map[string]string{"Authorization": "Bearer " + callKey,
			mcpserve.UserHeader: "u1"}, 403, false},
		{"a foreign Origin", "/mcp/ws", map[string]string{"Authorization": "Bearer " + callKey, "Origin": "https://evil.example"}, 403, false},
		{"call key", "/mcp/ws", map[string]string{"Authorization": "Bearer " + callKey}, 200, false},
		{"admin key", "/mcp/ws/alpha", map[string]string{"Authorization": "Bearer " + adminKey}, 200, false},
		{"unknown connector", "/mcp/ws/nope", map[string]string{"Authorization": "Bearer " + callKey}, 404, false},
	} {
		resp := post(c.path, c.headers)
		if resp.StatusCode != c.status {
			t.Errorf("%s: status %d, want %d", c.name, resp.StatusCode, c.status)
		}
		if got := resp.Header.Get("WWW-Authenticate"); c.challenge && !strings.HasPrefix(got, "Bearer ") {
			t.Errorf("%s: WWW-Authenticate %q, want a Bearer challenge", c.name, got)
		}
	}
	// A call key sees the tools, and no agent tool.
	c := connect(t, e.url+"/mcp/ws", map[string]string{"Authorization": "Bearer " + callKey})
	for _, n := range toolNames(t, c) {
		if strings.HasPrefix(n, "ask_") {
			t.Errorf("a call key is offered agent tool %s", n)
		}
	}
}

// elicitor answers approval forms as a person would.
type elicitor struct {
	mu     sync.Mutex
	asked  []mcp.ElicitationRequest
	answer func(mcp.ElicitationRequest) *mcp.ElicitationResult
}

func (e *elicitor) Elicit(_ context.Context, req mcp.ElicitationRequest) (*mcp.ElicitationResult, error) {
	e.mu.Lock()
	e.asked = append(e.asked, req)
	e.mu.Unlock()
	return e.answer(req), nil
}

// TestApprovalByForm checks that a tool that needs approval asks the MCP
// client with a form of its arguments: approved with edited arguments,
// the server gets the edited ones; denied, it runs nothing. A client that
// cannot answer a form is told how to get the call approved.
func TestApprovalByForm(t *testing.T) {
	e := newEnv(t, false, nil)
	for _, g := range generations {
		t.Run(g.name, func(t *testing.T) {
			e.up.mu.Lock()
			e.up.wiped = nil
			e.up.mu.Unlock()
			approve := &elicitor{answer: func(req mcp.ElicitationRequest) *mcp.ElicitationResult {
				return &mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{Action: mcp.ElicitationResponseActionAccept,
					Content: map[string]any{"approve": true, "arguments": `{"what":"the edited thing"}`}}}
			}}
			opts := append(slices.Clone(g.opts), mcpclient.WithElicitationHandler(approve))
			c := connect(t, e.url+"/mcp/ws", nil, opts...)
			res := call(t, c, "alpha__wipe", map[string]any{"what": "everything"})
			if res.IsError || text(res) != "wiped the edited thing" {
				t.Fatalf("approved wipe = %+v (%q), want the edited arguments run", res, text(res))
			}
			if len(approve.asked) != 1 || !strings.Contains(approve.asked[0].Params.Message, "everything") {
				t.Errorf("asked %d forms (%+v), want one showing the model's arguments", len(approve.asked), approve.asked)
			}
			deny := &elicitor{answer: func(mcp.ElicitationRequest) *mcp.ElicitationResult {
				return &mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{Action: mcp.ElicitationResponseActionAccept,
					Content: map[string]any{"approve": false, "message": "not today"}}}
			}}
			c2 := connect(t, e.url+"/mcp/ws/alpha", nil, append(slices.Clone(g.opts), mcpclient.WithElicitationHandler(deny))...)
			res = call(t, c2, "wipe", map[string]any{"what": "everything"})
			if !res.IsError || !strings.Contains(text(res), "not today") {
				t.Errorf("denied wipe = %q, want an error with the person's reason", text(res))
			}
			c3 := connect(t, e.url+"/mcp/ws/alpha", nil, g.opts...)
			res = call(t, c3, "wipe", map[string]any{"what": "everything"})
			if !res.IsError || !strings.Contains(text(res), "needs a person's approval") {
				t.Errorf("wipe from a client without elicitation = %q, want how to get it approved", text(res))
			}
			e.up.mu.Lock()
			defer e.up.mu.Unlock()
			if len(e.up.wiped) != 1 || e.up.wiped[0]["what"] != "the edited thing" {
				t.Errorf("the server ran wipe with %v, want once with the edited arguments", e.up.wiped)
			}
		})
	}
}

// TestListChangedReachesClients checks that disabling a tool (UpdateTool,
// here its store write and the reconcile the handler runs) takes it off
// the list and tells listening clients.
func TestListChangedReachesClients(t *testing.T) {
	e := newEnv(t, false, nil)
	var mu sync.Mutex
	changed := 0
	c := connectWith(t, e.url+"/mcp/ws/alpha", []transport.StreamableHTTPCOption{transport.WithContinuousListening()},
		mcpclient.WithLegacyProtocolOnly())
	c.OnNotification(func(n mcp.JSONRPCNotification) {
		if n.Method == string(mcp.MethodNotificationToolsListChanged) {
			mu.Lock()
			changed++
			mu.Unlock()
		}
	})
	toolNames(t, c)
	ctx := context.Background()
	off := false
	tool, err := e.db.UpdateToolFlags(ctx, "ws", "alpha", "wipe", store.ToolFlags{Enabled: &off})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.lv.Reconcile(ctx, tool.ConnectorID); err != nil {
		t.Fatal(err)
	}
	testsupport.WaitFor(t, "a list_changed notification", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return changed > 0
	})
	if slices.Contains(toolNames(t, c), "wipe") {
		t.Error("wipe is still listed after list_changed")
	}
}

// TestAgentTool checks ask_<connector>: a query key is offered it, it runs
// the connector's agent (a scripted model calls echo, then answers) and
// returns the answer with the run id and the tools used; a run that
// pauses for approval names the run.
func TestAgentTool(t *testing.T) {
	e := newEnv(t, false, nil,
		llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"message":"from the agent"}`}), llmtest.Answer("the echo said: from the agent"),
		llmtest.CallTools(llmtest.Call{Tool: "wipe", Args: `{"what":"all"}`}))
	c := connect(t, e.url+"/mcp/ws", nil)
	names := toolNames(t, c)
	if !slices.Contains(names, "ask_alpha") {
		t.Fatalf("tools = %v, want ask_alpha", names)
	}
	res := call(t, c, "ask_alpha", map[string]any{"query": "echo something"})
	sc, _ := res.StructuredContent.(map[string]any)
	if res.IsError || text(res) != "the echo said: from the agent" || sc["status"] != "completed" || sc["run_id"] == "" {
		t.Fatalf("ask_alpha = %q %+v, want the agent's answer, completed, with a run id", text(res), sc)
	}
	if used, _ := sc["tools_used"].([]any); len(used) != 1 || used[0] != "echo" {
		t.Errorf("tools_used = %v, want [echo]", sc["tools_used"])
	}
	res = call(t, c, "ask_alpha", map[string]any{"query": "wipe it all"})
	sc, _ = res.StructuredContent.(map[string]any)
	runID, _ := sc["run_id"].(string)
	if !res.IsError || sc["status"] != "awaiting_approval" || runID == "" || !strings.Contains(text(res), runID) ||
		!strings.Contains(text(res), "ResumeQuery") {
		t.Errorf("a paused ask_alpha = %q %+v, want an error naming the run and ResumeQuery", text(res), sc)
	}
	res = call(t, c, "ask_alpha", map[string]any{})
	if !res.IsError || !strings.Contains(text(res), "query") {
		t.Errorf("ask_alpha without a query = %q, want an error naming query", text(res))
	}
}

// TestBadRequests checks the answers to malformed JSON, an unknown method,
// a batch, a body over the cap and a key over its rate limit.
func TestBadRequests(t *testing.T) {
	e := newEnv(t, false, nil)
	post := func(body string, headers map[string]string) (int, map[string]any) {
		req, _ := http.NewRequest(http.MethodPost, e.url+"/mcp/ws/alpha", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var msg map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&msg)
		return resp.StatusCode, msg
	}
	code := func(msg map[string]any) float64 {
		errObj, _ := msg["error"].(map[string]any)
		c, _ := errObj["code"].(float64)
		return c
	}
	if status, msg := post(`{"jsonrpc":"2.0","id":1,"method":`, nil); code(msg) != -32700 {
		t.Errorf("malformed JSON: %d %v, want a -32700 parse error", status, msg)
	}
	c := connect(t, e.url+"/mcp/ws/alpha", nil, mcpclient.WithLegacyProtocolOnly())
	sid := c.GetSessionId()
	h := map[string]string{"Mcp-Session-Id": sid, "Mcp-Protocol-Version": "2025-11-25"}
	if status, msg := post(`{"jsonrpc":"2.0","id":2,"method":"no/such/method"}`, h); code(msg) != -32601 {
		t.Errorf("unknown method: %d %v, want -32601", status, msg)
	}
	if status, msg := post(`[{"jsonrpc":"2.0","id":3,"method":"tools/list"}]`, h); status < 400 && code(msg) == 0 {
		t.Errorf("a batch on 2025-11-25 (batches were removed in 2025-06-18): %d %v, want it refused", status, msg)
	}
	big := `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"echo","arguments":{"message":"` +
		strings.Repeat("x", 5<<20) + `"}}}`
	if status, _ := post(big, h); status != http.StatusRequestEntityTooLarge {
		t.Errorf("a 5 MiB body: status %d, want 413", status)
	}
	if status, msg := post(`{"jsonrpc":"2.0","id":5,"method":"tools/list"}`, map[string]string{"Mcp-Session-Id": "forged.session",
		"Mcp-Protocol-Version": "2025-11-25"}); status != http.StatusNotFound {
		t.Errorf("a forged session id: %d %v, want 404 (start a new session)", status, msg)
	}
}

// TestRateLimitPerKey checks that a key over MCP_RATE_LIMIT gets 429
// with Retry-After, and another key is not held back by it.
func TestRateLimitPerKey(t *testing.T) {
	e := newEnv(t, true, func(c *mcpserve.Config) { c.RateLimit, c.Burst = 1, 2 })
	ctx := context.Background()
	_, k1, _ := e.keys.Create(ctx, "ws", []auth.Scope{auth.ScopeCall}, "k1")
	_, k2, _ := e.keys.Create(ctx, "ws", []auth.Scope{auth.ScopeCall}, "k2")
	req := func(key string) (int, string) {
		r, _ := http.NewRequest(http.MethodGet, e.url+"/mcp/ws", nil)
		r.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Retry-After")
	}
	limited := 0
	for range 5 {
		if s, after := req(k1); s == http.StatusTooManyRequests {
			limited++
			if after == "" {
				t.Error("429 without Retry-After")
			}
		}
	}
	if limited < 2 {
		t.Errorf("5 requests at once with a limit of 1 per second, burst 2: %d got 429, want at least 2", limited)
	}
	if s, _ := req(k2); s == http.StatusTooManyRequests {
		t.Error("another key was held back by the first one's limit")
	}
}

// TestServersQuestionsReachTheClient checks that a form the connector's
// server asks during a call reaches an MCP client that declared
// elicitation (2025-11-25), and its answer reaches the server. Servers ask
// on connections of one person only: a per_session connector's (each MCP
// session has its own).
func TestServersQuestionsReachTheClient(t *testing.T) {
	e := newEnv(t, false, nil)
	e.add(t, "solo", store.Config{URL: e.up.url, CallTimeout: store.Duration(20 * time.Second), Elicitation: true,
		SessionMode: registry.SessionPerSession})
	ans := &elicitor{answer: func(mcp.ElicitationRequest) *mcp.ElicitationResult {
		return &mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{Action: mcp.ElicitationResponseActionAccept,
			Content: map[string]any{"name": "Alice"}}}
	}}
	c := connect(t, e.url+"/mcp/ws/solo", nil, mcpclient.WithLegacyProtocolOnly(), mcpclient.WithElicitationHandler(ans))
	res := call(t, c, "who", nil)
	if got := text(res); got != `accept {"name":"Alice"}` {
		t.Errorf("who = %q, want the client's answer at the server", got)
	}
	if len(ans.asked) != 1 || ans.asked[0].Params.Message != "Who are you?" {
		t.Errorf("the client was asked %+v, want the server's question once", ans.asked)
	}
}

// TestPerSessionConnector checks that a per_session connector's calls in
// one MCP session share one upstream session, another MCP session gets
// its own, and DELETE of an MCP session ends its upstream one.
func TestPerSessionConnector(t *testing.T) {
	e := newEnv(t, false, nil)
	e.up.mu.Lock()
	base := e.up.opened // the shared connectors' sessions
	e.up.mu.Unlock()
	e.add(t, "solo", store.Config{URL: e.up.url, CallTimeout: store.Duration(20 * time.Second), SessionMode: registry.SessionPerSession})
	counts := func() (int, int) {
		e.up.mu.Lock()
		defer e.up.mu.Unlock()
		return e.up.opened - base, e.up.closed
	}
	open0, _ := counts() // the catalog's own connection, if any
	a := connect(t, e.url+"/mcp/ws/solo", nil, mcpclient.WithLegacyProtocolOnly())
	for range 3 {
		if got := text(call(t, a, "echo", map[string]any{"message": "a"})); got != "a" {
			t.Fatalf("echo = %q", got)
		}
	}
	if opened, _ := counts(); opened != open0+1 {
		t.Errorf("3 calls in one MCP session opened %d upstream sessions, want 1", opened-open0)
	}
	b := connect(t, e.url+"/mcp/ws/solo", nil, mcpclient.WithLegacyProtocolOnly())
	call(t, b, "echo", map[string]any{"message": "b"})
	if opened, _ := counts(); opened != open0+2 {
		t.Errorf("a second MCP session: %d upstream sessions in all, want 2", opened-open0)
	}
	_, closed0 := counts()
	if err := a.Close(); err != nil { // DELETE
		t.Fatal(err)
	}
	testsupport.WaitFor(t, "the first MCP session's upstream session closed", func() bool {
		_, closed := counts()
		return closed == closed0+1
	})
	call(t, b, "echo", map[string]any{"message": "still here"})
}
