package cluster

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

func TestMain(m *testing.M) { os.Exit(storetest.Main(m)) }

// env is one database shared by the replicas of a test, with what the
// service's listener would do: pass every cluster notification to the
// replicas' Notified (while forward is on).
type env struct {
	db      *store.DB
	sql     *pgx.Conn
	counts  *countingStore
	forward atomic.Bool

	mu    sync.Mutex
	nodes []*node
}

func newEnv(t *testing.T) *env {
	t.Helper()
	url := storetest.NewURL(t)
	db, err := store.Open(context.Background(), url, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	e := &env{db: db, sql: conn, counts: &countingStore{Store: db, n: map[string]int{}}}
	e.forward.Store(true)
	e.listen(t, url)
	return e
}

// listen LISTENs on the cluster channel until t ends, like the service's
// one listener, and passes payloads to every node's Notified.
func (e *env) listen(t *testing.T, url string) {
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+store.ClusterChannel); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				return
			}
			if !e.forward.Load() {
				continue
			}
			e.mu.Lock()
			nodes := slices.Clone(e.nodes)
			e.mu.Unlock()
			for _, nd := range nodes {
				nd.m.Notified(n.Payload)
				nd.e.Notified(n.Payload)
				nd.o.Notified(n.Payload)
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		conn.Close(context.Background())
	})
}

func (e *env) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := e.sql.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// connectors creates n active connectors and returns their ids.
func (e *env) connectors(t *testing.T, n int) []int64 {
	t.Helper()
	var ids []int64
	for i := range n {
		c, err := e.db.CreateConnector(context.Background(), &store.Connector{
			WorkspaceID: "acme", ExternalID: fmt.Sprint("c", i), Name: "c", Transport: store.TransportStreamableHTTP,
			Config: store.Config{URL: "http://127.0.0.1:9/mcp"}, Active: true,
		})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, c.ID)
	}
	return ids
}

// activeIDs is the keys function the service gives Owners.
func (e *env) activeIDs(ctx context.Context) ([]int64, error) {
	e.counts.add("ActiveConnectors")
	cs, err := e.db.ActiveConnectors(ctx)
	if err != nil {
		return nil, err
	}
	ids := make([]int64, len(cs))
	for i, c := range cs {
		ids[i] = c.ID
	}
	return ids, nil
}

// node is one replica's cluster parts, running until stopped or t ends,
// with what its hooks saw.
type node struct {
	id     string
	m      *Membership
	e      *Elector
	o      *Owners
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	gained  map[int64]int64 // every connector ever gained, with its last epoch
	lostIDs []int64         // every OnLostOwnership, in order
	lostAll int             // OnLost calls
	leads   int             // OnLead calls
	unleads int             // OnLead contexts ended
}

func (e *env) start(t *testing.T, id string, cfg Config) *node {
	t.Helper()
	cfg.ID, cfg.Addr = id, id+".internal:7000"
	nd := &node{id: id, gained: map[int64]int64{}, done: make(chan struct{})}
	nd.m = New(e.counts, cfg)
	nd.e = NewElector(e.counts, cfg)
	nd.o = NewOwners(e.counts, nd.m, e.activeIDs)
	nd.m.OnLost(func() { nd.mu.Lock(); nd.lostAll++; nd.mu.Unlock() })
	nd.e.OnLead(func(ctx context.Context) {
		nd.mu.Lock()
		nd.leads++
		nd.mu.Unlock()
		<-ctx.Done()
		nd.mu.Lock()
		nd.unleads++
		nd.mu.Unlock()
	})
	nd.o.OnGained(func(id, epoch int64) { nd.mu.Lock(); nd.gained[id] = epoch; nd.mu.Unlock() })
	nd.o.OnLostOwnership(func(id int64) { nd.mu.Lock(); nd.lostIDs = append(nd.lostIDs, id); nd.mu.Unlock() })
	e.mu.Lock()
	e.nodes = append(e.nodes, nd)
	e.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	nd.cancel = cancel
	var wg sync.WaitGroup
	for _, run := range []func(context.Context) error{nd.m.Run, nd.e.Run, nd.o.Run} {
		wg.Go(func() {
			if err := run(ctx); err != nil {
				t.Errorf("%s: Run: %v", id, err)
			}
		})
	}
	go func() { wg.Wait(); close(nd.done) }()
	t.Cleanup(nd.stop)
	return nd
}

// stop ends the node's Runs and waits for them.
func (nd *node) stop() {
	nd.cancel()
	<-nd.done
}

// crash ends the node's Runs like kill -9: no leave, no resign, no release.
func (nd *node) crash() {
	nd.m.crash, nd.e.crash = true, true
	nd.stop()
}

func (nd *node) leadership() (leads, unleads int) {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	return nd.leads, nd.unleads
}

func (nd *node) snapshot() (gained map[int64]int64, lost []int64, lostAll, leads int) {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	return maps.Clone(nd.gained), slices.Clone(nd.lostIDs), nd.lostAll, nd.leads
}

// eventually polls cond until it holds or timeout passes, then fails with
// its last explanation.
func eventually(t *testing.T, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", timeout, why)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// countingStore counts the statements each Store method sends.
type countingStore struct {
	Store
	mu sync.Mutex
	n  map[string]int
}

func (c *countingStore) add(name string) {
	c.mu.Lock()
	c.n[name]++
	c.mu.Unlock()
}

func (c *countingStore) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.n)
}

func (c *countingStore) RegisterReplica(ctx context.Context, id, addr string, ttl time.Duration) error {
	c.add("RegisterReplica")
	return c.Store.RegisterReplica(ctx, id, addr, ttl)
}

func (c *countingStore) HeartbeatReplica(ctx context.Context, id string, ttl time.Duration) (bool, []store.Replica, error) {
	c.add("HeartbeatReplica")
	return c.Store.HeartbeatReplica(ctx, id, ttl)
}

func (c *countingStore) LiveReplicas(ctx context.Context) ([]store.Replica, error) {
	c.add("LiveReplicas")
	return c.Store.LiveReplicas(ctx)
}

func (c *countingStore) LeaveReplica(ctx context.Context, id string) error {
	c.add("LeaveReplica")
	return c.Store.LeaveReplica(ctx, id)
}

func (c *countingStore) ElectLeader(ctx context.Context, id string, ttl time.Duration) (time.Time, bool, error) {
	c.add("ElectLeader")
	return c.Store.ElectLeader(ctx, id, ttl)
}

func (c *countingStore) RenewLeader(ctx context.Context, id string, term time.Time, ttl time.Duration) (bool, error) {
	c.add("RenewLeader")
	return c.Store.RenewLeader(ctx, id, term, ttl)
}

func (c *countingStore) ResignLeader(ctx context.Context, id string, term time.Time) error {
	c.add("ResignLeader")
	return c.Store.ResignLeader(ctx, id, term)
}

func (c *countingStore) ClaimConnectors(ctx context.Context, replica string, ids []int64) (map[int64]int64, error) {
	c.add("ClaimConnectors")
	return c.Store.ClaimConnectors(ctx, replica, ids)
}

func (c *countingStore) ConnectorsOwnedBy(ctx context.Context, replica string) (map[int64]int64, error) {
	c.add("ConnectorsOwnedBy")
	return c.Store.ConnectorsOwnedBy(ctx, replica)
}

func (c *countingStore) ReleaseConnectors(ctx context.Context, replica string, ids []int64) ([]int64, error) {
	c.add("ReleaseConnectors")
	return c.Store.ReleaseConnectors(ctx, replica, ids)
}

func (c *countingStore) ConnectorOwner(ctx context.Context, id int64) (store.Replica, store.Fence, error) {
	c.add("ConnectorOwner")
	return c.Store.ConnectorOwner(ctx, id)
}
