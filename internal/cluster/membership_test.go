package cluster

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

func memberIDs(live []Member) []string {
	ids := make([]string, len(live))
	for i, m := range live {
		ids[i] = m.ID
	}
	return ids
}

// sees waits until every node sees exactly want as the live replicas.
func sees(t *testing.T, timeout time.Duration, nodes []*node, want ...string) {
	t.Helper()
	eventually(t, timeout, func() (bool, string) {
		for _, nd := range nodes {
			if got := memberIDs(nd.m.Live()); !slices.Equal(got, want) {
				return false, fmt.Sprintf("%s sees %v, want %v", nd.id, got, want)
			}
		}
		return true, ""
	})
}

// TestMembershipNotifiedJoinAndLeave checks that a join and a leave reach
// the others through the notification alone: heartbeats are a minute apart.
func TestMembershipNotifiedJoinAndLeave(t *testing.T) {
	env := newEnv(t)
	cfg := Config{TTL: 3 * time.Minute, Heartbeat: time.Minute}
	a, b := env.start(t, "a", cfg), env.start(t, "b", cfg)
	sees(t, 5*time.Second, []*node{a, b}, "a", "b")
	c := env.start(t, "c", cfg)
	sees(t, 2*time.Second, []*node{a, b, c}, "a", "b", "c")
	if got := a.m.Live()[2]; got != (Member{ID: "c", Addr: "c.internal:7000"}) {
		t.Errorf("a sees c as %+v", got)
	}
	c.stop()
	sees(t, 2*time.Second, []*node{a, b}, "a", "b")
	if n := env.counts.snapshot()["HeartbeatReplica"]; n != 0 {
		t.Errorf("%d heartbeats; the test must pass on notifications alone", n)
	}
}

// TestMembershipHeartbeatFindsJoinAndDeath checks the live set without
// notifications: a join is seen within a heartbeat, a killed replica is
// gone within its TTL.
func TestMembershipHeartbeatFindsJoinAndDeath(t *testing.T) {
	env := newEnv(t)
	env.forward.Store(false)
	cfg := Config{TTL: 1500 * time.Millisecond}
	a, b := env.start(t, "a", cfg), env.start(t, "b", cfg)
	c := env.start(t, "c", cfg)
	sees(t, 2*time.Second, []*node{a, b, c}, "a", "b", "c")
	killed := time.Now()
	c.crash()
	sees(t, 4*time.Second, []*node{a, b}, "a", "b")
	if d := time.Since(killed); d < time.Second {
		t.Errorf("c left the live set %v after it was killed, before its TTL could pass", d)
	}
}

// TestMembershipSelfExpiry deletes, then expires, a replica's row behind its
// back (what the leader does after a long pause): it calls OnLost and
// registers again.
func TestMembershipSelfExpiry(t *testing.T) {
	env := newEnv(t)
	env.forward.Store(false)
	a := env.start(t, "a", Config{TTL: 1500 * time.Millisecond})
	sees(t, 2*time.Second, []*node{a}, "a")
	for i, sql := range []string{
		`DELETE FROM replicas WHERE id = 'a'`,
		`UPDATE replicas SET expires_at = now() - interval '1 second' WHERE id = 'a'`,
	} {
		env.exec(t, sql)
		eventually(t, 3*time.Second, func() (bool, string) {
			_, _, lostAll, _ := a.snapshot()
			return lostAll == i+1, fmt.Sprintf("OnLost ran %d times, want %d", lostAll, i+1)
		})
		sees(t, 3*time.Second, []*node{a}, "a")
		live, err := env.db.LiveReplicas(t.Context())
		if err != nil || len(live) != 1 || live[0].ID != "a" {
			t.Errorf("after %q: live rows %v, %v; want a registered again", sql, live, err)
		}
	}
	if n := env.counts.snapshot()["RegisterReplica"]; n != 3 {
		t.Errorf("%d registrations, want 3 (start and twice again)", n)
	}
}
