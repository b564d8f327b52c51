package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/connector-svc/connector-svc/internal/store"
)

// ErrNoOwner means no live replica owns the connector (yet): it is between
// owners, or not active.
var ErrNoOwner = errors.New("no live replica owns the connector")

// ErrNotLive means this replica is not in the live set (not registered
// yet, lost, or released everything to stop): it claims nothing.
var ErrNotLive = errors.New("this replica is not live")

// Owners keeps this replica's share of the connectors: those whose
// rendezvous owner among the live replicas is this one. It claims them (an
// epoch per claim), releases those that moved to another live replica, and
// notices those another replica took over. Safe for concurrent use; hooks
// are set before Run.
type Owners struct {
	db     Store
	m      *Membership
	keys   func(ctx context.Context) ([]int64, error)
	logger *slog.Logger
	wake   chan struct{}
	// turn serializes claims and releases (a channel, not a mutex: it is
	// held across statements and waits honour the context).
	turn chan struct{}

	onGained []func(id, epoch int64)
	onLost   []func(id int64)

	mu       sync.Mutex
	owned    map[int64]int64 // connector id -> epoch
	draining bool            // ReleaseAll ran: claim nothing more
}

// NewOwners returns the ownership of the connectors keys lists (the active
// ones) for the replica of m. It hooks itself to m's changes and loss.
func NewOwners(db Store, m *Membership, keys func(ctx context.Context) ([]int64, error)) *Owners {
	o := &Owners{
		db: db, m: m, keys: keys, logger: m.cfg.Logger,
		wake: make(chan struct{}, 1), turn: make(chan struct{}, 1),
		owned: make(map[int64]int64),
	}
	m.OnChange(func([]Member) { poke(o.wake) })
	m.OnLost(o.dropAll)
	return o
}

// OnGained adds a hook called when this replica starts owning a connector,
// with the epoch its writes must carry (see Fence).
func (o *Owners) OnGained(fn func(id, epoch int64)) { o.onGained = append(o.onGained, fn) }

// OnLostOwnership adds a hook called when this replica stops owning a
// connector: before it releases the row, or after it found another replica
// took it over. The hook stops the connector's owned work.
func (o *Owners) OnLostOwnership(fn func(id int64)) { o.onLost = append(o.onLost, fn) }

// Owned returns the epoch of connector id if this replica owns it.
func (o *Owners) Owned(id int64) (epoch int64, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	epoch, ok = o.owned[id]
	return epoch, ok
}

// Fence returns what this replica's owned writes to connector id carry, if
// it owns it.
func (o *Owners) Fence(id int64) (store.Fence, bool) {
	epoch, ok := o.Owned(id)
	return store.Fence{Replica: o.m.Self(), Epoch: epoch}, ok
}

// OwnedIDs returns the connectors this replica owns, in id order.
func (o *Owners) OwnedIDs() []int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Sorted(maps.Keys(o.owned))
}

// OwnerOf returns the live replica that owns connector id, for forwarding.
// Returns ErrNoOwner if none does.
func (o *Owners) OwnerOf(ctx context.Context, id int64) (Member, error) {
	if _, ok := o.Owned(id); ok {
		return Member{ID: o.m.Self(), Addr: o.m.cfg.Addr}, nil
	}
	r, _, err := o.db.ConnectorOwner(ctx, id)
	if errors.Is(err, store.ErrOwnerNotFound) {
		return Member{}, fmt.Errorf("connector %d: %w", id, ErrNoOwner)
	}
	if err != nil {
		return Member{}, err
	}
	return Member{ID: r.ID, Addr: r.InternalAddr}, nil
}

// Notified takes a payload of store.ClusterChannel: an owner event (a
// release), or "" after a re-LISTEN, makes Run re-check ownership at once.
func (o *Owners) Notified(payload string) {
	if ev := parseEvent(payload); ev.Kind == "" || ev.Kind == store.EventOwner {
		poke(o.wake)
	}
}

// Run keeps ownership in line with the live replicas until ctx ends: on
// every change of the live set, every owner event and every heartbeat. It
// releases nothing when ctx ends (ReleaseAll does). Returns nil.
func (o *Owners) Run(ctx context.Context) error {
	ticker := time.NewTicker(o.m.cfg.Heartbeat)
	defer ticker.Stop()
	for {
		if err := o.sync(ctx); err != nil && ctx.Err() == nil {
			o.logger.WarnContext(ctx, "cluster: ownership round failed", slog.Any("error", err))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		case <-o.wake:
		}
	}
}

func (o *Owners) acquire(ctx context.Context) error {
	select {
	case o.turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (o *Owners) release() { <-o.turn }

// liveIDs returns the live replicas' ids, and whether this one is live.
func (o *Owners) liveIDs() ([]string, bool) {
	live := o.m.Live()
	ids := make([]string, len(live))
	for i, mb := range live {
		ids[i] = mb.ID
	}
	return ids, slices.Contains(ids, o.m.Self())
}

// sync is one round: find what another replica took, claim what should be
// this replica's, release what should be another's.
// Sync brings ownership in line with the live replicas now, as Run does
// at each round: for a start-up that claims before it serves.
func (o *Owners) Sync(ctx context.Context) error { return o.sync(ctx) }

func (o *Owners) sync(ctx context.Context) error {
	if err := o.acquire(ctx); err != nil {
		return err
	}
	defer o.release()
	members, live := o.liveIDs()
	if !live || o.isDraining() {
		o.dropAll()
		return nil
	}
	keys, err := o.keys(ctx)
	if err != nil {
		return fmt.Errorf("list connectors to own: %w", err)
	}
	held, err := o.db.ConnectorsOwnedBy(ctx, o.m.Self())
	if err != nil {
		return err
	}
	o.dropTaken(held)
	want := make(map[int64]bool)
	for _, id := range keys {
		if Owner(ConnectorKey(id), members) == o.m.Self() {
			want[id] = true
		}
	}
	if err := o.releaseUnwanted(ctx, held, want); err != nil {
		return err
	}
	return o.claim(ctx, want)
}

// dropTaken forgets the connectors whose row no longer names this
// replica with the epoch it knows: another replica took them over.
func (o *Owners) dropTaken(held map[int64]int64) {
	var lost []int64
	o.mu.Lock()
	for id, epoch := range o.owned {
		if held[id] != epoch {
			delete(o.owned, id)
			lost = append(lost, id)
		}
	}
	o.mu.Unlock()
	o.tellLost(lost)
}

// releaseUnwanted releases the rows this replica holds but should not: the
// rendezvous owner is another live replica, or the connector is no longer
// to be owned. The work stops (hooks) before the row goes.
func (o *Owners) releaseUnwanted(ctx context.Context, held map[int64]int64, want map[int64]bool) error {
	var ids, mine []int64
	o.mu.Lock()
	for id := range held {
		if !want[id] {
			ids = append(ids, id)
			if _, ok := o.owned[id]; ok {
				delete(o.owned, id)
				mine = append(mine, id)
			}
		}
	}
	o.mu.Unlock()
	if len(ids) == 0 {
		return nil
	}
	o.tellLost(mine)
	slices.Sort(ids)
	if _, err := o.db.ReleaseConnectors(ctx, o.m.Self(), ids); err != nil {
		return err
	}
	o.logger.InfoContext(ctx, "cluster: released connectors to their new owners", slog.Int("count", len(ids)))
	return nil
}

// claim claims the wanted connectors this replica does not own yet; those
// still held by another live replica are left for a later round (their
// holder releases them and notifies).
func (o *Owners) claim(ctx context.Context, want map[int64]bool) error {
	var ids []int64
	o.mu.Lock()
	for id := range want {
		if _, ok := o.owned[id]; !ok {
			ids = append(ids, id)
		}
	}
	o.mu.Unlock()
	if len(ids) == 0 {
		return nil
	}
	slices.Sort(ids)
	got, err := o.db.ClaimConnectors(ctx, o.m.Self(), ids)
	if err != nil {
		return err
	}
	o.gained(got)
	return nil
}

func (o *Owners) gained(got map[int64]int64) {
	o.mu.Lock()
	if o.draining {
		o.mu.Unlock()
		return
	}
	maps.Copy(o.owned, got)
	o.mu.Unlock()
	for _, id := range slices.Sorted(maps.Keys(got)) {
		for _, fn := range o.onGained {
			fn(id, got[id])
		}
	}
}

func (o *Owners) tellLost(ids []int64) {
	slices.Sort(ids)
	for _, id := range ids {
		for _, fn := range o.onLost {
			fn(id)
		}
	}
}

// dropAll forgets everything owned, telling the hooks: this replica is not
// live (lost, or leaving), so nothing it held is its own any more.
func (o *Owners) dropAll() {
	o.mu.Lock()
	ids := slices.Collect(maps.Keys(o.owned))
	clear(o.owned)
	o.mu.Unlock()
	o.tellLost(ids)
}

func (o *Owners) isDraining() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.draining
}

// Claim claims connector id at once (one just created or switched on), if
// its rendezvous owner is this replica, and returns its epoch; ok is false
// when it is another replica's, or held by another live replica still.
// Returns ErrNotLive while this replica is not live.
// OnGained is called as for any claim.
func (o *Owners) Claim(ctx context.Context, id int64) (epoch int64, ok bool, err error) {
	if err := o.acquire(ctx); err != nil {
		return 0, false, err
	}
	defer o.release()
	if epoch, ok := o.Owned(id); ok {
		return epoch, true, nil
	}
	members, live := o.liveIDs()
	if !live || o.isDraining() {
		return 0, false, ErrNotLive
	}
	if Owner(ConnectorKey(id), members) != o.m.Self() {
		return 0, false, nil
	}
	got, err := o.db.ClaimConnectors(ctx, o.m.Self(), []int64{id})
	if err != nil {
		return 0, false, err
	}
	o.gained(got)
	epoch, ok = got[id]
	return epoch, ok, nil
}

// ReleaseAll hands everything over at a graceful stop: it stops claiming,
// stops the owned work (OnLostOwnership for each connector), and leaves the
// membership, which deletes this replica's row and its ownership in one
// statement with one notification; the others then claim at once. Run and
// Membership.Run keep going until their context ends, claiming nothing.
func (o *Owners) ReleaseAll(ctx context.Context) error {
	if err := o.acquire(ctx); err != nil {
		return err
	}
	defer o.release()
	o.mu.Lock()
	o.draining = true
	o.mu.Unlock()
	o.dropAll()
	if err := o.m.Leave(ctx); err != nil {
		return fmt.Errorf("release all connectors: %w", err)
	}
	return nil
}
