package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/cluster"
	"github.com/connector-svc/connector-svc/internal/forward"
	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/tlsfiles"
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
		"this replica's name among the replicas on one database, unique among them; empty makes one up from the host name (REPLICA_ID)")
	fs.StringVar(&cfg.InternalAddr, "internal-addr", "127.0.0.1:0",
		"address other replicas forward stdio and per-session calls to, authenticated with a key derived from SECRET_KEY; :0 picks a port (INTERNAL_ADDR)")
	fs.StringVar(&cfg.InternalAdvertiseAddr, "internal-advertise-addr", "",
		"the address other replicas reach INTERNAL_ADDR at, e.g. the pod IP and port; empty is the address bound (INTERNAL_ADVERTISE_ADDR)")
	fs.StringVar(ttl, "replica-ttl", "15s", "a replica that stops heartbeating is taken over after this; it heartbeats every third of it; at least 3s (REPLICA_TTL)")
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
	host, _, err := net.SplitHostPort(cfg.InternalAddr)
	if err != nil {
		return fmt.Errorf("INTERNAL_ADDR %q: want host:port: %w", cfg.InternalAddr, err)
	}
	if ip := net.ParseIP(host); (host == "" || ip != nil && ip.IsUnspecified()) && cfg.InternalAdvertiseAddr == "" {
		return fmt.Errorf("INTERNAL_ADDR %q binds every interface: set INTERNAL_ADVERTISE_ADDR to the address other replicas reach it at (the pod IP and port)",
			cfg.InternalAddr)
	}
	if cfg.InternalAdvertiseAddr != "" {
		cfg.InternalAdvertiseAddr = bracketIPv6(cfg.InternalAdvertiseAddr)
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

// replica is this process's part in the cluster: its membership, its
// share of the connectors, the leader election, and the internal listener
// other replicas forward calls to (nil without SECRET_KEY: nothing can
// sign them).
type replica struct {
	members  *cluster.Membership
	owners   *cluster.Owners
	elector  *cluster.Elector
	internal net.Listener // nil: this replica takes no forwarded calls
	pool     *forward.Pool
	tls      *tlsfiles.Reloader // mutual TLS on the internal hop; nil: plaintext
	key      []byte
	older    [][]byte
	live     atomic.Int64 // live replicas, for the rate limits' shares
}

// joinCluster opens the internal listener and makes the cluster's parts;
// their jobs run with the rest.
func joinCluster(cfg config, db *store.DB, logger *slog.Logger) (*replica, error) {
	r := &replica{}
	r.live.Store(1)
	advertise := cfg.Cluster.InternalAdvertiseAddr
	keys, err := secret.DecodeKeys(cfg.SecretKey)
	if err != nil {
		return nil, err
	}
	if len(keys) > 0 {
		if r.tls, err = cfg.InternalTLS.load(logger); err != nil {
			return nil, err
		}
		if r.internal, err = net.Listen("tcp", cfg.Cluster.InternalAddr); err != nil {
			return nil, inUse(fmt.Errorf("listen on INTERNAL_ADDR %s: %w", cfg.Cluster.InternalAddr, err), "INTERNAL_ADDR (-internal-addr)")
		}
		if advertise == "" {
			advertise = r.internal.Addr().String()
		}
		r.key = forward.Key(keys[0])
		for _, k := range keys[1:] {
			r.older = append(r.older, forward.Key(k))
		}
		if r.pool, err = forward.NewPool(r.key, cfg.Cluster.ReplicaID,
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(cfg.GRPCMaxSendBytes+(1<<20)))); err != nil {
			r.internal.Close()
			return nil, err
		}
		cfg.InternalTLS.use(r.pool, r.tls)
	}
	ccfg := cluster.Config{ID: cfg.Cluster.ReplicaID, Addr: advertise, TTL: cfg.Cluster.ReplicaTTL, Logger: logger,
		Settings: settingsFingerprint(cfg, keys), SettingsKey: settingsKey}
	r.members = cluster.New(db, ccfg)
	r.members.OnChange(func(live []cluster.Member) { r.live.Store(int64(max(len(live), 1))) })
	r.owners = cluster.NewOwners(db, r.members, db.ActiveConnectorIDs)
	r.elector = cluster.NewElector(db, ccfg)
	return r, nil
}

// close leaves the cluster, if Run did not (serving failed after the
// replica registered), and closes the internal listener, if Serve did
// not, and the connections to other replicas.
func (r *replica) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = r.members.Leave(ctx)
	if r.internal != nil {
		_ = r.internal.Close()
	}
	if r.pool != nil {
		_ = r.pool.Close()
	}
}

// replicas is how many replicas are live (at least this one).
func (r *replica) replicas() int { return int(r.live.Load()) }

// notified passes a cluster notification to every part.
func (r *replica) notified(payload string) {
	r.members.Notified(payload)
	r.elector.Notified(payload)
	r.owners.Notified(payload)
}

// checkPeers refuses to join a cluster this replica cannot work in: its
// REPLICA_ID held by a live replica (two processes would own the same
// connectors), or replicas that cannot forward to each other (one without
// SECRET_KEY, or other SECRET_KEYs: each is asked to take a signed call).
func (r *replica) checkPeers(ctx context.Context, db *store.DB, self string, ttl time.Duration, logger *slog.Logger) error {
	live, err := r.sameIDGone(ctx, db, self, ttl, logger)
	if err != nil {
		return err
	}
	for _, p := range live {
		switch {
		case p.ID == self:
			return fmt.Errorf("REPLICA_ID %q is in use by a live replica (internal address %q): give each replica an id of its own, or leave REPLICA_ID empty to have one made up",
				self, p.InternalAddr)
		case r.pool == nil:
			return fmt.Errorf("replica %q is live on this database, and this one has no SECRET_KEY: replicas forward calls to each other, signed with it; set the same SECRET_KEY on every replica", p.ID)
		case p.InternalAddr == "":
			return fmt.Errorf("replica %q is live on this database without SECRET_KEY, so it cannot take forwarded calls: set the same SECRET_KEY on every replica", p.ID)
		}
		conn, err := r.pool.Conn(p.InternalAddr)
		if err != nil {
			return err
		}
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err = connectorv1.NewConnectorServiceClient(conn).ListSessions(pctx,
			&connectorv1.ListSessionsRequest{WorkspaceId: "-", ConnectorId: "-"})
		cancel()
		if status.Code(err) == codes.Unauthenticated {
			return fmt.Errorf("replica %q refuses this replica's signed calls: its SECRET_KEY differs; set the same SECRET_KEY on every replica (when rotating, the new key first on all of them, the old one after it)", p.ID)
		}
	}
	return nil
}

// sameIDGone returns the live replicas once none has id self: a process
// restarted in place (kill -9, same REPLICA_ID) waits for its last life's
// row to expire, at most a TTL and a heartbeat; one still live after that
// is another process with the same id.
func (r *replica) sameIDGone(ctx context.Context, db *store.DB, self string, ttl time.Duration, logger *slog.Logger) ([]store.Replica, error) {
	deadline := time.Now().Add(ttl + ttl/3)
	for said := false; ; said = true {
		live, err := db.LiveReplicas(ctx)
		if err != nil {
			return nil, fmt.Errorf("read the live replicas: %w", err)
		}
		if !slices.ContainsFunc(live, func(p store.Replica) bool { return p.ID == self }) || time.Now().After(deadline) {
			return live, nil
		}
		if !said {
			logger.WarnContext(ctx, "a live replica has this REPLICA_ID: waiting for it to expire (a process restarted in place), or fail",
				slog.String("replica_id", self))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// bracketIPv6 makes "fd00::5:50052", which "$(POD_IP):50052" gives on an
// IPv6 pod, the "[fd00::5]:50052" a dialer reads; anything else is left as
// it is.
func bracketIPv6(addr string) string {
	i := strings.LastIndex(addr, ":")
	if i < 0 || strings.HasPrefix(addr, "[") {
		return addr
	}
	host, port := addr[:i], addr[i+1:]
	if ip := net.ParseIP(host); ip != nil && ip.To4() == nil {
		return net.JoinHostPort(host, port)
	}
	return addr
}
