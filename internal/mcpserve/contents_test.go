package mcpserve_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/connector-svc/connector-svc/internal/mcpserve"
	"github.com/connector-svc/connector-svc/internal/store"
)

// The reference server's resources, templates, prompts, completions and
// subscriptions pass through a connector's endpoint unchanged, to the
// official Go SDK's client.
func TestContentsPassThrough(t *testing.T) {
	js := everythingEntry(t)
	e := newInteropEnv(t, &store.Connector{ExternalID: "everything", Transport: store.TransportStdio,
		Config: store.Config{Command: "node", Args: []string{js, "stdio"}, ConnectTimeout: store.Duration(30 * time.Second),
			CallTimeout: store.Duration(60 * time.Second)}})
	updated := make(chan string, 64)
	cs := goSDKConnect(t, e.url+"/mcp/ws/everything", "2025-11-25", &gomcp.ClientOptions{
		ResourceUpdatedHandler: func(_ context.Context, req *gomcp.ResourceUpdatedNotificationRequest) {
			updated <- req.Params.URI
		}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	caps := cs.InitializeResult().Capabilities
	if caps.Resources == nil || !caps.Resources.Subscribe || caps.Prompts == nil || caps.Completions == nil {
		t.Fatalf("capabilities = %+v; want resources with subscribe, prompts, completions", caps)
	}

	// The lists as the server gives them.
	id, _ := e.reg.Lookup("ws", "everything")
	k, err := e.reg.Contents(ctx, id, false)
	if err != nil {
		t.Fatal(err)
	}
	var uris []string
	for r, err := range cs.Resources(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		uris = append(uris, r.URI)
	}
	var want []string
	for _, r := range k.Resources {
		want = append(want, r.URI)
	}
	slices.Sort(uris)
	slices.Sort(want)
	if !slices.Equal(uris, want) || len(uris) == 0 {
		t.Errorf("resources through the endpoint %v, the server's %v", uris, want)
	}
	tmpl, err := cs.ListResourceTemplates(ctx, nil)
	if err != nil || len(tmpl.ResourceTemplates) != len(k.Templates) {
		t.Fatalf("templates = %v, %v", tmpl, err)
	}

	// Reads: a listed text resource, and a blob from a template.
	text, err := cs.ReadResource(ctx, &gomcp.ReadResourceParams{URI: want[0]})
	if err != nil || len(text.Contents) == 0 || text.Contents[0].URI != want[0] {
		t.Fatalf("read %s = %+v, %v", want[0], text, err)
	}
	blob, err := cs.ReadResource(ctx, &gomcp.ReadResourceParams{URI: "demo://resource/dynamic/blob/5"})
	if err != nil || len(blob.Contents) == 0 || len(blob.Contents[0].Blob) == 0 {
		t.Fatalf("read blob = %+v, %v", blob, err)
	}

	// Prompts, with arguments and an embedded resource.
	p, err := cs.GetPrompt(ctx, &gomcp.GetPromptParams{Name: "args-prompt", Arguments: map[string]string{"city": "Oslo"}})
	if err != nil {
		t.Fatal(err)
	}
	if tc, ok := p.Messages[0].Content.(*gomcp.TextContent); !ok || tc.Text != "What's weather in Oslo?" {
		t.Errorf("args-prompt = %+v", p.Messages[0].Content)
	}
	rp, err := cs.GetPrompt(ctx, &gomcp.GetPromptParams{Name: "resource-prompt", Arguments: map[string]string{"resourceType": "Text", "resourceId": "2"}})
	if err != nil {
		t.Fatal(err)
	}
	if er, ok := rp.Messages[1].Content.(*gomcp.EmbeddedResource); !ok || er.Resource.URI != "demo://resource/dynamic/text/2" {
		t.Errorf("resource-prompt's second message = %+v", rp.Messages[1].Content)
	}
	if _, err := cs.GetPrompt(ctx, &gomcp.GetPromptParams{Name: "no-such-prompt"}); err == nil {
		t.Error("an unknown prompt was got")
	}

	comp, err := cs.Complete(ctx, &gomcp.CompleteParams{Ref: &gomcp.CompleteReference{Type: "ref/prompt", Name: "completable-prompt"},
		Argument: gomcp.CompleteParamsArgument{Name: "name", Value: ""},
		Context:  &gomcp.CompleteContext{Arguments: map[string]string{"department": "Engineering"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(comp.Completion.Values, ","); got != "Alice,Bob,Charlie" {
		t.Errorf("completions = %q", got)
	}

	// A subscription through the endpoint: the server's updates arrive.
	everythingUpdate(ctx, t, cs, updated, want[0])
	if err := cs.Unsubscribe(ctx, &gomcp.UnsubscribeParams{URI: want[0]}); err != nil {
		t.Fatal(err)
	}
}

// On the workspace endpoint, every connector's resources and prompts,
// their uris and names saying which connector; a read of a federated uri
// returns the connector's content.
func TestContentsFederated(t *testing.T) {
	js := everythingEntry(t)
	e := newInteropEnv(t, &store.Connector{ExternalID: "everything", Transport: store.TransportStdio,
		Config: store.Config{Command: "node", Args: []string{js, "stdio"}, ConnectTimeout: store.Duration(30 * time.Second),
			CallTimeout: store.Duration(60 * time.Second)}})
	cs := goSDKConnect(t, e.url+"/mcp/ws", "2025-11-25", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var uris, names []string
	for r, err := range cs.Resources(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		uris, names = append(uris, r.URI), append(names, r.Name)
	}
	if len(uris) == 0 {
		t.Fatal("no resources on the workspace endpoint")
	}
	for i := range uris {
		if !strings.HasPrefix(uris[i], "connector-svc://everything/demo://") || !strings.HasPrefix(names[i], "everything__") {
			t.Errorf("federated resource %q named %q", uris[i], names[i])
		}
	}
	r, err := cs.ReadResource(ctx, &gomcp.ReadResourceParams{URI: "connector-svc://everything/demo://resource/dynamic/text/3"})
	if err != nil {
		t.Fatal(err)
	}
	if c := r.Contents[0]; c.URI != "connector-svc://everything/demo://resource/dynamic/text/3" || !strings.HasPrefix(c.Text, "Resource 3:") {
		t.Errorf("read = %+v", c)
	}
	p, err := cs.GetPrompt(ctx, &gomcp.GetPromptParams{Name: "everything__args-prompt", Arguments: map[string]string{"city": "Rome"}})
	if err != nil {
		t.Fatal(err)
	}
	if tc, ok := p.Messages[0].Content.(*gomcp.TextContent); !ok || tc.Text != "What's weather in Rome?" {
		t.Errorf("prompt = %+v", p.Messages[0].Content)
	}
	comp, err := cs.Complete(ctx, &gomcp.CompleteParams{Ref: &gomcp.CompleteReference{Type: "ref/prompt", Name: "everything__completable-prompt"},
		Argument: gomcp.CompleteParamsArgument{Name: "department", Value: "M"}})
	if err != nil || strings.Join(comp.Completion.Values, ",") != "Marketing" {
		t.Errorf("completion = %+v, %v", comp, err)
	}
	if _, err := cs.ReadResource(ctx, &gomcp.ReadResourceParams{URI: "demo://resource/dynamic/text/3"}); err == nil {
		t.Error("a uri that names no connector was read on the workspace endpoint")
	}
}

// Lists longer than a page come in pages, their nextCursor leading to the
// rest, together the server's items unchanged; an unknown uri or prompt
// is the JSON-RPC error the spec says, on both endpoints.
func TestContentsPagesAndErrors(t *testing.T) {
	js := everythingEntry(t)
	e := newInteropEnvWith(t, func(c *mcpserve.Config) { c.ListPageSize = 2 }, &store.Connector{ExternalID: "everything",
		Transport: store.TransportStdio, Config: store.Config{Command: "node", Args: []string{js, "stdio"},
			ConnectTimeout: store.Duration(30 * time.Second), CallTimeout: store.Duration(60 * time.Second)}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	id, _ := e.reg.Lookup("ws", "everything")
	k, err := e.reg.Contents(ctx, id, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(k.Resources) < 3 || len(k.Prompts) < 3 {
		t.Fatalf("the reference server lists %d resources and %d prompts; want 3 or more of each to page", len(k.Resources), len(k.Prompts))
	}
	cs := goSDKConnect(t, e.url+"/mcp/ws/everything", "2025-11-25", nil)
	var got []*gomcp.Resource
	pages := 0
	for cursor := ""; ; {
		r, err := cs.ListResources(ctx, &gomcp.ListResourcesParams{Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if len(r.Resources) > 2 {
			t.Errorf("page %d holds %d resources; the page size is 2", pages, len(r.Resources))
		}
		got = append(got, r.Resources...)
		if cursor = r.NextCursor; cursor == "" {
			break
		}
	}
	if want := (len(k.Resources) + 1) / 2; pages != want {
		t.Errorf("%d pages of resources, want %d", pages, want)
	}
	byURI := map[string]*gomcp.Resource{}
	for _, r := range got {
		byURI[r.URI] = r
	}
	if len(byURI) != len(k.Resources) || len(got) != len(k.Resources) {
		t.Errorf("%d resources (%d distinct) through the pages, the server lists %d", len(got), len(byURI), len(k.Resources))
	}
	for _, w := range k.Resources {
		r := byURI[w.URI]
		if r == nil || r.Name != w.Name || r.MIMEType != w.MIMEType || r.Description != w.Description {
			t.Errorf("resource %s through the endpoint = %+v; the server's %+v", w.URI, r, w)
		}
	}
	var prompts []string
	for p, err := range cs.Prompts(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		prompts = append(prompts, p.Name)
	}
	if len(prompts) != len(k.Prompts) {
		t.Errorf("prompts through the pages %v; the server lists %d", prompts, len(k.Prompts))
	}

	code := func(err error) int64 {
		var we *jsonrpc.Error
		if !errors.As(err, &we) {
			t.Fatalf("error %v is no JSON-RPC error", err)
		}
		return we.Code
	}
	_, err = cs.ReadResource(ctx, &gomcp.ReadResourceParams{URI: "nowhere://no/such/resource"})
	if err == nil || code(err) != -32002 || !strings.Contains(err.Error(), "nowhere://no/such/resource") {
		t.Errorf("read of an unknown uri: %v; want -32002 naming the uri", err)
	}
	_, err = cs.GetPrompt(ctx, &gomcp.GetPromptParams{Name: "no-such-prompt"})
	if err == nil || code(err) != -32602 || !strings.Contains(err.Error(), "no-such-prompt") {
		t.Errorf("an unknown prompt: %v; want -32602 naming it", err)
	}

	ws := goSDKConnect(t, e.url+"/mcp/ws", "2025-11-25", nil)
	for _, uri := range []string{"demo://resource/static/document/architecture.md", "connector-svc://nobody/demo://x"} {
		_, err = ws.ReadResource(ctx, &gomcp.ReadResourceParams{URI: uri})
		if err == nil || code(err) != -32002 || !strings.Contains(err.Error(), uri) {
			t.Errorf("federated read of %s: %v; want -32002 naming the uri", uri, err)
		}
	}
	_, err = ws.GetPrompt(ctx, &gomcp.GetPromptParams{Name: "args-prompt"})
	if err == nil || code(err) != -32602 {
		t.Errorf("federated prompt without its connector: %v; want -32602", err)
	}
}

// everythingUpdate subscribes cs to uri, has the reference server send
// its subscribers updates, and waits for uri's on updated.
func everythingUpdate(ctx context.Context, t *testing.T, cs *gomcp.ClientSession, updated <-chan string, uri string) {
	t.Helper()
	if err := cs.Subscribe(ctx, &gomcp.SubscribeParams{URI: uri}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CallTool(ctx, &gomcp.CallToolParams{Name: "toggle-subscriber-updates", Arguments: map[string]any{}}); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-updated:
		if got != uri {
			t.Errorf("update of %s, want %s", got, uri)
		}
	case <-ctx.Done():
		t.Fatalf("no update of %s through the endpoint", uri)
	}
}
