package main

// WatchResources across replicas (issue 31): the real binary, three
// replicas on one database, watchers on the replicas that do not own the
// connector; one subscription at the server, held by the owner.

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
)

// subsUpstream takes subscriptions and counts them.
type subsUpstream struct {
	mcp  *mcpserver.MCPServer
	srv  *httptest.Server
	mu   sync.Mutex
	subs int
}

func newSubsUpstream(t *testing.T) *subsUpstream {
	u := &subsUpstream{mcp: mcpserver.NewMCPServer("subs", "1", mcpserver.WithResourceCapabilities(true, true))}
	u.mcp.AddTool(mcp.NewTool("echo", mcp.WithString("text")), func(_ context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("echo: " + r.GetString("text", "")), nil
	})
	u.mcp.AddResource(mcp.NewResource("mem://doc", "doc"), func(_ context.Context, r mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
		return []mcp.ResourceContents{mcp.TextResourceContents{URI: r.Params.URI, Text: "v"}}, nil
	})
	h := mcpserver.NewStreamableHTTPServer(u.mcp)
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			var msg struct{ Method string }
			if json.Unmarshal(body, &msg) == nil && msg.Method == "resources/subscribe" {
				u.mu.Lock()
				u.subs++
				u.mu.Unlock()
			}
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *subsUpstream) subscribes() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.subs
}

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

// heard sends updates until w hears one, or the deadline passes.
func (u *subsUpstream) heard(w *watcher, d time.Duration) bool {
	deadline := time.After(d)
	for {
		u.mcp.SendNotificationToAllClients(mcp.MethodNotificationResourceUpdated, map[string]any{"uri": "mem://doc"})
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
	up := newSubsUpstream(t)
	create(t, c.client("a"), httpConnector("subs", up.srv.URL+"/mcp"))
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
			w, err = startWatch(t, ctx, c.client(id), "subs", "mem://doc")
			return err
		})
		if err != nil {
			t.Fatalf("watch through %s: %v", id, err)
		}
		ws = append(ws, w)
	}
	if n := up.subscribes(); n != 1 {
		t.Errorf("%d subscribes at the server for two watchers on two replicas, want 1", n)
	}
	for i, w := range ws {
		if !up.heard(w, 20*time.Second) {
			t.Fatalf("the watcher through %s heard no update", others[i])
		}
	}

	// The owner dies: the new owner subscribes, and the same watches go
	// on hearing updates (their replicas watch again there).
	c.kill9(own["subs"].replica)
	for i, w := range ws {
		drain(w)
		if !up.heard(w, 60*time.Second) {
			t.Fatalf("the watch through %s heard no update after the owner's kill (ended: %v)", others[i], w.err)
		}
	}
	if n := up.subscribes(); n != 2 {
		t.Errorf("%d subscribes in all, want 2 (one per owner)", n)
	}
	t.Logf("subscribes: %d", up.subscribes())
}
