package server_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/mcptest"
	"github.com/connector-svc/connector-svc/internal/server"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

// watch opens a WatchResources stream and reads its started message.
func (f *fixture) watch(t *testing.T, ctx context.Context, id string, uris ...string) connectorv1.ConnectorService_WatchResourcesClient {
	t.Helper()
	st, err := f.client.WatchResources(ctx, &connectorv1.WatchResourcesRequest{WorkspaceId: "ws", ConnectorId: id, Uris: uris})
	if err != nil {
		t.Fatal(err)
	}
	first, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if first.GetStarted() == nil {
		t.Fatalf("first message = %v, want started", first)
	}
	return st
}

// recvUpdate waits for an update of uri on st, sending updates until one
// arrives (a notification sent before the subscription is in place is
// not heard).
func recvUpdate(t *testing.T, st connectorv1.ConnectorService_WatchResourcesClient, srv *mcptest.Subscribable, uri string) {
	t.Helper()
	got := make(chan string, 16)
	go func() {
		for {
			m, err := st.Recv()
			if err != nil {
				close(got)
				return
			}
			if u := m.GetUpdated(); u != nil {
				got <- u.GetUri()
			}
		}
	}()
	deadline := time.After(20 * time.Second)
	for {
		srv.Update(uri)
		select {
		case u, ok := <-got:
			if !ok {
				t.Fatal("the watch ended before an update came")
			}
			if u != uri {
				t.Fatalf("update of %s, want %s", u, uri)
			}
			return
		case <-time.After(200 * time.Millisecond):
		case <-deadline:
			t.Fatalf("no update of %s", uri)
		}
	}
}

// Two watchers of one resource: one subscription at the server, each
// hears the update; the subscription ends with the last watcher.
func TestWatchResourcesHoldsOneSubscription(t *testing.T) {
	f := setup(t)
	srv := mcptest.NewSubscribable(t, true)
	f.create(t, "ws", mcpConnector("subs", srv.HTTP.URL+"/mcp"))
	f.waitReady(t, "ws", "subs")

	ctx1, cancel1 := context.WithCancel(ctx(t))
	defer cancel1()
	ctx2, cancel2 := context.WithCancel(ctx(t))
	defer cancel2()
	w1 := f.watch(t, ctx1, "subs", "mem://a")
	w2 := f.watch(t, ctx2, "subs", "mem://a", "mem://b")
	if n := srv.Count("resources/subscribe mem://a"); n != 1 {
		t.Errorf("%d subscribes to mem://a, want 1", n)
	}
	recvUpdate(t, w1, srv, "mem://a")
	recvUpdate(t, w2, srv, "mem://a")

	cancel1() // the first watcher goes away: the subscription stays for the second
	time.Sleep(300 * time.Millisecond)
	if n := srv.Count("resources/unsubscribe mem://a"); n != 0 {
		t.Errorf("unsubscribed with a watcher left")
	}
	cancel2()
	testsupport.WaitFor(t, "the last watcher's unsubscribes", func() bool {
		return srv.Count("resources/unsubscribe mem://a") == 1 && srv.Count("resources/unsubscribe mem://b") == 1
	})
	if n := srv.Count("resources/subscribe mem://a"); n != 1 {
		t.Errorf("%d subscribes to mem://a in all, want 1", n)
	}

	// Refusals: no uris, a bad one, a server without subscriptions.
	for field, uris := range map[string][]string{"uris": nil, "uris[0]": {"not a uri"}} {
		st, err := f.client.WatchResources(ctx(t), &connectorv1.WatchResourcesRequest{WorkspaceId: "ws", ConnectorId: "subs", Uris: uris})
		if err == nil {
			_, err = st.Recv()
		}
		wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, field)
	}
	tools := newTestMCP(t)
	f.create(t, "ws", mcpConnector("tools-only", tools.url()))
	f.waitReady(t, "ws", "tools-only")
	st, err := f.client.WatchResources(ctx(t), &connectorv1.WatchResourcesRequest{WorkspaceId: "ws", ConnectorId: "tools-only", Uris: []string{"mem://a"}})
	if err == nil {
		_, err = st.Recv()
	}
	wantStatus(t, err, codes.FailedPrecondition, server.ReasonNoSubscribe, "")
}

// The reference server's simulated updates reach a watcher.
func TestWatchResourcesOfTheReferenceServer(t *testing.T) {
	f := setup(t)
	f.create(t, "ws", mcpConnector("everything", everythingHTTP(t)))
	f.waitReady(t, "ws", "everything")
	list, err := f.client.ListResources(ctx(t), &connectorv1.ListResourcesRequest{WorkspaceId: "ws", ConnectorId: "everything"})
	if err != nil {
		t.Fatal(err)
	}
	uri := list.GetResources()[0].GetUri()
	st := f.watch(t, ctx(t), "everything", uri)
	if _, err := f.call(t, "ws", "everything", "toggle-subscriber-updates", map[string]any{}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		for {
			m, err := st.Recv()
			if err != nil {
				done <- err
				return
			}
			if m.GetUpdated().GetUri() == uri {
				done <- nil
				return
			}
		}
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no update from the reference server")
	}
}
