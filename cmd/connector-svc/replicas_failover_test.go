package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/cluster"
)

// TestReplicasKill9TakeoverBeforeTTL kills a replica owning a stdio
// connector with SIGKILL, with the default settings (REPLICA_TTL 15 s), and
// calls the connector through the survivors until a call succeeds. Postgres
// sees the killed process's connections close at once, so the survivors
// must take over without waiting for its TTL to run out.
func TestReplicasKill9TakeoverBeforeTTL(t *testing.T) {
	c := newCluster(t, defaultSettings, "a", "b", "c")
	c.waitMembers("a", "b", "c")
	db := c.db()
	var own map[string]owner
	var ofA string
	for i := 0; ofA == "" && i < 12; i++ {
		id := fmt.Sprintf("s%d", i)
		create(t, c.client("b"), c.stdioConnector(id))
		var err error
		if !poll(20*time.Second, func() bool {
			own, err = owners(context.Background(), db)
			o, ok := own[id]
			return err == nil && ok && o.live
		}) {
			t.Fatalf("stdio connector %s has no live owner 20s after it was created: %v (owners %v)", id, err, own)
		}
		if own[id].replica == "a" {
			ofA = id
		}
	}
	if ofA == "" {
		t.Fatalf("a owns none of 12 stdio connectors (owners %v)", own)
	}
	c.waitCallable(20*time.Second, "stdio", ofA, "b", "c")
	before := own[ofA].epoch

	killedAt := time.Now()
	c.kill9("a")
	var took time.Duration
	var err error
	ok := poll(cluster.DefaultTTL+10*time.Second, func() bool {
		err = echo(context.Background(), c.client("b"), ofA, "stdio")
		if err == nil {
			took = time.Since(killedAt)
		}
		return err == nil
	})
	if !ok {
		t.Fatalf("%s (owned by a) not callable through b %v after a's kill -9: %v", ofA, cluster.DefaultTTL+10*time.Second, err)
	}
	t.Logf("kill -9 to the first successful call of a's stdio connector through a survivor: %v", took.Round(time.Millisecond))
	// Before the TTL (15 s) no survivor could have found a dead by its
	// heartbeat's expiry: only the closed connections tell it that soon.
	if took >= cluster.DefaultTTL/2 {
		t.Errorf("a's stdio connector was taken over %v after kill -9, not before half of REPLICA_TTL (%v): the survivors waited for the TTL",
			took.Round(time.Millisecond), cluster.DefaultTTL/2)
	}
	if err := echo(context.Background(), c.client("c"), ofA, "stdio"); err != nil {
		t.Errorf("%s through c after the takeover: %v", ofA, err)
	}
	own, err = owners(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	if o := own[ofA]; o.replica == "a" || !o.live || o.epoch <= before {
		t.Errorf("owner of %s after the takeover = %+v, want a live survivor with an epoch above %d", ofA, o, before)
	}
	// a's own process dies with it (its process group), soon after.
	var pids []int
	if !poll(10*time.Second, func() bool { pids = c.liveProcesses(ofA); return len(pids) == 1 }) {
		parents := make([]int, len(pids))
		for i, p := range pids {
			parents[i] = parentOf(p)
		}
		t.Errorf("%s runs processes %v (parents %v) 10s after the takeover, want 1", ofA, pids, parents)
	}
}

// TestReplicasCallRightAfterCreate creates connectors through one replica
// and calls them through the two others at once, with no retry: a replica
// that finds a connector it has not heard of yet waits for its connect, as
// the creating replica does. The creating replica lists the new
// connector's tools within seconds, whoever owns it.
func TestReplicasCallRightAfterCreate(t *testing.T) {
	up := newUpstream(t)
	c := newCluster(t, defaultSettings, "a", "b", "c")
	c.waitMembers("a", "b", "c")
	var failed []string
	const rounds = 12
	for i := range rounds {
		id := fmt.Sprintf("h%d", i)
		kind, conn := "http", httpConnector(id, up.url("/"+id))
		if i%2 == 1 {
			kind, conn = "stdio", c.stdioConnector(id)
		}
		creator := []string{"a", "b", "c"}[i%3]
		create(t, c.client(creator), conn)
		errs := make(chan error, 3)
		for _, r := range []string{"a", "b", "c"} {
			go func() {
				if r == creator { // its catalog is synced by whoever owns it, within seconds
					var err error
					poll(5*time.Second, func() bool {
						var resp *connectorv1.ListToolsResponse
						resp, err = c.client(r).ListTools(ctxFor(t, 10*time.Second), &connectorv1.ListToolsRequest{WorkspaceId: "acme", ConnectorId: id})
						if err == nil && len(resp.GetTools()) == 0 {
							err = fmt.Errorf("no tools listed within 5s")
						}
						return err == nil
					})
					errs <- errors.Join(err, errorIf(err != nil, "ListTools through %s (the creator) of %s connector %s", r, kind, id))
					return
				}
				err := echo(context.Background(), c.client(r), id, kind)
				errs <- errors.Join(err, errorIf(err != nil, "CallTool through %s of %s connector %s created through %s", r, kind, id, creator))
			}()
		}
		for range 3 {
			if err := <-errs; err != nil {
				failed = append(failed, err.Error())
			}
		}
	}
	if len(failed) > 0 {
		t.Errorf("%d of %d calls and listings right after CreateConnector failed:\n%s", len(failed), 3*rounds, strings.Join(failed, "\n"))
	}
}

// errorIf returns an error of the message when cond holds, else nil.
func errorIf(cond bool, format string, args ...any) error {
	if !cond {
		return nil
	}
	return fmt.Errorf(format, args...)
}
