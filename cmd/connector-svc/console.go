package main

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/console"
	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/server"
	"github.com/connector-svc/connector-svc/internal/store"
)

// consoleConfig is the web console's listener (CONSOLE_ADDR; off by
// default).
type consoleConfig struct {
	Addr       string
	SessionTTL time.Duration
}

func consoleFlags(fs *flag.FlagSet, cfg *consoleConfig) {
	fs.StringVar(&cfg.Addr, "console-addr", "",
		"address to serve the web console on; empty is off. A non-loopback address needs TLS_CERT_FILE (CONSOLE_ADDR)")
	fs.DurationVar(&cfg.SessionTTL, "console-session-ttl", 12*time.Hour, "how long a sign-in to the console lasts (CONSOLE_SESSION_TTL)")
}

// read checks the console's settings: its cookies carry API keys, so it
// stays on loopback unless the traffic is encrypted.
func (c *consoleConfig) read(cfg config) error {
	if c.SessionTTL < time.Second {
		return fmt.Errorf("CONSOLE_SESSION_TTL %s: want 1s or more", c.SessionTTL)
	}
	if c.Addr == "" {
		return nil
	}
	loopback, err := isLoopback(c.Addr)
	if err != nil {
		return fmt.Errorf("CONSOLE_ADDR %s: %w", c.Addr, err)
	}
	if !loopback && cfg.TLSCertFile == "" {
		return fmt.Errorf("refusing CONSOLE_ADDR %s, which is not a loopback address, without TLS (TLS_CERT_FILE, TLS_KEY_FILE): "+
			"serve it on 127.0.0.1, or set both", c.Addr)
	}
	return nil
}

// consoleJob is the console's listener, its handler, and the in-process
// gRPC server its pages call with the signed-in key: the API's own
// handlers and interceptors (the key and scope guard among them), over a
// pipe rather than a port.
type consoleJob struct {
	lis    net.Listener
	srv    *http.Server
	grpc   *grpc.Server
	pipe   *bufconn.Listener
	conn   *grpc.ClientConn
	stop   context.CancelFunc
	logger *slog.Logger
	grace  time.Duration
}

// newConsoleJob binds CONSOLE_ADDR; nil without it.
func (s *parts) newConsoleJob() (*consoleJob, error) {
	cfg := s.cfg
	if cfg.Console.Addr == "" {
		return nil, nil
	}
	cookieKey, err := consoleCookieKey(cfg.SecretKey)
	if err != nil {
		return nil, err
	}
	if cookieKey == nil {
		cookieKey = make([]byte, 32)
		_, _ = rand.Read(cookieKey)
		s.logger.Warn("console: no SECRET_KEY, so its sign-ins are sealed with a key of this process: they end when it stops, " +
			"and another replica does not accept them")
	}
	var cluster console.Cluster // nil: no replica set (no SECRET_KEY)
	if s.rep.key != nil {
		cluster = consoleCluster{db: s.db, self: cfg.Cluster.ReplicaID}
	}
	j := &consoleJob{logger: s.logger, grace: cfg.ShutdownGrace, pipe: bufconn.Listen(1 << 20)}
	j.grpc, _ = server.NewGRPCServer(s.srv, connOptions(cfg.Conn, false)...)
	j.conn, err = grpc.NewClient("passthrough:///console", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return j.pipe.DialContext(ctx) }),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(cfg.GRPCMaxSendBytes+(1<<20))))
	if err != nil {
		return nil, err
	}
	h, err := console.New(console.Deps{API: connectorv1.NewConnectorServiceClient(j.conn), Keys: s.keys,
		Cluster: cluster, Logger: s.logger},
		console.Config{CookieKey: cookieKey, SessionTTL: cfg.Console.SessionTTL, ScopeOf: server.ScopeOf, Version: readBuild().Version})
	if err != nil {
		j.conn.Close()
		return nil, err
	}
	if j.lis, err = listenHTTP(cfg, cfg.Console.Addr, "CONSOLE_ADDR", "-console-addr", s.logger); err != nil {
		j.conn.Close()
		return nil, err
	}
	// Live lists (server-sent events) end when the console stops, so that
	// the drain does not wait for them.
	base, stop := context.WithCancel(context.Background())
	j.stop = stop
	j.srv = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		BaseContext: func(net.Listener) context.Context { return base },
		ErrorLog:    slog.NewLogLogger(s.logger.Handler(), slog.LevelWarn)}
	s.logger.Info("console serving", slog.String("addr", j.lis.Addr().String()), slog.Bool("tls", cfg.TLSCertFile != ""))
	return j, nil
}

// consoleCookieKey derives the console's cookie key from SECRET_KEY's
// first key, the same on every replica; nil without SECRET_KEY.
func consoleCookieKey(secretKey string) ([]byte, error) {
	keys, err := secret.DecodeKeys(secretKey)
	if err != nil || len(keys) == 0 {
		return nil, err
	}
	m := hmac.New(sha256.New, keys[0])
	m.Write([]byte("connector-svc console cookies"))
	return m.Sum(nil), nil
}

// run serves until ctx ends, then drains for the shutdown grace: the
// pages first (their live lists end at once), then the in-process API.
func (j *consoleJob) run(ctx context.Context) error {
	go func() {
		if err := j.grpc.Serve(j.pipe); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			j.logger.Error("console: the in-process API stopped", slog.String("error", err.Error()))
		}
	}()
	err := serveHTTP(ctx, "console", j.srv, j.lis, j.grace, j.logger, j.stop)
	j.stop()
	stopGracefully(j.grpc, j.grace)
	j.conn.Close()
	return err
}

// consoleCluster reads the replica set for the console's pages.
type consoleCluster struct {
	db   *store.DB
	self string
}

func (c consoleCluster) Replicas(ctx context.Context, workspace string) (console.Replicas, error) {
	out := console.Replicas{Self: c.self}
	live, err := c.db.LiveReplicas(ctx)
	if err != nil {
		return out, err
	}
	for _, r := range live {
		out.Live = append(out.Live, console.Replica{ID: r.ID, InternalAddr: r.InternalAddr, StartedAt: r.StartedAt, HeartbeatAt: r.HeartbeatAt})
	}
	if l, err := c.db.CurrentLeader(ctx); err == nil && l.ExpiresAt.After(time.Now()) {
		out.Leader, out.LeaderUntil = l.ID, l.ExpiresAt
	} else if err != nil && !errors.Is(err, store.ErrNotFound) {
		return out, err
	}
	out.Owners, err = c.db.WorkspaceOwners(ctx, workspace)
	return out, err
}
