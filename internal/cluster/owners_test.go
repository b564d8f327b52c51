package cluster

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/connector-svc/connector-svc/internal/store"
)

// partitioned waits until nodes own disjoint sets that cover ids, each
// connector owned by its rendezvous owner among the nodes, and the rows
// agree; it returns who owns what.
func partitioned(t *testing.T, env *env, timeout time.Duration, nodes []*node, ids []int64) map[string][]int64 {
	t.Helper()
	var owned map[string][]int64
	members := make([]string, len(nodes))
	for i, nd := range nodes {
		members[i] = nd.id
	}
	eventually(t, timeout, func() (bool, string) {
		owned = map[string][]int64{}
		for _, id := range ids {
			var owners []string
			for _, nd := range nodes {
				if _, ok := nd.o.Owned(id); ok {
					owners = append(owners, nd.id)
					owned[nd.id] = append(owned[nd.id], id)
				}
			}
			if want := Owner(ConnectorKey(id), members); len(owners) != 1 || owners[0] != want {
				return false, fmt.Sprintf("connector %d owned by %v, want %s alone", id, owners, want)
			}
		}
		for _, nd := range nodes {
			rows, err := env.db.ConnectorsOwnedBy(t.Context(), nd.id)
			if err != nil {
				return false, err.Error()
			}
			mine := map[int64]int64{}
			for _, id := range owned[nd.id] {
				mine[id], _ = nd.o.Owned(id)
			}
			if !maps.Equal(rows, mine) {
				return false, fmt.Sprintf("%s's rows %v differ from what it owns %v", nd.id, rows, mine)
			}
		}
		return true, ""
	})
	return owned
}

// TestOwnershipSpreadAndJoin runs three replicas over 200 connectors: they
// own disjoint sets that cover all. A fourth joins: it takes 20-45 % within
// a few heartbeats, and the others release exactly what it took.
func TestOwnershipSpreadAndJoin(t *testing.T) {
	env := newEnv(t)
	ids := env.connectors(t, 200)
	cfg := Config{TTL: 2 * time.Second}
	nodes := []*node{env.start(t, "a", cfg), env.start(t, "b", cfg), env.start(t, "c", cfg)}
	before := partitioned(t, env, 5*time.Second, nodes, ids)
	for _, nd := range nodes {
		if len(before[nd.id]) < 40 {
			t.Errorf("%s owns %d of 200", nd.id, len(before[nd.id]))
		}
	}
	// The start moved connectors already (a owned all until b came): count
	// hooks from here.
	gainedBefore, lostBefore := map[string]map[int64]int64{}, map[string]int{}
	for _, nd := range nodes {
		var lost []int64
		gainedBefore[nd.id], lost, _, _ = nd.snapshot()
		lostBefore[nd.id] = len(lost)
	}

	joined := time.Now()
	d := env.start(t, "d", cfg)
	after := partitioned(t, env, 3*cfg.Heartbeat+3*time.Second, append(nodes, d), ids)
	t.Logf("d owns %d of 200, %v after it started", len(after["d"]), time.Since(joined))
	if share := float64(len(after["d"])) / 200; share < 0.20 || share > 0.45 {
		t.Errorf("d took %.0f%% of the connectors, want 20-45%%", 100*share)
	}
	var released []int64
	for _, nd := range nodes {
		gained, lost, _, _ := nd.snapshot()
		released = append(released, lost[lostBefore[nd.id]:]...)
		if diff := cmp.Diff(gainedBefore[nd.id], gained); diff != "" {
			t.Errorf("%s gained connectors when d joined (-before +after):\n%s", nd.id, diff)
		}
	}
	slices.Sort(released)
	if diff := cmp.Diff(after["d"], released); diff != "" {
		t.Errorf("released by a, b, c (-taken by d +released):\n%s", diff)
	}
	gainedD, lostD, _, _ := d.snapshot()
	if diff := cmp.Diff(after["d"], slices.Sorted(maps.Keys(gainedD))); diff != "" || len(lostD) != 0 {
		t.Errorf("d's hooks: gained (-owned +gained):\n%s\nlost %v", diff, lostD)
	}
	// Owners tell the others where a connector lives.
	id := after["d"][0]
	if m, err := nodes[0].o.OwnerOf(t.Context(), id); err != nil || m != (Member{ID: "d", Addr: "d.internal:7000"}) {
		t.Errorf("a: OwnerOf(%d) = %+v, %v; want d", id, m, err)
	}
}

// TestOwnershipTakeoverAfterCrash kills a replica without release: the
// others take its connectors over once its TTL passed, with newer epochs,
// and its fenced writes fail.
func TestOwnershipTakeoverAfterCrash(t *testing.T) {
	env := newEnv(t)
	ids := env.connectors(t, 60)
	cfg := Config{TTL: 1500 * time.Millisecond}
	a, b, c := env.start(t, "a", cfg), env.start(t, "b", cfg), env.start(t, "c", cfg)
	owned := partitioned(t, env, 5*time.Second, []*node{a, b, c}, ids)
	fences := map[int64]store.Fence{}
	for _, id := range owned["c"] {
		f, ok := c.o.Fence(id)
		if !ok {
			t.Fatalf("c does not own %d", id)
		}
		fences[id] = f
	}
	if err := env.db.SaveHealthFenced(t.Context(), owned["c"][0], fences[owned["c"][0]], store.Health{State: "ready"}); err != nil {
		t.Fatalf("c's fenced write while it owns: %v", err)
	}

	killed := time.Now()
	c.crash()
	partitioned(t, env, cfg.TTL+5*time.Second, []*node{a, b}, ids)
	took := time.Since(killed)
	t.Logf("a and b own c's %d connectors %v after it was killed", len(owned["c"]), took)
	if took < time.Second {
		t.Errorf("c's connectors were taken %v after it was killed, before its TTL could pass", took)
	}
	for _, id := range owned["c"] {
		err := env.db.SaveHealthFenced(t.Context(), id, fences[id], store.Health{State: "error"})
		if !errors.Is(err, store.ErrNotOwner) {
			t.Errorf("c's fenced write to %d after the takeover: %v, want ErrNotOwner", id, err)
		}
		owner, f, err := env.db.ConnectorOwner(t.Context(), id)
		if err != nil || f.Epoch <= fences[id].Epoch {
			t.Errorf("connector %d: owner %s epoch %d (%v), want above c's %d", id, owner.ID, f.Epoch, err, fences[id].Epoch)
		}
	}
	if got, err := env.db.GetConnector(t.Context(), "acme", "c0"); err != nil || got.Health.State == "error" {
		t.Errorf("a fenced-off write reached the row: %+v, %v", got.Health, err)
	}
}

// TestOwnershipReleaseAllHandsOverAtOnce stops a replica gracefully: its
// work stops, and the other owns everything long before a heartbeat.
func TestOwnershipReleaseAllHandsOverAtOnce(t *testing.T) {
	env := newEnv(t)
	ids := env.connectors(t, 40)
	cfg := Config{TTL: 3 * time.Minute, Heartbeat: time.Minute}
	a, b := env.start(t, "a", cfg), env.start(t, "b", cfg)
	owned := partitioned(t, env, 5*time.Second, []*node{a, b}, ids)
	_, lostAtStart, _, _ := b.snapshot() // whichever registered first owned all for a moment

	start := time.Now()
	if err := b.o.ReleaseAll(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := b.o.OwnedIDs(); len(got) != 0 {
		t.Errorf("b owns %v after ReleaseAll", got)
	}
	_, lost, _, _ := b.snapshot()
	lost = lost[len(lostAtStart):]
	slices.Sort(lost)
	if diff := cmp.Diff(owned["b"], lost); diff != "" {
		t.Errorf("b's OnLostOwnership (-owned +lost):\n%s", diff)
	}
	partitioned(t, env, 2*time.Second, []*node{a}, ids)
	t.Logf("a owns all %d connectors %v after b released", len(ids), time.Since(start))
	if _, ok, err := b.o.Claim(t.Context(), ids[0]); ok || !errors.Is(err, ErrNotLive) {
		t.Errorf("b claims after ReleaseAll: ok %v, err %v; want ErrNotLive", ok, err)
	}
	if n := env.counts.snapshot()["HeartbeatReplica"]; n != 0 {
		t.Errorf("%d heartbeats; the handover must not wait for one", n)
	}
}

// TestOwnershipClaimNewConnector claims a new connector at once on its
// rendezvous owner only.
func TestOwnershipClaimNewConnector(t *testing.T) {
	env := newEnv(t)
	cfg := Config{TTL: 3 * time.Minute, Heartbeat: time.Minute}
	a, b := env.start(t, "a", cfg), env.start(t, "b", cfg)
	sees(t, 5*time.Second, []*node{a, b}, "a", "b")
	id := env.connectors(t, 1)[0]
	owner := map[string]*node{"a": a, "b": b}[Owner(ConnectorKey(id), []string{"a", "b"})]
	other := map[*node]*node{a: b, b: a}[owner]
	if _, ok, err := other.o.Claim(t.Context(), id); ok || err != nil {
		t.Errorf("%s (not the rendezvous owner) Claim = %v, %v; want not claimed", other.id, ok, err)
	}
	epoch, ok, err := owner.o.Claim(t.Context(), id)
	if !ok || err != nil {
		t.Fatalf("%s Claim = %v, %v", owner.id, ok, err)
	}
	gained, _, _, _ := owner.snapshot()
	if gained[id] != epoch {
		t.Errorf("OnGained(%d) epoch %d, want %d", id, gained[id], epoch)
	}
	if again, ok, err := owner.o.Claim(t.Context(), id); again != epoch || !ok || err != nil {
		t.Errorf("second Claim = %d, %v, %v; want the same epoch %d", again, ok, err, epoch)
	}
	if m, err := other.o.OwnerOf(t.Context(), id); err != nil || m.ID != owner.id {
		t.Errorf("%s: OwnerOf = %+v, %v; want %s", other.id, m, err, owner.id)
	}
	if _, err := other.o.OwnerOf(t.Context(), 999999); !errors.Is(err, ErrNoOwner) {
		t.Errorf("OwnerOf(unknown) = %v, want ErrNoOwner", err)
	}
}

// TestStatementRateAtRest counts what three settled replicas send per
// heartbeat, and reports it per second at the default TTL.
func TestStatementRateAtRest(t *testing.T) {
	env := newEnv(t)
	ids := env.connectors(t, 30)
	// A TTL of 3 s: at rest means no replica misses its heartbeat, and on
	// a loaded machine one starved for 1.5 s did, which set the replicas
	// changing (LiveReplicas, ClaimConnectors) in the middle of the count.
	cfg := Config{TTL: 3 * time.Second}
	nodes := []*node{env.start(t, "a", cfg), env.start(t, "b", cfg), env.start(t, "c", cfg)}
	partitioned(t, env, 5*time.Second, nodes, ids)
	time.Sleep(cfg.TTL) // let the start settle: this measures a rate, it waits for nothing
	before := env.counts.snapshot()
	const beats = 6
	time.Sleep(beats * cfg.TTL / 3)
	after := env.counts.snapshot()
	per := map[string]float64{}
	var total float64
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			per[k] = float64(d) / 3 / beats
			total += per[k]
		}
	}
	t.Logf("statements per replica per heartbeat at rest: %.2f %v; at the default TTL (15 s, heartbeat 5 s): %.2f/s",
		total, per, total/5)
	for _, k := range []string{"ClaimConnectors", "ReleaseConnectors", "RegisterReplica", "LiveReplicas"} {
		if per[k] != 0 {
			t.Errorf("%s ran %.2f times per replica per heartbeat at rest, want 0", k, per[k])
		}
	}
	if total > 4.5 {
		t.Errorf("%.2f statements per replica per heartbeat at rest, want at most 4.5", total)
	}
}
