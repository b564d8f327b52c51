package server_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/loudskip"
	"github.com/connector-svc/connector-svc/internal/server"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

// everythingHTTP serves the reference TypeScript server over streamable
// HTTP and returns its /mcp URL; the test is skipped loudly (failed
// under CI) if it is not installed.
func everythingHTTP(t *testing.T) string {
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

// The reference server's resources, templates, prompts and completions
// through the API.
func TestResourcesOfTheReferenceServer(t *testing.T) {
	f := setup(t)
	f.create(t, "ws", mcpConnector("everything", everythingHTTP(t)))
	f.waitReady(t, "ws", "everything")
	c := f.client

	// Every resource once, in order, however it is paged.
	all, err := c.ListResources(ctx(t), &connectorv1.ListResourcesRequest{WorkspaceId: "ws", ConnectorId: "everything", PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if len(all.GetResources()) < 2 || all.GetNextPageToken() != "" || !all.GetSubscribeSupported() || all.GetListedAt() == nil {
		t.Fatalf("ListResources = %d resources, next %q, subscribe %v", len(all.GetResources()), all.GetNextPageToken(), all.GetSubscribeSupported())
	}
	var paged []string
	token := ""
	for pages := 0; ; pages++ {
		if pages > 100 {
			t.Fatal("paging does not end")
		}
		p, err := c.ListResources(ctx(t), &connectorv1.ListResourcesRequest{WorkspaceId: "ws", ConnectorId: "everything",
			PageSize: 1, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range p.GetResources() {
			paged = append(paged, r.GetUri())
		}
		if token = p.GetNextPageToken(); token == "" {
			break
		}
	}
	var want []string
	for _, r := range all.GetResources() {
		want = append(want, r.GetUri())
	}
	if !slices.Equal(paged, want) || !slices.IsSorted(want) {
		t.Errorf("paged one by one: %v; all at once: %v", paged, want)
	}
	_, err = c.ListResources(ctx(t), &connectorv1.ListResourcesRequest{WorkspaceId: "ws", ConnectorId: "everything", PageToken: "nope"})
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "page_token")

	tmpl, err := c.ListResourceTemplates(ctx(t), &connectorv1.ListResourceTemplatesRequest{WorkspaceId: "ws", ConnectorId: "everything"})
	if err != nil {
		t.Fatal(err)
	}
	var uris []string
	for _, rt := range tmpl.GetResourceTemplates() {
		uris = append(uris, rt.GetUriTemplate())
	}
	if len(uris) != 2 || !strings.Contains(strings.Join(uris, " "), "demo://resource/dynamic/blob/{") {
		t.Errorf("templates = %v", uris)
	}

	// Text, and binary as bytes.
	text, err := c.ReadResource(ctx(t), &connectorv1.ReadResourceRequest{WorkspaceId: "ws", ConnectorId: "everything", Uri: want[0]})
	if err != nil {
		t.Fatal(err)
	}
	if len(text.GetContents()) == 0 || text.GetContents()[0].GetUri() != want[0] || text.GetSizeBytes() == 0 || text.GetDuration() == nil {
		t.Errorf("read %s = %v", want[0], text)
	}
	blob, err := c.ReadResource(ctx(t), &connectorv1.ReadResourceRequest{WorkspaceId: "ws", ConnectorId: "everything",
		Uri: "demo://resource/dynamic/blob/2"})
	if err != nil {
		t.Fatal(err)
	}
	if b := blob.GetContents()[0]; len(b.GetBlob()) == 0 || b.GetMimeType() == "" || int64(len(b.GetBlob())) != blob.GetSizeBytes() {
		t.Errorf("blob = %v", blob)
	}

	// Prompts, with arguments, and an embedded resource in one.
	prompts, err := c.ListPrompts(ctx(t), &connectorv1.ListPromptsRequest{WorkspaceId: "ws", ConnectorId: "everything"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range prompts.GetPrompts() {
		names = append(names, p.GetName())
	}
	if want := []string{"args-prompt", "completable-prompt", "resource-prompt", "simple-prompt"}; !slices.Equal(names, want) {
		t.Errorf("prompts = %v, want %v", names, want)
	}
	got, err := c.GetPrompt(ctx(t), &connectorv1.GetPromptRequest{WorkspaceId: "ws", ConnectorId: "everything", Name: "args-prompt",
		Arguments: map[string]string{"city": "Lyon"}})
	if err != nil {
		t.Fatal(err)
	}
	if m := got.GetMessages(); len(m) != 1 || m[0].GetRole() != "user" || m[0].GetContent().GetText().GetText() != "What's weather in Lyon?" {
		t.Errorf("args-prompt = %v", got)
	}
	res, err := c.GetPrompt(ctx(t), &connectorv1.GetPromptRequest{WorkspaceId: "ws", ConnectorId: "everything", Name: "resource-prompt",
		Arguments: map[string]string{"resourceType": "Blob", "resourceId": "4"}})
	if err != nil {
		t.Fatal(err)
	}
	if m := res.GetMessages(); len(m) != 2 || m[1].GetContent().GetResource().GetUri() != "demo://resource/dynamic/blob/4" ||
		len(m[1].GetContent().GetResource().GetBlob()) == 0 {
		t.Errorf("resource-prompt = %v", res)
	}
	_, err = c.GetPrompt(ctx(t), &connectorv1.GetPromptRequest{WorkspaceId: "ws", ConnectorId: "everything", Name: "args-prompt"})
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "arguments")
	_, err = c.GetPrompt(ctx(t), &connectorv1.GetPromptRequest{WorkspaceId: "ws", ConnectorId: "everything", Name: "no-such-prompt"})
	wantStatus(t, err, codes.NotFound, server.ReasonPromptNotFound, "")

	// Completions narrowed by the arguments filled in.
	comp, err := c.Complete(ctx(t), &connectorv1.CompleteRequest{WorkspaceId: "ws", ConnectorId: "everything",
		PromptName: "completable-prompt", ArgumentName: "name", ContextArguments: map[string]string{"department": "Sales"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(comp.GetValues(), ","); got != "David,Eve,Frank" {
		t.Errorf("completions = %q", got)
	}
	comp, err = c.Complete(ctx(t), &connectorv1.CompleteRequest{WorkspaceId: "ws", ConnectorId: "everything",
		PromptName: "completable-prompt", ArgumentName: "department", Value: "S"})
	if err != nil || strings.Join(comp.GetValues(), ",") != "Sales,Support" {
		t.Errorf("department completions = %v, %v", comp.GetValues(), err)
	}
	_, err = c.Complete(ctx(t), &connectorv1.CompleteRequest{WorkspaceId: "ws", ConnectorId: "everything", ArgumentName: "name"})
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "prompt_name")

	// Bad URIs, refused before they reach the server; an unknown one, by it.
	for _, uri := range []string{"", "no scheme at all"} {
		_, err = c.ReadResource(ctx(t), &connectorv1.ReadResourceRequest{WorkspaceId: "ws", ConnectorId: "everything", Uri: uri})
		wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "uri")
	}
	_, err = c.ReadResource(ctx(t), &connectorv1.ReadResourceRequest{WorkspaceId: "ws", ConnectorId: "everything",
		Uri: "demo://resource/dynamic/text/not-a-number"})
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
