package mcpserve_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	mcpclient "github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/cluster"
	"github.com/connector-svc/connector-svc/internal/forward"
	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/live/livetest"
	"github.com/connector-svc/connector-svc/internal/loudskip"
	"github.com/connector-svc/connector-svc/internal/mcpserve"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/server"
	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

// Interop: the endpoint with clients and servers that are not ours — the
// official Go SDK's client, and the reference TypeScript server
// (@modelcontextprotocol/server-everything) as a connector's upstream.

// everythingVersionForMCP is the reference server's version that
// scripts/install-mcp-everything.sh installs into .tools/npm.
const everythingVersionForMCP = "2026.8.31"

// everythingEntry returns the reference server's entry point, skipping the
// test loudly when it is not installed (failing under CI=true).
func everythingEntry(t *testing.T) string {
	t.Helper()
	path := os.Getenv("MCP_EVERYTHING_JS")
	if path == "" {
		path, _ = filepath.Abs("../../.tools/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js")
	}
	_, statErr := os.Stat(path)
	_, nodeErr := exec.LookPath("node")
	if statErr == nil && nodeErr == nil {
		return path
	}
	loudskip.Skip(t, fmt.Sprintf("the reference MCP server @modelcontextprotocol/server-everything@%s is not installed at %s "+
		"(or node is missing); run scripts/install-mcp-everything.sh", everythingVersionForMCP, path))
	return ""
}

// interopEnv is one replica's service, on workspace "ws", with the given
// connectors, and its MCP endpoint.
type interopEnv struct {
	url string
	reg *registry.Registry
}

// newInteropEnv is newEnv with the caller's connectors (all of workspace
// "ws"), no keys, and every connector READY before it returns.
func newInteropEnv(t *testing.T, rows ...*store.Connector) *interopEnv {
	t.Helper()
	return newInteropEnvWith(t, nil, rows...)
}

// newInteropEnvWith is newInteropEnv with the endpoint's config changed
// by with (if not nil).
func newInteropEnvWith(t *testing.T, with func(*mcpserve.Config), rows ...*store.Connector) *interopEnv {
	t.Helper()
	db := storetest.NewDB(t)
	reg, lv := livetest.Run(t, db)
	ctx := context.Background()
	for _, r := range rows {
		r.WorkspaceID, r.Active = "ws", true
		if r.Name == "" {
			r.Name = r.ExternalID
		}
		row, err := db.CreateConnector(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		lv.Apply(ctx, row)
	}
	srv := server.New(server.Deps{DB: db, Registry: reg, Live: lv}, server.Config{Auth: auth.ModeNone})
	uc := srv.UseCases()
	cfg := mcpserve.Config{Auth: auth.ModeNone, SessionKey: []byte("interop session key"), ListInterval: 100 * time.Millisecond}
	if with != nil {
		with(&cfg)
	}
	h := mcpserve.New(mcpserve.Deps{Calls: uc.Calls, Resources: uc.Resources, Watches: uc.Watches, Queries: uc.Queries,
		Placer: uc.Placer, Sessions: uc.Sessions, Authorizations: uc.Authorizations, Live: lv, Registry: reg, Tools: db}, cfg)
	rctx, cancel := context.WithCancel(ctx)
	go func() { _ = h.Run(rctx) }()
	mux := http.NewServeMux()
	mux.Handle("/mcp/", h)
	hs := httptest.NewServer(mux)
	t.Cleanup(func() { cancel(); hs.Close() })
	testsupport.WaitFor(t, "every connector READY", func() bool {
		for _, r := range rows {
			rid, ok := reg.Lookup("ws", r.ExternalID)
			if !ok {
				return false
			}
			if h, err := reg.Health(rid); err != nil || h.State != registry.StateReady {
				return false
			}
		}
		return true
	})
	return &interopEnv{url: hs.URL, reg: reg}
}

// goSDKVersions are the protocol versions the Go SDK's client opens with:
// the session generation, and its latest (sessionless, with server/discover).
var goSDKVersions = []string{"2025-11-25", "2026-07-28"}

func goSDKConnect(t *testing.T, url, version string, opts *gomcp.ClientOptions) *gomcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := gomcp.NewClient(&gomcp.Implementation{Name: "go-sdk-interop", Version: "1"}, opts)
	cs, err := c.Connect(ctx, &gomcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1},
		&gomcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		t.Fatalf("go-sdk connect %s (%s): %v", url, version, err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	if got := cs.InitializeResult().ProtocolVersion; got != version {
		t.Errorf("go-sdk negotiated %s with %s, want %s", got, url, version)
	}
	return cs
}

func goSDKTools(t *testing.T, cs *gomcp.ClientSession) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatalf("go-sdk tools/list: %v", err)
	}
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
	}
	slices.Sort(names)
	return names
}

func goSDKCall(t *testing.T, cs *gomcp.ClientSession, name string, args map[string]any) *gomcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &gomcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("go-sdk call %s: %v", name, err)
	}
	return res
}

func goSDKText(res *gomcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*gomcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// TestInteropGoSDKClient lists and calls tools on both endpoints with the
// official Go SDK's client, in both protocol generations, and answers the
// approval form with its ElicitationHandler: approved with edited
// arguments (the server runs those), and denied (the server runs nothing).
func TestInteropGoSDKClient(t *testing.T) {
	e := newEnv(t, false, nil)
	for _, v := range goSDKVersions {
		t.Run(v, func(t *testing.T) {
			one := goSDKConnect(t, e.url+"/mcp/ws/alpha", v, nil)
			if got, want := goSDKTools(t, one), []string{"echo", "kinds", "who", "wipe"}; !slices.Equal(got, want) {
				t.Errorf("/mcp/ws/alpha tools = %v, want %v", got, want)
			}
			if res := goSDKCall(t, one, "echo", map[string]any{"message": "hi"}); res.IsError || goSDKText(res) != "hi" {
				t.Errorf("echo = %+v (%q), want hi", res, goSDKText(res))
			}
			ws := goSDKConnect(t, e.url+"/mcp/ws", v, nil)
			names := goSDKTools(t, ws)
			if !slices.Contains(names, "alpha__echo") || len(names) != 8 {
				t.Fatalf("/mcp/ws tools = %v, want alpha's four and my.beta's four", names)
			}
			if res := goSDKCall(t, ws, "alpha__echo", map[string]any{"message": "ws"}); res.IsError || goSDKText(res) != "ws" {
				t.Errorf("alpha__echo = %+v (%q), want ws", res, goSDKText(res))
			}

			e.up.mu.Lock()
			e.up.wiped = nil
			e.up.mu.Unlock()
			var mu sync.Mutex
			var asked []*gomcp.ElicitParams
			answer := func(content map[string]any) *gomcp.ClientOptions {
				return &gomcp.ClientOptions{ElicitationHandler: func(_ context.Context, req *gomcp.ElicitRequest) (*gomcp.ElicitResult, error) {
					mu.Lock()
					asked = append(asked, req.Params)
					mu.Unlock()
					return &gomcp.ElicitResult{Action: "accept", Content: content}, nil
				}}
			}
			approver := goSDKConnect(t, e.url+"/mcp/ws", v, answer(map[string]any{"approve": true, "arguments": `{"what":"the edited thing"}`}))
			res := goSDKCall(t, approver, "alpha__wipe", map[string]any{"what": "everything"})
			if res.IsError || goSDKText(res) != "wiped the edited thing" {
				t.Errorf("approved wipe = %q (isError %v), want the edited arguments run", goSDKText(res), res.IsError)
			}
			mu.Lock()
			if len(asked) != 1 || !strings.Contains(asked[0].Message, "everything") {
				t.Errorf("asked %d forms (%+v), want one showing the model's arguments", len(asked), asked)
			}
			asked = nil
			mu.Unlock()
			denier := goSDKConnect(t, e.url+"/mcp/ws/alpha", v, answer(map[string]any{"approve": false, "message": "not today"}))
			res = goSDKCall(t, denier, "wipe", map[string]any{"what": "everything"})
			if !res.IsError || !strings.Contains(goSDKText(res), "not today") {
				t.Errorf("denied wipe = %q (isError %v), want an error with the person's reason", goSDKText(res), res.IsError)
			}
			e.up.mu.Lock()
			defer e.up.mu.Unlock()
			if len(e.up.wiped) != 1 || e.up.wiped[0]["what"] != "the edited thing" {
				t.Errorf("the server ran wipe with %v, want once with the edited arguments", e.up.wiped)
			}
		})
	}
}

// rawCall sends tools/call on an initialized client's transport and
// returns the result's JSON as the server wrote it (the client's own
// parsing would drop what it does not know). ids start high, clear of the
// client's own.
var rawID struct {
	sync.Mutex
	n int64
}

func rawCall(t *testing.T, tr transport.Interface, name string, args map[string]any) json.RawMessage {
	t.Helper()
	rawID.Lock()
	rawID.n++
	id := 1_000_000 + rawID.n
	rawID.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	resp, err := tr.SendRequest(ctx, transport.JSONRPCRequest{JSONRPC: mcp.JSONRPC_VERSION, ID: mcp.NewRequestId(id),
		Method: string(mcp.MethodToolsCall), Params: map[string]any{"name": name, "arguments": args}})
	if err != nil {
		t.Fatalf("tools/call %s: %v", name, err)
	}
	if resp.Error != nil {
		t.Fatalf("tools/call %s: JSON-RPC error %d %s", name, resp.Error.Code, resp.Error.Message)
	}
	return resp.Result
}

// canonical is j with every _meta member dropped (at any depth) and its
// keys in order, for comparison.
func canonical(t *testing.T, j json.RawMessage) string {
	t.Helper()
	var v any
	d := json.NewDecoder(bytes.NewReader(j))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		t.Fatalf("result is not JSON: %v: %s", err, j)
	}
	var strip func(any) any
	strip = func(v any) any {
		switch x := v.(type) {
		case map[string]any:
			delete(x, "_meta")
			for k, e := range x {
				x[k] = strip(e)
			}
		case []any:
			for i, e := range x {
				x[i] = strip(e)
			}
		}
		return v
	}
	b, _ := json.Marshal(strip(v))
	return string(b)
}

// metaKeys lists the _meta members of a result's JSON, at any depth.
func metaKeys(j json.RawMessage) []string {
	var v any
	_ = json.Unmarshal(j, &v)
	var out []string
	var walk func(string, any)
	walk = func(path string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				if k == "_meta" {
					b, _ := json.Marshal(e)
					out = append(out, path+"._meta="+string(b))
					continue
				}
				walk(path+"."+k, e)
			}
		case []any:
			for i, e := range x {
				walk(fmt.Sprintf("%s[%d]", path, i), e)
			}
		}
	}
	walk("", v)
	slices.Sort(out)
	return out
}

// everythingCalls are calls of the reference server's tools, together
// returning every content type it has: text (annotated, too), image,
// resource links, embedded text and blob resources, structured content,
// and isError results (an argument the tool's schema refuses, a tool that
// throws). It has no tool that returns audio (the in-process upstream's
// "kinds" covers that, TestEveryContentTypePassesThrough).
var everythingCalls = []struct {
	name string
	args map[string]any
}{
	{"echo", map[string]any{"message": "héllo ✓ \"quoted\" <b>"}},
	{"get-sum", map[string]any{"a": 2, "b": 40.5}},
	{"get-tiny-image", map[string]any{}},
	{"get-annotated-message", map[string]any{"messageType": "error", "includeImage": true}},
	{"get-annotated-message", map[string]any{"messageType": "debug", "includeImage": false}},
	{"get-resource-links", map[string]any{"count": 3}},
	{"get-resource-reference", map[string]any{"resourceType": "Text", "resourceId": 2}},
	{"get-resource-reference", map[string]any{"resourceType": "Blob", "resourceId": 3}},
	{"get-structured-content", map[string]any{"location": "New York"}},
	{"gzip-file-as-resource", map[string]any{"name": "x.gz", "data": "data:text/plain;base64,aGVsbG8gd29ybGQ=", "outputType": "resource"}},
	{"get-sum", map[string]any{"a": "not a number", "b": 1}},
	{"gzip-file-as-resource", map[string]any{"name": "y.gz", "data": "ftp://example.invalid/x", "outputType": "resource"}},
}

// TestInteropEverythingResults calls the reference server's tools through
// the endpoint (a stdio connector, mcp-go's client, 2025-11-25) and on the
// server directly (its own stdio process, the same client), and compares
// the results' JSON as each server wrote it, _meta aside.
func TestInteropEverythingResults(t *testing.T) {
	js := everythingEntry(t)
	e := newInteropEnv(t, &store.Connector{ExternalID: "everything", Transport: store.TransportStdio,
		Config: store.Config{Command: "node", Args: []string{js, "stdio"}, ConnectTimeout: store.Duration(30 * time.Second),
			CallTimeout: store.Duration(60 * time.Second)}})

	direct, err := mcpclient.NewStdioMCPClient("node", nil, js, "stdio")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = direct.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := direct.Initialize(ctx, mcp.InitializeRequest{Params: mcp.InitializeParams{ProtocolVersion: "2025-11-25",
		ClientInfo: mcp.Implementation{Name: "direct", Version: "1"}}}); err != nil {
		t.Fatalf("initialize the reference server directly: %v", err)
	}

	tr, err := transport.NewStreamableHTTP(e.url + "/mcp/ws/everything")
	if err != nil {
		t.Fatal(err)
	}
	via := mcpclient.NewClient(tr, mcpclient.WithLegacyProtocolOnly())
	if err := via.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = via.Close() })
	if _, err := via.Initialize(ctx, mcp.InitializeRequest{Params: mcp.InitializeParams{ProtocolVersion: "2025-11-25",
		ClientInfo: mcp.Implementation{Name: "via", Version: "1"}}}); err != nil {
		t.Fatalf("initialize the endpoint: %v", err)
	}
	listed := toolNames(t, via)
	compareToolLists(t, direct.GetTransport(), tr, false)
	for _, c := range everythingCalls {
		if !slices.Contains(listed, c.name) {
			t.Errorf("the endpoint does not list %s: %v", c.name, listed)
		}
	}

	seen := map[string]bool{}
	for i, c := range everythingCalls {
		t.Run(fmt.Sprintf("%d_%s", i, c.name), func(t *testing.T) {
			// Some results name the second they were made in ("created at
			// 4:16:36 PM"): a pair of calls across a second's turn differs
			// by that alone, so a difference is believed on the third try.
			var cw, cg string
			var got, want json.RawMessage
			for range 3 {
				want = rawCall(t, direct.GetTransport(), c.name, c.args)
				got = rawCall(t, tr, c.name, c.args)
				if cw, cg = canonical(t, want), canonical(t, got); cw == cg {
					break
				}
			}
			if cw != cg {
				t.Errorf("%s(%v) through the endpoint differs from the server's own result:\n got: %s\nwant: %s", c.name, c.args, cg, cw)
			}
			if os.Getenv("INTEROP_DUMP") != "" {
				t.Logf("%s: %s", c.name, cg)
			}
			if gm, wm := metaKeys(got), metaKeys(want); !slices.Equal(gm, wm) {
				t.Logf("%s: _meta through the endpoint %v, the server's %v", c.name, gm, wm)
			}
			for k := range contentKinds(t, got) {
				seen[k] = true
			}
		})
	}
	// The sessionless generation (2026-07-28) through the endpoint, read
	// with mcp-go's client (its raw transport would need the request _meta
	// the client adds): the parsed results, marshalled again, compared with
	// the server's own read the same way; resultType is the new
	// generation's envelope.
	modern := connect(t, e.url+"/mcp/ws/everything", nil)
	for i, c := range everythingCalls {
		t.Run(fmt.Sprintf("2026-07-28_%d_%s", i, c.name), func(t *testing.T) {
			var cw, cg string
			for range 3 {
				want, err := direct.CallTool(ctx, mcp.CallToolRequest{Params: mcp.CallToolParams{Name: c.name, Arguments: c.args}})
				if err != nil {
					t.Fatal(err)
				}
				got, err := modern.CallTool(ctx, mcp.CallToolRequest{Params: mcp.CallToolParams{Name: c.name, Arguments: c.args}})
				if err != nil {
					t.Fatal(err)
				}
				if got.ResultType != "" && got.ResultType != mcp.ResultTypeComplete {
					t.Fatalf("%s: resultType %q, want complete", c.name, got.ResultType)
				}
				want.ResultType, got.ResultType = "", ""
				wb, _ := json.Marshal(want)
				gb, _ := json.Marshal(got)
				if cw, cg = canonical(t, wb), canonical(t, gb); cw == cg {
					break
				}
			}
			if cw != cg {
				t.Errorf("%s(%v) through the endpoint (2026-07-28) differs from the server's own result:\n got: %s\nwant: %s", c.name, c.args, cg, cw)
			}
		})
	}

	// The calls covered what they are meant to (a newer server version
	// could change its tools' results).
	for _, k := range []string{"text", "text+annotations", "image", "image+annotations", "resource_link", "resource/text",
		"resource/blob", "structuredContent", "isError"} {
		if !seen[k] {
			t.Errorf("no result through the endpoint had %s (seen %v): the reference server's tools changed?", k, seen)
		}
	}
}

// compareToolLists compares tools/list through the endpoint with the
// server's own, tool by tool (_meta aside). The reference server offers
// some tools only to clients that declared a capability (elicitation,
// sampling, roots): the service's connection and the direct client
// declare different ones, so only the tools both list are compared.
func compareToolLists(t *testing.T, direct, via transport.Interface, fromStore bool) {
	t.Helper()
	list := func(tr transport.Interface) map[string]json.RawMessage {
		rawID.Lock()
		rawID.n++
		id := 1_000_000 + rawID.n
		rawID.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		resp, err := tr.SendRequest(ctx, transport.JSONRPCRequest{JSONRPC: mcp.JSONRPC_VERSION, ID: mcp.NewRequestId(id),
			Method: string(mcp.MethodToolsList), Params: map[string]any{}})
		if err != nil || resp.Error != nil {
			t.Fatalf("tools/list: %v %+v", err, resp)
		}
		var r struct {
			Tools []json.RawMessage `json:"tools"`
		}
		if err := json.Unmarshal(resp.Result, &r); err != nil {
			t.Fatal(err)
		}
		out := map[string]json.RawMessage{}
		for _, tool := range r.Tools {
			var n struct {
				Name string `json:"name"`
			}
			_ = json.Unmarshal(tool, &n)
			out[n.Name] = tool
		}
		return out
	}
	want, got := list(direct), list(via)
	var only, dialectLost []string
	storeLost := map[string][]string{}
	for name, w := range want {
		g, ok := got[name]
		if !ok {
			only = append(only, name+" (the server's only)")
			continue
		}
		// Known loss (a bug, reported in notes/30-interop.md): the
		// registry's catalog is mcp-go's parse of tools/list, whose
		// ToolArgumentsSchema keeps only type, properties, required,
		// additionalProperties and $defs of a schema's top level. The
		// reference server's schemas lose "$schema" (draft-07, so a
		// client reads them as 2020-12) and gain "required": [] — the
		// rest must match.
		var lost bool
		w, lost = schemaTopLevel(t, w)
		g, _ = schemaTopLevel(t, g)
		if lost && !bytes.Contains(got[name], []byte(`"$schema"`)) {
			dialectLost = append(dialectLost, name)
		}
		if fromStore {
			// Known loss (reported): a replica that holds no connection
			// of the connector lists the catalog its owner synced to the
			// store, which keeps name, description, input schema and
			// annotations only (endpoint.go's catalog).
			var gone []string
			w, gone = dropKeys(t, w, "title", "execution", "outputSchema", "icons")
			for _, k := range gone {
				storeLost[k] = append(storeLost[k], name)
			}
		}
		if cw, cg := canonical(t, w), canonical(t, g); cw != cg {
			t.Errorf("tools/list: %s through the endpoint differs from the server's own:\n got: %s\nwant: %s", name, cg, cw)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			only = append(only, name+" (the endpoint's only)")
		}
	}
	for k, names := range storeLost {
		slices.Sort(names)
		t.Logf("KNOWN DIFFERENCE: the store's catalog has no %q: it is missing from %v", k, names)
	}
	if len(dialectLost) > 0 {
		slices.Sort(dialectLost)
		t.Logf("KNOWN DIFFERENCE: the endpoint lists these tools' schemas without their \"$schema\": %v", dialectLost)
	}
	if len(only) > 0 {
		slices.Sort(only)
		t.Logf("tools listed on one side only (capability-dependent tools): %v", only)
	}
}

// schemaTopLevel is tool (JSON) with its inputSchema's and outputSchema's
// "$schema" dropped and an empty "required" dropped; had says a "$schema"
// was there.
func schemaTopLevel(t *testing.T, tool json.RawMessage) (out json.RawMessage, had bool) {
	t.Helper()
	var m map[string]any
	d := json.NewDecoder(bytes.NewReader(tool))
	d.UseNumber()
	if err := d.Decode(&m); err != nil {
		t.Fatalf("tool: %v: %s", err, tool)
	}
	for _, k := range []string{"inputSchema", "outputSchema"} {
		sch, ok := m[k].(map[string]any)
		if !ok {
			continue
		}
		if _, ok := sch["$schema"]; ok {
			had = true
			delete(sch, "$schema")
		}
		if r, ok := sch["required"].([]any); ok && len(r) == 0 {
			delete(sch, "required")
		}
	}
	b, _ := json.Marshal(m)
	return b, had
}

// dropKeys is object j without keys; gone lists those it had.
func dropKeys(t *testing.T, j json.RawMessage, keys ...string) (json.RawMessage, []string) {
	t.Helper()
	var m map[string]any
	d := json.NewDecoder(bytes.NewReader(j))
	d.UseNumber()
	if err := d.Decode(&m); err != nil {
		t.Fatalf("%v: %s", err, j)
	}
	var gone []string
	for _, k := range keys {
		if _, ok := m[k]; ok {
			gone = append(gone, k)
			delete(m, k)
		}
	}
	b, _ := json.Marshal(m)
	return b, gone
}

// withoutContentAnnotations is result j with its contents' (and their
// resources') annotations dropped; had says there were some.
func withoutContentAnnotations(t *testing.T, j json.RawMessage) (json.RawMessage, bool) {
	t.Helper()
	var m map[string]any
	d := json.NewDecoder(bytes.NewReader(j))
	d.UseNumber()
	if err := d.Decode(&m); err != nil {
		t.Fatalf("%v: %s", err, j)
	}
	had := false
	contents, _ := m["content"].([]any)
	for _, c := range contents {
		cm, _ := c.(map[string]any)
		if _, ok := cm["annotations"]; ok {
			had = true
			delete(cm, "annotations")
		}
		if r, ok := cm["resource"].(map[string]any); ok {
			if _, ok := r["annotations"]; ok {
				had = true
				delete(r, "annotations")
			}
		}
	}
	b, _ := json.Marshal(m)
	return b, had
}

// contentKinds names what a result's JSON has: each content's type (with
// "+annotations" when it has some; resource/text or resource/blob),
// structuredContent and isError.
func contentKinds(t *testing.T, j json.RawMessage) map[string]bool {
	t.Helper()
	var r struct {
		Content []struct {
			Type        string          `json:"type"`
			Annotations json.RawMessage `json:"annotations"`
			Resource    *struct {
				Text *string `json:"text"`
				Blob *string `json:"blob"`
			} `json:"resource"`
		} `json:"content"`
		StructuredContent json.RawMessage `json:"structuredContent"`
		IsError           bool            `json:"isError"`
	}
	if err := json.Unmarshal(j, &r); err != nil {
		t.Fatalf("result: %v", err)
	}
	out := map[string]bool{}
	for _, c := range r.Content {
		k := c.Type
		if c.Type == "resource" && c.Resource != nil {
			if c.Resource.Blob != nil {
				k += "/blob"
			} else if c.Resource.Text != nil {
				k += "/text"
			}
		}
		out[k] = true
		if len(c.Annotations) > 0 {
			out[k+"+annotations"] = true
		}
	}
	if len(r.StructuredContent) > 0 {
		out["structuredContent"] = true
	}
	if r.IsError {
		out["isError"] = true
	}
	return out
}

// TestInteropEverythingProgress calls the reference server's long-running
// tool with a progress token through the endpoint: mcp-go's client (both
// generations) and the Go SDK's (2025-11-25) get its progress
// notifications.
func TestInteropEverythingProgress(t *testing.T) {
	js := everythingEntry(t)
	e := newInteropEnv(t, &store.Connector{ExternalID: "everything", Transport: store.TransportStdio,
		Config: store.Config{Command: "node", Args: []string{js, "stdio"}, ConnectTimeout: store.Duration(30 * time.Second),
			CallTimeout: store.Duration(60 * time.Second)}})
	args := map[string]any{"duration": 1, "steps": 4}
	for _, g := range generations {
		t.Run("mcp-go "+g.name, func(t *testing.T) {
			c := connect(t, e.url+"/mcp/ws/everything", nil, g.opts...)
			var mu sync.Mutex
			var got []float64
			c.OnNotification(func(n mcp.JSONRPCNotification) {
				if n.Method != string(mcp.MethodNotificationProgress) {
					return
				}
				if tok := n.Params.AdditionalFields["progressToken"]; tok != "tok-1" {
					t.Errorf("progress for token %v, want tok-1", tok)
				}
				p, _ := n.Params.AdditionalFields["progress"].(float64)
				mu.Lock()
				got = append(got, p)
				mu.Unlock()
			})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			req := mcp.CallToolRequest{Params: mcp.CallToolParams{Name: "trigger-long-running-operation", Arguments: args,
				Meta: &mcp.Meta{ProgressToken: "tok-1"}}}
			res, err := c.CallTool(ctx, req)
			if err != nil || res.IsError {
				t.Fatalf("trigger-long-running-operation: %v %+v", err, res)
			}
			mu.Lock()
			defer mu.Unlock()
			checkProgress(t, got)
		})
	}
	for _, v := range goSDKVersions {
		t.Run("go-sdk "+v, func(t *testing.T) {
			var mu sync.Mutex
			var got []float64
			cs := goSDKConnect(t, e.url+"/mcp/ws/everything", v, &gomcp.ClientOptions{
				ProgressNotificationHandler: func(_ context.Context, req *gomcp.ProgressNotificationClientRequest) {
					mu.Lock()
					got = append(got, req.Params.Progress)
					mu.Unlock()
				}})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			p := &gomcp.CallToolParams{Name: "trigger-long-running-operation", Arguments: args}
			p.SetProgressToken("tok-2")
			res, err := cs.CallTool(ctx, p)
			if err != nil || res.IsError {
				t.Fatalf("trigger-long-running-operation: %v %+v", err, res)
			}
			// The Go SDK's client hands notifications to their handler on
			// a goroutine of their own: one read before the response may
			// be handled after CallTool returned.
			deadline := time.Now().Add(time.Second)
			for {
				mu.Lock()
				n := len(got)
				mu.Unlock()
				if n >= 4 || time.Now().After(deadline) {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			mu.Lock()
			defer mu.Unlock()
			checkProgress(t, got)
		})
	}
}

// checkProgress checks the progress a client got of a 4-step run: 1, 2, 3
// and 4 in order. The last may be missing: mcp-go v1.2.1's streamable
// HTTP server (the endpoint's) drops a notification sent just before a
// tool's result about one time in five — its forwarder takes it off the
// session's channel, loses the lock to the response path, finds the
// request done and discards it (mark3labs/mcp-go PR #969, not released).
// Steps 1-3 come 250 ms before the result and are not at risk.
func checkProgress(t *testing.T, got []float64) {
	t.Helper()
	switch {
	case slices.Equal(got, []float64{1, 2, 3, 4}):
	case slices.Equal(got, []float64{1, 2, 3}):
		t.Logf("KNOWN LOSS: the last progress notification (4) was dropped by mcp-go's streamable HTTP server (mark3labs/mcp-go#969)")
	default:
		t.Errorf("progress notifications = %v, want 1, 2, 3, 4", got)
	}
}

// blockingUpstream is an mcp-go server with "block", which waits until
// its context ends and reports that on ended, and "who", which asks its
// client a question by elicitation and says what it got.
type blockingUpstream struct {
	url     string
	started chan struct{}
	ended   chan error
}

func newBlockingUpstream(t *testing.T) *blockingUpstream {
	t.Helper()
	u := &blockingUpstream{started: make(chan struct{}, 10), ended: make(chan error, 10)}
	m := mcpserver.NewMCPServer("blocking", "1.0", mcpserver.WithToolCapabilities(true), mcpserver.WithElicitation())
	m.AddTool(mcp.NewTool("block", mcp.WithReadOnlyHintAnnotation(true)), func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		u.started <- struct{}{}
		select {
		case <-ctx.Done():
			u.ended <- ctx.Err()
			return nil, ctx.Err()
		case <-time.After(time.Minute):
			u.ended <- errors.New("not cancelled within a minute")
			return mcp.NewToolResultText("done"), nil
		}
	})
	m.AddTool(mcp.NewTool("who", mcp.WithReadOnlyHintAnnotation(true)), func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		res, err := mcpserver.ServerFromContext(ctx).RequestElicitation(ctx, mcp.ElicitationRequest{Params: mcp.ElicitationParams{
			Message: "Who are you?", RequestedSchema: map[string]any{"type": "object",
				"properties": map[string]any{"name": map[string]any{"type": "string"}}, "required": []string{"name"}}}})
		if err != nil {
			return nil, err
		}
		b, _ := json.Marshal(res.Content)
		return mcp.NewToolResultText(fmt.Sprintf("%s %s", res.Action, b)), nil
	})
	hs := httptest.NewServer(mcpserver.NewStreamableHTTPServer(m))
	t.Cleanup(hs.Close)
	u.url = hs.URL + "/mcp"
	return u
}

// TestInteropCancelEndsUpstreamCall cancels a client's long call (mcp-go's
// client and the Go SDK's, both generations): the upstream tool's context
// ends.
func TestInteropCancelEndsUpstreamCall(t *testing.T) {
	up := newBlockingUpstream(t)
	e := newInteropEnv(t, &store.Connector{ExternalID: "slow", Transport: store.TransportStreamableHTTP,
		Config: store.Config{URL: up.url, CallTimeout: store.Duration(2 * time.Minute)}})
	for _, g := range generations {
		t.Run(g.name, func(t *testing.T) {
			c := connect(t, e.url+"/mcp/ws/slow", nil, g.opts...)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				_, err := c.CallTool(ctx, mcp.CallToolRequest{Params: mcp.CallToolParams{Name: "block"}})
				done <- err
			}()
			select {
			case <-up.started:
			case <-time.After(20 * time.Second):
				t.Fatal("the upstream tool did not start")
			}
			cancel()
			select {
			case err := <-up.ended:
				if !errors.Is(err, context.Canceled) {
					t.Errorf("the upstream call ended with %v, want its context cancelled", err)
				}
			case <-time.After(15 * time.Second):
				t.Fatal("the upstream call's context was not cancelled within 15 s of the client's cancel")
			}
			if err := <-done; err == nil {
				t.Error("the cancelled call returned no error")
			}
		})
	}
	for _, v := range goSDKVersions {
		t.Run("go-sdk "+v, func(t *testing.T) {
			cs := goSDKConnect(t, e.url+"/mcp/ws/slow", v, nil)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				_, err := cs.CallTool(ctx, &gomcp.CallToolParams{Name: "block"})
				done <- err
			}()
			select {
			case <-up.started:
			case <-time.After(20 * time.Second):
				t.Fatal("the upstream tool did not start")
			}
			cancel()
			select {
			case err := <-up.ended:
				if !errors.Is(err, context.Canceled) {
					t.Errorf("the upstream call ended with %v, want its context cancelled", err)
				}
			case <-time.After(15 * time.Second):
				t.Fatal("the upstream call's context was not cancelled within 15 s of the client's cancel")
			}
			if err := <-done; err == nil {
				t.Error("the cancelled call returned no error")
			}
		})
	}
}

// TestInteropServerElicitation has the upstream's own tool ask its client
// a question (elicitation/create): a 2025-11-25 client that declared
// elicitation gets the form, and its answer (accept with content, or
// decline) reaches the upstream; a client that did not declare it has the
// upstream answered cancel.
func TestInteropServerElicitation(t *testing.T) {
	up := newBlockingUpstream(t)
	e := newInteropEnv(t, &store.Connector{ExternalID: "asker", Transport: store.TransportStreamableHTTP,
		Config: store.Config{URL: up.url, CallTimeout: store.Duration(30 * time.Second), SessionMode: registry.SessionPerSession,
			Elicitation: true}})
	t.Run("mcp-go", func(t *testing.T) {
		el := &elicitor{answer: func(mcp.ElicitationRequest) *mcp.ElicitationResult {
			return &mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{Action: mcp.ElicitationResponseActionAccept,
				Content: map[string]any{"name": "Ada"}}}
		}}
		c := connect(t, e.url+"/mcp/ws/asker", nil, mcpclient.WithLegacyProtocolOnly(), mcpclient.WithElicitationHandler(el))
		res := call(t, c, "who", nil)
		if res.IsError || text(res) != `accept {"name":"Ada"}` {
			t.Errorf("who = %q (isError %v), want the answer back from the upstream", text(res), res.IsError)
		}
		el.mu.Lock()
		defer el.mu.Unlock()
		if len(el.asked) != 1 || el.asked[0].Params.Message != "Who are you?" {
			t.Errorf("the client was asked %+v, want the upstream's question once", el.asked)
		}
	})
	t.Run("mcp-go declines", func(t *testing.T) {
		el := &elicitor{answer: func(mcp.ElicitationRequest) *mcp.ElicitationResult {
			return &mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{Action: mcp.ElicitationResponseActionDecline}}
		}}
		c := connect(t, e.url+"/mcp/ws/asker", nil, mcpclient.WithLegacyProtocolOnly(), mcpclient.WithElicitationHandler(el))
		if res := call(t, c, "who", nil); res.IsError || text(res) != "decline null" {
			t.Errorf("who = %q (isError %v), want the decline back from the upstream", text(res), res.IsError)
		}
	})
	t.Run("a client without elicitation", func(t *testing.T) {
		// The upstream is answered cancel at once, not left to time out.
		c := connect(t, e.url+"/mcp/ws/asker", nil, mcpclient.WithLegacyProtocolOnly())
		start := time.Now()
		if res := call(t, c, "who", nil); res.IsError || text(res) != "cancel null" {
			t.Errorf("who = %q (isError %v), want cancel back from the upstream", text(res), res.IsError)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("who took %v, want the cancel at once", d)
		}
	})
	t.Run("go-sdk", func(t *testing.T) {
		var mu sync.Mutex
		var asked []string
		cs := goSDKConnect(t, e.url+"/mcp/ws/asker", "2025-11-25", &gomcp.ClientOptions{
			ElicitationHandler: func(_ context.Context, req *gomcp.ElicitRequest) (*gomcp.ElicitResult, error) {
				mu.Lock()
				asked = append(asked, req.Params.Message)
				mu.Unlock()
				return &gomcp.ElicitResult{Action: "accept", Content: map[string]any{"name": "Grace"}}, nil
			}})
		res := goSDKCall(t, cs, "who", nil)
		if res.IsError || goSDKText(res) != `accept {"name":"Grace"}` {
			t.Errorf("who = %q (isError %v), want the answer back from the upstream", goSDKText(res), res.IsError)
		}
		mu.Lock()
		defer mu.Unlock()
		if !slices.Equal(asked, []string{"Who are you?"}) {
			t.Errorf("the client was asked %v, want the upstream's question once", asked)
		}
	})
}

// interopReplica is one replica of a cluster on a shared database, wired
// as main wires one (cmd/connector-svc/serve.go): membership, ownership
// (a stdio connector runs on its owner only), the router and the internal
// gRPC listener other replicas forward calls to, and the MCP endpoint.
type interopReplica struct {
	url     string
	reg     *registry.Registry
	members *cluster.Membership
	owners  *cluster.Owners
}

var interopForwardKey = forward.Key(bytes.Repeat([]byte{7}, 32))

func newInteropReplica(t *testing.T, db *store.DB, id string) *interopReplica {
	t.Helper()
	ctx := context.Background()
	logger := slog.New(slog.DiscardHandler)
	internal, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	members := cluster.New(db, cluster.Config{ID: id, Addr: internal.Addr().String(), Logger: logger})
	owners := cluster.NewOwners(db, members, db.ActiveConnectorIDs)
	pool, err := forward.NewPool(interopForwardKey, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	src := live.NewSource(db, nil, logger)
	src.FenceWith(owners.Fence)
	var sessions *live.Sessions
	reg := registry.New(src, registry.Config{HealthInterval: 200 * time.Millisecond, DetachSessions: true,
		OnSessionOpened: func(id int64, sid string, h registry.SessionHandle) { sessions.Opened(id, sid, h) },
		OnSessionClosed: func(id int64, sid string) { sessions.Closed(id, sid) }}, logger)
	sessions = live.NewSessions(db, reg, nil, members, pool, 64, logger)
	router := live.NewRouter(owners, pool, reg)
	members.OnChange(func([]cluster.Member) { router.Moved() })
	lv := live.New(db, src, reg, live.Owned(owners, logger), live.Config{Logger: logger})
	owners.OnGained(func(id, _ int64) { lv.Touch(id) })
	owners.OnLostOwnership(lv.Touch)
	if err := members.Register(ctx); err != nil {
		t.Fatal(err)
	}
	if err := owners.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := reg.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lv.Load(ctx); err != nil {
		t.Fatal(err)
	}
	listener := db.NewListener(100*time.Millisecond, logger)
	listener.Handle(store.ConnectorChangesChannel, lv.Notified)
	listener.Handle(store.ClusterChannel, func(payload string) {
		members.Notified(payload)
		owners.Notified(payload)
		router.Moved()
	})
	listener.OnListen(lv.Resync)
	srv := server.New(server.Deps{DB: db, Registry: reg, Live: lv, Router: router, Sessions: sessions, Logger: logger},
		server.Config{Auth: auth.ModeNone})
	rctx, cancel := context.WithCancel(ctx)
	jobs := []func(context.Context) error{reg.Run, lv.Run, listener.Run, members.Run, owners.Run,
		func(ctx context.Context) error { return srv.Run(ctx, time.Second) }}
	done := make(chan error, len(jobs))
	for _, job := range jobs {
		go func() { done <- job(rctx) }()
	}
	ig := server.NewInternalGRPCServer(srv, forward.ServerOptions(interopForwardKey, 0)...)
	go func() { _ = ig.Serve(internal) }()
	uc := srv.UseCases()
	h := mcpserve.New(mcpserve.Deps{Calls: uc.Calls, Resources: uc.Resources, Watches: uc.Watches, Queries: uc.Queries, Placer: uc.Placer, Sessions: uc.Sessions,
		Authorizations: uc.Authorizations, Live: lv, Registry: reg, Tools: db, Logger: logger},
		mcpserve.Config{Auth: auth.ModeNone, SessionKey: []byte("interop session key"), ListInterval: 100 * time.Millisecond})
	go func() { _ = h.Run(rctx) }()
	mux := http.NewServeMux()
	mux.Handle("/mcp/", h)
	hs := httptest.NewServer(mux)
	t.Cleanup(func() {
		hs.Close()
		ig.Stop()
		cancel()
		for range jobs {
			<-done
		}
	})
	return &interopReplica{url: hs.URL, reg: reg, members: members, owners: owners}
}

// TestInteropEverythingForwarded runs the reference server as a stdio
// connector on one of two replicas and calls it through the other's
// endpoint, so each call takes the internal hop (forward.go): the results
// are compared with the server's own, as TestInteropEverythingResults
// does on the owner. What the hop does not carry is reported, not failed
// (forward.go: "content annotations and _meta stay behind on the owner").
func TestInteropEverythingForwarded(t *testing.T) {
	js := everythingEntry(t)
	_, other, _ := everythingOnTwoReplicas(t, js)
	ctx := context.Background()

	direct, err := mcpclient.NewStdioMCPClient("node", nil, js, "stdio")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = direct.Close() })
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := direct.Initialize(cctx, mcp.InitializeRequest{Params: mcp.InitializeParams{ProtocolVersion: "2025-11-25",
		ClientInfo: mcp.Implementation{Name: "direct", Version: "1"}}}); err != nil {
		t.Fatal(err)
	}
	tr, err := transport.NewStreamableHTTP(other.url + "/mcp/ws/everything")
	if err != nil {
		t.Fatal(err)
	}
	via := mcpclient.NewClient(tr, mcpclient.WithLegacyProtocolOnly())
	if err := via.Start(cctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = via.Close() })
	if _, err := via.Initialize(cctx, mcp.InitializeRequest{Params: mcp.InitializeParams{ProtocolVersion: "2025-11-25",
		ClientInfo: mcp.Implementation{Name: "via", Version: "1"}}}); err != nil {
		t.Fatal(err)
	}
	testsupport.WaitFor(t, "the other replica lists the connector's tools", func() bool {
		return slices.Contains(toolNames(t, via), "echo")
	})
	compareToolLists(t, direct.GetTransport(), tr, true)
	for i, c := range everythingCalls {
		t.Run(fmt.Sprintf("%d_%s", i, c.name), func(t *testing.T) {
			var cw, cg string
			var annotated bool
			for range 3 {
				want := rawCall(t, direct.GetTransport(), c.name, c.args)
				got := rawCall(t, tr, c.name, c.args)
				// Known loss (reported): the hop's proto has no content
				// annotations (forward.go).
				want, annotated = withoutContentAnnotations(t, want)
				if cw, cg = canonical(t, want), canonical(t, got); cw == cg {
					break
				}
			}
			if cw != cg {
				t.Errorf("%s(%v) forwarded differs from the server's own result:\n got: %s\nwant: %s", c.name, c.args, cg, cw)
			}
			if annotated {
				t.Logf("KNOWN DIFFERENCE: %s's content annotations do not cross the internal hop", c.name)
			}
		})
	}
}

// Through a replica that does not hold the stdio connector, its
// endpoint's resources, reads, prompts, completions and subscriptions
// are the owner's, forwarded: the same as the server's own.
func TestInteropEverythingContentsForwarded(t *testing.T) {
	js := everythingEntry(t)
	owner, other, id := everythingOnTwoReplicas(t, js)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	k, err := owner.reg.Contents(ctx, id, false)
	if err != nil {
		t.Fatal(err)
	}

	updated := make(chan string, 64)
	cs := goSDKConnect(t, other.url+"/mcp/ws/everything", "2025-11-25", &gomcp.ClientOptions{
		ResourceUpdatedHandler: func(_ context.Context, req *gomcp.ResourceUpdatedNotificationRequest) {
			updated <- req.Params.URI
		}})
	caps := cs.InitializeResult().Capabilities
	if caps.Resources == nil || !caps.Resources.Subscribe || caps.Prompts == nil || caps.Completions == nil {
		t.Fatalf("capabilities through the other replica = %+v; want resources with subscribe, prompts, completions", caps)
	}
	var uris, want []string
	for r, err := range cs.Resources(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		uris = append(uris, r.URI)
	}
	for _, r := range k.Resources {
		want = append(want, r.URI)
	}
	slices.Sort(uris)
	slices.Sort(want)
	if len(want) == 0 || !slices.Equal(uris, want) {
		t.Fatalf("resources through the other replica %v; the server's %v", uris, want)
	}

	direct, err := mcpclient.NewStdioMCPClient("node", nil, js, "stdio")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = direct.Close() })
	if _, err := direct.Initialize(ctx, mcp.InitializeRequest{Params: mcp.InitializeParams{ProtocolVersion: "2025-11-25",
		ClientInfo: mcp.Implementation{Name: "direct", Version: "1"}}}); err != nil {
		t.Fatal(err)
	}
	for _, uri := range []string{want[0], "demo://resource/dynamic/blob/7"} {
		d, err := direct.ReadResource(ctx, mcp.ReadResourceRequest{Params: mcp.ReadResourceParams{URI: uri}})
		if err != nil {
			t.Fatal(err)
		}
		got, err := cs.ReadResource(ctx, &gomcp.ReadResourceParams{URI: uri})
		if err != nil {
			t.Fatalf("read %s through the other replica: %v", uri, err)
		}
		if len(got.Contents) != len(d.Contents) || len(got.Contents) == 0 {
			t.Fatalf("read %s: %d contents, the server's %d", uri, len(got.Contents), len(d.Contents))
		}
		switch dc := d.Contents[0].(type) {
		case mcp.TextResourceContents:
			if g := got.Contents[0]; g.URI != dc.URI || untimed(g.Text) != untimed(dc.Text) || g.MIMEType != dc.MIMEType {
				t.Errorf("read %s = %+v; the server's %+v", uri, g, dc)
			}
		case mcp.BlobResourceContents:
			raw, _ := base64.StdEncoding.DecodeString(dc.Blob)
			if g := got.Contents[0]; g.URI != dc.URI || untimed(string(g.Blob)) != untimed(string(raw)) || g.MIMEType != dc.MIMEType {
				t.Errorf("read %s = %+v; the server's %+v", uri, g, dc)
			}
		default:
			t.Fatalf("read %s directly: %T", uri, dc)
		}
	}

	p, err := cs.GetPrompt(ctx, &gomcp.GetPromptParams{Name: "args-prompt", Arguments: map[string]string{"city": "Lima"}})
	if err != nil {
		t.Fatal(err)
	}
	if tc, ok := p.Messages[0].Content.(*gomcp.TextContent); !ok || tc.Text != "What's weather in Lima?" {
		t.Errorf("args-prompt through the other replica = %+v", p.Messages[0].Content)
	}
	comp, err := cs.Complete(ctx, &gomcp.CompleteParams{Ref: &gomcp.CompleteReference{Type: "ref/prompt", Name: "completable-prompt"},
		Argument: gomcp.CompleteParamsArgument{Name: "department", Value: "M"}})
	if err != nil || strings.Join(comp.Completion.Values, ",") != "Marketing" {
		t.Errorf("completion through the other replica = %+v, %v", comp, err)
	}

	everythingUpdate(ctx, t, cs, updated, want[0])
}

// everythingOnTwoReplicas runs two replicas and the reference server as a
// stdio connector ("everything" in "ws"): the replica that owns and
// serves it, the other (which does not run it), and its id.
func everythingOnTwoReplicas(t *testing.T, js string) (owner, other *interopReplica, id int64) {
	t.Helper()
	db := storetest.NewDB(t)
	a := newInteropReplica(t, db, "interop-a")
	b := newInteropReplica(t, db, "interop-b")
	testsupport.WaitFor(t, "both replicas live", func() bool {
		return len(a.members.Live()) == 2 && len(b.members.Live()) == 2
	})
	ctx := context.Background()
	row, err := db.CreateConnector(ctx, &store.Connector{WorkspaceID: "ws", ExternalID: "everything", Name: "everything", Active: true,
		Transport: store.TransportStdio, Config: store.Config{Command: "node", Args: []string{js, "stdio"},
			ConnectTimeout: store.Duration(30 * time.Second), CallTimeout: store.Duration(60 * time.Second)}})
	if err != nil {
		t.Fatal(err)
	}
	testsupport.WaitFor(t, "one replica owns the stdio connector and serves it", func() bool {
		for _, r := range []*interopReplica{a, b} {
			if _, ok := r.owners.Owned(row.ID); ok {
				if h, err := r.reg.Health(row.ID); err == nil && h.State == registry.StateReady {
					owner = r
				}
			}
		}
		return owner != nil
	})
	other = a
	if owner == a {
		other = b
	}
	if other.reg.Has(row.ID) {
		t.Fatal("the replica that does not own the stdio connector runs it too")
	}
	return owner, other, row.ID
}

// untimed is the reference server's dynamic resource text without the time
// it was made at ("… created at 8:37:14 PM"), which differs between two
// reads a second apart.
func untimed(s string) string {
	before, _, _ := strings.Cut(s, " created at ")
	return before
}
