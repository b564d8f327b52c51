package cluster

import (
	"fmt"
	"testing"
	"time"
)

// leaders returns the nodes that believe they lead.
func leaders(nodes []*node) []string {
	var ids []string
	for _, nd := range nodes {
		if nd.e.IsLeader() {
			ids = append(ids, nd.id)
		}
	}
	return ids
}

// TestElectorsCompete runs four electors on one lease: one leads, never two
// at once, and it stays the leader (its hook runs once) while it renews.
func TestElectorsCompete(t *testing.T) {
	env := newEnv(t)
	// A TTL of 3 s (renewed every second): with 1.5 s, a leader starved
	// for that long on a loaded machine rightly lost its lease.
	cfg := Config{TTL: 3 * time.Second}
	var nodes []*node
	for i := range 4 {
		nodes = append(nodes, env.start(t, fmt.Sprint("r", i), cfg))
	}
	eventually(t, 5*time.Second, func() (bool, string) {
		ls := leaders(nodes)
		return len(ls) == 1, fmt.Sprintf("leaders %v, want one", ls)
	})
	first := leaders(nodes)[0]
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if ls := leaders(nodes); len(ls) > 1 || (len(ls) == 1 && ls[0] != first) {
			t.Fatalf("leaders %v while %s renews its lease", ls, first)
		}
	}
	l, err := env.db.CurrentLeader(t.Context())
	if err != nil || l.ID != first {
		t.Errorf("lease row = %+v, %v; want %s", l, err, first)
	}
	for _, nd := range nodes {
		_, _, _, leads := nd.snapshot()
		if want := map[bool]int{true: 1, false: 0}[nd.id == first]; leads != want {
			t.Errorf("%s: OnLead ran %d times, want %d", nd.id, leads, want)
		}
	}
	if n := env.counts.snapshot()["RenewLeader"]; n < 3 {
		t.Errorf("%d renewals in the 4 s watched with a 1 s interval, want at least 3", n)
	}
}

// TestElectorResignHandsOverAtOnce stops the leader: it resigns, and the
// follower, woken by the notification, leads long before its own next
// attempt (a minute away).
func TestElectorResignHandsOverAtOnce(t *testing.T) {
	env := newEnv(t)
	cfg := Config{TTL: 3 * time.Minute, Heartbeat: time.Minute}
	a := env.start(t, "a", cfg)
	eventually(t, 5*time.Second, func() (bool, string) { return a.e.IsLeader(), "a does not lead" })
	b := env.start(t, "b", cfg)
	// b's first attempt, at its start, finds a's lease.
	eventually(t, 5*time.Second, func() (bool, string) {
		n := env.counts.snapshot()["ElectLeader"]
		return n >= 2, fmt.Sprintf("%d elections, want a's and b's", n)
	})
	if b.e.IsLeader() {
		t.Fatal("b leads while a holds the lease")
	}
	start := time.Now()
	a.stop()
	if a.e.IsLeader() {
		t.Error("a still leads after its Run returned")
	}
	eventually(t, 5*time.Second, func() (bool, string) { return b.e.IsLeader(), "b does not lead after a resigned" })
	t.Logf("b leads %v after a stopped", time.Since(start))
	if l, err := env.db.CurrentLeader(t.Context()); err != nil || l.ID != "b" {
		t.Errorf("lease row = %+v, %v; want b", l, err)
	}
}

// TestElectorStopsLeadingWhenTermReplaced replaces the leader's term behind
// its back: its next renewal fails, its hook's context ends, and it does not
// extend the other term.
func TestElectorStopsLeadingWhenTermReplaced(t *testing.T) {
	env := newEnv(t)
	a := env.start(t, "a", Config{TTL: 1500 * time.Millisecond})
	eventually(t, 5*time.Second, func() (bool, string) { return a.e.IsLeader(), "a does not lead" })
	env.exec(t, `UPDATE cluster_leader SET leader_id = 'other', elected_at = now(), expires_at = now() + interval '1 hour'`)
	before, err := env.db.CurrentLeader(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, func() (bool, string) { return !a.e.IsLeader(), "a still leads" })
	eventually(t, 5*time.Second, func() (bool, string) {
		leads, unleads := a.leadership()
		return leads == 1 && unleads == 1, fmt.Sprintf("OnLead ran %d times, %d contexts ended; want 1 and 1", leads, unleads)
	})
	// a keeps trying: wait a few attempts and check that the lease is still
	// other's, as it was.
	eventually(t, 5*time.Second, func() (bool, string) {
		n := env.counts.snapshot()["ElectLeader"]
		return n >= 3, fmt.Sprintf("%d elections", n)
	})
	if after, _ := env.db.CurrentLeader(t.Context()); after != before {
		t.Errorf("lease after a's attempts = %+v, want other's untouched %+v", after, before)
	}
	if a.e.IsLeader() {
		t.Error("a leads under other's term")
	}
}
