package watches_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/live/livetest"
	"github.com/connector-svc/connector-svc/internal/mcptest"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
	"github.com/connector-svc/connector-svc/internal/watches"
)

func TestMain(m *testing.M) { storetest.Main(m) }

// setup runs one replica's registry with a READY connector on u, and a
// hub over it hearing its resource events.
func setup(t *testing.T, u *mcptest.Subscribable) (*watches.Hub, *registry.Registry, int64) {
	t.Helper()
	db := storetest.NewDB(t)
	reg, lv := livetest.Run(t, db)
	ctx := context.Background()
	row, err := db.CreateConnector(ctx, &store.Connector{WorkspaceID: "ws", ExternalID: "subs", Name: "Subs", Active: true,
		Transport: store.TransportStreamableHTTP, Config: store.Config{URL: u.HTTP.URL + "/mcp", CallTimeout: store.Duration(10 * time.Second)}})
	if err != nil {
		t.Fatal(err)
	}
	lv.Apply(ctx, row)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := reg.Contents(ctx, row.ID, true); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("connector not READY within 20s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	h := watches.New(reg, nil)
	reg.OnResourceEvent(h.Notify)
	t.Cleanup(h.Stop)
	return h, reg, row.ID
}

// hear sends updates of uri (or list changes, uri empty) until every one
// of ws hears one; other events are passed over.
func hear(t *testing.T, u *mcptest.Subscribable, uri string, ws ...*watches.Watch) {
	t.Helper()
	method, params := mcp.MethodNotificationResourceUpdated, map[string]any{"uri": uri}
	if uri == "" {
		method, params = mcp.MethodNotificationResourcesListChanged, nil
	}
	deadline := time.After(20 * time.Second)
	for i, w := range ws {
		for heard := false; !heard; {
			u.MCP.SendNotificationToAllClients(method, params)
			select {
			case ev, ok := <-w.Events:
				if !ok {
					t.Fatalf("watch %d ended: %v", i, w.Err())
				}
				if ev.At.IsZero() {
					t.Fatalf("watch %d heard %+v without its time", i, ev)
				}
				// Earlier sends may still arrive: wait for this kind.
				heard = ev.URI == uri && (uri != "" || ev.ResourcesChanged)
			case <-time.After(200 * time.Millisecond):
			case <-deadline:
				t.Fatalf("watch %d heard nothing of %q", i, uri)
			}
		}
	}
}

// Two watchers of one resource: one subscription at the server, both hear
// its updates, the first to go keeps it, the last (its context ended)
// ends it; a list change reaches every watcher of the connector.
func TestOneSubscriptionForEveryWatcher(t *testing.T) {
	u := mcptest.NewSubscribable(t, true)
	h, reg, id := setup(t, u)
	ctx := context.Background()

	w1, err := h.Watch(ctx, id, []string{"mem://a"})
	if err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithCancel(ctx)
	defer cancel2()
	w2, err := h.Watch(ctx2, id, []string{"mem://a", "mem://a"})
	if err != nil {
		t.Fatal(err)
	}
	w3, err := h.Watch(ctx, id, []string{"mem://b"})
	if err != nil {
		t.Fatal(err)
	}
	if n := u.Count("resources/subscribe mem://a"); n != 1 {
		t.Errorf("%d subscribes of mem://a for two watchers, want 1", n)
	}
	if got := reg.Subscriptions(id); !slices.Equal(got, []string{"mem://a", "mem://b"}) {
		t.Errorf("subscriptions %v", got)
	}
	if n := h.Watchers(id); n != 3 {
		t.Errorf("%d watchers, want 3", n)
	}
	hear(t, u, "mem://a", w1, w2)
	hear(t, u, "", w1, w2, w3)

	w1.Close()
	if _, ok := <-w1.Events; ok {
		t.Error("a closed watch's events still open")
	}
	if w1.Err() != nil {
		t.Errorf("closed watch's error %v", w1.Err())
	}
	if n := u.Count("resources/unsubscribe mem://a"); n != 0 {
		t.Errorf("%d unsubscribes with a watcher left, want 0", n)
	}
	hear(t, u, "mem://a", w2)

	cancel2() // the last watcher of mem://a goes away
	deadline := time.Now().Add(10 * time.Second)
	for u.Count("resources/unsubscribe mem://a") != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("%d unsubscribes after the last watcher's context ended, want 1", u.Count("resources/unsubscribe mem://a"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := reg.Subscriptions(id); !slices.Equal(got, []string{"mem://b"}) {
		t.Errorf("subscriptions after the last watcher of mem://a left: %v", got)
	}
	if n := u.Count("resources/subscribe mem://a"); n != 1 {
		t.Errorf("%d subscribes of mem://a in all, want 1", n)
	}

	h.Stop()
	if _, ok := <-w3.Events; ok {
		t.Error("a stopped hub's watch still open")
	}
	if !errors.Is(w3.Err(), watches.ErrStopping) {
		t.Errorf("stopped watch's error %v, want ErrStopping", w3.Err())
	}
	if _, err := h.Watch(ctx, id, []string{"mem://a"}); !errors.Is(err, watches.ErrStopping) {
		t.Errorf("watch on a stopped hub: %v, want ErrStopping", err)
	}
	select {
	case <-h.Stopping():
	default:
		t.Error("Stopping not closed after Stop")
	}
}

// Many watchers coming and going at once leave no subscription behind,
// and took it out at most once per time it was needed.
func TestConcurrentWatchers(t *testing.T) {
	u := mcptest.NewSubscribable(t, true)
	h, reg, id := setup(t, u)
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w, err := h.Watch(context.Background(), id, []string{"mem://a", "mem://b"})
			if err != nil {
				errs <- err
				return
			}
			w.Close()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := reg.Subscriptions(id); len(got) != 0 {
		t.Errorf("subscriptions left after every watcher went: %v", got)
	}
	for _, uri := range []string{"mem://a", "mem://b"} {
		s, un := u.Count("resources/subscribe "+uri), u.Count("resources/unsubscribe "+uri)
		if s != un || s < 1 {
			t.Errorf("%s: %d subscribes, %d unsubscribes; want as many, at least 1", uri, s, un)
		}
	}
	if n := h.Watchers(id); n != 0 {
		t.Errorf("%d watchers left", n)
	}
}

// A server that takes no subscriptions: the watch fails with
// registry.ErrNoSubscribe and holds nothing.
func TestWatchNoSubscribe(t *testing.T) {
	u := mcptest.NewSubscribable(t, false)
	h, _, id := setup(t, u)
	if _, err := h.Watch(context.Background(), id, []string{"mem://a"}); !errors.Is(err, registry.ErrNoSubscribe) {
		t.Fatalf("watch: %v, want ErrNoSubscribe", err)
	}
	if n := h.Watchers(id); n != 0 {
		t.Errorf("%d watchers after a failed watch", n)
	}
	if _, err := h.Watch(context.Background(), id, nil); err == nil {
		t.Error("a watch of no resources was taken")
	}
}
