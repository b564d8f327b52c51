package live

import (
	"context"
	"errors"
	"fmt"

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
}

// NewRouter routes by owners' ownership over pool's connections; a nil
// pool forwards nothing, and calls that need it fail with ErrNoRoute.
func NewRouter(owners *cluster.Owners, pool *forward.Pool) *Router {
	return &Router{owners: owners, pool: pool}
}

// ToOwner returns the connection to the replica that owns row's
// connector, or nil when that is this replica, or when ctx is a call
// another replica forwarded here (a forwarded call is never forwarded
// again). For is what the call needs the owner for: every call when
// ownerOnly, stdio connectors' calls otherwise.
func (r *Router) ToOwner(ctx context.Context, row *store.Connector, ownerOnly bool) (*grpc.ClientConn, error) {
	if r == nil || forward.Forwarded(ctx) || (!ownerOnly && row.Transport != registry.TransportStdio) {
		return nil, nil
	}
	if _, ok := r.owners.Owned(row.ID); ok {
		return nil, nil
	}
	owner, err := r.owners.OwnerOf(ctx, row.ID)
	if errors.Is(err, cluster.ErrNoOwner) {
		return nil, fmt.Errorf("%w: no live replica owns connector %q yet (a replica may have just stopped); retry shortly", ErrNoRoute, row.ExternalID)
	}
	if err != nil {
		return nil, err
	}
	if r.pool == nil {
		return nil, fmt.Errorf("%w: connector %q runs on replica %s, and this replica cannot forward without SECRET_KEY", ErrNoRoute, row.ExternalID, owner.ID)
	}
	return r.pool.Conn(owner.Addr)
}
