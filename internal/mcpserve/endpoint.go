package mcpserve

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/store"
)

// An endpoint is one URL's MCP server: the tools of one connector, or of
// every connector of a workspace. It is made on its first request on each
// replica, and its tool list is kept in line with the live catalogs:
// Handler.Run compares them every ListInterval and, when they changed,
// replaces the list, and mcp-go sends notifications/tools/list_changed to
// the endpoint's clients that listen on this replica. Every replica reads
// the same catalogs (the owners sync them to every replica), so a change
// made through any replica reaches every client.
type endpoint struct {
	h             *Handler
	ws, connector string // connector "": the workspace's endpoint
	path          string
	mcp           *server.MCPServer
	http          *server.StreamableHTTPServer

	// syncMu makes one sync of the endpoint at a time (Run's, and a first
	// request's); it guards fingerprint, the hash of the list last set.
	syncMu      sync.Mutex
	fingerprint string
	// contentsPrint is the hash of the resources, templates and prompts
	// last set (under syncMu); subs the MCP sessions' subscriptions.
	contentsPrint string
	subs          subscriptions
	// prompts are the workspace endpoint's prompts by the names it lists
	// them under (under subs.mu).
	prompts map[string]promptRef
}

func (h *Handler) endpoint(ctx context.Context, ws, connector string) (*endpoint, error) {
	path := "/mcp/" + ws
	if connector != "" {
		path += "/" + connector
		if _, ok := h.d.Live.LookupOrLearn(ctx, ws, connector); !ok {
			return nil, fmt.Errorf("connector %q not found in workspace %q", connector, ws)
		}
	}
	h.mu.Lock()
	ep, ok := h.endpoints[path]
	h.mu.Unlock()
	if !ok {
		// What the connector offers beside tools is declared when its
		// endpoint is made.
		k := &endpointContents{}
		if connector == "" && h.d.Resources != nil {
			// The workspace's: its connectors come and go; each request
			// goes to the connector its name or uri says.
			k.caps = registry.ContentCaps{Resources: true, Subscribe: true, Prompts: true, Completions: true}
		}
		if connector != "" {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			var err error
			if k, err = h.contentsOf(cctx, ws, connector); err != nil {
				h.logger.WarnContext(ctx, "list a connector's resources and prompts for its MCP endpoint",
					slog.String("connector_id", connector), slog.String("error", err.Error()))
				k = &endpointContents{}
			}
			cancel()
		}
		h.mu.Lock()
		if ep, ok = h.endpoints[path]; !ok {
			ep = h.newEndpoint(ws, connector, path, k)
			h.endpoints[path] = ep
		}
		h.mu.Unlock()
	}
	if !ok {
		ep.sync(ctx)
	}
	return ep, nil
}

func (h *Handler) newEndpoint(ws, connector, path string, k *endpointContents) *endpoint {
	ep := &endpoint{h: h, ws: ws, connector: connector, path: path}
	instructions := "The tools of workspace " + ws + "'s connectors, each named <connector>" + Separator + "<tool>; " +
		agentPrefix + "<connector> asks a connector's agent, which picks and runs its tools and answers with a trace."
	if connector != "" {
		instructions = "The tools of connector " + connector + " of workspace " + ws + ", under its server's own names."
	}
	opts := append([]server.ServerOption{
		server.WithToolCapabilities(true),
		server.WithLogging(),
		server.WithToolFilter(scopeFilter),
		server.WithRecovery(),
		server.WithPaginationLimit(h.cfg.ListPageSize),
		server.WithInstructions(instructions)}, h.contentOptions(ep, k)...)
	ep.mcp = server.NewMCPServer("connector-svc", h.cfg.Version, opts...)
	ep.http = server.NewStreamableHTTPServer(ep.mcp,
		server.WithSessionIdManagerResolver(&resolver{ids: h.ids, path: path, onDelete: ep.sessionEnded}),
		server.WithHeartbeatInterval(30*time.Second),
		server.WithSessionIdleTTL(h.cfg.SessionIdleTTL),
		server.WithStreamableHTTPLogger(h.logger))
	return ep
}

// scopeFilter hides the agent tools from keys without scope query, in
// lists and calls alike.
func scopeFilter(ctx context.Context, tools []mcp.Tool) []mcp.Tool {
	if callerFrom(ctx).allows(auth.ScopeQuery) {
		return tools
	}
	return slices.DeleteFunc(slices.Clone(tools), func(t mcp.Tool) bool { return isAgentTool(t) })
}

func isAgentTool(t mcp.Tool) bool {
	if t.Meta == nil {
		return false
	}
	v, _ := t.Meta.AdditionalFields[agentMetaKey].(bool)
	return v
}

// agentMetaKey marks an agent tool in its _meta.
const agentMetaKey = "connector-svc/agent"

// syncAll brings every endpoint's tool list in line with the catalogs.
func (h *Handler) syncAll(ctx context.Context) {
	h.mu.Lock()
	eps := slices.Collect(maps.Values(h.endpoints))
	h.mu.Unlock()
	for _, ep := range eps {
		ep.sync(ctx)
	}
}

// sync sets the endpoint's tools if they changed since the last sync.
func (ep *endpoint) sync(ctx context.Context) {
	ep.syncMu.Lock()
	defer ep.syncMu.Unlock()
	tools := ep.list(ctx)
	sum := sha256.New()
	for _, t := range tools {
		b, _ := json.Marshal(t.Tool)
		sum.Write(b)
	}
	fp := hex.EncodeToString(sum.Sum(nil))
	ep.syncContents(ctx)
	if fp == ep.fingerprint {
		return
	}
	ep.fingerprint = fp
	ep.mcp.SetTools(tools...)
}

// list is the endpoint's tools now, in a stable order.
func (ep *endpoint) list(ctx context.Context) []server.ServerTool {
	if ep.connector != "" {
		row, ok := ep.h.d.Live.Lookup(ep.ws, ep.connector)
		if !ok || !row.Active {
			return nil
		}
		var out []server.ServerTool
		for _, t := range ep.h.catalog(ctx, row) {
			out = append(out, server.ServerTool{Tool: t, Handler: ep.h.toolHandler(ep.ws, row.ExternalID, t.Name)})
		}
		return out
	}
	var out []server.ServerTool
	names := map[string]int{} // name -> index in out, for clashes
	for _, row := range ep.h.d.Live.InWorkspace(ep.ws) {
		if !row.Active {
			continue
		}
		cat := ep.h.catalog(ctx, row)
		for _, t := range cat {
			orig := t.Name
			t.Name = prefixedName(row.ExternalID, orig)
			if i, clash := names[t.Name]; clash {
				// Two pairs on one name: a hash collision, or an id made
				// to look like another's hashed form. Neither may pass
				// for the other: both get the long hash.
				ep.h.logger.WarnContext(ctx, "two tools of the workspace endpoint have one name: both get a longer one",
					slog.String("workspace_id", ep.ws), slog.String("name", t.Name))
				prev := &out[i]
				prev.Tool.Name = shortenLong(prev.Tool.Name)
				t.Name = shortenLong(t.Name + "\x00" + row.ExternalID + "\x00" + orig)
			}
			names[t.Name] = len(out)
			out = append(out, server.ServerTool{Tool: t, Handler: ep.h.toolHandler(ep.ws, row.ExternalID, orig)})
		}
		if ep.h.d.Queries != nil && ep.h.cfg.Agents {
			out = append(out, server.ServerTool{Tool: agentTool(row, cat), Handler: ep.h.agentHandler(ep.ws, row.ExternalID)})
		}
	}
	return out
}

// shortenLong is shorten with the whole hash room a name has.
func shortenLong(key string) string {
	h := hash(key)
	return "t" + h[:maxToolName-1]
}

// catalog is connector row's enabled tools as its server gave them: from
// the live connection when this replica holds one, else the catalog its
// owner synced to the store (a stdio connector another replica owns).
func (h *Handler) catalog(ctx context.Context, row *store.Connector) []mcp.Tool {
	if id, ok := h.d.Registry.Lookup(row.WorkspaceID, row.ExternalID); ok {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		cat, err := h.d.Registry.Catalog(cctx, id)
		cancel()
		if err == nil {
			return slices.Clone(cat.Enabled())
		}
	}
	if h.d.Tools == nil {
		return nil
	}
	rows, err := h.d.Tools.ConnectorTools(ctx, row.ID)
	if err != nil {
		h.logger.WarnContext(ctx, "list a connector's tools for the MCP endpoint", slog.String("connector_id", row.ExternalID),
			slog.String("error", err.Error()))
		return nil
	}
	var out []mcp.Tool
	for _, t := range rows {
		if !t.Enabled {
			continue
		}
		tool := mcp.Tool{Name: t.Name, Description: t.Description, RawInputSchema: t.InputSchema}
		a := t.Annotations
		tool.Annotations = mcp.ToolAnnotation{Title: a.Title, ReadOnlyHint: a.ReadOnlyHint, DestructiveHint: a.DestructiveHint,
			IdempotentHint: a.IdempotentHint, OpenWorldHint: a.OpenWorldHint}
		out = append(out, tool)
	}
	return out
}

// agentTool is connector row's agent as a tool.
func agentTool(row *store.Connector, cat []mcp.Tool) mcp.Tool {
	name := row.Name
	if name == "" {
		name = row.ExternalID
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Ask the %s connector's agent a question in plain words: it picks the connector's relevant tools, runs them "+
		"(independent ones in parallel) and answers, with the run id and the tools it used.", name)
	if row.Description != "" {
		fmt.Fprintf(&b, " The connector: %s.", strings.TrimSuffix(row.Description, "."))
	}
	if len(cat) > 0 {
		names := make([]string, 0, min(len(cat), 20))
		for _, t := range cat[:min(len(cat), 20)] {
			names = append(names, t.Name)
		}
		fmt.Fprintf(&b, " Its tools: %s", strings.Join(names, ", "))
		if len(cat) > 20 {
			fmt.Fprintf(&b, " and %d more", len(cat)-20)
		}
		b.WriteString(".")
	}
	t := mcp.NewTool(agentName(row.ExternalID),
		mcp.WithDescription(b.String()),
		mcp.WithString("query", mcp.Required(), mcp.Description("The question or task, in plain words.")),
		mcp.WithString("context", mcp.Description("What the agent should know besides the question (the conversation so far, say).")),
		mcp.WithNumber("max_tools", mcp.Description("The most tool calls the agent may make; the service's default if left out.")),
		mcp.WithOpenWorldHintAnnotation(true),
	)
	t.Title = "Ask " + name
	t.Meta = &mcp.Meta{AdditionalFields: map[string]any{agentMetaKey: true}}
	return t
}

// sessionEnded closes what a deleted MCP session held upstream.
func (ep *endpoint) sessionEnded(id string) {
	ep.unsubscribe(id, "")
	if ep.h.d.Sessions == nil {
		return
	}
	sid := serviceSession(id)
	ctx, cancel := context.WithTimeout(ep.h.life, 30*time.Second)
	go func() {
		defer cancel()
		rows := ep.h.d.Live.InWorkspace(ep.ws)
		for _, row := range rows {
			if ep.connector != "" && row.ExternalID != ep.connector {
				continue
			}
			if !row.Active || row.Config.SessionMode != registry.SessionPerSession {
				continue
			}
			if _, err := ep.h.d.Sessions.Close(ctx, ep.ws, row.ExternalID, sid); err != nil {
				ep.h.logger.WarnContext(ctx, "close the upstream session of a deleted MCP session", slog.String("connector_id", row.ExternalID),
					slog.String("error", err.Error()))
			}
		}
	}()
}
