// Command connector-svc serves the connector.v1.ConnectorService gRPC API:
// persistent MCP connectors stored in Postgres.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/cluster"
	"github.com/connector-svc/connector-svc/internal/egress"
	"github.com/connector-svc/connector-svc/internal/forward"
	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/llm"
	"github.com/connector-svc/connector-svc/internal/oauth"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/runs"
	"github.com/connector-svc/connector-svc/internal/sampling"
	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/server"
	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/telemetry"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	var usage *usageError
	if errors.As(err, &usage) {
		fmt.Fprintf(os.Stderr, "connector-svc: %v\n\n%s", err, usage.usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "connector-svc: %v\n", err)
		os.Exit(1)
	}
}

// run is the whole program: main and the end-to-end tests call it. It
// returns when ctx is done (after a graceful stop) or on a start-up error.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	if dev := devCommand(args); dev != nil { // dev-model, dev-certs (devmodel.go): no service settings
		return dev(ctx, getenv, stdout)
	}
	cfg, rest, err := parseConfig(args, getenv, stdout)
	if err != nil {
		return err
	}
	command := rest[0]
	if cfg.Version {
		_, err := fmt.Fprintln(stdout, readBuild())
		return err
	}
	if command == "keys" {
		return runKeys(ctx, cfg, rest[1:], stdout)
	}
	if command == "healthcheck" {
		return healthcheck(ctx, cfg, stdout)
	}
	// Errors of MCP connections carry their URLs: the handler redacts query values.
	logger := slog.New(secret.NewRedactingHandler(slog.NewJSONHandler(stdout, &slog.HandlerOptions{Level: cfg.LogLevel})))
	// Libraries that take no logger log through slog's default (mcp-go's
	// stdio transport does): make it the service's.
	defer slog.SetDefault(slog.Default())
	slog.SetDefault(logger)

	// A bad SECRET_KEY fails before any database work.
	box, err := secret.ParseKey(cfg.SecretKey)
	if err != nil {
		return err
	}
	var creds []grpc.ServerOption
	if command == "serve" {
		if creds, err = serverCreds(cfg, logger); err != nil {
			return err
		}
	}
	db, err := openDB(ctx, cfg.DatabaseURL, logger)
	if err != nil {
		return err
	}
	defer db.Close()
	switch command {
	case "migrate":
		logger.InfoContext(ctx, "migrations applied")
		return nil
	case "reseal":
		return reseal(ctx, db, box, logger)
	case "oauth":
		return runOAuth(ctx, cfg, db, box, rest[1], stdout)
	}
	if err := checkSecretKey(ctx, db, box); err != nil {
		return fmt.Errorf("%w\n\n%s", err, devSecretsHint(cfg.DatabaseURL))
	}
	keys := auth.NewKeys(db, auth.Config{OnFirstKey: func() { logFirstKey(ctx, cfg.Auth, logger) }}, logger)
	if err := keys.Load(ctx); err != nil {
		return err
	}
	if err := checkAuth(ctx, cfg, keys.Exist(), logger); err != nil {
		return err
	}
	err = withAdmin(ctx, cfg, db, logger, func(ctx context.Context, obs observability) error {
		return serve(ctx, cfg, db, box, keys, creds, obs, logger)
	})
	if err != nil {
		return err
	}
	logger.Info("stopped")
	return nil
}

// logFirstKey says what the first API key, created while the service
// runs, changes for callers.
func logFirstKey(ctx context.Context, mode auth.Mode, logger *slog.Logger) {
	switch mode {
	case auth.ModeAuto:
		logger.InfoContext(ctx, "the first API key was created: API keys are now required (AUTH=auto); "+
			"calls without one fail with UNAUTHENTICATED", slog.String("auth", string(mode)))
	case auth.ModeKeys:
		logger.InfoContext(ctx, "the first API key was created: calls with it are now accepted (AUTH=keys)",
			slog.String("auth", string(mode)))
	default:
		logger.WarnContext(ctx, "an API key was created, but AUTH="+string(mode)+" asks callers for none; "+
			"restart with AUTH=auto or AUTH=keys to require keys", slog.String("auth", string(mode)))
	}
}

// openDB connects, creating the database if needed, and migrates. A
// refused connection says how to start Postgres; a malformed URL or a
// refused login says only what went wrong.
func openDB(ctx context.Context, url string, logger *slog.Logger) (*store.DB, error) {
	db, err := store.Open(ctx, url, logger)
	if err != nil && errors.Is(err, syscall.ECONNREFUSED) {
		return nil, fmt.Errorf("%w\n\nIs Postgres running, and is DATABASE_URL right? On a Debian machine start it with\n"+
			"  pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start\n"+
			"or point DATABASE_URL (or -database-url) at your server", err)
	}
	if err != nil {
		return nil, err
	}
	if err := db.Migrate(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// checkSecretKey fails start-up when stored secrets could not be used: no
// key, or a key that does not open them.
func checkSecretKey(ctx context.Context, db *store.DB, box *secret.Box) error {
	if err := oauth.CheckKey(ctx, db, box); err != nil {
		return fmt.Errorf("stored OAuth tokens: %w", err)
	}
	ws, id, sealed, err := db.AnySealedSecrets(ctx)
	if err != nil || sealed == nil {
		return err
	}
	if _, err := box.Open(sealed, live.SealContext(ws, id)); err != nil {
		if errors.Is(err, secret.ErrNoKey) {
			return fmt.Errorf("connector %q of workspace %q has encrypted headers or env values, but SECRET_KEY is not set; "+
				"set it to the key they were stored with", id, ws)
		}
		return fmt.Errorf("connector %q of workspace %q: %w", id, ws, err)
	}
	return nil
}

// devSecretsHint says how to get past stored secrets that do not open,
// in development: `make run` takes SECRET_KEY from .dev/secret_key.
func devSecretsHint(databaseURL string) string {
	name := "connector_svc"
	if u, err := url.Parse(databaseURL); err == nil && strings.Trim(u.Path, "/") != "" {
		name = strings.Trim(u.Path, "/")
	}
	return "In development (make run), SECRET_KEY comes from .dev/secret_key: restore that file (or set SECRET_KEY to the key\n" +
		"the secrets were sealed with), or start afresh by dropping the development database, which deletes its\n" +
		"connectors and keys:\n" +
		"  psql -h 127.0.0.1 -U postgres -c 'DROP DATABASE " + name + "'"
}

// reseal seals every stored secret again under the first SECRET_KEY, so
// that the keys after it can be retired.
func reseal(ctx context.Context, db *store.DB, box *secret.Box, logger *slog.Logger) error {
	if box == nil {
		return errors.New("reseal needs SECRET_KEY: the new key first, then the old ones (SECRET_KEY=new,old)")
	}
	n, err := db.ResealSecrets(ctx, func(ws, id string, sealed []byte) ([]byte, error) {
		resealed, err := box.Reseal(sealed, live.SealContext(ws, id))
		if err != nil {
			return nil, fmt.Errorf("connector %q of workspace %q: %w", id, ws, err)
		}
		return resealed, nil
	})
	if err != nil {
		return fmt.Errorf("reseal: %w; nothing was changed", err)
	}
	tokens, err := oauth.Reseal(ctx, db, box)
	if err != nil {
		return fmt.Errorf("reseal OAuth tokens and clients: %w; the connectors' secrets were resealed, run reseal again", err)
	}
	logger.InfoContext(ctx, "secrets resealed under the first SECRET_KEY", slog.Int("connectors", n), slog.Int("oauth_values", tokens))
	return nil
}

// serve runs the registry and the gRPC server (with creds, its transport
// credentials, if any) until ctx is done, then drains gRPC, closes the MCP
// connections and only then flushes the traces. Its parts record metrics on
// obs.meters and spans on the tracer provider OTEL_TRACES_EXPORTER asks
// for; gRPC health and obs.ready follow Postgres.
func serve(ctx context.Context, cfg config, db *store.DB, box *secret.Box, keys *auth.Keys, creds []grpc.ServerOption,
	obs observability, logger *slog.Logger) error {
	tracing, err := telemetry.SetupTracing(ctx, cfg.Tracing)
	if err != nil {
		return err
	}
	defer flushTraces(ctx, tracing, cfg.ShutdownGrace, logger)
	tp := tracing.Provider
	policy := egress.New(egress.Config{Allow: cfg.EgressAllow, Deny: cfg.EgressDeny})
	// Listen first: a replica that cannot serve never joins the others.
	lis, err := net.Listen("tcp", cfg.GRPCAddr)
	if err != nil {
		return inUse(fmt.Errorf("listen on GRPC_ADDR %s: %w", cfg.GRPCAddr, err), "GRPC_ADDR (-grpc-addr)")
	}
	defer lis.Close()
	var callbackLis net.Listener
	if cfg.OAuth.CallbackAddr != "" {
		if callbackLis, err = net.Listen("tcp", cfg.OAuth.CallbackAddr); err != nil {
			return inUse(fmt.Errorf("listen on OAUTH_CALLBACK_ADDR %s: %w", cfg.OAuth.CallbackAddr, err), "OAUTH_CALLBACK_ADDR (-oauth-callback-addr)")
		}
		defer callbackLis.Close()
	}
	rep, err := joinCluster(cfg, db, logger)
	if err != nil {
		return err
	}
	defer rep.close()
	oauthMgr, err := newOAuth(cfg.OAuth, db, box, policy, logger)
	if err != nil {
		return err
	}
	src := live.NewSource(db, box, logger)
	src.FenceWith(rep.owners.Fence) // only the owner syncs catalogs and writes health
	var sessions *live.Sessions     // set below; the registry's hooks run once it serves
	var sampler *sampling.Sampler   // nil without an LLM: servers' sampling requests are refused
	var lv *live.Connectors
	reg := registry.New(src, registry.Config{
		HealthInterval:           cfg.HealthInterval,
		Concurrency:              cfg.HealthConcurrency,
		SessionIdleTTL:           cfg.SessionIdleTTL,
		MaxSessions:              cfg.MaxSessions,
		MaxIdleConnsPerConnector: cfg.MaxIdleConns,
		MaxResultBytes:           cfg.MaxToolResultBytes,
		Egress:                   policy,
		MeterProvider:            obs.meters,
		TracerProvider:           tp,
		// Every replica's call counters reach the row within a second, so
		// GetConnector on any replica shows the same figures.
		UsageInterval: time.Second,
		// A per-session HTTP session outlives this replica, for another
		// to adopt; the sessions table says who holds which.
		DetachSessions:  true,
		OnSessionOpened: func(id int64, sid string, h registry.SessionHandle) { sessions.Opened(id, sid, h) },
		OnSessionClosed: func(id int64, sid string) { sessions.Closed(id, sid) },
		Authorize:       authorizeHook(oauthMgr),
		// What servers ask of a call: the user (through the call's
		// caller) and the connector's model.
		ElicitationTimeout: cfg.ElicitationTimeout,
		Sample: func(ctx context.Context, id int64, a ask.Asker, call ask.Call, req mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			if sampler == nil {
				return nil, errors.New("sampling is not available: the service has no LLM configured (LLM_BASE_URL)")
			}
			return sampler.Sample(ctx, id, a, call, req)
		},
	}, logger)
	sessions = live.NewSessions(db, reg, box, rep.members, rep.pool, cfg.MaxSessions, logger)
	router := live.NewRouter(rep.owners, rep.pool, reg)
	rep.members.OnChange(func([]cluster.Member) { router.Moved() })
	agent, model, embedder, err := newAgent(cfg, reg, obs.meters, tp, logger)
	if err != nil {
		return err
	}
	lv = live.New(db, src, reg, live.Owned(rep.owners, logger), live.Config{Logger: logger, Embedder: embedder, EmbeddingModel: cfg.EmbeddingsModel,
		ReconcileInterval: cfg.Cluster.ReconcileInterval})
	if model != nil {
		sampler = newSampler(cfg, model, lv, db, obs.meters, tp, logger)
	}
	rep.owners.OnGained(func(id, _ int64) { lv.Touch(id) })
	rep.owners.OnLostOwnership(lv.Touch)
	// Join, and claim this replica's share, before loading: a connector
	// is then connected at once in its role, a stdio one where it runs.
	if err := rep.checkPeers(ctx, db, cfg.Cluster.ReplicaID, cfg.Cluster.ReplicaTTL, logger); err != nil {
		return err
	}
	if err := rep.members.Register(ctx); err != nil {
		return fmt.Errorf("join the replicas on the database: %w", err)
	}
	if err := rep.owners.Sync(ctx); err != nil {
		return fmt.Errorf("claim this replica's connectors: %w", err)
	}
	if err := lv.Load(ctx); err != nil {
		return err
	}
	// The process's one LISTEN connection: connector changes made by any
	// replica (or by SQL), and API key changes when keys are checked.
	interval := listenInterval
	if cfg.Auth.Guarded() {
		interval = min(interval, keys.ConfirmInterval())
	}
	listener := db.NewListener(interval, logger).Named(cfg.Cluster.ReplicaID)
	listener.Handle(store.ConnectorChangesChannel, lv.Notified)
	listener.Handle(store.ClusterChannel, func(payload string) {
		rep.notified(payload)
		router.Moved() // an owner released a connector: ask again
	})
	listener.OnListen(lv.Resync)
	listener.OnListen(func() { rep.notified("") })
	if cfg.Auth.Guarded() { // follow key changes: revocations, and the first key in auto mode
		keys.Follow(listener)
	}
	deps := server.Deps{DB: db, Box: box, Registry: reg, Live: lv, Router: router, Sessions: sessions,
		Replicas: rep.replicas, Agent: agent, Keys: keys, Logger: logger, TracerProvider: tp, MeterProvider: obs.meters}
	if cfg.OAuth.RedirectURL != "" { // without it, no user can be sent to authorize
		deps.OAuth = server.NewAuthorizer(oauthMgr)
	}
	srv := server.New(deps, server.Config{
		StdioAllowedCommands:  cfg.StdioAllowedCommands,
		DefaultRPCTimeout:     cfg.RPCTimeout,
		QueryTimeout:          cfg.QueryTimeout,
		ApprovalTimeout:       cfg.ApprovalTimeout,
		ReplicaID:             cfg.Cluster.ReplicaID,
		MaxToolResultBytes:    cfg.MaxToolResultBytes,
		MaxToolArgumentsBytes: cfg.MaxToolArgumentsBytes,
		MaxRecvBytes:          cfg.GRPCMaxRecvBytes,
		MaxSendBytes:          cfg.GRPCMaxSendBytes,
		Egress:                policy,
		Auth:                  cfg.Auth,
		OAuthWindow:           cfg.OAuth.StateTTL,
		// A run's (or a direct call's) budget of its servers' sampling.
		SamplingBudget: func(c *store.Connector) *ask.Budget {
			if sampler == nil || !c.Config.SamplingOn() {
				return nil
			}
			return sampler.Budget(c.Config.Sampling)
		},
	})
	g, hs := server.NewGRPCServer(srv, append(connOptions(cfg.Conn, true), creds...)...)
	server.SetServing(hs, true)
	obs.ready.SetStarted(true)
	logger.InfoContext(ctx, "serving", slog.String("addr", lis.Addr().String()), slog.String("replica_id", cfg.Cluster.ReplicaID),
		slog.String("internal_addr", rep.members.Config().Addr),
		slog.Bool("tls", cfg.TLSCertFile != ""), slog.Bool("client_certificates_required", cfg.TLSClientCAFile != ""),
		slog.Bool("secret_key_set", box != nil), slog.Any("stdio_allowed_commands", cfg.StdioAllowedCommands),
		slog.Any("egress_allow_cidrs", cfg.EgressAllow), slog.Any("egress_deny_cidrs", cfg.EgressDeny),
		slog.String("auth", string(cfg.Auth)), slog.String("traces_exporter", tracing.Exporter),
		slog.String("oauth_redirect_url", cfg.OAuth.RedirectURL), slog.String("oauth_callback_addr", callbackAddr(callbackLis)),
		slog.String("version", obs.build.Version), slog.String("revision", obs.build.revision()))

	sweeper := runs.NewSweeper(db, runSweepInterval, cfg.RunRetention, runStaleAfter, logger)
	rep.elector.OnLead(rep.housekeeping(db, sweeper, cfg.SessionIdleTTL, logger))
	serving := []job{
		{"grpc", func(ctx context.Context) error {
			drained := make(chan struct{})
			go func() {
				defer close(drained)
				<-ctx.Done()
				obs.ready.SetStarted(false)
				hs.Shutdown() // NOT_SERVING from now on, whatever the watcher says
				logger.Info("shutting down", slog.String("delay", cfg.Conn.ShutdownDelay.String()),
					slog.String("grace", cfg.ShutdownGrace.String()))
				// Balancers that read health or /readyz stop sending
				// calls meanwhile; those still sent are served.
				time.Sleep(cfg.Conn.ShutdownDelay)
				stopGracefully(g, cfg.ShutdownGrace)
			}()
			if err := g.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				return err
			}
			<-drained // Serve returns when the drain starts
			return nil
		}},
		{"readiness", func(ctx context.Context) error {
			return obs.ready.Watch(ctx, func(up bool) { server.SetServing(hs, up) })
		}},
		{"listener", listener.Run},
		{"reconcile", lv.Run},
		{"membership", rep.members.Run},
		{"ownership", rep.owners.Run},
		{"leader election", rep.elector.Run},
	}
	if callbackLis != nil {
		cb := newCallbackServer(cfg.OAuth, oauthMgr, logger)
		serving = append(serving, job{"oauth callback", func(ctx context.Context) error {
			return serveCallback(ctx, cfg.OAuth, callbackLis, cb, logger)
		}})
	}
	if rep.internal != nil {
		internal := server.NewInternalGRPCServer(srv, append(connOptions(cfg.Conn, false),
			forward.ServerOptions(rep.key, forward.DefaultSkew, rep.older...)...)...)
		serving = append(serving, job{"internal listener", func(ctx context.Context) error {
			drained := make(chan struct{})
			go func() {
				defer close(drained)
				<-ctx.Done()
				stopGracefully(internal, cfg.ShutdownGrace)
			}()
			if err := internal.Serve(rep.internal); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				return err
			}
			<-drained
			return nil
		}})
	}
	// The registry stops once the runs still going on here without their
	// callers have failed: their tool calls' connections close with it.
	regCtx, stopRegistry := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRegistry()
	drained := []job{
		{"registry", func(ctx context.Context) error {
			go func() {
				<-ctx.Done()
				srv.StopLiveRuns(cfg.ShutdownGrace)
				stopRegistry()
			}()
			return reg.Run(regCtx)
		}},
		{"counters and run records", func(ctx context.Context) error { return srv.Run(ctx, cfg.ShutdownGrace) }},
	}
	return runJobs(ctx, serving, drained, logger)
}

// runSweepInterval is how often the leader expires paused runs, fails
// runs whose replica stopped and purges old runs; runStaleAfter, how old a
// resumed run's heartbeat may be before it counts as abandoned (its holder
// touches it every 10 s). A run whose replica died fails within 40 s.
const (
	runSweepInterval = 10 * time.Second
	runStaleAfter    = 30 * time.Second
)

// listenInterval is how often the listening connection makes a round trip
// when no API key cache needs it more often: a dead connection is noticed
// within it.
const listenInterval = 5 * time.Second

// inUse says what a listen that failed with "address already in use"
// most likely means; setting is where to give another address.
func inUse(err error, setting string) error {
	if !errors.Is(err, syscall.EADDRINUSE) {
		return err
	}
	return fmt.Errorf("%w: another connector-svc is probably running there; stop it, or set %s to a free address", err, setting)
}

// newAgent returns the connector agent, or nil when no LLM is configured:
// then the query RPCs refuse and everything else works. With an
// embeddings model, it also returns the embedder the agent ranks tools
// with.
func newAgent(cfg config, reg *registry.Registry, meters metric.MeterProvider, tp trace.TracerProvider,
	logger *slog.Logger) (*orchestrator.Agent, *llm.Client, orchestrator.Embedder, error) {
	model, err := llm.New(llm.Config{BaseURL: cfg.LLMBaseURL, APIKey: cfg.LLMAPIKey, Model: cfg.LLMModel,
		EmbeddingModel: cfg.EmbeddingsModel, MeterProvider: meters})
	if errors.Is(err, llm.ErrNotConfigured) {
		logger.Info("no LLM configured: QueryConnector and StreamQueryConnector are disabled, and servers' sampling requests " +
			"are refused; set LLM_BASE_URL and LLM_MODEL")
		return nil, nil, nil, nil
	}
	if err != nil {
		return nil, nil, nil, err
	}
	logger.Info("LLM configured", slog.String("base_url", secret.RedactText(cfg.LLMBaseURL)), slog.String("model", cfg.LLMModel),
		slog.String("embeddings_model", cfg.EmbeddingsModel), slog.Bool("api_key_set", cfg.LLMAPIKey != ""))
	acfg := orchestrator.Config{NarrowAbove: cfg.NarrowToolsAbove, NarrowTo: cfg.NarrowToolsTo, MeterProvider: meters, TracerProvider: tp}
	if cfg.EmbeddingsModel != "" {
		acfg.Embedder = model
	}
	return orchestrator.New(model, server.ToolCaller{Registry: reg}, acfg, logger), model, acfg.Embedder, nil
}

// newSampler answers servers' sampling requests with each connector's
// model (or LLM_MODEL), within the connector's budgets, those it leaves
// unset being the service's.
func newSampler(cfg config, model *llm.Client, lv *live.Connectors, db *store.DB, meters metric.MeterProvider,
	tp trace.TracerProvider, logger *slog.Logger) *sampling.Sampler {
	return sampling.New(sampling.Config{
		Chat:  model.Chat,
		Model: cfg.LLMModel,
		Connector: func(id int64) (sampling.Target, bool) {
			row, ok := lv.Row(id)
			if !ok {
				return sampling.Target{}, false
			}
			return sampling.Target{Workspace: row.WorkspaceID, Name: row.ExternalID, Model: row.Config.Model,
				Sampling: row.Config.Sampling}, true
		},
		Minutes:        db,
		Defaults:       sampling.Limits(cfg.AskBack.Sampling),
		MeterProvider:  meters,
		TracerProvider: tp,
		Logger:         logger,
	})
}

// flushTraces exports the spans still buffered, within grace.
func flushTraces(ctx context.Context, tracing *telemetry.Tracing, grace time.Duration, logger *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	if err := tracing.Shutdown(ctx); err != nil {
		logger.Warn("traces not flushed", slog.String("error", err.Error()))
	}
}

// connOptions is the connection policy of a gRPC server: keepalive pings
// of silent connections, tolerance of clients' pings, and, on the public
// server, the connection age that makes clients resolve again. Replicas
// reach each other's internal listener at fixed addresses, so there a
// connection has no age.
func connOptions(c connConfig, public bool) []grpc.ServerOption {
	params := keepalive.ServerParameters{Time: c.KeepaliveTime, Timeout: c.KeepaliveTimeout}
	if public {
		params.MaxConnectionAge, params.MaxConnectionAgeGrace = c.MaxAge, c.MaxAgeGrace
	}
	return []grpc.ServerOption{
		grpc.KeepaliveParams(params),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: keepaliveMinTime, PermitWithoutStream: true}),
	}
}

// stopGracefully lets in-flight RPCs finish within grace, then cuts the rest.
func stopGracefully(g *grpc.Server, grace time.Duration) {
	done := make(chan struct{})
	go func() {
		g.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(grace):
		g.Stop()
		<-done
	}
}
