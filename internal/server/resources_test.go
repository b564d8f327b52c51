package server_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/loudskip"
	"github.com/connector-svc/connector-svc/internal/server"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

// everythingJS returns the reference TypeScript server's entry point; the
// test is skipped loudly (failed under CI) if it or node is missing.
func everythingJS(t *testing.T) string {
	t.Helper()
	js := os.Getenv("MCP_EVERYTHING_JS")
	if js == "" {
		js, _ = filepath.Abs("../../.tools/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js")
	}
	_, statErr := os.Stat(js)
	_, nodeErr := exec.LookPath("node")
	if statErr != nil || nodeErr != nil {
		loudskip.Skip(t, "the reference MCP server @modelcontextprotocol/server-everything is not installed at "+js+
			" (or node is missing); run scripts/install-mcp-everything.sh")
	}
	return js
}

// everythingHTTP serves the reference TypeScript server over streamable
// HTTP and returns its /mcp URL.
func everythingHTTP(t *testing.T) string {
	t.Helper()
	js := everythingJS(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := lis.Addr().(*net.TCPAddr).Port
	lis.Close()
	cmd := exec.Command("node", js, "streamableHttp")
	cmd.Env = append(os.Environ(), fmt.Sprint("PORT=", port))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	testsupport.WaitFor(t, "the reference server to listen", func() bool {
		c, err := net.DialTimeout("tcp", fmt.Sprint("127.0.0.1:", port), 100*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
}

// everythingStdio returns a stdio connector running the reference server,
// as `npx -y @modelcontextprotocol/server-everything stdio` would: the
// harness allows npx, and an npx first on PATH runs the installed server
// with node (no download). It sets PATH for the test.
func everythingStdio(t *testing.T, id string) *connectorv1.Connector {
	t.Helper()
	js := everythingJS(t)
	node, _ := exec.LookPath("node")
	node, _ = filepath.Abs(node)
	dir := t.TempDir()
	script := fmt.Sprintf("#!/bin/sh\nexec '%s' '%s' stdio\n", node, js)
	if err := os.WriteFile(filepath.Join(dir, "npx"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	return &connectorv1.Connector{ConnectorId: id, Transport: connectorv1.Transport_TRANSPORT_STDIO,
		Connection: &connectorv1.Connector_Stdio{Stdio: &connectorv1.StdioConfig{Command: "npx",
			Args: []string{"-y", "@modelcontextprotocol/server-everything", "stdio"}}},
		ApprovalPolicy: connectorv1.ApprovalPolicy_APPROVAL_POLICY_NONE}
}

// The reference server's resources, templates, prompts and completions
// through the API, over streamable HTTP and over stdio.
func TestResourcesOfTheReferenceServer(t *testing.T) {
	f := setup(t)
	f.create(t, "ws", mcpConnector("everything-http", everythingHTTP(t)))
	f.create(t, "ws", everythingStdio(t, "everything-stdio"))
	for _, id := range []string{"everything-http", "everything-stdio"} {
		t.Run(id, func(t *testing.T) {
			f.waitReady(t, "ws", id)
			referenceContents(t, f, id)
		})
	}
}

// referenceContents checks what the reference server offers through
// connector id of workspace ws.
func referenceContents(t *testing.T, f *fixture, id string) {
	c := f.client

	// Every resource once, in order, however it is paged.
	all, err := c.ListResources(ctx(t), &connectorv1.ListResourcesRequest{WorkspaceId: "ws", ConnectorId: id, PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if len(all.GetResources()) < 4 || all.GetNextPageToken() != "" || !all.GetSubscribeSupported() || all.GetListedAt() == nil {
		t.Fatalf("ListResources = %d resources, next %q, subscribe %v", len(all.GetResources()), all.GetNextPageToken(), all.GetSubscribeSupported())
	}
	var want []string
	for _, r := range all.GetResources() {
		want = append(want, r.GetUri())
	}
	for _, size := range []int32{3, 1} {
		var paged []string
		pages := 0
		for token := ""; ; {
			if pages++; pages > 100 {
				t.Fatal("paging does not end")
			}
			p, err := c.ListResources(ctx(t), &connectorv1.ListResourcesRequest{WorkspaceId: "ws", ConnectorId: id,
				PageSize: size, PageToken: token})
			if err != nil {
				t.Fatal(err)
			}
			token = p.GetNextPageToken()
			if n := len(p.GetResources()); n > int(size) || (token != "" && n != int(size)) {
				t.Errorf("page %d of size %d has %d resources (next %q)", pages, size, n, token)
			}
			for _, r := range p.GetResources() {
				paged = append(paged, r.GetUri())
			}
			if token == "" {
				break
			}
		}
		if !slices.Equal(paged, want) || !slices.IsSorted(want) {
			t.Errorf("paged by %d: %v; all at once: %v", size, paged, want)
		}
		if wantPages := (len(want) + int(size) - 1) / int(size); pages != wantPages {
			t.Errorf("%d resources paged by %d in %d pages, want %d", len(want), size, pages, wantPages)
		}
	}
	_, err = c.ListResources(ctx(t), &connectorv1.ListResourcesRequest{WorkspaceId: "ws", ConnectorId: id, PageToken: "nope"})
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "page_token")
	_, err = c.ListResources(ctx(t), &connectorv1.ListResourcesRequest{WorkspaceId: "ws", ConnectorId: id, PageSize: -1})
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "page_size")
	if over, err := c.ListResources(ctx(t), &connectorv1.ListResourcesRequest{WorkspaceId: "ws", ConnectorId: id, PageSize: 5000}); err != nil ||
		len(over.GetResources()) != len(want) {
		t.Errorf("page_size over the maximum (served as 1000) = %d resources, %v", len(over.GetResources()), err)
	}

	tmpl, err := c.ListResourceTemplates(ctx(t), &connectorv1.ListResourceTemplatesRequest{WorkspaceId: "ws", ConnectorId: id})
	if err != nil {
		t.Fatal(err)
	}
	var uris []string
	for _, rt := range tmpl.GetResourceTemplates() {
		uris = append(uris, rt.GetUriTemplate())
	}
	if want := []string{"demo://resource/dynamic/blob/{resourceId}", "demo://resource/dynamic/text/{resourceId}"}; !slices.Equal(uris, want) {
		t.Errorf("templates = %v, want %v", uris, want)
	}

	// Text, and binary as bytes.
	text, err := c.ReadResource(ctx(t), &connectorv1.ReadResourceRequest{WorkspaceId: "ws", ConnectorId: id, Uri: want[0]})
	if err != nil {
		t.Fatal(err)
	}
	if len(text.GetContents()) == 0 || text.GetContents()[0].GetUri() != want[0] || text.GetSizeBytes() == 0 || text.GetDuration() == nil {
		t.Errorf("read %s = %v", want[0], text)
	}
	dyn, err := c.ReadResource(ctx(t), &connectorv1.ReadResourceRequest{WorkspaceId: "ws", ConnectorId: id,
		Uri: "demo://resource/dynamic/text/1"})
	if err != nil || !strings.HasPrefix(dyn.GetContents()[0].GetText(), "Resource 1: This is a plaintext resource") {
		t.Errorf("text/1 = %v, %v", dyn, err)
	}
	blob, err := c.ReadResource(ctx(t), &connectorv1.ReadResourceRequest{WorkspaceId: "ws", ConnectorId: id,
		Uri: "demo://resource/dynamic/blob/1"})
	if err != nil {
		t.Fatal(err)
	}
	if b := blob.GetContents()[0]; !strings.HasPrefix(string(b.GetBlob()), "Resource 1: This is a base64 blob created at") ||
		b.GetText() != "" || b.GetMimeType() == "" || int64(len(b.GetBlob())) != blob.GetSizeBytes() {
		t.Errorf("blob/1 = %v (blob %q)", blob, b.GetBlob())
	}

	// Prompts, with arguments, and an embedded resource in one.
	prompts, err := c.ListPrompts(ctx(t), &connectorv1.ListPromptsRequest{WorkspaceId: "ws", ConnectorId: id})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	required := map[string][]string{}
	for _, p := range prompts.GetPrompts() {
		names = append(names, p.GetName())
		for _, a := range p.GetArguments() {
			if a.GetRequired() {
				required[p.GetName()] = append(required[p.GetName()], a.GetName())
			}
		}
	}
	if want := []string{"args-prompt", "completable-prompt", "resource-prompt", "simple-prompt"}; !slices.Equal(names, want) {
		t.Errorf("prompts = %v, want %v", names, want)
	}
	if got := required["args-prompt"]; !slices.Equal(got, []string{"city"}) {
		t.Errorf("args-prompt's required arguments = %v, want [city]", got)
	}
	got, err := c.GetPrompt(ctx(t), &connectorv1.GetPromptRequest{WorkspaceId: "ws", ConnectorId: id, Name: "args-prompt",
		Arguments: map[string]string{"city": "Lyon"}})
	if err != nil {
		t.Fatal(err)
	}
	if m := got.GetMessages(); len(m) != 1 || m[0].GetRole() != "user" || m[0].GetContent().GetText().GetText() != "What's weather in Lyon?" {
		t.Errorf("args-prompt = %v", got)
	}
	res, err := c.GetPrompt(ctx(t), &connectorv1.GetPromptRequest{WorkspaceId: "ws", ConnectorId: id, Name: "resource-prompt",
		Arguments: map[string]string{"resourceType": "Blob", "resourceId": "4"}})
	if err != nil {
		t.Fatal(err)
	}
	if m := res.GetMessages(); len(m) != 2 || m[1].GetContent().GetResource().GetUri() != "demo://resource/dynamic/blob/4" ||
		!strings.HasPrefix(string(m[1].GetContent().GetResource().GetBlob()), "Resource 4: This is a base64 blob") {
		t.Errorf("resource-prompt = %v", res)
	}
	_, err = c.GetPrompt(ctx(t), &connectorv1.GetPromptRequest{WorkspaceId: "ws", ConnectorId: id, Name: "args-prompt"})
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "arguments")
	if msg := status.Convert(err).Message(); !strings.Contains(msg, "city") {
		t.Errorf("a missing argument: %q does not name city", msg)
	}
	_, err = c.GetPrompt(ctx(t), &connectorv1.GetPromptRequest{WorkspaceId: "ws", ConnectorId: id, Name: "no-such-prompt"})
	wantStatus(t, err, codes.NotFound, server.ReasonPromptNotFound, "")
	_, err = c.GetPrompt(ctx(t), &connectorv1.GetPromptRequest{WorkspaceId: "ws", ConnectorId: id})
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "name")

	// Completions narrowed by the arguments filled in.
	comp, err := c.Complete(ctx(t), &connectorv1.CompleteRequest{WorkspaceId: "ws", ConnectorId: id,
		PromptName: "completable-prompt", ArgumentName: "name", ContextArguments: map[string]string{"department": "Sales"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(comp.GetValues(), ","); got != "David,Eve,Frank" {
		t.Errorf("completions = %q", got)
	}
	comp, err = c.Complete(ctx(t), &connectorv1.CompleteRequest{WorkspaceId: "ws", ConnectorId: id,
		PromptName: "completable-prompt", ArgumentName: "department", Value: "S"})
	if err != nil || strings.Join(comp.GetValues(), ",") != "Sales,Support" {
		t.Errorf("department completions = %v, %v", comp.GetValues(), err)
	}
	comp, err = c.Complete(ctx(t), &connectorv1.CompleteRequest{WorkspaceId: "ws", ConnectorId: id,
		ResourceTemplateUri: "demo://resource/dynamic/text/{resourceId}", ArgumentName: "resourceId", Value: "1"})
	if err != nil || !slices.Contains(comp.GetValues(), "1") {
		t.Errorf("resourceId completions = %v, %v", comp.GetValues(), err)
	}
	_, err = c.Complete(ctx(t), &connectorv1.CompleteRequest{WorkspaceId: "ws", ConnectorId: id, ArgumentName: "name"})
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "prompt_name")

	// Bad URIs, refused before they reach the server; an unknown one, by it.
	for _, uri := range []string{"", "no scheme at all"} {
		_, err = c.ReadResource(ctx(t), &connectorv1.ReadResourceRequest{WorkspaceId: "ws", ConnectorId: id, Uri: uri})
		wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "uri")
	}
	_, err = c.ReadResource(ctx(t), &connectorv1.ReadResourceRequest{WorkspaceId: "ws", ConnectorId: id,
		Uri: "demo://resource/no-such-kind/1"})
	if code := statusCode(err); code != codes.NotFound && code != codes.FailedPrecondition {
		t.Errorf("an unknown resource: %v", err)
	}
}

// An mcp-go server's resources: an image in a prompt, reads over the cap
// refused; a tools-only server says it has no resources.
func TestResourcesOfAnMCPGoServer(t *testing.T) {
	f := setup(t)
	m := mcpserver.NewMCPServer("contents", "1", mcpserver.WithResourceCapabilities(false, true), mcpserver.WithPromptCapabilities(true))
	m.AddTool(mcp.NewTool("noop"), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("ok"), nil
	})
	sized := func(n int) mcpserver.ResourceHandlerFunc {
		return func(_ context.Context, req mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
			return []mcp.ResourceContents{mcp.TextResourceContents{URI: req.Params.URI, MIMEType: "text/plain", Text: strings.Repeat("x", n)}}, nil
		}
	}
	m.AddResource(mcp.NewResource("mem://small", "small"), sized(10))
	m.AddResource(mcp.NewResource("mem://over-the-cap", "over"), sized(server.DefaultMaxToolResultBytes+1))
	m.AddResource(mcp.NewResource("mem://huge", "huge"), sized(8<<20)) // over the registry's message limit too
	png := base64.StdEncoding.EncodeToString([]byte("\x89PNG fake"))
	m.AddPrompt(mcp.NewPrompt("picture"), func(context.Context, mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		return mcp.NewGetPromptResult("a picture", []mcp.PromptMessage{
			mcp.NewPromptMessage(mcp.RoleUser, mcp.NewImageContent(png, "image/png"))}), nil
	})
	srv := httptest.NewServer(mcpserver.NewStreamableHTTPServer(m))
	t.Cleanup(srv.Close)
	f.create(t, "ws", mcpConnector("m", srv.URL+"/mcp"))
	f.waitReady(t, "ws", "m")

	small, err := f.client.ReadResource(ctx(t), &connectorv1.ReadResourceRequest{WorkspaceId: "ws", ConnectorId: "m", Uri: "mem://small"})
	if err != nil || small.GetContents()[0].GetText() != "xxxxxxxxxx" {
		t.Fatalf("small = %v, %v", small, err)
	}
	for _, uri := range []string{"mem://over-the-cap", "mem://huge"} {
		_, err := f.client.ReadResource(ctx(t), &connectorv1.ReadResourceRequest{WorkspaceId: "ws", ConnectorId: "m", Uri: uri})
		wantStatus(t, err, codes.ResourceExhausted, server.ReasonToolResultTooLarge, "")
	}
	// The session goes on after the refusals.
	if _, err := f.client.ReadResource(ctx(t), &connectorv1.ReadResourceRequest{WorkspaceId: "ws", ConnectorId: "m", Uri: "mem://small"}); err != nil {
		t.Fatal(err)
	}
	p, err := f.client.GetPrompt(ctx(t), &connectorv1.GetPromptRequest{WorkspaceId: "ws", ConnectorId: "m", Name: "picture"})
	if err != nil {
		t.Fatal(err)
	}
	if img := p.GetMessages()[0].GetContent().GetImage(); img.GetMimeType() != "image/png" || string(img.GetData()) != "\x89PNG fake" {
		t.Errorf("image = %v", p)
	}
	_, err = f.client.Complete(ctx(t), &connectorv1.CompleteRequest{WorkspaceId: "ws", ConnectorId: "m", PromptName: "picture", ArgumentName: "a"})
	wantStatus(t, err, codes.FailedPrecondition, server.ReasonNoCompletions, "")

	// A server with tools only.
	tools := newTestMCP(t)
	f.create(t, "ws", mcpConnector("tools-only", tools.url()))
	f.waitReady(t, "ws", "tools-only")
	_, err = f.client.ListResources(ctx(t), &connectorv1.ListResourcesRequest{WorkspaceId: "ws", ConnectorId: "tools-only"})
	wantStatus(t, err, codes.FailedPrecondition, server.ReasonNoResources, "")
	_, err = f.client.ListPrompts(ctx(t), &connectorv1.ListPromptsRequest{WorkspaceId: "ws", ConnectorId: "tools-only"})
	wantStatus(t, err, codes.FailedPrecondition, server.ReasonNoPrompts, "")
	_, err = f.client.ReadResource(ctx(t), &connectorv1.ReadResourceRequest{WorkspaceId: "ws", ConnectorId: "tools-only", Uri: "mem://small"})
	wantStatus(t, err, codes.FailedPrecondition, server.ReasonNoResources, "")
	_, err = f.client.ListResources(ctx(t), &connectorv1.ListResourcesRequest{WorkspaceId: "ws", ConnectorId: "nope"})
	wantStatus(t, err, codes.NotFound, server.ReasonConnectorNotFound, "")
}

// A resource added at the server is listed once it says its list changed.
func TestResourceListFollowsTheServer(t *testing.T) {
	f := setup(t)
	m := mcpserver.NewMCPServer("contents", "1", mcpserver.WithResourceCapabilities(false, true))
	m.AddTool(mcp.NewTool("noop"), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("ok"), nil
	})
	read := func(_ context.Context, req mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
		return []mcp.ResourceContents{mcp.TextResourceContents{URI: req.Params.URI, Text: "hi"}}, nil
	}
	m.AddResource(mcp.NewResource("mem://a", "a"), read)
	srv := httptest.NewServer(mcpserver.NewStreamableHTTPServer(m))
	t.Cleanup(srv.Close)
	f.create(t, "ws", mcpConnector("m", srv.URL+"/mcp"))
	f.waitReady(t, "ws", "m")
	count := func(refresh bool) int {
		r, err := f.client.ListResources(ctx(t), &connectorv1.ListResourcesRequest{WorkspaceId: "ws", ConnectorId: "m", Refresh: refresh})
		if err != nil {
			t.Fatal(err)
		}
		return len(r.GetResources())
	}
	if n := count(false); n != 1 {
		t.Fatalf("%d resources", n)
	}
	m.AddResource(mcp.NewResource("mem://b", "b"), read)
	// mcp-go's server sends list_changed to sessions it has a stream to;
	// refresh lists now in any case.
	if n := count(true); n != 2 {
		t.Errorf("after refresh: %d resources, want 2", n)
	}
}

func statusCode(err error) codes.Code { return status.Code(err) }

// countingListener counts the bytes its connections wrote, and keeps each
// connection's send buffer small, so that what a peer stops reading
// stays unsent rather than piling up in the kernel.
type countingListener struct {
	net.Listener
	written *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(64 << 10)
	}
	return countingConn{Conn: c, written: l.written}, nil
}

type countingConn struct {
	net.Conn
	written *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.written.Add(int64(n))
	return n, err
}

// Reads and prompts over MAX_TOOL_RESULT_BYTES are refused: one the
// registry reads whole (under its message limit, about twice the cap) and
// the service measures, and one far over that limit, which the registry
// stops reading: the server could send no more than a fraction of it.
// The connection goes on.
func TestResourceReadsOverTheCap(t *testing.T) {
	const limit = 64 << 10
	const huge = 48 << 20 // the registry's message limit is 2*limit + 1 MiB
	f := setup(t, options{maxResultBytes: limit})
	m := mcpserver.NewMCPServer("capped", "1", mcpserver.WithResourceCapabilities(false, false), mcpserver.WithPromptCapabilities(false))
	m.AddTool(mcp.NewTool("noop"), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("ok"), nil
	})
	sized := func(n int) mcpserver.ResourceHandlerFunc {
		return func(_ context.Context, req mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
			return []mcp.ResourceContents{mcp.TextResourceContents{URI: req.Params.URI, MIMEType: "text/plain", Text: strings.Repeat("x", n)}}, nil
		}
	}
	m.AddResource(mcp.NewResource("mem://fits", "fits"), sized(limit))
	m.AddResource(mcp.NewResource("mem://over", "over"), sized(limit+1))
	m.AddResource(mcp.NewResource("mem://huge", "huge"), sized(huge))
	blob := base64.StdEncoding.EncodeToString(make([]byte, limit+1))
	m.AddResource(mcp.NewResource("mem://blob-over", "blob"), func(_ context.Context, req mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
		return []mcp.ResourceContents{mcp.BlobResourceContents{URI: req.Params.URI, MIMEType: "application/octet-stream", Blob: blob}}, nil
	})
	m.AddPrompt(mcp.NewPrompt("long"), func(context.Context, mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		return mcp.NewGetPromptResult("long", []mcp.PromptMessage{
			mcp.NewPromptMessage(mcp.RoleUser, mcp.NewTextContent(strings.Repeat("y", limit+1)))}), nil
	})
	var written, inFlight atomic.Int64
	h := mcpserver.NewStreamableHTTPServer(m)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inFlight.Add(1)
		defer inFlight.Add(-1)
		h.ServeHTTP(w, r)
	}))
	srv.Listener = countingListener{Listener: srv.Listener, written: &written}
	srv.Start()
	t.Cleanup(srv.Close)
	f.create(t, "ws", mcpConnector("m", srv.URL+"/mcp"))
	f.waitReady(t, "ws", "m")
	read := func(uri string) (*connectorv1.ReadResourceResponse, error) {
		return f.client.ReadResource(ctx(t), &connectorv1.ReadResourceRequest{WorkspaceId: "ws", ConnectorId: "m", Uri: uri})
	}

	fits, err := read("mem://fits")
	if err != nil || fits.GetSizeBytes() != limit || len(fits.GetContents()[0].GetText()) != limit {
		t.Fatalf("a read of exactly the cap = %d bytes, %v", fits.GetSizeBytes(), err)
	}
	for _, uri := range []string{"mem://over", "mem://blob-over"} {
		_, err = read(uri)
		wantStatus(t, err, codes.ResourceExhausted, server.ReasonToolResultTooLarge, "")
		if msg := status.Convert(err).Message(); !strings.Contains(msg, fmt.Sprint(limit)) || !strings.Contains(msg, "resource") {
			t.Errorf("%s: %q names neither the cap nor a resource", uri, msg)
		}
	}
	_, err = f.client.GetPrompt(ctx(t), &connectorv1.GetPromptRequest{WorkspaceId: "ws", ConnectorId: "m", Name: "long"})
	wantStatus(t, err, codes.ResourceExhausted, server.ReasonToolResultTooLarge, "")

	before := written.Load()
	_, err = read("mem://huge")
	wantStatus(t, err, codes.ResourceExhausted, server.ReasonToolResultTooLarge, "")
	testsupport.WaitFor(t, "the server's handler of the huge read to end", func() bool { return inFlight.Load() == 0 })
	sent := written.Load() - before
	t.Logf("the server sent %.1f MiB of a %d MiB resource before the registry stopped reading", float64(sent)/(1<<20), huge>>20)
	if sent > huge/3 {
		t.Errorf("the server sent %d bytes of a %d-byte resource: the registry read on past its limit", sent, huge)
	}

	// The connection goes on.
	if again, err := read("mem://fits"); err != nil || again.GetSizeBytes() != limit {
		t.Fatalf("a read after the refusals = %v, %v", again.GetSizeBytes(), err)
	}
}

// The resource RPCs are for keys of scope call, which query and admin
// imply; a key of scope users alone, or of another workspace, is refused.
func TestResourcesScopes(t *testing.T) {
	f := setup(t, options{auth: auth.ModeAuto})
	m := mcpserver.NewMCPServer("contents", "1", mcpserver.WithResourceCapabilities(false, false), mcpserver.WithPromptCapabilities(false))
	m.AddTool(mcp.NewTool("noop"), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("ok"), nil
	})
	m.AddResource(mcp.NewResource("mem://a", "a"), func(_ context.Context, req mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
		return []mcp.ResourceContents{mcp.TextResourceContents{URI: req.Params.URI, Text: "hi"}}, nil
	})
	m.AddPrompt(mcp.NewPrompt("p"), func(context.Context, mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		return mcp.NewGetPromptResult("p", []mcp.PromptMessage{mcp.NewPromptMessage(mcp.RoleUser, mcp.NewTextContent("hello"))}), nil
	})
	srv := httptest.NewServer(mcpserver.NewStreamableHTTPServer(m))
	t.Cleanup(srv.Close)
	f.create(t, "ws", mcpConnector("m", srv.URL+"/mcp")) // before the first key: auth is still off
	f.waitReady(t, "ws", "m")
	admin := f.createKey(t, "", "ws", scopeAdmin).GetToken()
	keys := map[string]string{"admin": admin,
		"query": f.createKey(t, admin, "ws", scopeQuery).GetToken(),
		"call":  f.createKey(t, admin, "ws", connectorv1.ApiKeyScope_API_KEY_SCOPE_CALL).GetToken(),
		"users": f.createKey(t, admin, "ws", connectorv1.ApiKeyScope_API_KEY_SCOPE_USERS).GetToken()}
	_, other, err := f.keys.Create(ctx(t), "other", []auth.Scope{auth.ScopeAdmin}, "")
	if err != nil {
		t.Fatal(err)
	}
	keys["other workspace"] = other
	rpcs := map[string]func(context.Context) error{
		"ListResources": func(c context.Context) error {
			_, err := f.client.ListResources(c, &connectorv1.ListResourcesRequest{WorkspaceId: "ws", ConnectorId: "m"})
			return err
		},
		"ListResourceTemplates": func(c context.Context) error {
			_, err := f.client.ListResourceTemplates(c, &connectorv1.ListResourceTemplatesRequest{WorkspaceId: "ws", ConnectorId: "m"})
			return err
		},
		"ReadResource": func(c context.Context) error {
			_, err := f.client.ReadResource(c, &connectorv1.ReadResourceRequest{WorkspaceId: "ws", ConnectorId: "m", Uri: "mem://a"})
			return err
		},
		"ListPrompts": func(c context.Context) error {
			_, err := f.client.ListPrompts(c, &connectorv1.ListPromptsRequest{WorkspaceId: "ws", ConnectorId: "m"})
			return err
		},
		"GetPrompt": func(c context.Context) error {
			_, err := f.client.GetPrompt(c, &connectorv1.GetPromptRequest{WorkspaceId: "ws", ConnectorId: "m", Name: "p"})
			return err
		},
		"Complete": func(c context.Context) error {
			_, err := f.client.Complete(c, &connectorv1.CompleteRequest{WorkspaceId: "ws", ConnectorId: "m", PromptName: "p", ArgumentName: "a"})
			if status.Code(err) == codes.FailedPrecondition {
				return nil // past the guard: the server offers no completions
			}
			return err
		},
	}
	for rpc, call := range rpcs {
		for name, token := range keys {
			err := call(bearer(ctx(t), token))
			switch name {
			case "users":
				if status.Code(err) != codes.PermissionDenied || !strings.Contains(fmt.Sprint(status.Convert(err).Details()), auth.ReasonScopeMissing) {
					t.Errorf("%s with a users key: %v, want PERMISSION_DENIED %s", rpc, err, auth.ReasonScopeMissing)
				}
			case "other workspace":
				if status.Code(err) != codes.PermissionDenied || !strings.Contains(fmt.Sprint(status.Convert(err).Details()), auth.ReasonWrongWorkspace) {
					t.Errorf("%s with another workspace's key: %v, want PERMISSION_DENIED %s", rpc, err, auth.ReasonWrongWorkspace)
				}
			default:
				if err != nil {
					t.Errorf("%s with a %s key: %v", rpc, name, err)
				}
			}
		}
		if err := call(ctx(t)); status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s without a key: %v, want UNAUTHENTICATED", rpc, err)
		}
	}
}
