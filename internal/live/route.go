package live

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/connector-svc/connector-svc/internal/cluster"
	"github.com/connector-svc/connector-svc/internal/forward"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/store"
)

// ErrNoRoute means a call must run on another replica and cannot reach
// it now: no live replica owns the connector (one just stopped, and the
// others have not taken it over yet), or this replica cannot forward
// (no SECRET_KEY to sign with). Worth a retry.
var ErrNoRoute = errors.New("the call cannot reach the replica that serves it")

// Router says where a call of a connector runs: here, or on the replica
// that owns it, reached over the internal listener. Calls of a stdio
// connector run on its owner (the one replica that runs its process); so
// do refreshes and checks of any connector (the owner syncs and writes).
type Router struct {
	owners *cluster.Owners
	pool   *forward.Pool // nil: this replica cannot forward
	reg    *registry.Registry

	// known caches other replicas' ownership read from Postgres, so that
	// a forwarded call costs no query: kept for ownerTTL, and forgotten
	// at once when ownership may have moved (Moved) or a forward failed.
	mu    sync.Mutex
	known map[int64]knownOwner
}

type knownOwner struct {
	owner cluster.Member
	at    time.Time
}

// ownerTTL bounds how long a cached owner is used without asking again.
const ownerTTL = 5 * time.Second

// handoverWait is how long a call waits for a connector between owners
// (the last one stopped; the next claims it within milliseconds) before
// it fails with ErrNoRoute.
const handoverWait = 2 * time.Second

// NewRouter routes by owners' ownership over pool's connections; a nil
// pool forwards nothing, and calls that need it fail with ErrNoRoute. reg
// is this replica's: a stdio connector it has just come to own is served
// once reg holds it.
func NewRouter(owners *cluster.Owners, pool *forward.Pool, reg *registry.Registry) *Router {
	return &Router{owners: owners, pool: pool, reg: reg, known: map[int64]knownOwner{}}
}

// Moved forgets what the router knows of other replicas' ownership: the
// live replicas changed, or ownership moved. Hook it to both.
func (r *Router) Moved() {
	r.mu.Lock()
	clear(r.known)
	r.mu.Unlock()
}

// ownerOf is Owners.OwnerOf, cached for ownerTTL.
func (r *Router) ownerOf(ctx context.Context, id int64) (cluster.Member, error) {
	r.mu.Lock()
	k, ok := r.known[id]
	r.mu.Unlock()
	if ok && time.Since(k.at) < ownerTTL {
		return k.owner, nil
	}
	owner, err := r.owners.OwnerOf(ctx, id)
	if err == nil {
		r.mu.Lock()
		r.known[id] = knownOwner{owner: owner, at: time.Now()}
		r.mu.Unlock()
	}
	return owner, err
}

// ToOwner returns the connection to the replica that owns row's
// connector, or nil when that is this replica, or when ctx is a call
// another replica forwarded here (a forwarded call is never forwarded
// again). Every call goes to the owner with ownerOnly; otherwise only a
// stdio connector's. A connector between owners is waited for, up to
// handoverWait.
func (r *Router) ToOwner(ctx context.Context, row *store.Connector, ownerOnly bool) (*grpc.ClientConn, error) {
	stdio := row.Transport == registry.TransportStdio
	if r == nil || (!ownerOnly && !stdio) {
		return nil, nil
	}
	forwarded := forward.Forwarded(ctx)
	// Between owners (one stopped, the next claims within milliseconds,
	// and then connects), wait a little rather than fail.
	deadline := time.Now().Add(handoverWait)
	for {
		if _, ok := r.owners.Owned(row.ID); ok {
			if !stdio || r.reg.Has(row.ID) {
				return nil, nil
			}
		} else if forwarded {
			return nil, nil // sent here as the owner: served here, never forwarded again
		} else {
			owner, err := r.ownerOf(ctx, row.ID)
			switch {
			case err == nil && r.pool == nil:
				return nil, fmt.Errorf("%w: connector %q runs on replica %s, and this replica cannot forward without SECRET_KEY",
					ErrNoRoute, row.ExternalID, owner.ID)
			case err == nil:
				return r.pool.Conn(owner.Addr)
			case !errors.Is(err, cluster.ErrNoOwner):
				return nil, err
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%w: no live replica serves connector %q yet (a replica may have just stopped); retry shortly",
				ErrNoRoute, row.ExternalID)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(25 * time.Millisecond):
		}
	}
}
