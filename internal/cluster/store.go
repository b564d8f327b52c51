package cluster

import (
	"context"
	"encoding/json"
	"time"

	"github.com/connector-svc/connector-svc/internal/store"
)

// Store is what the package needs of the database; *store.DB implements it.
// It is an interface so that tests can count or fail the statements.
type Store interface {
	RegisterReplica(ctx context.Context, id, internalAddr string, ttl time.Duration) error
	HeartbeatReplica(ctx context.Context, id string, ttl time.Duration) (alive bool, live []store.Replica, err error)
	LiveReplicas(ctx context.Context) ([]store.Replica, error)
	SetReplicaSettings(ctx context.Context, id string, settings map[string]string) error
	LeaveReplica(ctx context.Context, id string) error
	ExpireVanishedReplicas(ctx context.Context, self string) ([]string, error)
	ExpireDeadReplicas(ctx context.Context, grace time.Duration) (int64, error)

	ElectLeader(ctx context.Context, id string, ttl time.Duration) (term time.Time, ok bool, err error)
	RenewLeader(ctx context.Context, id string, term time.Time, ttl time.Duration) (bool, error)
	ResignLeader(ctx context.Context, id string, term time.Time) error

	ClaimConnectors(ctx context.Context, replica string, ids []int64) (map[int64]int64, error)
	ConnectorsOwnedBy(ctx context.Context, replica string) (map[int64]int64, error)
	ReleaseConnectors(ctx context.Context, replica string, ids []int64) ([]int64, error)
	ConnectorOwner(ctx context.Context, id int64) (store.Replica, store.Fence, error)
}

var _ Store = (*store.DB)(nil)

// parseEvent reads a notification payload. An empty or unreadable payload
// means "anything may have changed" (a re-LISTEN), kind "".
func parseEvent(payload string) store.ClusterEvent {
	var ev store.ClusterEvent
	if payload != "" && json.Unmarshal([]byte(payload), &ev) != nil {
		return store.ClusterEvent{}
	}
	return ev
}

// poke wakes a Run loop without blocking; wakes coalesce.
func poke(wake chan struct{}) {
	select {
	case wake <- struct{}{}:
	default:
	}
}
