package mcpserve_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/connector-svc/connector-svc/internal/store"
)

// docsServer is an mcp-go server with more resources than one of its
// pages holds, a blob, a template, a prompt whose messages carry an image
// and an embedded resource, and completions.
type docsServer struct{ blob []byte }

func (d *docsServer) CompletePromptArgument(_ context.Context, prompt string, arg mcp.CompleteArgument, _ mcp.CompleteContext) (*mcp.Completion, error) {
	if prompt != "greet" || arg.Name != "name" {
		return nil, fmt.Errorf("nothing completes %s's %s", prompt, arg.Name)
	}
	var out []string
	for _, v := range []string{"Ada", "Alan", "Grace"} {
		if strings.HasPrefix(v, arg.Value) {
			out = append(out, v)
		}
	}
	return &mcp.Completion{Values: out, Total: len(out)}, nil
}

// greetMessages are the greet prompt's messages for name.
func (d *docsServer) greetMessages(name string) []mcp.PromptMessage {
	return []mcp.PromptMessage{
		mcp.NewPromptMessage(mcp.RoleUser, mcp.NewTextContent("Hello "+name)),
		mcp.NewPromptMessage(mcp.RoleAssistant, mcp.NewImageContent(base64.StdEncoding.EncodeToString(d.blob[:16]), "image/png")),
		mcp.NewPromptMessage(mcp.RoleUser, mcp.NewEmbeddedResource(mcp.TextResourceContents{URI: "up://doc/007", MIMEType: "text/plain", Text: "doc 7"})),
	}
}

func newDocsServer(t *testing.T) (*docsServer, string) {
	d := &docsServer{blob: make([]byte, 256)}
	for i := range d.blob {
		d.blob[i] = byte(255 - i)
	}
	s := mcpserver.NewMCPServer("docs", "1.0", mcpserver.WithResourceCapabilities(true, true), mcpserver.WithPromptCapabilities(true),
		mcpserver.WithCompletions(), mcpserver.WithPromptCompletionProvider(d), mcpserver.WithPaginationLimit(50),
		mcpserver.WithToolCapabilities(true))
	s.AddTool(mcp.NewTool("noop"), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("ok"), nil
	})
	for i := range 120 {
		uri := fmt.Sprintf("up://doc/%03d", i)
		s.AddResource(mcp.NewResource(uri, fmt.Sprintf("doc-%03d", i), mcp.WithMIMEType("text/plain"), mcp.WithResourceDescription("doc number")),
			func(context.Context, mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
				return []mcp.ResourceContents{mcp.TextResourceContents{URI: uri, MIMEType: "text/plain", Text: fmt.Sprintf("doc %d", i)}}, nil
			})
	}
	s.AddResource(mcp.NewResource("up://bin", "bin", mcp.WithMIMEType("application/octet-stream")),
		func(context.Context, mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
			return []mcp.ResourceContents{mcp.BlobResourceContents{URI: "up://bin", MIMEType: "application/octet-stream",
				Blob: base64.StdEncoding.EncodeToString(d.blob)}}, nil
		})
	s.AddResourceTemplate(mcp.NewResourceTemplate("up://item/{id}", "item", mcp.WithTemplateMIMEType("text/plain")),
		func(_ context.Context, req mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
			id := strings.TrimPrefix(req.Params.URI, "up://item/")
			return []mcp.ResourceContents{mcp.TextResourceContents{URI: req.Params.URI, MIMEType: "text/plain", Text: "item " + id}}, nil
		})
	s.AddPrompt(mcp.NewPrompt("greet", mcp.WithPromptDescription("greets"), mcp.WithArgument("name", mcp.RequiredArgument())),
		func(_ context.Context, req mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			return mcp.NewGetPromptResult("a greeting", d.greetMessages(req.Params.Arguments["name"])), nil
		})
	hs := httptest.NewServer(mcpserver.NewStreamableHTTPServer(s))
	t.Cleanup(hs.Close)
	return d, hs.URL + "/mcp"
}

// An mcp-go server's resources (over several of its pages), blob,
// template, prompt and completions pass through a connector's endpoint
// unchanged, to mcp-go's client of either generation; the workspace
// endpoint federates them; unknown uris and prompts get the spec's codes.
func TestContentsMCPGoServer(t *testing.T) {
	e := newEnv(t, false, nil)
	d, url := newDocsServer(t)
	e.add(t, "docs", store.Config{URL: url, CallTimeout: store.Duration(20 * time.Second)})
	for _, g := range generations {
		t.Run(g.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c := connect(t, e.url+"/mcp/ws/docs", nil, g.opts...)
			caps := c.GetServerCapabilities()
			if caps.Resources == nil || caps.Prompts == nil || caps.Completions == nil {
				t.Fatalf("capabilities = %+v; want resources, prompts, completions", caps)
			}
			if tools := connect(t, e.url+"/mcp/ws/alpha", nil, g.opts...).GetServerCapabilities(); tools.Resources != nil || tools.Prompts != nil {
				t.Errorf("a tools-only connector's endpoint declares %+v", tools)
			}

			// Every page of the server's list, items unchanged.
			var all []mcp.Resource
			var cursor mcp.Cursor
			for {
				r, err := c.ListResources(ctx, mcp.ListResourcesRequest{PaginatedRequest: mcp.PaginatedRequest{
					Params: mcp.PaginatedParams{Cursor: cursor}}})
				if err != nil {
					t.Fatal(err)
				}
				all = append(all, r.Resources...)
				if cursor = r.NextCursor; cursor == "" {
					break
				}
			}
			if len(all) != 121 {
				t.Fatalf("%d resources through the endpoint, the server has 121", len(all))
			}
			seen := map[string]mcp.Resource{}
			for _, r := range all {
				seen[r.URI] = r
			}
			if r := seen["up://doc/042"]; r.Name != "doc-042" || r.MIMEType != "text/plain" || r.Description != "doc number" {
				t.Errorf("up://doc/042 listed as %+v", r)
			}
			tl, err := c.ListResourceTemplates(ctx, mcp.ListResourceTemplatesRequest{})
			if err != nil || len(tl.ResourceTemplates) != 1 || tl.ResourceTemplates[0].URITemplate.Raw() != "up://item/{id}" {
				t.Fatalf("templates = %+v, %v", tl, err)
			}

			// Reads: text, the blob byte for byte, a template's uri.
			assertRead(ctx, t, c, "up://doc/042", "up://doc/042", "doc 42")
			assertRead(ctx, t, c, "up://item/xyz", "up://item/xyz", "item xyz")
			assertBlob(ctx, t, c, "up://bin", "up://bin", d.blob)
			_, err = c.ReadResource(ctx, mcp.ReadResourceRequest{Params: mcp.ReadResourceParams{URI: "up://nowhere"}})
			if want := mcp.ErrResourceNotFound; g.name == "2026-07-28" {
				want = mcp.ErrInvalidParams // the modern generation's code for it
				if !errors.Is(err, want) {
					t.Errorf("read of an unknown uri: %v, want %v", err, want)
				}
			} else if !errors.Is(err, want) || !strings.Contains(err.Error(), "up://nowhere") {
				t.Errorf("read of an unknown uri: %v, want %v naming it", err, want)
			}

			// The prompt's messages unchanged: text, image, embedded resource.
			p, err := c.GetPrompt(ctx, mcp.GetPromptRequest{Params: mcp.GetPromptParams{Name: "greet", Arguments: map[string]string{"name": "Ada"}}})
			if err != nil {
				t.Fatal(err)
			}
			assertSameJSON(t, "greet's messages", p.Messages, d.greetMessages("Ada"))
			if p.Description != "a greeting" {
				t.Errorf("greet's description %q", p.Description)
			}
			if _, err := c.GetPrompt(ctx, mcp.GetPromptRequest{Params: mcp.GetPromptParams{Name: "nope"}}); !errors.Is(err, mcp.ErrInvalidParams) ||
				!strings.Contains(err.Error(), "nope") {
				t.Errorf("an unknown prompt: %v, want invalid params naming it", err)
			}
			comp, err := c.Complete(ctx, mcp.CompleteRequest{Params: mcp.CompleteParams{Ref: mcp.PromptReference{Type: "ref/prompt", Name: "greet"},
				Argument: mcp.CompleteArgument{Name: "name", Value: "A"}}})
			if err != nil || strings.Join(comp.Completion.Values, ",") != "Ada,Alan" || comp.Completion.Total != 2 {
				t.Errorf("completion = %+v, %v", comp, err)
			}

			// The workspace endpoint: uris and names say which connector.
			w := connect(t, e.url+"/mcp/ws", nil, g.opts...)
			var fed []mcp.Resource
			cursor = ""
			for {
				r, err := w.ListResources(ctx, mcp.ListResourcesRequest{PaginatedRequest: mcp.PaginatedRequest{
					Params: mcp.PaginatedParams{Cursor: cursor}}})
				if err != nil {
					t.Fatal(err)
				}
				fed = append(fed, r.Resources...)
				if cursor = r.NextCursor; cursor == "" {
					break
				}
			}
			if len(fed) != 121 {
				t.Errorf("%d resources on the workspace endpoint, want docs' 121 (alpha and my.beta have none)", len(fed))
			}
			for _, r := range fed {
				if !strings.HasPrefix(r.URI, "connector-svc://docs/up://") || !strings.HasPrefix(r.Name, "docs__") {
					t.Errorf("federated resource %q named %q", r.URI, r.Name)
				}
			}
			assertRead(ctx, t, w, "connector-svc://docs/up://doc/042", "connector-svc://docs/up://doc/042", "doc 42")
			assertRead(ctx, t, w, "connector-svc://docs/up://item/7", "connector-svc://docs/up://item/7", "item 7")
			assertBlob(ctx, t, w, "connector-svc://docs/up://bin", "connector-svc://docs/up://bin", d.blob)
			wp, err := w.GetPrompt(ctx, mcp.GetPromptRequest{Params: mcp.GetPromptParams{Name: "docs__greet", Arguments: map[string]string{"name": "Grace"}}})
			if err != nil || len(wp.Messages) != 3 {
				t.Fatalf("docs__greet = %+v, %v", wp, err)
			}
			if tc, ok := wp.Messages[0].Content.(mcp.TextContent); !ok || tc.Text != "Hello Grace" {
				t.Errorf("docs__greet's first message %+v", wp.Messages[0].Content)
			}
			wc, err := w.Complete(ctx, mcp.CompleteRequest{Params: mcp.CompleteParams{Ref: mcp.PromptReference{Type: "ref/prompt", Name: "docs__greet"},
				Argument: mcp.CompleteArgument{Name: "name", Value: "G"}}})
			if err != nil || strings.Join(wc.Completion.Values, ",") != "Grace" {
				t.Errorf("federated completion = %+v, %v", wc, err)
			}
		})
	}
}

func assertRead(ctx context.Context, t *testing.T, c interface {
	ReadResource(context.Context, mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error)
}, uri, wantURI, wantText string) {
	t.Helper()
	r, err := c.ReadResource(ctx, mcp.ReadResourceRequest{Params: mcp.ReadResourceParams{URI: uri}})
	if err != nil {
		t.Fatalf("read %s: %v", uri, err)
	}
	if len(r.Contents) != 1 {
		t.Fatalf("read %s: %d contents", uri, len(r.Contents))
	}
	tc, ok := r.Contents[0].(mcp.TextResourceContents)
	if !ok || tc.URI != wantURI || tc.Text != wantText || tc.MIMEType != "text/plain" {
		t.Errorf("read %s = %+v; want %s %q text/plain", uri, r.Contents[0], wantURI, wantText)
	}
}

func assertBlob(ctx context.Context, t *testing.T, c interface {
	ReadResource(context.Context, mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error)
}, uri, wantURI string, want []byte) {
	t.Helper()
	r, err := c.ReadResource(ctx, mcp.ReadResourceRequest{Params: mcp.ReadResourceParams{URI: uri}})
	if err != nil || len(r.Contents) != 1 {
		t.Fatalf("read %s = %+v, %v", uri, r, err)
	}
	b, ok := r.Contents[0].(mcp.BlobResourceContents)
	if !ok || b.URI != wantURI || b.MIMEType != "application/octet-stream" {
		t.Fatalf("read %s = %+v", uri, r.Contents[0])
	}
	if got, err := base64.StdEncoding.DecodeString(b.Blob); err != nil || string(got) != string(want) {
		t.Errorf("read %s: %d bytes, not the server's %d (%v)", uri, len(got), len(want), err)
	}
}

func assertSameJSON(t *testing.T, what string, got, want any) {
	t.Helper()
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(want)
	if string(g) != string(w) {
		t.Errorf("%s:\n got %s\nwant %s", what, g, w)
	}
}
