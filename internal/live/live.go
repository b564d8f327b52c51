// Package live keeps this replica's live copy of every connector in line
// with its stored row: the MCP connection the registry holds for it (added,
// replaced or removed), its catalog's operator flags, and the settings its
// agent is built from. Apply is the one path that changes them. The gRPC
// handlers call it after they write a row; the change listener calls it
// when any replica, or an operator's SQL, changed one (migration 006's
// triggers notify every change with the row's id and config_version); and
// a periodic full reconcile compares versions, so a lost notification is
// caught too.
package live

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/store"
)

// Placement says which connectors this replica connects, and which it
// owns (health checks, catalog syncs and health writes happen on the owner
// only). Nil placement: a single replica, which holds and owns them all.
type Placement interface {
	// Holds reports whether this replica keeps a connection for row (an
	// active connector): every replica holds an HTTP connector, only its
	// owner holds a stdio one.
	Holds(row *store.Connector) bool
	// Owns reports whether this replica owns connector id.
	Owns(id int64) bool
	// Claim claims connector id, just created or activated, if this
	// replica should own it.
	Claim(ctx context.Context, id int64)
}

// Config tunes Connectors; zero values take the defaults.
type Config struct {
	// ReconcileInterval is how often every live copy is compared with its
	// row's version; a minute.
	ReconcileInterval time.Duration
	// Embedder and EmbeddingModel, when set, give the agents' narrowing
	// its semantic ranking: tool embeddings are computed with them and
	// stored per model.
	Embedder       orchestrator.Embedder
	EmbeddingModel string
	Logger         *slog.Logger
}

// Connectors is this replica's live copy of every connector. Safe for
// concurrent use.
type Connectors struct {
	db        Store
	reg       *registry.Registry
	source    *Source
	placement Placement
	emb       *embeddings
	cfg       Config
	logger    *slog.Logger

	agents agents
	loaded atomic.Bool // Load has run

	mu sync.Mutex
	// rows holds the row each live copy was built from, by id; inactive
	// connectors have theirs too, so that their versions compare equal.
	// byRef finds them by the names callers use.
	rows  map[int64]*store.Connector
	byRef map[ref]int64

	locks map[int64]*applyLock
	// due holds the ids a notification named, for Run to reconcile.
	due  map[int64]struct{}
	wake chan struct{}
}

type applyLock struct {
	mu    sync.Mutex
	users int
}

// New returns the live copies of db's connectors, kept in reg, with the
// secrets opened by source. Call Load before serving and Run after.
func New(db Store, source *Source, reg *registry.Registry, placement Placement, cfg Config) *Connectors {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ReconcileInterval <= 0 {
		cfg.ReconcileInterval = time.Minute
	}
	return &Connectors{db: db, reg: reg, source: source, placement: placement, cfg: cfg, logger: cfg.Logger,
		emb:  newEmbeddings(db, cfg.Embedder, cfg.EmbeddingModel, cfg.Logger),
		rows: map[int64]*store.Connector{}, byRef: map[ref]int64{},
		locks: map[int64]*applyLock{}, due: map[int64]struct{}{},
		wake: make(chan struct{}, 1)}
}

// Load applies every active connector's row: the registry connects them
// once it runs. A connector whose secrets do not open is left out, logged,
// and marked in its health.
func (l *Connectors) Load(ctx context.Context) error {
	rows, err := l.db.ActiveConnectors(ctx)
	if err != nil {
		return fmt.Errorf("load connectors: %w", err)
	}
	for _, row := range rows {
		l.Apply(ctx, row)
	}
	// From now on a connector that appears is new: its owner claims it at
	// once. Those loaded here are claimed by the first ownership round.
	l.loaded.Store(true)
	l.logger.InfoContext(ctx, "loaded connectors", slog.Int("count", len(rows)))
	return nil
}

// Apply brings connector row.ID's live copy in line with row, a row just
// read or written, and with this replica's place in the cluster: its
// connection is added, replaced (when how to connect changed: transport,
// URL, command, secrets, timeouts, session mode, protocol) or removed
// (deactivated, or not this replica's to hold), its role (owner or
// follower) set, its catalog given the stored tools' flags, and its agent
// the new settings. A row older than the one applied (a smaller
// config_version) changes no settings, nor does the same version again.
func (l *Connectors) Apply(ctx context.Context, row *store.Connector) {
	unlock := l.lock(row.ID)
	defer unlock()
	l.mu.Lock()
	old := l.rows[row.ID]
	l.mu.Unlock()
	if old != nil && row.ConfigVersion < old.ConfigVersion {
		row = old // a stale read; only the placement may have changed
	}
	hold, owns := l.place(row)
	held := l.reg.Has(row.ID)
	if old != nil && row.ConfigVersion == old.ConfigVersion && hold == held && (!hold || owns == l.reg.Owner(row.ID)) {
		return
	}
	if row.Active && (old == nil || !old.Active) && l.placement != nil && l.loaded.Load() {
		l.placement.Claim(ctx, row.ID) // new here: its owner claims it at once
		hold, owns = l.place(row)
	}
	l.mu.Lock()
	if old != nil {
		delete(l.byRef, ref{old.WorkspaceID, old.ExternalID})
	}
	l.rows[row.ID] = row
	l.byRef[ref{row.WorkspaceID, row.ExternalID}] = row.ID
	l.mu.Unlock()

	if hold {
		l.reg.SetOwner(row.ID, owns)
	}
	switch {
	case !hold && held && row.Active:
		l.reg.HandOver(row.ID) // its new owner holds it now; calls under way finish here
	case !hold && held:
		l.reg.Remove(row.ID)
	case hold && !held:
		l.connect(ctx, row, false)
	case hold && old != nil && connectionChanged(old, row):
		// The new client connects first, then replaces the old one.
		l.connect(ctx, row, true)
	case hold && old != nil && row.ConfigVersion != old.ConfigVersion:
		l.applyTools(ctx, row, owns)
	}
	if row.Active {
		l.agents.settle(row, l.emb)
	} else {
		l.agents.forget(row.ID)
	}
}

// Learn applies row, a connector's row a call read from the store because
// the registry does not hold it: a connector created or activated a moment
// ago through another replica, whose notification is still on its way, or
// one this replica has just claimed (its re-apply is queued). The call then
// finds it held and waits for its connect, as on the creating replica,
// instead of finding it not connected. Apply keeps a newer row applied
// already, and does nothing when nothing changed.
func (l *Connectors) Learn(ctx context.Context, row *store.Connector) { l.Apply(ctx, row) }

// LookupOrLearn is Lookup, and for a connector this replica has not
// applied, the row read from the store, applied now (Learn): a call routed
// right after the connector was created through another replica goes
// where its row says, as on the creating replica.
func (l *Connectors) LookupOrLearn(ctx context.Context, workspaceID, connectorID string) (*store.Connector, bool) {
	if row, ok := l.Lookup(workspaceID, connectorID); ok {
		return row, true
	}
	row, err := l.db.GetConnector(ctx, workspaceID, connectorID)
	if err != nil {
		return nil, false
	}
	l.Learn(ctx, row)
	return l.Lookup(workspaceID, connectorID)
}

// place says whether this replica holds a connection for row, and
// whether it owns it.
func (l *Connectors) place(row *store.Connector) (hold, owns bool) {
	if l.placement == nil {
		return row.Active, true
	}
	return row.Active && l.placement.Holds(row), l.placement.Owns(row.ID)
}

// Touch has Run re-apply connector id soon: its placement changed (this
// replica gained or lost its ownership). It never blocks.
func (l *Connectors) Touch(id int64) {
	l.mu.Lock()
	l.due[id] = struct{}{}
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Lookup returns the row of a workspace's connector as last applied.
func (l *Connectors) Lookup(workspaceID, connectorID string) (*store.Connector, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	id, ok := l.byRef[ref{workspaceID, connectorID}]
	if !ok {
		return nil, false
	}
	return l.rows[id], true
}

// InWorkspace returns the rows of a workspace's connectors as last
// applied, active or not, sorted by connector id.
func (l *Connectors) InWorkspace(workspaceID string) []*store.Connector {
	l.mu.Lock()
	var out []*store.Connector
	for r, id := range l.byRef {
		if r.workspaceID == workspaceID {
			out = append(out, l.rows[id])
		}
	}
	l.mu.Unlock()
	slices.SortFunc(out, func(a, b *store.Connector) int { return strings.Compare(a.ExternalID, b.ExternalID) })
	return out
}

// ref is how callers name a connector.
type ref struct{ workspaceID, connectorID string }

// Deleted drops connector id's live copy: its connection closes, and
// calls running on it fail with registry.ErrDeleted.
func (l *Connectors) Deleted(id int64) {
	unlock := l.lock(id)
	defer unlock()
	l.mu.Lock()
	if row := l.rows[id]; row != nil {
		delete(l.byRef, ref{row.WorkspaceID, row.ExternalID})
	}
	delete(l.rows, id)
	l.mu.Unlock()
	l.reg.Delete(id)
	l.agents.forget(id)
}

// Reconcile re-reads connector id's row and applies it, or drops the live
// copy of a connector that is gone.
func (l *Connectors) Reconcile(ctx context.Context, id int64) error {
	row, err := l.db.ConnectorByID(ctx, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		l.Deleted(id)
		return nil
	case err != nil:
		return err
	}
	l.Apply(ctx, row)
	return nil
}

// ReconcileAll compares every live copy's version with its row's and
// reconciles those that differ: what a lost notification, or a change made
// while this replica was not listening, left behind.
func (l *Connectors) ReconcileAll(ctx context.Context) error {
	versions, err := l.db.ConnectorVersions(ctx)
	if err != nil {
		return err
	}
	var stale []int64
	l.mu.Lock()
	for id := range l.rows {
		if _, ok := versions[id]; !ok {
			stale = append(stale, id)
		}
	}
	for id, v := range versions {
		if row := l.rows[id]; row == nil || row.ConfigVersion != v {
			stale = append(stale, id)
		}
	}
	l.mu.Unlock()
	var errs []error
	for _, id := range stale {
		if err := l.Reconcile(ctx, id); err != nil {
			errs = append(errs, err)
		}
	}
	if len(stale) > 0 {
		l.logger.InfoContext(ctx, "reconciled connectors", slog.Int("changed", len(stale)))
	}
	return errors.Join(errs...)
}

// Notified takes a connector_changes payload: the connector it names is
// reconciled soon by Run. It never blocks.
func (l *Connectors) Notified(payload string) {
	c, err := store.ParseConnectorChange(payload)
	if err != nil {
		l.logger.Warn("connector change notification", slog.String("error", err.Error()))
		return
	}
	l.mu.Lock()
	if row := l.rows[c.ID]; row != nil && !c.Deleted && row.ConfigVersion >= c.Version {
		l.mu.Unlock()
		return // applied already (this replica's own write, most often)
	}
	l.due[c.ID] = struct{}{}
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Resync asks Run for a full reconcile soon: the listener (re)started, and
// what changed meanwhile was not heard.
func (l *Connectors) Resync() {
	l.mu.Lock()
	l.due[0] = struct{}{} // 0 is no connector's id: it means all of them
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Run reconciles the connectors notifications name as they come, and all
// of them every Config.ReconcileInterval, until ctx is done. It returns
// nil then, after the background work on tool embeddings stopped.
func (l *Connectors) Run(ctx context.Context) error {
	defer l.emb.close()
	tick := time.NewTicker(l.cfg.ReconcileInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			l.Resync()
		case <-l.wake:
		}
		l.mu.Lock()
		due := l.due
		l.due = map[int64]struct{}{}
		l.mu.Unlock()
		if _, all := due[0]; all {
			if err := l.ReconcileAll(ctx); err != nil && ctx.Err() == nil {
				l.logger.WarnContext(ctx, "reconcile connectors", slog.String("error", err.Error()))
			}
			continue
		}
		for id := range due {
			if err := l.Reconcile(ctx, id); err != nil && ctx.Err() == nil {
				l.logger.WarnContext(ctx, "reconcile connector", slog.Int64("id", id), slog.String("error", err.Error()))
				l.Resync() // try again with the next round
			}
		}
	}
}

// Settings returns connector id's live agent, reading its row with load
// if it is not known yet.
func (l *Connectors) Settings(id int64, load func() (*store.Connector, error)) (*Agent, error) {
	return l.agents.settings(id, load, l.emb)
}

// Row returns the row connector id's live copy was built from, if any.
func (l *Connectors) Row(id int64) (*store.Connector, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	row, ok := l.rows[id]
	return row, ok
}

// connect hands an active connector to the registry, which connects it in
// the background (or, replacing, connects the new client first).
func (l *Connectors) connect(ctx context.Context, row *store.Connector, replace bool) {
	spec, err := l.source.Spec(row)
	if err != nil {
		l.logger.ErrorContext(ctx, "connector not connected", append(ConnectorAttrs(row), slog.String("error", err.Error()))...)
		now := time.Now()
		_ = l.db.SaveHealth(ctx, row.ID, store.Health{State: string(registry.StateError), LastError: err.Error(), CheckedAt: &now})
		return
	}
	if replace {
		l.reg.Replace(ctx, spec)
		return
	}
	l.reg.Add(spec)
}

// applyTools gives the live catalog the stored tools' operator flags; a
// follower whose tools differ from those the owner stored re-lists them.
func (l *Connectors) applyTools(ctx context.Context, row *store.Connector, owns bool) {
	tools, err := l.db.ConnectorTools(ctx, row.ID)
	if err != nil {
		l.logger.WarnContext(ctx, "read tool flags", append(ConnectorAttrs(row), slog.String("error", err.Error()))...)
		return
	}
	stored := map[string]string{}
	for _, t := range tools {
		l.reg.SetToolEnabled(row.ID, t.Name, t.Enabled)
		l.reg.SetToolApproval(row.ID, t.Name, t.RequiresApproval)
		if t.Listed {
			stored[t.Name] = t.Description
		}
	}
	if owns {
		return
	}
	local, err := l.reg.Tools(row.ID)
	if err != nil || len(local) == 0 {
		return // not connected yet: its connect lists the tools
	}
	same := len(local) == len(stored)
	for _, t := range local {
		if d, ok := stored[t.Name]; !ok || d != t.Description {
			same = false
		}
	}
	if same {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := l.reg.Resync(rctx, row.ID); err != nil {
		l.logger.WarnContext(ctx, "re-list tools after the owner's sync", append(ConnectorAttrs(row), slog.String("error", err.Error()))...)
	}
}

// lock serializes Apply and Deleted per connector.
func (l *Connectors) lock(id int64) (unlock func()) {
	l.mu.Lock()
	k := l.locks[id]
	if k == nil {
		k = &applyLock{}
		l.locks[id] = k
	}
	k.users++
	l.mu.Unlock()
	k.mu.Lock()
	return func() {
		k.mu.Unlock()
		l.mu.Lock()
		if k.users--; k.users == 0 {
			delete(l.locks, id)
		}
		l.mu.Unlock()
	}
}

// connectionChanged reports whether how to connect differs between two
// rows of a connector: then its connection is replaced, and its open
// sessions close. Letting servers elicit or sample changes the
// capabilities a connection declares when it opens.
func connectionChanged(old, row *store.Connector) bool {
	a, b := old.Config, row.Config
	return old.Transport != row.Transport || !bytes.Equal(old.SealedSecrets, row.SealedSecrets) ||
		a.URL != b.URL || a.Command != b.Command || !reflect.DeepEqual(a.Args, b.Args) ||
		!reflect.DeepEqual(a.HeaderNames, b.HeaderNames) || !reflect.DeepEqual(a.EnvKeys, b.EnvKeys) ||
		a.ConnectTimeout != b.ConnectTimeout || a.CallTimeout != b.CallTimeout ||
		a.SessionMode != b.SessionMode || a.ProtocolPreference != b.ProtocolPreference ||
		!reflect.DeepEqual(a.Auth, b.Auth) || a.Elicitation != b.Elicitation || a.SamplingOn() != b.SamplingOn()
}
