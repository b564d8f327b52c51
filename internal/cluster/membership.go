package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/connector-svc/connector-svc/internal/store"
)

// DefaultTTL is how long a replica stays live after its last heartbeat, and
// how long a leader's lease lasts after its last renewal.
const DefaultTTL = 15 * time.Second

// DefaultWatch is how often a replica looks for replicas whose database
// connections closed (Config.Watch).
const DefaultWatch = time.Second

// leaveTimeout bounds the last statements at shutdown (leave, resign), run
// after Run's context ended.
const leaveTimeout = 5 * time.Second

// Config configures a replica's part in the cluster.
type Config struct {
	// ID names this replica; it must be unique among the replicas at any
	// time, and should be new at every start (NewID).
	ID string
	// Addr is the internal address other replicas forward to.
	Addr string
	// TTL is how long the replica stays live without a heartbeat, and the
	// leader's lease without a renewal. Default DefaultTTL.
	TTL time.Duration
	// Heartbeat is how often the replica heartbeats, re-reads the live set
	// and re-checks its ownership, and how often the elector tries to elect
	// or renew (with jitter). Default TTL/3.
	Heartbeat time.Duration
	// Watch is how often the replica asks Postgres whether another live
	// replica's listener connection has closed (a kill -9, a crash), and if
	// so expires it at once, without waiting for its TTL. Default
	// DefaultWatch; negative never (the TTL alone tells).
	Watch time.Duration
	// Logger receives failed rounds and changes of the live set; nil
	// discards.
	Logger *slog.Logger
	// Settings is this replica's fingerprint of the settings that must
	// match across replicas: setting name to a keyed hash of the value,
	// never the value. It is published in the replica's row; a live
	// replica whose fingerprint differs is warned of once per change,
	// naming the settings. Nil publishes none and compares nothing.
	Settings map[string]string
	// SettingsKey names the setting whose value keys the others' hashes:
	// when it differs, the others cannot be compared, and only it is named.
	SettingsKey string
}

func (c Config) withDefaults() Config {
	if c.TTL <= 0 {
		c.TTL = DefaultTTL
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = c.TTL / 3
	}
	if c.Watch == 0 {
		c.Watch = DefaultWatch
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Member is a live replica.
type Member struct {
	ID   string
	Addr string
}

// Membership keeps this replica registered and knows the live replicas.
// Safe for concurrent use; hooks are set before Run.
type Membership struct {
	db   Store
	cfg  Config
	wake chan struct{}

	onChange []func(live []Member)
	onLost   []func()

	mu   sync.Mutex
	live []Member
	left bool // Leave ran: no more heartbeats
	// trustedUntil is when this replica's row may have expired, by the local
	// clock, counted from the start of its last successful heartbeat.
	trustedUntil time.Time
	registered   bool

	// crash, set by tests, makes Run end like a killed process: without
	// leaving.
	crash bool

	// warned is, by replica id, the settings last warned of as differing.
	warnedMu sync.Mutex
	warned   map[string]string
}

// New returns the membership of the replica cfg names; Run registers it.
func New(db Store, cfg Config) *Membership {
	return &Membership{db: db, cfg: cfg.withDefaults(), wake: make(chan struct{}, 1)}
}

// Self returns this replica's id.
func (m *Membership) Self() string { return m.cfg.ID }

// Config returns the configuration with its defaults filled in.
func (m *Membership) Config() Config { return m.cfg }

// Live returns the live replicas in id order, this one included while it is
// registered, as of the last heartbeat or notification.
func (m *Membership) Live() []Member {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.live)
}

// OnChange adds a hook called with the live replicas whenever they change.
func (m *Membership) OnChange(fn func(live []Member)) { m.onChange = append(m.onChange, fn) }

// OnLost adds a hook called when this replica finds it was no longer live
// (a pause longer than its TTL, or its row deleted): everything it owned is
// someone else's by now. Run then registers it again.
func (m *Membership) OnLost(fn func()) { m.onLost = append(m.onLost, fn) }

// Notified takes a payload of store.ClusterChannel: a member event, or ""
// after a re-LISTEN, makes Run re-read the live replicas at once.
func (m *Membership) Notified(payload string) {
	if ev := parseEvent(payload); ev.Kind == "" || ev.Kind == store.EventMember {
		poke(m.wake)
	}
}

// Run registers the replica, heartbeats every Config.Heartbeat and keeps
// the live set, until ctx ends; then it deletes the replica's row (its
// ownership goes with it) and notifies the others. It returns an error only
// if the first registration fails, and nil when ctx ends.
func (m *Membership) Run(ctx context.Context) error {
	m.mu.Lock()
	registered := m.registered
	m.mu.Unlock()
	if !registered {
		if err := m.register(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
	ticker := time.NewTicker(m.cfg.Heartbeat)
	defer ticker.Stop()
	var watch <-chan time.Time
	if m.cfg.Watch > 0 {
		w := time.NewTicker(m.cfg.Watch)
		defer w.Stop()
		watch = w.C
	}
	for {
		select {
		case <-ctx.Done():
			m.leaveAtEnd(ctx)
			return nil
		case <-ticker.C:
			m.heartbeat(ctx)
		case <-watch:
			m.watch(ctx)
		case <-m.wake:
			m.reread(ctx)
		}
	}
}

// watch expires the live replicas whose listener connection Postgres saw
// close, and re-reads the live set if it did: they died, and their
// connectors are free to claim now rather than after their TTL. The
// others hear the member event and re-read too.
func (m *Membership) watch(ctx context.Context) {
	m.mu.Lock()
	skip := m.left || !m.registered
	m.mu.Unlock()
	if skip {
		return
	}
	gone, err := m.db.ExpireVanishedReplicas(ctx, m.cfg.ID)
	switch {
	case err != nil:
		if ctx.Err() == nil {
			m.cfg.Logger.WarnContext(ctx, "cluster: looking for replicas whose connections closed failed", slog.Any("error", err))
		}
	case len(gone) > 0:
		m.cfg.Logger.WarnContext(ctx, "cluster: replicas whose database connections closed are no longer live; taking over their connectors",
			slog.Any("replicas", gone))
		m.reread(ctx)
	}
}

// Register registers the replica now, so that it takes part before Run
// starts (which then heartbeats it): a replica's start-up claims its
// connectors before it serves.
func (m *Membership) Register(ctx context.Context) error { return m.register(ctx) }

// register inserts the replica's row and reads the live set.
func (m *Membership) register(ctx context.Context) error {
	start := time.Now()
	if err := m.db.RegisterReplica(ctx, m.cfg.ID, m.cfg.Addr, m.cfg.TTL); err != nil {
		return err
	}
	if m.cfg.Settings != nil {
		if err := m.db.SetReplicaSettings(ctx, m.cfg.ID, m.cfg.Settings); err != nil {
			return err
		}
	}
	m.mu.Lock()
	m.registered, m.trustedUntil = true, start.Add(m.cfg.TTL)
	m.mu.Unlock()
	m.reread(ctx)
	return nil
}

// heartbeat extends the replica's row and reads the live set in one
// statement; a row found gone or expired means this replica was lost.
func (m *Membership) heartbeat(ctx context.Context) {
	m.mu.Lock()
	left, registered, trusted := m.left, m.registered, m.trustedUntil
	m.mu.Unlock()
	switch {
	case left:
		return
	case !registered:
		if err := m.register(ctx); err != nil && ctx.Err() == nil {
			m.cfg.Logger.WarnContext(ctx, "cluster: register again failed", slog.Any("error", err))
		}
		return
	}
	start := time.Now()
	alive, live, err := m.db.HeartbeatReplica(ctx, m.cfg.ID, m.cfg.TTL)
	switch {
	case err != nil && ctx.Err() == nil:
		m.cfg.Logger.WarnContext(ctx, "cluster: heartbeat failed", slog.Any("error", err))
		if time.Now().After(trusted) { // the row has expired by now, as far as we can tell
			m.lost(ctx, "no heartbeat within the TTL")
		}
	case err != nil:
	case !alive:
		m.setLive(ctx, live)
		m.lost(ctx, "its row was gone or expired")
		if err := m.register(ctx); err != nil && ctx.Err() == nil {
			m.cfg.Logger.WarnContext(ctx, "cluster: register again failed", slog.Any("error", err))
		}
	default:
		m.mu.Lock()
		m.trustedUntil = start.Add(m.cfg.TTL)
		m.mu.Unlock()
		m.setLive(ctx, live)
	}
}

// lost drops the registration, tells the hooks, and lets the next round
// register again.
func (m *Membership) lost(ctx context.Context, why string) {
	m.cfg.Logger.WarnContext(ctx, "cluster: this replica was no longer live; it gives up what it owned and registers again",
		slog.String("replica", m.cfg.ID), slog.String("reason", why))
	m.mu.Lock()
	m.registered = false
	live := slices.DeleteFunc(slices.Clone(m.live), func(mb Member) bool { return mb.ID == m.cfg.ID })
	m.mu.Unlock()
	m.publish(live)
	for _, fn := range m.onLost {
		fn()
	}
}

// reread reads the live set without heartbeating.
func (m *Membership) reread(ctx context.Context) {
	live, err := m.db.LiveReplicas(ctx)
	if err != nil {
		if ctx.Err() == nil {
			m.cfg.Logger.WarnContext(ctx, "cluster: read live replicas failed", slog.Any("error", err))
		}
		return
	}
	m.setLive(ctx, live)
}

func (m *Membership) setLive(ctx context.Context, rows []store.Replica) {
	m.compareSettings(ctx, rows)
	live := make([]Member, 0, len(rows))
	for _, r := range rows {
		live = append(live, Member{ID: r.ID, Addr: r.InternalAddr})
	}
	m.mu.Lock()
	if !m.registered || m.left { // our own row is not ours to trust
		live = slices.DeleteFunc(live, func(mb Member) bool { return mb.ID == m.cfg.ID })
	}
	m.mu.Unlock()
	if m.publish(live) {
		ids := make([]string, len(live))
		for i, l := range live {
			ids[i] = l.ID
		}
		m.cfg.Logger.InfoContext(ctx, "cluster: live replicas changed", slog.Int("count", len(live)), slog.Any("replicas", ids))
	}
}

// compareSettings warns of each other live replica whose settings
// fingerprint differs from this one's, once per change of the settings
// that differ. Replicas that published none (an older version) are not
// compared.
func (m *Membership) compareSettings(ctx context.Context, rows []store.Replica) {
	if m.cfg.Settings == nil {
		return
	}
	m.warnedMu.Lock()
	defer m.warnedMu.Unlock()
	if m.warned == nil {
		m.warned = map[string]string{}
	}
	seen := map[string]bool{}
	for _, r := range rows {
		if r.ID == m.cfg.ID || len(r.Settings) == 0 {
			continue
		}
		seen[r.ID] = true
		names := DifferingSettings(m.cfg.Settings, r.Settings, m.cfg.SettingsKey)
		key := strings.Join(names, ",")
		if m.warned[r.ID] == key {
			continue
		}
		m.warned[r.ID] = key
		if len(names) > 0 {
			m.cfg.Logger.WarnContext(ctx, "cluster: another live replica has different settings; set them the same on every replica "+
				"(README, Several replicas)", slog.String("replica", m.cfg.ID), slog.String("other_replica", r.ID),
				slog.Any("settings", names))
		}
	}
	for id := range m.warned {
		if !seen[id] {
			delete(m.warned, id)
		}
	}
}

// DifferingSettings returns the names of the settings whose fingerprints
// differ between mine and theirs, sorted; a setting only one of them has
// differs. When key (the setting whose value keys the others' hashes)
// differs, it alone is returned: the others cannot be compared.
func DifferingSettings(mine, theirs map[string]string, key string) []string {
	if key != "" && mine[key] != theirs[key] {
		return []string{key}
	}
	var names []string
	for name, v := range mine {
		if w, ok := theirs[name]; !ok || w != v {
			names = append(names, name)
		}
	}
	for name := range theirs {
		if _, ok := mine[name]; !ok {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// publish stores live and calls the hooks if it differs from what was
// known; it reports whether it did.
func (m *Membership) publish(live []Member) bool {
	m.mu.Lock()
	changed := !slices.Equal(m.live, live)
	m.live = live
	m.mu.Unlock()
	if changed {
		for _, fn := range m.onChange {
			fn(slices.Clone(live))
		}
	}
	return changed
}

// Leave deletes this replica's row now (its connector ownership goes with
// it) and notifies the others, in one statement; Run then stops
// heartbeating. For a graceful stop: Owners.ReleaseAll calls it.
func (m *Membership) Leave(ctx context.Context) error {
	m.mu.Lock()
	m.left = true
	m.mu.Unlock()
	err := m.db.LeaveReplica(ctx, m.cfg.ID)
	if err == nil {
		m.setLive(ctx, nil)
	}
	return err
}

func (m *Membership) leaveAtEnd(ctx context.Context) {
	m.mu.Lock()
	left := m.left
	m.mu.Unlock()
	if left || m.crash {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaveTimeout)
	defer cancel()
	if err := m.Leave(ctx); err != nil {
		m.cfg.Logger.WarnContext(ctx, "cluster: leave failed; the others take over after the TTL", slog.Any("error", err))
	}
}

// ExpireDead deletes the rows of replicas expired for more than a TTL, with
// their ownership, and returns how many; for the leader's housekeeping.
func (m *Membership) ExpireDead(ctx context.Context) (int64, error) {
	n, err := m.db.ExpireDeadReplicas(ctx, m.cfg.TTL)
	if err != nil {
		return 0, err
	}
	return n, nil
}

// NewID returns a replica id that is new at every start: prefix (the host
// name, say) and 8 random hex digits. A restarted replica must not reuse its
// former id, or it would inherit rows it never claimed.
func NewID(prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return prefix + "-" + hex.EncodeToString(b[:])
}
