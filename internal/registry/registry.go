// Package registry keeps one persistent MCP client per active connector:
// it connects them at start-up, shares each client among all callers,
// re-initializes sessions a server forgot, rebuilds dead connections,
// health-checks the connectors this replica owns with tools/list (see
// SetOwner), and reconnects with backoff. Per-session connections of
// streamable HTTP can be handed to another replica (Adopt). It knows
// nothing of gRPC or SQL: it reads connectors from and reports what it
// learns to a ConnectorSource.
//
// What needs no connection's state lives in subpackages, each given what
// it needs explicitly: httppool (the HTTP transports shared by origin,
// each connector's pool, each session's ending client), stdio (a stdio
// server's process group), msglimit (the size limit on a server's
// messages), oauthtransport (the client that puts users' tokens on
// requests, and the unauthenticated probe), ssereq (server requests on a
// legacy SSE stream), progress (progress notifications routed to their
// calls), tasks (task tools), sessionless (calls of the 2026-07-28
// protocol and their input rounds) and elicit (elicitation to and from
// internal/ask).
package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/mark3labs/mcp-go/mcp"
	"go.opentelemetry.io/otel/trace"

	"github.com/connector-svc/connector-svc/internal/registry/httppool"
)

// Registry holds the connections. Create it with New, run it with Run; all
// other methods are safe for concurrent use while it runs.
type Registry struct {
	source ConnectorSource
	cfg    Config
	logger *slog.Logger
	tracer trace.Tracer
	// metrics records what the registry does, on Config.MeterProvider.
	metrics *metrics
	// transports are the HTTP transports connectors share, by origin.
	transports *httppool.Transports

	// life bounds every background stream and connect; cancelled by Run's end.
	life   context.Context
	cancel context.CancelFunc

	mu    sync.Mutex
	conns map[int64]*conn
	byRef map[ref]int64
	// followers are the connectors this replica does not own (SetOwner);
	// a role outlives the conns that take it.
	followers map[int64]bool
	loaded    bool
	stopping  bool // set by shutdown: no new background work

	due *dueQueue // connectors whose connect or check is due
	sem chan struct{}
	bg  sync.WaitGroup // jobs, late closes and refreshes

	// catVersions numbers the catalogs of every connection (see Catalog).
	catVersions atomic.Uint64
	// resourceEvents, if set, takes Config.OnResourceEvent's place.
	resourceEvents atomic.Pointer[func(int64, ResourceEvent)]
}

// New returns a Registry over source. It starts nothing: call Run.
func New(source ConnectorSource, cfg Config, logger *slog.Logger) *Registry {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cfg.setDefaults()
	life, cancel := context.WithCancel(context.Background())
	r := &Registry{
		source: source, cfg: cfg, logger: logger, tracer: cfg.TracerProvider.Tracer("connector-svc/registry"),
		life: life, cancel: cancel,
		conns:     make(map[int64]*conn),
		byRef:     make(map[ref]int64),
		followers: make(map[int64]bool),
		due:       newDueQueue(),
		sem:       make(chan struct{}, cfg.Concurrency),
	}
	r.metrics = newMetrics(cfg.MeterProvider, r)
	r.transports = httppool.New(cfg.Egress, cfg.MaxIdleConnsPerConnector, cfg.ownTransports)
	return r
}

// Load reads the active connectors from the source and holds them as
// CONNECTING; Run connects them. Calling it before serving means no call
// finds a loaded connector missing. Run calls it if nobody has.
func (r *Registry) Load(ctx context.Context) error {
	r.mu.Lock()
	done := r.loaded
	r.loaded = true
	r.mu.Unlock()
	if done {
		return nil
	}
	specs, err := r.source.ActiveConnectors(ctx)
	if err != nil {
		return fmt.Errorf("load connectors: %w", err)
	}
	for _, s := range specs {
		r.Add(s)
	}
	if len(specs) > 0 { // a source that hands connectors over otherwise (live.Apply) lists none
		r.logger.InfoContext(ctx, "registry loaded connectors", slog.Int("count", len(specs)))
	}
	return nil
}

// ref is how callers name a connector.
type ref struct{ workspaceID, connectorID string }

// put holds c as the connection of its connector and returns the one it
// replaces, if any. r.mu must be held.
func (r *Registry) put(c *conn) *conn {
	old := r.conns[c.spec.ID]
	if old != nil {
		delete(r.byRef, ref{old.spec.WorkspaceID, old.spec.ConnectorID})
	}
	r.conns[c.spec.ID] = c
	r.byRef[ref{c.spec.WorkspaceID, c.spec.ConnectorID}] = c.spec.ID
	c.setOwner(!r.followers[c.spec.ID]) // SetOwner may have changed it since newConn
	return old
}

// SetOwner makes this replica connector id's owner, or one of its
// followers. Only the owner runs the periodic health checks (tools/list),
// writes health (SaveHealth) and syncs the catalog to the source
// (SyncTools). A follower keeps a session of its own and serves calls
// over it; it connects and lists the tools once at connect (that listing,
// with the flags read from the source, is its catalog: see ToolFlags),
// reconnects with backoff when its session dies or a call finds it dead,
// and re-lists on Resync and on the server's tools/list_changed, but runs
// no periodic check and writes no health and no catalog. Both report
// usage counters (AddUsage adds them up). A connector the registry has
// never been told about is owned: a single replica behaves as if there
// were no roles. A new owner checks at once, and that check syncs the
// catalog and writes health whatever changed; a new follower's checks
// stop. The role is kept for connector id across Add and Replace, even if
// set before them, and forgotten by Remove and Delete.
func (r *Registry) SetOwner(id int64, owner bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if owner {
		delete(r.followers, id)
	} else {
		r.followers[id] = true
	}
	if c := r.conns[id]; c != nil {
		c.setOwner(owner)
	}
}

// Owner reports whether this replica owns connector id (see SetOwner).
func (r *Registry) Owner(id int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.followers[id]
}

// Resync lists connector id's tools once and publishes its catalog, with
// the flags read from the source (ToolFlags), writing nothing: a
// follower's answer to its owner's announcing a changed catalog. On an
// owner it is the same, and its next check syncs the source.
func (r *Registry) Resync(ctx context.Context, id int64) error {
	c, err := r.get(id)
	if err != nil {
		return err
	}
	return c.resync(ctx)
}

// Lookup returns the id of a workspace's connector if the registry holds
// it, that is if it is active.
func (r *Registry) Lookup(workspaceID, connectorID string) (int64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	id, ok := r.byRef[ref{workspaceID, connectorID}]
	return id, ok
}

// SetToolEnabled publishes an operator's change of a tool's enabled flag to
// the live catalog; the caller has stored it already.
func (r *Registry) SetToolEnabled(id int64, name string, enabled bool) {
	if c, err := r.get(id); err == nil {
		c.setFlag(func(k *catalog) *catalog { return k.withEnabled(name, enabled) })
	}
}

// SetToolApproval publishes an operator's change of a tool's approval
// override (nil: none) to the live catalog; the caller has stored it
// already.
func (r *Registry) SetToolApproval(id int64, name string, override *bool) {
	if c, err := r.get(id); err == nil {
		c.setFlag(func(k *catalog) *catalog { return k.withApproval(name, override) })
	}
}

// Add starts keeping a connection for spec; the loop connects it soon, and
// calls that arrive first wait for that connect. A connector already held
// is replaced (see Replace).
func (r *Registry) Add(spec Spec) {
	c := newConn(r, spec)
	r.mu.Lock()
	c.inheritSubscriptions(r.conns[spec.ID])
	old := r.put(c)
	r.mu.Unlock()
	r.retireLater(old)
	c.mu.Lock()
	c.arm() // a connect, due now
	c.mu.Unlock()
}

// Replace swaps in a connection with spec's new settings: the new client
// connects first (within ctx), then takes the old one's place, so that new
// calls go to it; calls running on the old one finish (bounded by the call
// timeout) before it closes. If the new connect fails, the new settings
// still take effect and reconnect with backoff.
func (r *Registry) Replace(ctx context.Context, spec Spec) {
	c := newConn(r, spec)
	r.mu.Lock()
	c.owner = !r.followers[spec.ID] // before its connect, which writes only as the owner
	c.inheritSubscriptions(r.conns[spec.ID])
	r.mu.Unlock()
	_ = c.connectShared(ctx) // arms c's timer, for a check or a reconnect
	r.mu.Lock()
	old := r.put(c)
	r.mu.Unlock()
	r.retireLater(old)
}

// retireLater closes a replaced conn once its calls have drained, off the
// caller's path; Run waits for it.
func (r *Registry) retireLater(old *conn) {
	if old == nil {
		return
	}
	if !r.enter() {
		old.close(ErrClosed) // shutting down: close it here
		return
	}
	go func() {
		defer r.bg.Done()
		old.closeDrained()
		r.reportConn(context.Background(), old)
	}()
}

// Remove closes and forgets the connection of a connector that was
// deactivated. It returns when the connection is closed; calls running on
// it, or waiting for it, fail with ErrDeactivated.
func (r *Registry) Remove(id int64) { r.remove(id, ErrDeactivated) }

// Delete closes and forgets the connection of a connector that was
// deleted. It returns when the connection is closed; calls running on it,
// or waiting for it, fail with ErrDeleted.
func (r *Registry) Delete(id int64) { r.remove(id, ErrDeleted) }

// HandOver forgets the connection of a connector another replica now
// holds (a stdio connector whose ownership moved): new calls no longer
// find it here, and the calls running on it finish (bounded by the call
// timeout) before it closes, as a replaced connection's do.
func (r *Registry) HandOver(id int64) { r.retireLater(r.take(id)) }

// take forgets connector id's connection and returns it (nil if none).
func (r *Registry) take(id int64) *conn {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.conns[id]
	delete(r.conns, id)
	delete(r.followers, id)
	if c != nil {
		delete(r.byRef, ref{c.spec.WorkspaceID, c.spec.ConnectorID})
	}
	return c
}

func (r *Registry) remove(id int64, why error) {
	if c := r.take(id); c != nil {
		c.close(why)
		r.reportConn(context.Background(), c)
	}
}

// CallTool runs a tool of connector id over its persistent session, or,
// for a per_session connector, over the connection of opts.Session
// (ErrSessionRequired without one, *SessionLimitError at the connector's
// cap), or, for an oauth_user connector, over the connection of
// opts.UserID (ErrUserRequired without one; an *AuthError when the user
// has no usable token). A call that arrives while the connector connects waits for that
// connect (within ctx); one that arrives during an update runs on the new
// connection. Tools annotated read-only or idempotent are retried once on
// a rebuilt connection if the connection broke mid-call. With
// opts.Progress, the server's progress notifications for the call reach it
// before CallTool returns (see CallOptions). A call that ends by its
// deadline with no answer has the session probed at once (see
// conn.suspect). What the server asks in the middle of the call
// (elicitation, sampling) goes to the ask.Asker ctx carries (ask.With;
// see asks.go), and the user's wait does not count against the call
// timeout; a sessionless server's request for the user's input ends the
// call with an *ask.InputRequiredError (send it again with opts.Retry),
// and a classic server's -32042 with an *ask.URLRequiredError. Returns ErrNotLoaded, ErrDeleted or ErrDeactivated (the
// connector went under the call), ErrClosed (shutdown), ErrToolNotFound
// (the server does not list it now), ErrToolDisabled, or an error wrapping
// ErrUnavailable when the connector cannot be used now: it says what
// failed last, how long ago, and when the next attempt is.
func (r *Registry) CallTool(ctx context.Context, id int64, name string, args map[string]any, opts CallOptions) (*mcp.CallToolResult, error) {
	for {
		c, err := r.get(id)
		if err != nil {
			return nil, err
		}
		var res *mcp.CallToolResult
		switch {
		case c.spec.perUser() && opts.UserID == "":
			return nil, ErrUserRequired
		case c.spec.perUser():
			opts.Session = UserSession(opts.UserID)
			res, err = c.callSession(ctx, name, args, opts)
		case !c.spec.perSession():
			res, err = c.call(ctx, name, args, opts)
		case opts.Session == "":
			return nil, ErrSessionRequired
		default:
			res, err = c.callSession(ctx, name, args, opts)
		}
		if !errors.Is(err, errReplaced) {
			return res, err
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
}

// Tools returns the cached tool list of connector id, sorted by name.
func (r *Registry) Tools(id int64) ([]mcp.Tool, error) {
	c, err := r.get(id)
	if err != nil {
		return nil, err
	}
	return c.tools(), nil
}

// Refresh lists connector id's tools now and syncs the catalog; on a
// follower it writes nothing (see Resync), and the changes are empty.
func (r *Registry) Refresh(ctx context.Context, id int64) (ToolChanges, error) {
	c, err := r.get(id)
	if err != nil {
		return ToolChanges{}, err
	}
	return c.refresh(ctx)
}

// Check probes connector id now (reconnecting it if it is down) and
// returns its health.
func (r *Registry) Check(ctx context.Context, id int64) (Health, error) {
	c, err := r.get(id)
	if err != nil {
		return Health{}, err
	}
	done := make(chan Health, 1)
	go func() { done <- c.check() }()
	select {
	case h := <-done:
		r.logger.Debug("on-demand health check", append(c.logAttrs(), slog.String("state", string(h.State)),
			slog.String("latency", h.Latency.String()))...)
		return h, nil
	case <-ctx.Done():
		return c.snapshot(), ctx.Err()
	}
}

// Ready returns nil when connector id can take calls now, its catalog
// included: it waits for a connect under way and fails fast (ErrUnavailable
// with the last error) when the connector is down.
func (r *Registry) Ready(ctx context.Context, id int64) error {
	_, err := r.Catalog(ctx, id)
	return err
}

// Catalog is a connector's tool catalog at one version: the tools its
// server listed, with the operators' flags. It never changes; a change is
// a new Catalog with a higher version. Versions are unique across the
// registry, a replaced connection's included, so what is derived from a
// catalog can be kept as long as the version it was derived from is
// current.
type Catalog struct{ cat *catalog }

// Version identifies the catalog.
func (c Catalog) Version() uint64 { return c.cat.version }

// Enabled returns the tools that may be called, sorted by name.
func (c Catalog) Enabled() []mcp.Tool {
	if len(c.cat.disabled) == 0 {
		return c.cat.tools
	}
	out := make([]mcp.Tool, 0, len(c.cat.tools))
	for _, t := range c.cat.tools {
		if !c.cat.disabled[t.Name] {
			out = append(out, t)
		}
	}
	return out
}

// Tool returns a tool that may be called (listed and enabled) and its
// approval override (nil: none).
func (c Catalog) Tool(name string) (mcp.Tool, *bool, bool) {
	t, err := c.cat.callable(name)
	if err != nil {
		return mcp.Tool{}, nil, false
	}
	return t, c.Override(name), true
}

// Override returns a tool's approval override: true, always ask; false,
// never; nil, none (its connector's policy decides).
func (c Catalog) Override(name string) *bool {
	if v, set := c.cat.approval[name]; set {
		return &v
	}
	return nil
}

// Catalog returns connector id's current catalog once it can take calls:
// like Ready, it waits for a connect under way and fails fast when the
// connector is down.
func (r *Registry) Catalog(ctx context.Context, id int64) (Catalog, error) {
	for {
		c, err := r.get(id)
		if err != nil {
			return Catalog{}, err
		}
		_, _, cat, err := c.ready(ctx)
		switch {
		case errors.Is(err, errReplaced):
			continue
		case err != nil:
			return Catalog{}, err
		case cat == nil:
			// READY implies a synced catalog; this is a defect, not a state.
			return Catalog{}, c.unavailable(errors.New("the connector has no tool catalog yet"))
		}
		return Catalog{cat: cat}, nil
	}
}

// Has reports whether the registry holds a connection for connector id.
func (r *Registry) Has(id int64) bool {
	_, err := r.get(id)
	return err == nil
}

// Health returns connector id's last known health.
func (r *Registry) Health(id int64) (Health, error) {
	c, err := r.get(id)
	if err != nil {
		return Health{}, err
	}
	return c.snapshot(), nil
}

func (r *Registry) get(id int64) (*conn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.life.Err() != nil {
		return nil, ErrClosed
	}
	c, ok := r.conns[id]
	if !ok {
		return nil, ErrNotLoaded
	}
	return c, nil
}

// enter registers background work that shutdown must wait for; it
// returns false once shutdown has begun. Pair a true with r.bg.Done().
func (r *Registry) enter() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopping {
		return false
	}
	r.bg.Add(1)
	return true
}

// refreshLater re-syncs c's catalog after a tools/list_changed notification.
func (r *Registry) refreshLater(c *conn) {
	if !r.enter() {
		return
	}
	go func() {
		defer r.bg.Done()
		ctx, cancel := context.WithTimeout(r.life, r.cfg.HealthTimeout)
		defer cancel()
		if _, err := c.refresh(ctx); err != nil && !errors.Is(err, context.Canceled) {
			r.logger.Warn("refresh after tools/list_changed", append(c.logAttrs(), slog.String("error", err.Error()))...)
		}
	}()
}

// closeLater closes a session off the caller's path; Run waits for it.
func (r *Registry) closeLater(s *session) {
	if s == nil {
		return
	}
	if !r.enter() {
		s.close(r.cfg.CloseGrace) // shutting down: close it here
		return
	}
	go func() {
		defer r.bg.Done()
		s.close(r.cfg.CloseGrace)
	}()
}
