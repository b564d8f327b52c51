package main

import (
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"net"
	"os"
	"regexp"
	"time"
)

// clusterConfig is how this replica takes part in the cluster of replicas
// that share the database (docs/replicas.md).
type clusterConfig struct {
	// ReplicaID names this replica; "" means one made up at start
	// (host name and a random suffix), new at every start.
	ReplicaID string
	// InternalAddr is where this replica serves the calls other replicas
	// forward to it; InternalAdvertiseAddr, the address they reach it at
	// ("" means the address InternalAddr bound).
	InternalAddr, InternalAdvertiseAddr string
	// ReplicaTTL is how long a replica that stopped heartbeating counts as
	// live; it heartbeats every third of it.
	ReplicaTTL time.Duration
	// ReconcileInterval is how often every connector's live copy is
	// compared with its row, catching a lost notification.
	ReconcileInterval time.Duration
}

func clusterFlags(fs *flag.FlagSet, cfg *clusterConfig, ttl, reconcile *string) {
	fs.StringVar(&cfg.ReplicaID, "replica-id", "",
		"this replica's name among the replicas on one database; empty makes one up from the host name (REPLICA_ID)")
	fs.StringVar(&cfg.InternalAddr, "internal-addr", "127.0.0.1:0",
		"address other replicas forward stdio and per-session calls to, authenticated with a key derived from SECRET_KEY; :0 picks a port (INTERNAL_ADDR)")
	fs.StringVar(&cfg.InternalAdvertiseAddr, "internal-advertise-addr", "",
		"the address other replicas reach INTERNAL_ADDR at, e.g. the pod IP and port; empty is the address bound (INTERNAL_ADVERTISE_ADDR)")
	fs.StringVar(ttl, "replica-ttl", "15s", "a replica that stops heartbeating is taken over after this; it heartbeats every third of it (REPLICA_TTL)")
	fs.StringVar(reconcile, "reconcile-interval", "1m",
		"how often every connector is compared with its row, catching a change notification that was lost (RECONCILE_INTERVAL)")
}

var replicaIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,62}$`)

// readCluster checks the cluster settings and fills the replica id.
func (cfg *clusterConfig) read(ttl, reconcile string) error {
	var err error
	if cfg.ReplicaTTL, err = positiveDuration("REPLICA_TTL", ttl); err != nil {
		return err
	}
	if cfg.ReplicaTTL < 3*time.Second {
		return fmt.Errorf("REPLICA_TTL %v: want at least 3s (the replica heartbeats every third of it)", cfg.ReplicaTTL)
	}
	if cfg.ReconcileInterval, err = positiveDuration("RECONCILE_INTERVAL", reconcile); err != nil {
		return err
	}
	if _, _, err := net.SplitHostPort(cfg.InternalAddr); err != nil {
		return fmt.Errorf("INTERNAL_ADDR %q: want host:port: %w", cfg.InternalAddr, err)
	}
	if cfg.InternalAdvertiseAddr != "" {
		if _, _, err := net.SplitHostPort(cfg.InternalAdvertiseAddr); err != nil {
			return fmt.Errorf("INTERNAL_ADVERTISE_ADDR %q: want host:port: %w", cfg.InternalAdvertiseAddr, err)
		}
	}
	if cfg.ReplicaID == "" {
		cfg.ReplicaID = madeUpReplicaID()
	}
	if !replicaIDPattern.MatchString(cfg.ReplicaID) {
		return fmt.Errorf("REPLICA_ID %q: want 1 to 63 letters, digits, '.', '_', ':' or '-', starting with a letter or digit", cfg.ReplicaID)
	}
	return nil
}

// madeUpReplicaID is the host name (a pod's name on Kubernetes) and a
// random suffix: a restarted process is a new replica.
func madeUpReplicaID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "replica"
	}
	if len(host) > 48 {
		host = host[:48]
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	id := host + "-" + hex.EncodeToString(b)
	if !replicaIDPattern.MatchString(id) {
		return "replica-" + hex.EncodeToString(b)
	}
	return id
}
