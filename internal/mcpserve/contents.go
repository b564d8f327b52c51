package mcpserve

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/resources"
)

// A connector's endpoint passes its server's resources, resource
// templates, prompts and completions through unchanged: the lists as the
// registry keeps them (or as the replica that serves the connector lists
// them), reads, prompts and completions through resources.Service where
// the connection is, placed as tool calls are. resources/subscribe
// watches the resource on the connector's owner (internal/watches), and
// the updates go to the MCP session that subscribed.

// endpointContents is what a connector endpoint offers beside tools.
type endpointContents struct {
	caps      registry.ContentCaps
	resources []mcp.Resource
	templates []mcp.ResourceTemplate
	prompts   []mcp.Prompt
}

// contentsOf lists connector's contents: from the registry when this
// replica holds its connection, else from the replica that serves it.
func (h *Handler) contentsOf(ctx context.Context, ws, connector string) (*endpointContents, error) {
	if h.d.Resources == nil {
		return &endpointContents{}, nil
	}
	if _, ok := h.d.Registry.Lookup(ws, connector); ok {
		k, err := h.d.Resources.Contents(ctx, resources.Target{WorkspaceID: ws, ConnectorID: connector}, false)
		if err != nil {
			return nil, err
		}
		return &endpointContents{caps: k.Caps, resources: k.Resources, templates: k.Templates, prompts: k.Prompts}, nil
	}
	conn, err := h.d.Placer.Place(ctx, live.Target{WorkspaceID: ws, ConnectorID: connector, OwnerOnly: true})
	if err != nil || conn == nil {
		return &endpointContents{}, err
	}
	return forwardedContents(ctx, connectorv1.NewConnectorServiceClient(conn), ws, connector)
}

// forwardedContents lists a connector's contents on another replica.
func forwardedContents(ctx context.Context, c connectorv1.ConnectorServiceClient, ws, connector string) (*endpointContents, error) {
	k := &endpointContents{}
	for token := ""; ; {
		r, err := c.ListResources(ctx, &connectorv1.ListResourcesRequest{WorkspaceId: ws, ConnectorId: connector, PageSize: 1000, PageToken: token})
		if reasonOf(err) == "NO_RESOURCES" {
			break
		}
		if err != nil {
			return nil, errors.New(statusMessage(err))
		}
		k.caps.Resources, k.caps.Subscribe = true, r.GetSubscribeSupported()
		for _, p := range r.GetResources() {
			res := mcp.Resource{URI: p.GetUri(), Name: p.GetName(), Title: p.GetTitle(), Description: p.GetDescription(), MIMEType: p.GetMimeType()}
			if p.GetSize() > 0 {
				n := p.GetSize()
				res.Size = &n
			}
			k.resources = append(k.resources, res)
		}
		if token = r.GetNextPageToken(); token == "" {
			break
		}
	}
	if k.caps.Resources {
		for token := ""; ; {
			r, err := c.ListResourceTemplates(ctx, &connectorv1.ListResourceTemplatesRequest{WorkspaceId: ws, ConnectorId: connector,
				PageSize: 1000, PageToken: token})
			if err != nil {
				return nil, errors.New(statusMessage(err))
			}
			for _, p := range r.GetResourceTemplates() {
				t := mcp.NewResourceTemplate(p.GetUriTemplate(), p.GetName(), mcp.WithTemplateDescription(p.GetDescription()),
					mcp.WithTemplateMIMEType(p.GetMimeType()))
				t.Title = p.GetTitle()
				k.templates = append(k.templates, t)
			}
			if token = r.GetNextPageToken(); token == "" {
				break
			}
		}
	}
	for token := ""; ; {
		r, err := c.ListPrompts(ctx, &connectorv1.ListPromptsRequest{WorkspaceId: ws, ConnectorId: connector, PageSize: 1000, PageToken: token})
		if reasonOf(err) == "NO_PROMPTS" {
			break
		}
		if err != nil {
			return nil, errors.New(statusMessage(err))
		}
		k.caps.Prompts = true
		for _, p := range r.GetPrompts() {
			pr := mcp.Prompt{Name: p.GetName(), Title: p.GetTitle(), Description: p.GetDescription()}
			for _, a := range p.GetArguments() {
				pr.Arguments = append(pr.Arguments, mcp.PromptArgument{Name: a.GetName(), Description: a.GetDescription(), Required: a.GetRequired()})
			}
			k.prompts = append(k.prompts, pr)
		}
		if token = r.GetNextPageToken(); token == "" {
			break
		}
	}
	// Whether the server completes is not listed: asking tells.
	_, err := c.Complete(ctx, &connectorv1.CompleteRequest{WorkspaceId: ws, ConnectorId: connector, PromptName: "-", ArgumentName: "-"})
	k.caps.Completions = reasonOf(err) != "NO_COMPLETIONS"
	return k, nil
}

// contentOptions are the server options that declare what a connector
// endpoint offers beside tools.
func (h *Handler) contentOptions(ep *endpoint, k *endpointContents) []server.ServerOption {
	var opts []server.ServerOption
	if k.caps.Resources {
		opts = append(opts, server.WithResourceCapabilities(k.caps.Subscribe && h.d.Watches != nil, true))
	}
	if k.caps.Prompts {
		opts = append(opts, server.WithPromptCapabilities(true))
	}
	if k.caps.Completions {
		c := &completer{h: h, ep: ep}
		opts = append(opts, server.WithCompletions(), server.WithPromptCompletionProvider(c), server.WithResourceCompletionProvider(c))
	}
	if k.caps.Subscribe && h.d.Watches != nil {
		hooks := &server.Hooks{}
		hooks.AddAfterSubscribe(func(ctx context.Context, _ any, req *mcp.SubscribeRequest, _ *mcp.EmptyResult) {
			ep.subscribe(ctx, req.Params.URI)
		})
		hooks.AddAfterUnsubscribe(func(ctx context.Context, _ any, req *mcp.UnsubscribeRequest, _ *mcp.EmptyResult) {
			if s := server.ClientSessionFromContext(ctx); s != nil {
				ep.unsubscribe(s.SessionID(), req.Params.URI)
			}
		})
		opts = append(opts, server.WithHooks(hooks))
	}
	return opts
}

// syncContents sets the endpoint's resources, templates and prompts when
// they changed since the last sync: its connector's, or on the workspace
// endpoint every active connector's, federated (federatedURI, prefixed
// names). ep.syncMu is held.
func (ep *endpoint) syncContents(ctx context.Context) {
	if ep.h.d.Resources == nil {
		return
	}
	var rs []server.ServerResource
	var ts []server.ServerResourceTemplate
	var ps []server.ServerPrompt
	prompts := map[string]promptRef{}
	sum := sha256.New()
	connectors := []string{ep.connector}
	if ep.connector == "" {
		connectors = nil
		for _, row := range ep.h.d.Live.InWorkspace(ep.ws) {
			if row.Active {
				connectors = append(connectors, row.ExternalID)
			}
		}
	}
	var caps registry.ContentCaps
	for _, connector := range connectors {
		k, err := ep.h.contentsOf(ctx, ep.ws, connector)
		if err != nil {
			if ep.connector != "" {
				return // the last lists stay
			}
			continue
		}
		sum.Write([]byte(connector))
		for _, v := range []any{k.resources, k.templates, k.prompts} {
			b, _ := json.Marshal(v)
			sum.Write(b)
		}
		caps.Resources = caps.Resources || k.caps.Resources
		caps.Prompts = caps.Prompts || k.caps.Prompts
		for _, r := range k.resources {
			r.URI, r.Name = ep.outURI(connector, r.URI), ep.outName(connector, r.Name)
			rs = append(rs, server.ServerResource{Resource: r, Handler: ep.reader(connector)})
		}
		for _, t := range k.templates {
			raw := ep.outURI(connector, templateText(t))
			t.URITemplate, t.Name = mcp.NewResourceTemplate(raw, "").URITemplate, ep.outName(connector, t.Name)
			ts = append(ts, server.ServerResourceTemplate{Template: t, Handler: server.ResourceTemplateHandlerFunc(ep.reader(connector))})
		}
		for _, p := range k.prompts {
			orig := p.Name
			p.Name = ep.outName(connector, orig)
			prompts[p.Name] = promptRef{connector: connector, name: orig}
			ps = append(ps, server.ServerPrompt{Prompt: p, Handler: ep.prompter(connector, orig)})
		}
	}
	fp := hex.EncodeToString(sum.Sum(nil))
	if fp == ep.contentsPrint {
		return
	}
	ep.contentsPrint = fp
	ep.subs.mu.Lock()
	ep.prompts = prompts
	ep.subs.mu.Unlock()
	if caps.Resources || ep.connector == "" {
		ep.mcp.SetResources(rs...)
		ep.mcp.SetResourceTemplates(ts...)
	}
	if caps.Prompts || ep.connector == "" {
		ep.mcp.SetPrompts(ps...)
	}
}

// promptRef is a federated prompt's connector and own name.
type promptRef struct{ connector, name string }

// templateText is a template's URI template as the server gave it.
func templateText(t mcp.ResourceTemplate) string {
	if t.URITemplate == nil || t.URITemplate.Template == nil {
		return ""
	}
	return t.URITemplate.Raw()
}

// FederatedScheme starts the workspace endpoint's resource URIs:
// connector-svc://<connector>/<the server's own uri>.
const FederatedScheme = "connector-svc://"

// outURI is the uri a client of the endpoint sees of connector's uri.
func (ep *endpoint) outURI(connector, uri string) string {
	if ep.connector != "" {
		return uri
	}
	return FederatedScheme + connector + "/" + uri
}

// outName is the name a client of the endpoint sees of connector's
// resource or prompt name.
func (ep *endpoint) outName(connector, name string) string {
	if ep.connector != "" {
		return name
	}
	return connectorPart(connector) + Separator + name
}

// route is the connector and its server's own uri of a uri a client of
// the endpoint sent.
func (ep *endpoint) route(uri string) (connector, orig string, ok bool) {
	if ep.connector != "" {
		return ep.connector, uri, true
	}
	rest, found := strings.CutPrefix(uri, FederatedScheme)
	if !found {
		return "", "", false
	}
	connector, orig, found = strings.Cut(rest, "/")
	return connector, orig, found && connector != "" && orig != ""
}

// target is connector's caller in ctx: its MCP session (for a
// per_session connector) and the user the key names.
func (ep *endpoint) target(ctx context.Context, connector string) resources.Target {
	t := resources.Target{WorkspaceID: ep.ws, ConnectorID: connector, UserID: callerFrom(ctx).userID}
	if row, ok := ep.h.d.Live.Lookup(ep.ws, connector); ok && row.Config.SessionMode == registry.SessionPerSession {
		if s := server.ClientSessionFromContext(ctx); s != nil {
			t.SessionID = serviceSession(s.SessionID())
		}
	}
	return t
}

// place is where t's request runs: nil here.
func (ep *endpoint) place(ctx context.Context, t resources.Target) (connectorv1.ConnectorServiceClient, error) {
	conn, err := ep.h.d.Placer.Place(ctx, live.Target{WorkspaceID: t.WorkspaceID, ConnectorID: t.ConnectorID,
		SessionID: t.SessionID, UserID: t.UserID})
	if err != nil || conn == nil {
		return nil, err
	}
	return connectorv1.NewConnectorServiceClient(conn), nil
}

// reader reads resources of connector, as its server gave them (their
// uris as the endpoint shows them).
func (ep *endpoint) reader(connector string) server.ResourceHandlerFunc {
	return func(ctx context.Context, req mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
		c, orig, ok := ep.route(req.Params.URI)
		if !ok || c != connector {
			return nil, fmt.Errorf("%w: %s", mcp.ErrResourceNotFound, req.Params.URI)
		}
		req.Params.URI = orig
		out, err := ep.readResource(ctx, connector, req)
		for i, rc := range out {
			switch rc := rc.(type) {
			case mcp.TextResourceContents:
				rc.URI = ep.outURI(connector, rc.URI)
				out[i] = rc
			case mcp.BlobResourceContents:
				rc.URI = ep.outURI(connector, rc.URI)
				out[i] = rc
			}
		}
		return out, err
	}
}

// readResource reads a resource of connector.
func (ep *endpoint) readResource(ctx context.Context, connector string, req mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
	t := ep.target(ctx, connector)
	client, err := ep.place(ctx, t)
	if err != nil {
		return nil, err
	}
	if client != nil {
		r, err := client.ReadResource(ctx, &connectorv1.ReadResourceRequest{WorkspaceId: t.WorkspaceID, ConnectorId: t.ConnectorID,
			Uri: req.Params.URI, SessionId: t.SessionID, UserId: t.UserID})
		if err != nil {
			return nil, errors.New(statusMessage(err))
		}
		out := make([]mcp.ResourceContents, 0, len(r.GetContents()))
		for _, c := range r.GetContents() {
			if c.GetData() == nil {
				continue
			}
			if b, ok := c.GetData().(*connectorv1.ResourceContents_Blob); ok {
				out = append(out, mcp.BlobResourceContents{URI: c.GetUri(), MIMEType: c.GetMimeType(), Blob: base64.StdEncoding.EncodeToString(b.Blob)})
			} else {
				out = append(out, mcp.TextResourceContents{URI: c.GetUri(), MIMEType: c.GetMimeType(), Text: c.GetText()})
			}
		}
		return out, nil
	}
	res, err := ep.h.d.Resources.Read(ctx, t, req.Params.URI)
	if err != nil {
		return nil, err
	}
	return res.Contents, nil
}

// prompter gets connector's prompt name.
func (ep *endpoint) prompter(connector, name string) server.PromptHandlerFunc {
	return func(ctx context.Context, req mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		req.Params.Name = name
		return ep.getPrompt(ctx, connector, req)
	}
}

// getPrompt gets a prompt of connector.
func (ep *endpoint) getPrompt(ctx context.Context, connector string, req mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
	t := ep.target(ctx, connector)
	client, err := ep.place(ctx, t)
	if err != nil {
		return nil, err
	}
	if client == nil {
		return ep.h.d.Resources.GetPrompt(ctx, t, req.Params.Name, req.Params.Arguments)
	}
	r, err := client.GetPrompt(ctx, &connectorv1.GetPromptRequest{WorkspaceId: t.WorkspaceID, ConnectorId: t.ConnectorID,
		Name: req.Params.Name, Arguments: req.Params.Arguments, SessionId: t.SessionID, UserId: t.UserID})
	if err != nil {
		return nil, errors.New(statusMessage(err))
	}
	res := &mcp.GetPromptResult{Description: r.GetDescription()}
	for _, m := range r.GetMessages() {
		conv := resultFromProto(&connectorv1.CallToolResponse{Content: []*connectorv1.Content{m.GetContent()}})
		if len(conv.Content) == 1 {
			res.Messages = append(res.Messages, mcp.PromptMessage{Role: mcp.Role(m.GetRole()), Content: conv.Content[0]})
		}
	}
	return res, nil
}

// completer completes the endpoint's connector's prompt and template
// arguments.
type completer struct {
	h  *Handler
	ep *endpoint
}

func (c *completer) CompletePromptArgument(ctx context.Context, prompt string, arg mcp.CompleteArgument, cc mcp.CompleteContext) (*mcp.Completion, error) {
	connector := c.ep.connector
	if connector == "" {
		c.ep.subs.mu.Lock()
		ref, ok := c.ep.prompts[prompt]
		c.ep.subs.mu.Unlock()
		if !ok {
			return nil, fmt.Errorf("prompt %q is not listed", prompt)
		}
		connector, prompt = ref.connector, ref.name
	}
	return c.complete(ctx, connector, registry.CompleteRequest{Prompt: prompt, Argument: arg.Name, Value: arg.Value, Context: cc.Arguments})
}

func (c *completer) CompleteResourceArgument(ctx context.Context, uri string, arg mcp.CompleteArgument, cc mcp.CompleteContext) (*mcp.Completion, error) {
	connector, orig, ok := c.ep.route(uri)
	if !ok {
		return nil, fmt.Errorf("%w: %s", mcp.ErrResourceNotFound, uri)
	}
	return c.complete(ctx, connector, registry.CompleteRequest{TemplateURI: orig, Argument: arg.Name, Value: arg.Value, Context: cc.Arguments})
}

func (c *completer) complete(ctx context.Context, connector string, req registry.CompleteRequest) (*mcp.Completion, error) {
	t := c.ep.target(ctx, connector)
	client, err := c.ep.place(ctx, t)
	if err != nil {
		return nil, err
	}
	if client == nil {
		res, err := c.h.d.Resources.Complete(ctx, t, req)
		if err != nil {
			return nil, err
		}
		return &res.Completion, nil
	}
	r, err := client.Complete(ctx, &connectorv1.CompleteRequest{WorkspaceId: t.WorkspaceID, ConnectorId: t.ConnectorID,
		PromptName: req.Prompt, ResourceTemplateUri: req.TemplateURI, ArgumentName: req.Argument, Value: req.Value,
		ContextArguments: req.Context, SessionId: t.SessionID, UserId: t.UserID})
	if err != nil {
		return nil, errors.New(statusMessage(err))
	}
	return &mcp.Completion{Values: r.GetValues(), Total: int(r.GetTotal()), HasMore: r.GetHasMore()}, nil
}

// subscriptions are an endpoint's MCP sessions' watches, by session and
// uri.
type subscriptions struct {
	mu      sync.Mutex
	watches map[string]map[string]context.CancelFunc
}

// subscribe watches uri for the MCP session of ctx, on the connector's
// owner, until it unsubscribes or ends; updates go to that session.
func (ep *endpoint) subscribe(ctx context.Context, uri string) {
	s := server.ClientSessionFromContext(ctx)
	connector, orig, ok := ep.route(uri)
	if s == nil || !ok {
		return
	}
	session := s.SessionID()
	wctx, cancel := context.WithCancel(ep.h.life)
	ep.subs.mu.Lock()
	if ep.subs.watches == nil {
		ep.subs.watches = map[string]map[string]context.CancelFunc{}
	}
	if ep.subs.watches[session] == nil {
		ep.subs.watches[session] = map[string]context.CancelFunc{}
	}
	if _, ok := ep.subs.watches[session][uri]; ok {
		ep.subs.mu.Unlock()
		cancel()
		return
	}
	ep.subs.watches[session][uri] = cancel
	ep.subs.mu.Unlock()
	notify := func() {
		_ = ep.mcp.SendNotificationToSpecificClient(session, mcp.MethodNotificationResourceUpdated, map[string]any{"uri": uri})
	}
	started := make(chan error, 1)
	go func() {
		defer ep.unsubscribe(session, uri)
		err := ep.watch(wctx, connector, orig, started, notify)
		if err != nil && wctx.Err() == nil {
			ep.h.logger.WarnContext(wctx, "an MCP session's resource subscription ended", slog.String("connector_id", connector),
				slog.String("uri", uri), slog.String("error", err.Error()))
		}
	}()
	// The subscribe's answer waits, briefly, for the watch to be in place.
	select {
	case <-started:
	case <-time.After(5 * time.Second):
	case <-ctx.Done():
	}
}

// watch relays uri's updates to notify until ctx ends: from this
// replica's hub when it owns the connector, else from the owner's
// WatchResources. started hears once the watch is in place (or failed).
func (ep *endpoint) watch(ctx context.Context, connector, uri string, started chan<- error, notify func()) error {
	once := sync.OnceFunc(func() { close(started) })
	defer once()
	conn, err := ep.h.d.Placer.Place(ctx, live.Target{WorkspaceID: ep.ws, ConnectorID: connector, OwnerOnly: true})
	if err != nil {
		return err
	}
	if conn != nil {
		return ep.watchOn(ctx, conn, connector, uri, once, notify)
	}
	id, err := ep.h.d.Calls.Callable(ctx, ep.ws, connector)
	if err != nil {
		return err
	}
	w, err := ep.h.d.Watches.Watch(ctx, id, []string{uri})
	if err != nil {
		return err
	}
	defer w.Close()
	once()
	for ev := range w.Events {
		if ev.URI == uri {
			notify()
		}
	}
	return w.Err()
}

func (ep *endpoint) watchOn(ctx context.Context, conn *grpc.ClientConn, connector, uri string, started func(), notify func()) error {
	st, err := connectorv1.NewConnectorServiceClient(conn).WatchResources(ctx, &connectorv1.WatchResourcesRequest{
		WorkspaceId: ep.ws, ConnectorId: connector, Uris: []string{uri}})
	if err != nil {
		return err
	}
	for {
		m, err := st.Recv()
		if err != nil {
			return err
		}
		if m.GetStarted() != nil {
			started()
		}
		if m.GetUpdated() != nil {
			notify()
		}
	}
}

// unsubscribe ends session's watch of uri; "" ends all its watches.
func (ep *endpoint) unsubscribe(session, uri string) {
	ep.subs.mu.Lock()
	defer ep.subs.mu.Unlock()
	for u, cancel := range ep.subs.watches[session] {
		if uri == "" || u == uri {
			cancel()
			delete(ep.subs.watches[session], u)
		}
	}
	if len(ep.subs.watches[session]) == 0 {
		delete(ep.subs.watches, session)
	}
}

// reasonOf is a gRPC error's ErrorInfo reason, "" without one.
func reasonOf(err error) string {
	if err == nil {
		return ""
	}
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}
