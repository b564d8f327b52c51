package main

// WatchResources across replicas (issue 31): the real binary, three
// replicas on one database, watchers on the replicas that do not own the
// connector; one subscription at the server, held by the owner, and
// taken out by the next owner when it dies, the same watches going on.

import (
	"context"
	"testing"
	"time"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/mcptest"
)

// watcher reads a WatchResources stream into a channel of updated uris;
// it is closed, with the stream's error in err, when the stream ends.
type watcher struct {
	updates chan string
	err     error
}

func startWatch(t *testing.T, ctx context.Context, client connectorv1.ConnectorServiceClient, connector, uri string) (*watcher, error) {
	st, err := client.WatchResources(ctx, &connectorv1.WatchResourcesRequest{WorkspaceId: "acme", ConnectorId: connector, Uris: []string{uri}})
	if err != nil {
		return nil, err
	}
	first, err := st.Recv()
	if err != nil {
		return nil, err
	}
	if first.GetStarted() == nil {
		t.Fatalf("first message = %v", first)
	}
	w := &watcher{updates: make(chan string, 64)}
	go func() {
		defer close(w.updates)
		for {
			m, err := st.Recv()
			if err != nil {
				w.err = err
				return
			}
			if u := m.GetUpdated(); u != nil {
				w.updates <- u.GetUri()
			}
		}
	}()
	return w, nil
}

// drain drops the updates w heard so far.
func drain(w *watcher) {
	for {
		select {
		case <-w.updates:
		default:
			return
		}
	}
}

// heard sends updates of mem://a until w hears one, or the deadline
// passes.
func heard(u *mcptest.Subscribable, w *watcher, d time.Duration) bool {
	deadline := time.After(d)
	for {
		u.Update("mem://a")
		select {
		case _, ok := <-w.updates:
			return ok
		case <-time.After(200 * time.Millisecond):
		case <-deadline:
			return false
		}
	}
}

func TestReplicasWatchResources(t *testing.T) {
	c := newCluster(t, defaultSettings, "a", "b", "c")
	c.waitMembers("a", "b", "c")
	up := mcptest.NewSubscribable(t, true)
	create(t, c.client("a"), httpConnector("subs", up.HTTP.URL+"/mcp"))
	db := c.db()
	var own map[string]owner
	if !poll(20*time.Second, func() bool {
		var err error
		own, err = owners(context.Background(), db)
		return err == nil && own["subs"].live
	}) {
		t.Fatalf("no live owner of the connector: %v", own)
	}
	var others []string
	for _, id := range []string{"a", "b", "c"} {
		if id != own["subs"].replica {
			others = append(others, id)
		}
	}
	ctx, cancel := context.WithCancel(ctxFor(t, 2*time.Minute))
	defer cancel()
	var ws []*watcher
	for _, id := range others {
		var w *watcher
		err := retryUnavailable(func(int) error {
			var err error
			w, err = startWatch(t, ctx, c.client(id), "subs", "mem://a")
			return err
		})
		if err != nil {
			t.Fatalf("watch through %s: %v", id, err)
		}
		ws = append(ws, w)
	}
	if n := up.Count("resources/subscribe mem://a"); n != 1 {
		t.Errorf("%d subscribes at the server for two watchers on two replicas, want 1", n)
	}
	for i, w := range ws {
		if !heard(up, w, 20*time.Second) {
			t.Fatalf("the watcher through %s heard no update", others[i])
		}
	}

	// The owner dies: the new owner subscribes, and the same watches go
	// on hearing updates (their replicas watch again there).
	c.kill9(own["subs"].replica)
	for i, w := range ws {
		drain(w)
		if !heard(up, w, 60*time.Second) {
			t.Fatalf("the watch through %s heard no update after the owner's kill (ended: %v)", others[i], w.err)
		}
	}
	if n := up.Count("resources/subscribe mem://a"); n != 2 {
		t.Errorf("%d subscribes in all, want 2 (one per owner)", n)
	}
	t.Logf("subscribes: %d", up.Count("resources/subscribe mem://a"))
}
