// Package mcpserve is the service's second front door: the connectors
// served over MCP (streamable HTTP), on the same use cases as the gRPC API.
//
// Two kinds of endpoint, under one listener (MCP_ADDR):
//   - /mcp/<workspace>/<connector> serves one connector's enabled tools
//     under the server's own names;
//   - /mcp/<workspace> serves every active connector of the workspace,
//     each tool named <connector>__<tool> (names.go), and, to keys of
//     scope query, one agent tool per connector (ask_<connector>) that
//     runs a query on the connector's agent.
//
// A caller authenticates with a workspace API key (Authorization: Bearer);
// who may do what is access.go's. A tool call is placed by live.Placer as
// a gRPC call is (here, or one hop to the replica that serves it), and runs
// through calls.Service: rate limit, approval policy, egress, result caps,
// counters and traces are the use case's, written once. A call that needs
// a person's approval asks the MCP client with a form (approval.go); a user
// who must authorize first is sent the authorization URL.
//
// Both protocol generations are served on the same URL (mcp-go decides per
// request): 2025-11-25 with sessions, whose ids any replica accepts
// (sessionid.go), and the sessionless 2026-07-28.
package mcpserve

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/authorizations"
	"github.com/connector-svc/connector-svc/internal/calls"
	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/queries"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/resources"
	"github.com/connector-svc/connector-svc/internal/sessions"
	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/watches"
)

// Deps are the Handler's collaborators: the use cases the gRPC adapter
// calls (the same instances), and the live state it lists tools from.
type Deps struct {
	Calls *calls.Service
	// Resources serves the connectors' resources, prompts and completions;
	// Watches their subscriptions. Nil: the endpoints offer tools only
	// (nil Watches: no subscriptions).
	Resources *resources.Service
	Watches   *watches.Hub
	Queries   *queries.Service
	// Placer says where a call runs; the connection it returns is the
	// internal hop to that replica.
	Placer *live.Placer
	// Sessions closes a deleted MCP session's upstream sessions;
	// Authorizations starts a user's authorization a call needs.
	Sessions       *sessions.Service
	Authorizations *authorizations.Service
	Live           *live.Connectors
	Registry       *registry.Registry
	// Tools reads a connector's catalog from the store, for a connector
	// this replica holds no connection of (a stdio one another replica
	// owns).
	Tools ToolStore
	// Relay sends an MCP client's answer that reached this replica to
	// every replica (answers.go); nil: answers are served where they come
	// in, and a balancer must keep a session's requests on one replica.
	Relay Relay
	// Keys verifies API keys; nil: no keys, and Config.Auth decides.
	Keys   *auth.Keys
	Logger *slog.Logger
}

// ToolStore reads a connector's synced catalog.
type ToolStore interface {
	ConnectorTools(ctx context.Context, id int64) ([]*store.Tool, error)
}

// Config is the endpoint's settings.
type Config struct {
	// Auth is the service's AUTH mode: with keys (auto once one exists,
	// keys always) every request needs one.
	Auth auth.Mode
	// SessionKey signs the 2025-11-25 session ids, so that every replica
	// accepts a session another one started (derived from SECRET_KEY).
	SessionKey []byte
	// AllowedOrigins are the Origin values accepted besides the
	// endpoint's own host; "*" accepts any (not for browsers' reach).
	AllowedOrigins []string
	// MaxBodyBytes caps a request's body; 0 means 4 MiB.
	MaxBodyBytes int64
	// RateLimit is each key's requests per second on this replica, and
	// Burst its burst; 0 means no limit.
	RateLimit float64
	Burst     int
	// SessionQueue bounds the notifications waiting for one slow client.
	SessionQueue int
	// SessionIdleTTL is how long a replica keeps the state of a 2025-11-25
	// session that sends it nothing (mcp-go keeps it until a DELETE reaches
	// this replica, which behind a balancer without affinity, or from a
	// client that never sends one, may be never); 0 means 30 minutes. The
	// session itself goes on: its id is signed, and the next request finds
	// it again on any replica.
	SessionIdleTTL time.Duration
	// ListInterval is how often an endpoint with clients compares its
	// catalogs, to tell them of a change; 0 means 2 s.
	ListInterval time.Duration
	// ListPageSize is how many tools, resources, templates or prompts
	// one list answer holds, the rest behind its nextCursor; 0 means 100.
	ListPageSize int
	// CallTimeout bounds a tool call that has no deadline of its own; the
	// agent tools take QueryTimeout.
	CallTimeout, QueryTimeout time.Duration
	// Agents offers the agent tools (ask_<connector>): an LLM is
	// configured.
	Agents bool
	// Version is the service's version, as initialize reports it.
	Version string
}

func (c Config) withDefaults() Config {
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = 4 << 20
	}
	if c.ListInterval <= 0 {
		c.ListInterval = 2 * time.Second
	}
	if c.ListPageSize <= 0 {
		c.ListPageSize = 100
	}
	if c.CallTimeout <= 0 {
		c.CallTimeout = 5 * time.Minute
	}
	if c.QueryTimeout <= 0 {
		c.QueryTimeout = 10 * time.Minute
	}
	if c.SessionIdleTTL <= 0 {
		c.SessionIdleTTL = 30 * time.Minute
	}
	if c.SessionQueue <= 0 {
		c.SessionQueue = 100
	}
	if c.Version == "" {
		c.Version = "dev"
	}
	return c
}

// UserHeader names the end user behind a request, for oauth_user
// connectors and the audit trail; only keys of scope users may send it.
const UserHeader = "X-Connector-User-Id"

// Handler serves the MCP endpoints. Safe for concurrent use.
type Handler struct {
	d      Deps
	cfg    Config
	logger *slog.Logger
	access *access
	ids    *sessionIDs

	open      openRequests // each session's requests served here now
	mu        sync.Mutex
	endpoints map[string]*endpoint // by path
	life      context.Context      // Run's: endpoints' pollers end with it
}

// New returns the endpoints' handler. Run keeps their tool lists current.
func New(d Deps, cfg Config) *Handler {
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	cfg = cfg.withDefaults()
	return &Handler{d: d, cfg: cfg, logger: d.Logger, access: newAccess(d.Keys, cfg),
		ids: newSessionIDs(cfg.SessionKey), endpoints: map[string]*endpoint{}, life: context.Background()}
}

// Run tells the endpoints' clients of catalog changes until ctx ends.
func (h *Handler) Run(ctx context.Context) error {
	h.mu.Lock()
	h.life = ctx
	h.mu.Unlock()
	t := time.NewTicker(h.cfg.ListInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			h.syncAll(ctx)
		}
	}
}

// ServeHTTP checks the caller, then hands the request to its endpoint.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ws, connector, ok := parsePath(r.URL.Path)
	if !ok {
		http.Error(w, "not found: the MCP endpoints are /mcp/<workspace> and /mcp/<workspace>/<connector>", http.StatusNotFound)
		return
	}
	if !h.access.originAllowed(r) {
		http.Error(w, "forbidden: Origin "+r.Header.Get("Origin")+" is not allowed (MCP_ALLOWED_ORIGINS)", http.StatusForbidden)
		return
	}
	who, denied := h.access.check(r, ws)
	if denied != nil && !h.endsItsSession(r, ws, connector) {
		denied.write(w)
		return
	}
	var body []byte
	if r.Method == http.MethodPost {
		var err error
		body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes))
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeJSONRPCError(w, http.StatusRequestEntityTooLarge, -32600,
				"request body is over the limit of "+strconv.FormatInt(h.cfg.MaxBodyBytes, 10)+" bytes (MCP_MAX_BODY_BYTES)")
			return
		}
		if err != nil {
			http.Error(w, "cannot read the request body", http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r = r.WithContext(withInitialize(r.Context(), body))
	}
	ep, err := h.endpoint(r.Context(), ws, connector)
	if err != nil {
		writeJSONRPCError(w, http.StatusNotFound, -32600, err.Error())
		return
	}
	r = r.WithContext(withCaller(r.Context(), who))
	if r.Method == http.MethodPost {
		if h.serveAnswer(w, r, ep, body) {
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		if s := r.Header.Get("Mcp-Session-Id"); s != "" {
			defer h.open.add(s)()
		}
	}
	ep.http.ServeHTTP(w, r)
}

// endsItsSession reports whether r is a DELETE of a session of this very
// endpoint that carries no key: some clients (mcp-go's) send their DELETE
// without the headers they send with requests. Ending a session takes its
// signed id, which only its client has; it grants nothing else.
func (h *Handler) endsItsSession(r *http.Request, ws, connector string) bool {
	if r.Method != http.MethodDelete || r.Header.Get("Authorization") != "" {
		return false
	}
	path := "/mcp/" + ws
	if connector != "" {
		path += "/" + connector
	}
	c, err := h.ids.parse(r.Header.Get("Mcp-Session-Id"))
	return err == nil && c.Path == path
}

// parsePath splits /mcp/<workspace>[/<connector>].
func parsePath(p string) (ws, connector string, ok bool) {
	rest, found := strings.CutPrefix(p, "/mcp/")
	if !found {
		return "", "", false
	}
	rest = strings.TrimSuffix(rest, "/")
	parts := strings.Split(rest, "/")
	switch {
	case len(parts) == 1 && parts[0] != "":
		return parts[0], "", true
	case len(parts) == 2 && parts[0] != "" && parts[1] != "":
		return parts[0], parts[1], true
	}
	return "", "", false
}

func writeJSONRPCError(w http.ResponseWriter, status, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"jsonrpc": "2.0", "id": nil, "error": map[string]any{"code": code, "message": msg}})
}
