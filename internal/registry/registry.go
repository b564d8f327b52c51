// Package registry keeps one persistent MCP client per active connector:
// it connects them at start-up, shares each client among all callers,
// re-initializes sessions a server forgot, rebuilds dead connections,
// health-checks every connector with tools/list, and reconnects with
// backoff. It knows nothing of gRPC or SQL: it reads connectors from and
// reports what it learns to a ConnectorSource.
package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
)

// Spec is what the registry needs to connect one connector. Secret values
// (Headers, Env) are held in memory only.
type Spec struct {
	ID          int64 // the source's key
	WorkspaceID string
	ConnectorID string
	Transport   string // TransportStdio, TransportSSE or TransportStreamableHTTP
	URL         string
	Headers     map[string]string
	Command     string
	Args        []string
	Env         map[string]string

	ConnectTimeout time.Duration
	CallTimeout    time.Duration
}

// State is a connector's connection health.
type State string

// States, as the source persists them.
const (
	StateConnecting State = "connecting"
	StateReady      State = "ready"
	StateDegraded   State = "degraded"
	StateError      State = "error"
)

// Health is a connector's last known connection health.
type Health struct {
	State           State
	LastError       string
	Latency         time.Duration
	CheckedAt       time.Time
	ProtocolVersion string
}

// Usage are counter increments since the last report.
type Usage struct {
	Calls, Errors, Reconnects, Reinitializations int64
	LastUsed                                     time.Time // zero if unused
}

// ToolChanges says what a catalog sync changed, and which tools operators
// have disabled after it.
type ToolChanges struct {
	Added, Removed, Changed []string
	Disabled                []string
}

// Empty reports whether nothing changed.
func (t ToolChanges) Empty() bool { return len(t.Added)+len(t.Removed)+len(t.Changed) == 0 }

// ConnectorSource is where the registry reads connectors and reports what it
// learns. It is an interface here so that the registry needs no SQL.
type ConnectorSource interface {
	// ActiveConnectors returns every connector to connect at start-up.
	ActiveConnectors(ctx context.Context) ([]Spec, error)
	// SyncTools makes the stored catalog of connector id match tools.
	SyncTools(ctx context.Context, id int64, tools []mcp.Tool) (ToolChanges, error)
	// SaveHealth persists a connector's health.
	SaveHealth(ctx context.Context, id int64, h Health) error
	// AddUsage adds counter increments.
	AddUsage(ctx context.Context, id int64, u Usage) error
}

// Config tunes the registry; zero fields take the defaults in New.
type Config struct {
	HealthInterval  time.Duration // between tools/list checks of a ready connector; 30s
	HealthTimeout   time.Duration // bound on one check; 10s
	Concurrency     int           // connects and checks running at once; 16
	BackoffBase     time.Duration // first reconnect delay (full jitter); 1s
	BackoffMax      time.Duration // reconnect delay cap; 5m
	ErrorAfter      int           // consecutive failures before StateError; 3
	DiscoverTimeout time.Duration // bound on the 2026-07 server/discover probe; 1s
	CloseGrace      time.Duration // before a stdio server's process group is killed; 2s
	UsageInterval   time.Duration // between counter reports; 5s
}

func (c *Config) setDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.HealthInterval, 30*time.Second)
	def(&c.HealthTimeout, 10*time.Second)
	def(&c.BackoffBase, time.Second)
	def(&c.BackoffMax, 5*time.Minute)
	def(&c.DiscoverTimeout, time.Second)
	def(&c.CloseGrace, 2*time.Second)
	def(&c.UsageInterval, 5*time.Second)
	if c.Concurrency <= 0 {
		c.Concurrency = 16
	}
	if c.ErrorAfter <= 0 {
		c.ErrorAfter = 3
	}
}

// Registry holds the connections. Create it with New, run it with Run; all
// other methods are safe for concurrent use while it runs.
type Registry struct {
	source ConnectorSource
	cfg    Config
	logger *slog.Logger
	tracer trace.Tracer

	// life bounds every background stream and connect; cancelled by Run's end.
	life   context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	conns    map[int64]*conn
	byRef    map[ref]int64
	loaded   bool
	stopping bool // set by shutdown: no new background work

	wake chan struct{}
	sem  chan struct{}
	bg   sync.WaitGroup // jobs, late closes and refreshes
}

// New returns a Registry over source. It starts nothing: call Run.
func New(source ConnectorSource, cfg Config, logger *slog.Logger) *Registry {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cfg.setDefaults()
	life, cancel := context.WithCancel(context.Background())
	return &Registry{
		source: source, cfg: cfg, logger: logger, tracer: otel.Tracer("connector-svc/registry"),
		life: life, cancel: cancel,
		conns: make(map[int64]*conn),
		byRef: make(map[ref]int64),
		wake:  make(chan struct{}, 1),
		sem:   make(chan struct{}, cfg.Concurrency),
	}
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
	r.logger.InfoContext(ctx, "registry loaded connectors", slog.Int("count", len(specs)))
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
	return old
}

// Lookup returns the id of a workspace's connector if the registry holds
// it, that is if it is active.
func (r *Registry) Lookup(workspaceID, connectorID string) (int64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	id, ok := r.byRef[ref{workspaceID, connectorID}]
	return id, ok
}

// ToolState says whether connector id's catalog, as last synced, has the
// tool, and whether operators left it enabled.
func (r *Registry) ToolState(id int64, name string) (known, enabled bool) {
	c, err := r.get(id)
	if err != nil {
		return false, false
	}
	if _, ok := c.tool(name); !ok {
		return false, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.disabled == nil {
		return false, false // not synced with the store yet
	}
	return true, !c.disabled[name]
}

// SetToolEnabled records an operator's change of a tool's enabled flag.
func (r *Registry) SetToolEnabled(id int64, name string, enabled bool) {
	c, err := r.get(id)
	if err != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.disabled == nil {
		return
	}
	if enabled {
		delete(c.disabled, name)
	} else {
		c.disabled[name] = true
	}
}

// Add starts keeping a connection for spec; the loop connects it soon. A
// connector already held is replaced (see Replace).
func (r *Registry) Add(spec Spec) {
	c := newConn(r, spec)
	r.mu.Lock()
	old := r.put(c)
	r.mu.Unlock()
	if old != nil {
		r.closeLater(old.sessionForClose())
		r.reportConn(context.Background(), old)
	}
	r.poke()
}

// Replace swaps in a connection with spec's new settings: the new client
// connects first (within its connect timeout), then takes the old one's
// place, then the old one closes. Calls in flight on the old client finish
// or fail on their own. If the new connect fails, the new settings still
// take effect and reconnect with backoff.
func (r *Registry) Replace(ctx context.Context, spec Spec) {
	c := newConn(r, spec)
	_ = c.connectShared(ctx)
	r.mu.Lock()
	old := r.put(c)
	r.mu.Unlock()
	if old != nil {
		old.close()
		r.reportConn(context.Background(), old)
	}
	r.poke()
}

// Remove closes and forgets a connector's connection. It returns when the
// connection is closed.
func (r *Registry) Remove(id int64) {
	r.mu.Lock()
	c := r.conns[id]
	delete(r.conns, id)
	if c != nil {
		delete(r.byRef, ref{c.spec.WorkspaceID, c.spec.ConnectorID})
	}
	r.mu.Unlock()
	if c != nil {
		c.close()
		r.reportConn(context.Background(), c)
	}
}

// CallTool runs a tool of connector id over its persistent session. Tools
// annotated read-only or idempotent are retried once on a rebuilt
// connection if the connection broke mid-call. Returns ErrNotLoaded or an
// error wrapping ErrUnavailable when the connector cannot be used now.
func (r *Registry) CallTool(ctx context.Context, id int64, name string, args map[string]any) (*mcp.CallToolResult, error) {
	c, err := r.get(id)
	if err != nil {
		return nil, err
	}
	t, _ := c.tool(name)
	retrySafe := t.Annotations.ReadOnlyHint != nil && *t.Annotations.ReadOnlyHint ||
		t.Annotations.IdempotentHint != nil && *t.Annotations.IdempotentHint
	return c.call(ctx, name, args, retrySafe)
}

// Tools returns the cached tool list of connector id, sorted by name.
func (r *Registry) Tools(id int64) ([]mcp.Tool, error) {
	c, err := r.get(id)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tools, nil
}

// Refresh lists connector id's tools now and syncs the catalog.
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
		return h, nil
	case <-ctx.Done():
		return c.snapshot(), ctx.Err()
	}
}

// Ready returns nil when connector id can take calls now: it waits for a
// first connect under way and fails fast (ErrUnavailable with the last
// error) when the connector is down.
func (r *Registry) Ready(ctx context.Context, id int64) error {
	c, err := r.get(id)
	if err != nil {
		return err
	}
	_, _, err = c.current(ctx)
	return err
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

func (r *Registry) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
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

func (r *Registry) saveHealth(c *conn, h Health) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.source.SaveHealth(ctx, c.spec.ID, h); err != nil {
		r.logger.Error("save health", append(c.logAttrs(), slog.String("error", err.Error()))...)
	}
}

// sessionForClose marks c closed and hands back its session to close.
func (c *conn) sessionForClose() *session {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sess
	c.sess, c.closed = nil, true
	return s
}
