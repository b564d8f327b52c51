package resources_test

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/connector-svc/connector-svc/internal/calls"
	"github.com/connector-svc/connector-svc/internal/live/livetest"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/resources"
	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

func TestMain(m *testing.M) { storetest.Main(m) }

// limit is the Service's MaxResultBytes in these tests.
const limit = 1024

// contentsServer serves a real mcp-go server over streamable HTTP: text
// and binary resources (one over limit), a template, a prompt with a
// required argument and one with an image; no completions. With tools
// only, it offers nothing else.
func contentsServer(t *testing.T, toolsOnly bool) string {
	t.Helper()
	opts := []mcpserver.ServerOption{mcpserver.WithToolCapabilities(false)}
	if !toolsOnly {
		opts = append(opts, mcpserver.WithResourceCapabilities(false, false), mcpserver.WithPromptCapabilities(false))
	}
	m := mcpserver.NewMCPServer("contents", "1", opts...)
	m.AddTool(mcp.NewTool("noop"), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("ok"), nil
	})
	if !toolsOnly {
		text := func(n int) mcpserver.ResourceHandlerFunc {
			return func(_ context.Context, req mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
				return []mcp.ResourceContents{mcp.TextResourceContents{URI: req.Params.URI, MIMEType: "text/plain", Text: strings.Repeat("t", n)}}, nil
			}
		}
		m.AddResource(mcp.NewResource("mem://b-text", "text"), text(10))
		m.AddResource(mcp.NewResource("mem://c-over", "over"), text(limit+1))
		m.AddResource(mcp.NewResource("mem://a-blob", "blob"), func(_ context.Context, req mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
			return []mcp.ResourceContents{mcp.BlobResourceContents{URI: req.Params.URI, MIMEType: "application/octet-stream",
				Blob: base64.StdEncoding.EncodeToString([]byte{0, 1, 2, 3, 4})}}, nil
		})
		m.AddResourceTemplate(mcp.NewResourceTemplate("mem://items/{id}", "item"), func(_ context.Context, req mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
			return []mcp.ResourceContents{mcp.TextResourceContents{URI: req.Params.URI, Text: "item"}}, nil
		})
		m.AddPrompt(mcp.NewPrompt("greet", mcp.WithArgument("name", mcp.RequiredArgument()), mcp.WithArgument("tone")),
			func(_ context.Context, req mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
				return mcp.NewGetPromptResult("greet", []mcp.PromptMessage{
					mcp.NewPromptMessage(mcp.RoleUser, mcp.NewTextContent("Hello, "+req.Params.Arguments["name"]))}), nil
			})
		m.AddPrompt(mcp.NewPrompt("picture"), func(context.Context, mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			return mcp.NewGetPromptResult("a picture", []mcp.PromptMessage{mcp.NewPromptMessage(mcp.RoleUser,
				mcp.NewImageContent(base64.StdEncoding.EncodeToString(make([]byte, limit+1)), "image/png"))}), nil
		})
	}
	hs := httptest.NewServer(mcpserver.NewStreamableHTTPServer(m))
	t.Cleanup(hs.Close)
	return hs.URL + "/mcp"
}

// setup runs the live state of connectors "c" (contentsServer) and
// "tools" (tools only) of workspace "ws" on a real Postgres, and a
// Service over it once both are callable.
func setup(t *testing.T) *resources.Service {
	t.Helper()
	db := storetest.NewDB(t)
	reg, lv := livetest.Run(t, db)
	ctx := context.Background()
	c := calls.New(calls.Deps{Registry: reg, Live: lv, Store: db})
	for id, url := range map[string]string{"c": contentsServer(t, false), "tools": contentsServer(t, true)} {
		row, err := db.CreateConnector(ctx, &store.Connector{WorkspaceID: "ws", ExternalID: id, Name: id, Active: true,
			Transport: store.TransportStreamableHTTP, Config: store.Config{URL: url, CallTimeout: store.Duration(20 * time.Second)}})
		if err != nil {
			t.Fatal(err)
		}
		lv.Apply(ctx, row)
	}
	svc := resources.New(resources.Deps{Registry: reg, Calls: c, MaxResultBytes: limit})
	deadline := time.Now().Add(20 * time.Second)
	for _, id := range []string{"c", "tools"} {
		for {
			_, err := svc.Contents(ctx, resources.Target{WorkspaceID: "ws", ConnectorID: id}, false)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("connector %s not ready within 20s: %v", id, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return svc
}

// The use case called directly: lists, reads and prompts with their sizes
// capped, completions, and each typed error.
func TestService(t *testing.T) {
	svc := setup(t)
	ctx := context.Background()
	c := resources.Target{WorkspaceID: "ws", ConnectorID: "c"}

	k, err := svc.Resources(ctx, c, false)
	if err != nil {
		t.Fatal(err)
	}
	var uris []string
	for _, r := range k.Resources {
		uris = append(uris, r.URI)
	}
	slices.Sort(uris)
	if want := []string{"mem://a-blob", "mem://b-text", "mem://c-over"}; !slices.Equal(uris, want) || len(k.Templates) != 1 || !k.Caps.Resources {
		t.Errorf("resources %v, %d templates, caps %+v; want %v and 1 template", uris, len(k.Templates), k.Caps, want)
	}

	blob, err := svc.Read(ctx, c, "mem://a-blob")
	if err != nil {
		t.Fatal(err)
	}
	if b, ok := blob.Contents[0].(mcp.BlobResourceContents); !ok || blob.Bytes != 5 || b.MIMEType != "application/octet-stream" {
		t.Errorf("blob read = %+v, %d bytes", blob.Contents, blob.Bytes)
	}
	if text, err := svc.Read(ctx, c, "mem://b-text"); err != nil || text.Bytes != 10 {
		t.Errorf("text read = %v, %v", text, err)
	}
	if item, err := svc.Read(ctx, c, "mem://items/7"); err != nil || item.Contents[0].(mcp.TextResourceContents).URI != "mem://items/7" {
		t.Errorf("templated read = %v, %v", item, err)
	}
	_, err = svc.Read(ctx, c, "mem://c-over")
	var tooLarge *calls.ResultTooLargeError
	if !errors.As(err, &tooLarge) || tooLarge.Size != limit+1 || tooLarge.Limit != limit || tooLarge.What != "resource" {
		t.Errorf("a read over the cap: %v (%+v)", err, tooLarge)
	}
	for _, uri := range []string{"", "no-scheme", strings.Repeat("x", resources.MaxURIBytes+1), "mem://\xff"} {
		_, err := svc.Read(ctx, c, uri)
		var inv *resources.InvalidError
		if !errors.As(err, &inv) || inv.Field != "uri" {
			t.Errorf("Read(%.20q) = %v, want an InvalidError of uri", uri, err)
		}
	}
	_, err = svc.Read(ctx, c, "mem://not-there")
	var refused *resources.ServerError
	if !errors.As(err, &refused) {
		t.Errorf("an unknown resource: %v, want the server's refusal", err)
	}

	p, err := svc.GetPrompt(ctx, c, "greet", map[string]string{"name": "Ada"})
	if err != nil {
		t.Fatal(err)
	}
	if tc, ok := p.Messages[0].Content.(mcp.TextContent); !ok || tc.Text != "Hello, Ada" {
		t.Errorf("greet = %+v", p.Messages)
	}
	_, err = svc.GetPrompt(ctx, c, "greet", map[string]string{"tone": "warm"})
	var missing *resources.MissingArgumentsError
	if !errors.As(err, &missing) || !slices.Equal(missing.Missing, []string{"name"}) || !strings.Contains(err.Error(), "name") {
		t.Errorf("greet without its name: %v", err)
	}
	_, err = svc.GetPrompt(ctx, c, "nope", nil)
	var unknown *resources.UnknownPromptError
	if !errors.As(err, &unknown) || unknown.Name != "nope" {
		t.Errorf("an unknown prompt: %v", err)
	}
	_, err = svc.GetPrompt(ctx, c, "picture", nil)
	if !errors.As(err, &tooLarge) || tooLarge.What != "prompt" || tooLarge.Size != limit+1 {
		t.Errorf("a prompt over the cap: %v", err)
	}
	_, err = svc.Complete(ctx, c, registry.CompleteRequest{Prompt: "greet", Argument: "name"})
	if !errors.Is(err, resources.ErrNoCompletions) {
		t.Errorf("completions of a server without them: %v", err)
	}
	var inv *resources.InvalidError
	if _, err := svc.Complete(ctx, c, registry.CompleteRequest{Argument: "name"}); !errors.As(err, &inv) || inv.Field != "ref" {
		t.Errorf("a completion of nothing: %v", err)
	}

	tools := resources.Target{WorkspaceID: "ws", ConnectorID: "tools"}
	if _, err := svc.Resources(ctx, tools, false); !errors.Is(err, resources.ErrNoResources) {
		t.Errorf("resources of a tools-only server: %v", err)
	}
	if _, err := svc.Prompts(ctx, tools, false); !errors.Is(err, resources.ErrNoPrompts) {
		t.Errorf("prompts of a tools-only server: %v", err)
	}
	if _, err := svc.Read(ctx, tools, "mem://b-text"); !errors.Is(err, resources.ErrNoResources) {
		t.Errorf("a read of a tools-only server: %v", err)
	}
	if _, err := svc.Resources(ctx, resources.Target{WorkspaceID: "ws", ConnectorID: "missing"}, false); err == nil {
		t.Error("resources of a connector that does not exist: no error")
	}
}

// Page goes through a list in key order, each item once, whatever the
// list's own order; a token whose item is gone goes on after it.
func TestPage(t *testing.T) {
	items := []string{"d", "a", "e", "c", "b"}
	key := func(s string) string { return s }
	var got []string
	pages := 0
	for token := ""; ; {
		page, next := resources.Page(items, key, token, 2)
		pages++
		got = append(got, page...)
		if next == "" {
			break
		}
		token = next
	}
	if !slices.Equal(got, []string{"a", "b", "c", "d", "e"}) || pages != 3 {
		t.Errorf("paged by 2: %v in %d pages", got, pages)
	}
	if page, next := resources.Page([]string{"a", "c", "d"}, key, "b", 1); !slices.Equal(page, []string{"c"}) || next != "c" {
		t.Errorf("after a removed key: %v, next %q", page, next)
	}
	if page, next := resources.Page(items, key, "e", 2); len(page) != 0 || next != "" {
		t.Errorf("after the last: %v, next %q", page, next)
	}
	if !slices.Equal(items, []string{"d", "a", "e", "c", "b"}) {
		t.Errorf("Page reordered its input: %v", items)
	}
}
