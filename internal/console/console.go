// Package console is the web console of connector-svc: server-rendered
// pages for the people who run it (connectors and their health, tools,
// runs waiting for a person, sessions, authorizations, API keys,
// replicas). It is a front door like the gRPC API and the MCP endpoint,
// and writes no rule of its own: every page calls the ConnectorService
// in-process with the signed-in API key, so the same scope and workspace
// checks, validation and messages apply, and a call that must run on
// another replica is forwarded as the API's calls are.
//
// A person signs in with a workspace API key, kept sealed in a Secure,
// HttpOnly, SameSite=Strict cookie that any replica sharing SECRET_KEY
// can open; every form carries a CSRF token derived from that cookie. A
// route needs the strongest scope among the RPCs it calls (Routes), and
// what a key's scopes do not allow is not shown.
package console

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/metadata"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/auth"
)

//go:embed templates/*.html
var templateFiles embed.FS

//go:embed static
var staticFiles embed.FS

// KeyVerifier checks an API key's token (auth.Keys).
type KeyVerifier interface {
	Verify(ctx context.Context, token string) (auth.Key, error)
}

// Cluster shows the live replicas, the leader and who owns which
// connector; nil shows this replica alone.
type Cluster interface {
	Replicas(ctx context.Context, workspace string) (Replicas, error)
}

// Replicas is the replica set as the console shows it.
type Replicas struct {
	Self   string
	Leader string
	// LeaderUntil is when the leader's term ends unless renewed.
	LeaderUntil time.Time
	Live        []Replica
	// Owners maps the workspace's connector ids to the replica that owns
	// each (health checks, catalog, stdio processes).
	Owners map[string]string
}

// Replica is one live replica.
type Replica struct {
	ID           string
	InternalAddr string
	StartedAt    time.Time
	HeartbeatAt  time.Time
}

// Deps are the console's collaborators.
type Deps struct {
	// API is the ConnectorService, called with the signed-in key.
	API connectorv1.ConnectorServiceClient
	// Keys verifies the key a person signs in with, and again on every
	// request (a revoked key signs its sessions out).
	Keys    KeyVerifier
	Cluster Cluster
	Logger  *slog.Logger
}

// Config are the console's settings.
type Config struct {
	// CookieKey seals the session cookie and derives CSRF tokens: 32 bytes,
	// the same on every replica behind one balancer.
	CookieKey []byte
	// SessionTTL is how long a sign-in lasts; default 12h.
	SessionTTL time.Duration
	// ScopeOf is the scope the API's guard asks of a method (its full
	// name); a route needs the strongest of its RPCs'.
	ScopeOf func(fullMethod string) auth.Scope
	// Refresh is how often the live connector list is re-read; default 1s.
	Refresh time.Duration
	// Version is shown in the footer.
	Version string
}

// Handler serves the console. Safe for concurrent use.
type Handler struct {
	api     connectorv1.ConnectorServiceClient
	keys    KeyVerifier
	cluster Cluster
	logger  *slog.Logger
	cfg     Config
	seal    *sealer
	pages   map[string]*template.Template
	mux     *http.ServeMux
	routes  []Route
}

// Route is one of the console's routes and the scope it needs.
type Route struct {
	Method, Pattern string
	// Scope is what the signed-in key needs; "" is any signed-in key, and
	// Public routes need none.
	Scope  auth.Scope
	Public bool
	// RPCs are the ConnectorService methods (full names) it calls, or a
	// form it shows posts to.
	RPCs []string
	// Optional are methods it calls only when the key's scopes allow them
	// (a run's page reads the tools' schemas for an admin key, and shows
	// JSON to others).
	Optional []string
}

// New returns the console's handler.
func New(d Deps, cfg Config) (*Handler, error) {
	if d.API == nil || d.Keys == nil {
		return nil, errors.New("console: the API and the key verifier are required")
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = 12 * time.Hour
	}
	if cfg.Refresh <= 0 {
		cfg.Refresh = time.Second
	}
	if cfg.ScopeOf == nil {
		return nil, errors.New("console: ScopeOf is required")
	}
	seal, err := newSealer(cfg.CookieKey)
	if err != nil {
		return nil, err
	}
	h := &Handler{api: d.API, keys: d.Keys, cluster: d.Cluster, logger: d.Logger, cfg: cfg, seal: seal, mux: http.NewServeMux()}
	if h.pages, err = parsePages(); err != nil {
		return nil, err
	}
	h.register()
	return h, nil
}

// Routes are the console's routes with the scope each needs, in the order
// they were registered.
func (h *Handler) Routes() []Route { return slices.Clone(h.routes) }

// ServeHTTP serves the console.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Referrer-Policy", "same-origin")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
	h.mux.ServeHTTP(w, r)
}

// handlerFunc is a route's handler, given the signed-in person.
type handlerFunc func(w http.ResponseWriter, r *http.Request, s *session)

// scopeRank orders scopes by strength: a route needs its strongest RPC's.
var scopeRank = map[auth.Scope]int{"": 0, auth.ScopeCall: 1, auth.ScopeQuery: 2, auth.ScopeAdmin: 3}

// handle registers a signed-in route that calls rpcs (ConnectorService
// method names, as "ListConnectors").
func (h *Handler) handle(method, pattern string, rpcs []string, fn handlerFunc) {
	rt := Route{Method: method, Pattern: pattern}
	for _, name := range rpcs {
		full := "/" + connectorv1.ConnectorService_ServiceDesc.ServiceName + "/" + name
		rt.RPCs = append(rt.RPCs, full)
		if s := h.cfg.ScopeOf(full); scopeRank[s] > scopeRank[rt.Scope] {
			rt.Scope = s
		}
	}
	h.routes = append(h.routes, rt)
	h.mux.HandleFunc(method+" "+pattern, func(w http.ResponseWriter, r *http.Request) {
		s, err := h.session(r)
		if err != nil {
			h.signedOut(w, r, err)
			return
		}
		if rt.Scope != "" && !s.key.Allows(rt.Scope) {
			h.fail(w, r, s, http.StatusForbidden, "Not allowed",
				fmt.Sprintf("This page needs an API key with scope %s; key %s has %s.", rt.Scope, s.key.ID, scopeNames(s.key.Scopes)))
			return
		}
		if method == http.MethodPost {
			if err := h.checkForm(r, s); err != nil {
				h.fail(w, r, s, http.StatusForbidden, "Form refused", err.Error())
				return
			}
		}
		fn(w, r, s)
	})
}

// also marks methods the last route calls only when the key allows them.
func (h *Handler) also(names ...string) {
	rt := &h.routes[len(h.routes)-1]
	for _, name := range names {
		rt.Optional = append(rt.Optional, "/"+connectorv1.ConnectorService_ServiceDesc.ServiceName+"/"+name)
	}
}

// public registers a route that needs no sign-in.
func (h *Handler) public(method, pattern string, fn http.HandlerFunc) {
	h.routes = append(h.routes, Route{Method: method, Pattern: pattern, Public: true})
	h.mux.HandleFunc(method+" "+pattern, fn)
}

func (h *Handler) register() {
	static, _ := fs.Sub(staticFiles, "static")
	h.public(http.MethodGet, "/static/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=3600")
		http.StripPrefix("/static/", http.FileServerFS(static)).ServeHTTP(w, r)
	})
	h.public(http.MethodGet, "/signin", h.signInPage)
	h.public(http.MethodPost, "/signin", h.signIn)
	h.handle(http.MethodPost, "/signout", nil, h.signOut)
	h.handle(http.MethodGet, "/{$}", nil, h.home)

	h.handle(http.MethodGet, "/connectors", []string{"ListConnectors"}, h.connectorsPage)
	h.handle(http.MethodGet, "/connectors/events", []string{"ListConnectors"}, h.connectorEvents)
	h.handle(http.MethodGet, "/connectors/new", []string{"CreateConnector"}, h.newConnectorPage) // the RPC its form posts to
	h.handle(http.MethodPost, "/connectors", []string{"CreateConnector"}, h.createConnector)
	h.handle(http.MethodGet, "/connectors/{id}", []string{"GetConnector", "ListTools"}, h.connectorPage)
	h.handle(http.MethodGet, "/connectors/{id}/edit", []string{"GetConnector"}, h.editConnectorPage)
	h.handle(http.MethodPost, "/connectors/{id}/edit", []string{"GetConnector", "UpdateConnector"}, h.updateConnector)
	h.handle(http.MethodPost, "/connectors/{id}/activate", []string{"ActivateConnector"}, h.connectorAction)
	h.handle(http.MethodPost, "/connectors/{id}/deactivate", []string{"DeactivateConnector"}, h.connectorAction)
	h.handle(http.MethodPost, "/connectors/{id}/check", []string{"CheckConnector"}, h.connectorAction)
	h.handle(http.MethodPost, "/connectors/{id}/refresh", []string{"RefreshTools"}, h.connectorAction)
	h.handle(http.MethodGet, "/connectors/{id}/delete", []string{"GetConnector"}, h.deleteConnectorPage)
	h.handle(http.MethodPost, "/connectors/{id}/delete", []string{"DeleteConnector"}, h.deleteConnector)
	h.handle(http.MethodGet, "/connectors/{id}/tools/{tool}", []string{"ListTools"}, h.toolPage)
	h.handle(http.MethodPost, "/connectors/{id}/tools/{tool}", []string{"UpdateTool"}, h.updateTool)
	h.handle(http.MethodPost, "/connectors/{id}/tools/{tool}/call", []string{"ListTools", "CallTool"}, h.callTool)

	h.handle(http.MethodGet, "/runs", []string{"ListQueryRuns"}, h.runsPage)
	h.handle(http.MethodGet, "/runs/{id}", []string{"GetQueryRun"}, h.runPage)
	h.also("ListTools")
	h.handle(http.MethodPost, "/runs/{id}/resume", []string{"GetQueryRun", "ResumeQuery"}, h.resumeRun)
	h.also("ListTools")

	h.handle(http.MethodGet, "/sessions", []string{"ListSessions"}, h.sessionsPage)
	h.also("ListConnectors")
	h.handle(http.MethodPost, "/sessions/close", []string{"CloseSession"}, h.closeSession)
	h.handle(http.MethodGet, "/authorizations", []string{"ListAuthorizations"}, h.authorizationsPage)
	h.handle(http.MethodPost, "/authorizations/revoke", []string{"RevokeAuthorization"}, h.revokeAuthorization)
	h.handle(http.MethodGet, "/keys", []string{"ListApiKeys"}, h.keysPage)
	h.handle(http.MethodPost, "/keys", []string{"CreateApiKey"}, h.createKey)
	h.handle(http.MethodPost, "/keys/{id}/revoke", []string{"RevokeApiKey"}, h.revokeKey)
	h.handle(http.MethodGet, "/replicas", []string{"ListConnectors"}, h.replicasPage)
}

// outgoing is ctx carrying the signed-in key for the API.
func outgoing(ctx context.Context, s *session) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+s.token)
}

// home sends a person to the first page their key may see.
func (h *Handler) home(w http.ResponseWriter, r *http.Request, s *session) {
	for _, n := range navItems {
		if s.key.Allows(n.Scope) {
			http.Redirect(w, r, n.Path, http.StatusSeeOther)
			return
		}
	}
	h.fail(w, r, s, http.StatusForbidden, "Nothing to show", "This key's scopes allow no page of the console.")
}

// nav is one entry of the navigation bar.
type nav struct {
	Path, Label string
	Scope       auth.Scope
}

var navItems = []nav{
	{"/connectors", "Connectors", auth.ScopeAdmin},
	{"/runs", "Runs", auth.ScopeQuery},
	{"/sessions", "Sessions", auth.ScopeCall},
	{"/authorizations", "Authorizations", auth.ScopeQuery},
	{"/keys", "API keys", auth.ScopeAdmin},
	{"/replicas", "Replicas", auth.ScopeAdmin},
}

func scopeNames(ss []auth.Scope) string {
	if len(ss) == 0 {
		return "no scope"
	}
	names := make([]string, len(ss))
	for i, s := range ss {
		names[i] = string(s)
	}
	return strings.Join(names, ", ")
}
