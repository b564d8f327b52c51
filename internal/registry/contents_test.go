package registry_test

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

// events collects a registry's resource events.
type events struct {
	mu  sync.Mutex
	got []registry.ResourceEvent
}

func (e *events) add(_ int64, ev registry.ResourceEvent) {
	e.mu.Lock()
	e.got = append(e.got, ev)
	e.mu.Unlock()
}

func (e *events) updated(uri string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.ContainsFunc(e.got, func(ev registry.ResourceEvent) bool { return ev.URI == uri })
}

func (e *events) count(uri string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, ev := range e.got {
		if ev.URI == uri {
			n++
		}
	}
	return n
}

// The reference server's resources, templates, prompts, completions and
// subscriptions, over stdio and streamable HTTP.
func TestContentsTypeScript(t *testing.T) {
	js := everythingJS(t)
	for _, mode := range []string{"stdio", "streamableHttp"} {
		t.Run(mode, func(t *testing.T) {
			spec := registry.Spec{ID: 1, WorkspaceID: "ws", ConnectorID: "everything", Transport: registry.TransportStdio,
				Command: "node", Args: []string{js, "stdio"}, ConnectTimeout: 30 * time.Second, CallTimeout: 30 * time.Second}
			if mode != "stdio" {
				srv := startTSServer(t, mode)
				spec = httpSpec(1, srv.url("/mcp"))
			}
			var ev events
			cfg := testConfig()
			cfg.OnResourceEvent = ev.add
			reg := run(t, newSource(spec), cfg)
			k, err := reg.Contents(ctxT(t), 1, false)
			if err != nil {
				t.Fatal(err)
			}
			if !k.Caps.Resources || !k.Caps.Subscribe || !k.Caps.Prompts || !k.Caps.Completions {
				t.Errorf("caps = %+v; want resources, subscribe, prompts and completions", k.Caps)
			}
			if len(k.Resources) == 0 || len(k.Templates) != 2 {
				t.Fatalf("%d resources, %d templates; want some and 2", len(k.Resources), len(k.Templates))
			}
			var names []string
			for _, p := range k.Prompts {
				names = append(names, p.Name)
			}
			slices.Sort(names)
			if want := "args-prompt,completable-prompt,resource-prompt,simple-prompt"; strings.Join(names, ",") != want {
				t.Errorf("prompts = %v; want %s", names, want)
			}

			// A text resource listed, and a blob one from a template.
			res, err := reg.ReadResource(ctxT(t), 1, k.Resources[0].URI, registry.CallOptions{})
			if err != nil || len(res.Contents) == 0 {
				t.Fatalf("read %s: %v %+v", k.Resources[0].URI, err, res)
			}
			blob, err := reg.ReadResource(ctxT(t), 1, "demo://resource/dynamic/blob/3", registry.CallOptions{})
			if err != nil {
				t.Fatal(err)
			}
			b, ok := blob.Contents[0].(mcp.BlobResourceContents)
			if !ok {
				t.Fatalf("blob contents = %T", blob.Contents[0])
			}
			if raw, err := base64.StdEncoding.DecodeString(b.Blob); err != nil || len(raw) == 0 {
				t.Errorf("blob = %q: %v", b.Blob, err)
			}
			if _, err := reg.ReadResource(ctxT(t), 1, "demo://resource/dynamic/text/nope", registry.CallOptions{}); err == nil {
				t.Error("an unknown resource was read")
			}

			p, err := reg.GetPrompt(ctxT(t), 1, "args-prompt", map[string]string{"city": "Lyon", "state": "Rhône"}, registry.CallOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := p.Messages[0].Content.(mcp.TextContent).Text; got != "What's weather in Lyon, Rhône?" {
				t.Errorf("prompt text = %q", got)
			}
			if _, err := reg.GetPrompt(ctxT(t), 1, "no-such-prompt", nil, registry.CallOptions{}); err == nil {
				t.Error("an unknown prompt was got")
			}

			c, err := reg.Complete(ctxT(t), 1, registry.CompleteRequest{Prompt: "completable-prompt", Argument: "name", Value: "",
				Context: map[string]string{"department": "Sales"}}, registry.CallOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(c.Completion.Values, ","); got != "David,Eve,Frank" {
				t.Errorf("completions = %q", got)
			}

			// Subscribed, then the server's simulated updates turned on: an
			// update arrives (on stdio, or the GET stream of HTTP).
			uri := k.Resources[0].URI
			if err := reg.Subscribe(ctxT(t), 1, uri); err != nil {
				t.Fatal(err)
			}
			if got := reg.Subscriptions(1); !slices.Equal(got, []string{uri}) {
				t.Errorf("subscriptions = %v", got)
			}
			if _, err := reg.CallTool(ctxT(t), 1, "toggle-subscriber-updates", nil, registry.CallOptions{}); err != nil {
				t.Fatal(err)
			}
			testsupport.WaitFor(t, "an update of the subscribed resource", func() bool { return ev.updated(uri) })
			if err := reg.Unsubscribe(ctxT(t), 1, uri); err != nil {
				t.Fatal(err)
			}
			if got := reg.Subscriptions(1); len(got) != 0 {
				t.Errorf("subscriptions after unsubscribe = %v", got)
			}
		})
	}
}

// An mcp-go server's lists follow list_changed; a server without
// resources says so; a subscription is taken out again after a reconnect.
func TestContentsMCPGo(t *testing.T) {
	s := server.NewMCPServer("contents", "1", server.WithResourceCapabilities(true, true),
		server.WithPromptCapabilities(true))
	s.AddTool(mcp.NewTool("noop"), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("ok"), nil
	})
	read := func(_ context.Context, req mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
		return []mcp.ResourceContents{mcp.TextResourceContents{URI: req.Params.URI, MIMEType: "text/plain", Text: "hello"}}, nil
	}
	s.AddResource(mcp.NewResource("mem://a", "a"), read)
	srv := httptest.NewServer(server.NewStreamableHTTPServer(s))
	t.Cleanup(srv.Close)

	var ev events
	cfg := testConfig()
	cfg.OnResourceEvent = ev.add
	reg := run(t, newSource(httpSpec(1, srv.URL+"/mcp")), cfg)
	k, err := reg.Contents(ctxT(t), 1, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(k.Resources) != 1 || k.Caps.Completions {
		t.Fatalf("contents = %+v", k)
	}
	s.AddResource(mcp.NewResource("mem://b", "b"), read) // notifies list_changed
	testsupport.WaitFor(t, "the new resource listed", func() bool {
		k, err := reg.Contents(ctxT(t), 1, false)
		return err == nil && len(k.Resources) == 2
	})
	if _, err := reg.Complete(ctxT(t), 1, registry.CompleteRequest{Prompt: "p", Argument: "a"}, registry.CallOptions{}); !errors.Is(err, registry.ErrNoCompletions) {
		t.Errorf("complete on a server without completions: %v", err)
	}
	if err := reg.Subscribe(ctxT(t), 1, "mem://a"); err != nil {
		t.Fatal(err)
	}
	testsupport.WaitFor(t, "an update of mem://a", func() bool {
		s.SendNotificationToAllClients(mcp.MethodNotificationResourceUpdated, map[string]any{"uri": "mem://a"})
		return ev.updated("mem://a")
	})
}

// A server with tools only: its contents say it has no resources or
// prompts, and a read says so rather than answer empty.
func TestContentsNone(t *testing.T) {
	s := server.NewMCPServer("tools-only", "1")
	s.AddTool(mcp.NewTool("noop"), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("ok"), nil
	})
	srv := httptest.NewServer(server.NewStreamableHTTPServer(s))
	t.Cleanup(srv.Close)
	reg := run(t, newSource(httpSpec(1, srv.URL+"/mcp")), testConfig())
	k, err := reg.Contents(ctxT(t), 1, false)
	if err != nil {
		t.Fatal(err)
	}
	if k.Caps != (registry.ContentCaps{}) || len(k.Resources)+len(k.Prompts) != 0 {
		t.Errorf("contents = %+v", k)
	}
	if _, err := reg.ReadResource(ctxT(t), 1, "mem://a", registry.CallOptions{}); !errors.Is(err, registry.ErrNoResources) {
		t.Errorf("read: %v; want ErrNoResources", err)
	}
	if _, err := reg.GetPrompt(ctxT(t), 1, "p", nil, registry.CallOptions{}); !errors.Is(err, registry.ErrNoPrompts) {
		t.Errorf("prompt: %v; want ErrNoPrompts", err)
	}
	if err := reg.Subscribe(ctxT(t), 1, "mem://a"); !errors.Is(err, registry.ErrNoSubscribe) {
		t.Errorf("subscribe: %v; want ErrNoSubscribe", err)
	}
	if got := reg.Subscriptions(1); len(got) != 0 {
		t.Errorf("a refused subscription is held: %v", got)
	}
}
