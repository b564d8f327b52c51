package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/authorizations"
	"github.com/connector-svc/connector-svc/internal/cluster"
	"github.com/connector-svc/connector-svc/internal/egress"
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

// parts is what serve builds, part by part and in order, before any of
// its jobs runs.
type parts struct {
	cfg    config
	db     *store.DB
	box    *secret.Box
	keys   *auth.Keys
	logger *slog.Logger
	obs    observability
	tp     trace.TracerProvider
	policy *egress.Policy

	lis, callbackLis net.Listener // callbackLis nil: no OAUTH_CALLBACK_ADDR
	rep              *replica
	oauth            *oauth.Manager
	late             *lateHooks
	reg              *registry.Registry
	sessions         *live.Sessions
	router           *live.Router
	lv               *live.Connectors
	agent            *orchestrator.Agent
	listener         *store.Listener
	srv              *server.Server
	leader           *leaderWork
	mcp              *mcpJob     // nil: no MCP_ADDR
	console          *consoleJob // nil: no CONSOLE_ADDR
}

// lateHooks are the registry's ways to parts made after it, since they
// need it: the sessions table, and the sampler (which needs the live
// connectors). serve sets both fields before any job runs; the registry
// calls the hooks only once it serves (its Run, or a call), so each is
// read after it was set, runJobs's go statements in between.
type lateHooks struct {
	sessions *live.Sessions
	sampler  *sampling.Sampler // nil without an LLM: servers' sampling requests are refused
}

func (h *lateHooks) opened(id int64, sid string, s registry.SessionHandle) {
	h.sessions.Opened(id, sid, s)
}
func (h *lateHooks) closed(id int64, sid string) { h.sessions.Closed(id, sid) }

func (h *lateHooks) sample(ctx context.Context, id int64, a ask.Asker, call ask.Call, req mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
	if h.sampler == nil {
		return nil, errors.New("sampling is not available: the service has no LLM configured (LLM_BASE_URL)")
	}
	return h.sampler.Sample(ctx, id, a, call, req)
}

// budget is a run's (or a direct call's) budget of its servers' sampling.
func (h *lateHooks) budget(c *store.Connector) *ask.Budget {
	if h.sampler == nil || !c.Config.SamplingOn() {
		return nil
	}
	return h.sampler.Budget(c.Config.Sampling)
}

// serve runs the registry and the gRPC server (with creds, its transport
// credentials, if any) until ctx is done, then drains gRPC, closes the MCP
// connections, stops the admin listener, and only then flushes the metrics
// and traces. Its parts record metrics on the meter provider of
// OTEL_METRICS_EXPORTER and spans on the tracer provider
// OTEL_TRACES_EXPORTER asks for; gRPC health and /readyz follow Postgres.
func serve(ctx context.Context, cfg config, db *store.DB, box *secret.Box, keys *auth.Keys, creds []grpc.ServerOption,
	logger *slog.Logger) error {
	tracing, err := telemetry.SetupTracing(ctx, cfg.Tracing)
	if err != nil {
		return err
	}
	defer flushTraces(ctx, tracing, cfg.ShutdownGrace, logger)
	obs, admin, err := newObservability(ctx, cfg, db, logger)
	if err != nil {
		return err
	}
	defer obs.flush(ctx, logger)
	defer admin.closeUnlessRun()
	s := &parts{cfg: cfg, db: db, box: box, keys: keys, logger: logger, obs: obs, tp: tracing.Provider,
		policy: egress.New(egress.Config{Allow: cfg.EgressAllow, Deny: cfg.EgressDeny}), late: &lateHooks{}}
	if err := s.listen(); err != nil {
		return err
	}
	defer s.lis.Close()
	if s.callbackLis != nil {
		defer s.callbackLis.Close()
	}
	if s.rep, err = joinCluster(cfg, db, logger); err != nil {
		return err
	}
	defer s.rep.close()
	if s.oauth, err = newOAuth(cfg.OAuth, db, box, s.policy, logger); err != nil {
		return err
	}
	if err := s.buildLive(); err != nil {
		return err
	}
	if err := s.join(ctx); err != nil {
		return err
	}
	s.listener = s.newListener()
	s.srv = server.New(s.deps(), s.serverConfig())
	// The MCP endpoint listens before "serving" is logged, as gRPC does.
	if s.mcp, err = s.newMCPJob(keys != nil && keys.Exist()); err != nil {
		return err
	}
	if s.console, err = s.newConsoleJob(); err != nil {
		return err
	}
	g, hs := server.NewGRPCServer(s.srv, append(connOptions(cfg.Conn, true), creds...)...)
	server.SetServing(hs, true)
	obs.ready.SetStarted(true)
	s.logServing(tracing.Exporter)
	sweeper := runs.NewSweeper(db, runSweepInterval, cfg.RunRetention, runStaleAfter, logger)
	s.leader = newLeaderWork(whileLeading(cfg.Cluster.ReplicaID, s.rep.leaderJobs(db, sweeper, cfg.SessionIdleTTL, logger), logger))
	s.rep.elector.OnLead(s.leader.onLead)
	return runJobs(ctx, s.stages(g, hs, admin), logger)
}

// listen binds the gRPC address and the OAuth callback's, first: a
// replica that cannot serve never joins the others.
func (s *parts) listen() error {
	var err error
	if s.lis, err = net.Listen("tcp", s.cfg.GRPCAddr); err != nil {
		return inUse(fmt.Errorf("listen on GRPC_ADDR %s: %w", s.cfg.GRPCAddr, err), "GRPC_ADDR (-grpc-addr)")
	}
	if s.cfg.OAuth.CallbackAddr == "" {
		return nil
	}
	if s.callbackLis, err = net.Listen("tcp", s.cfg.OAuth.CallbackAddr); err != nil {
		s.lis.Close()
		return inUse(fmt.Errorf("listen on OAUTH_CALLBACK_ADDR %s: %w", s.cfg.OAuth.CallbackAddr, err), "OAUTH_CALLBACK_ADDR (-oauth-callback-addr)")
	}
	return nil
}

// buildLive makes the registry and what keeps it in line with the rows:
// the sessions table, the router, the agent, the live connectors and the
// sampler.
func (s *parts) buildLive() error {
	cfg := s.cfg
	src := live.NewSource(s.db, s.box, s.logger)
	src.FenceWith(s.rep.owners.Fence) // only the owner syncs catalogs and writes health
	s.reg = registry.New(src, registry.Config{
		HealthInterval:           cfg.HealthInterval,
		Concurrency:              cfg.HealthConcurrency,
		SessionIdleTTL:           cfg.SessionIdleTTL,
		MaxSessions:              cfg.MaxSessions,
		MaxIdleConnsPerConnector: cfg.MaxIdleConns,
		MaxResultBytes:           cfg.MaxToolResultBytes,
		Egress:                   s.policy,
		MeterProvider:            s.obs.meters,
		TracerProvider:           s.tp,
		// Every replica's call counters reach the row within a second, so
		// GetConnector on any replica shows the same figures.
		UsageInterval: time.Second,
		// Every check's time reaches the row, so GetConnector on a replica
		// that does not own the connector shows a check no older than
		// HEALTH_INTERVAL (and the check's own time): one fenced write per
		// connector per interval, on its owner.
		HealthSaveInterval: cfg.HealthInterval / 2,
		// A per-session HTTP session outlives this replica, for another
		// to adopt; the sessions table says who holds which.
		DetachSessions:  true,
		OnSessionOpened: s.late.opened,
		OnSessionClosed: s.late.closed,
		Authorize:       authorizeHook(s.oauth),
		// What servers ask of a call: the user (through the call's
		// caller) and the connector's model.
		ElicitationTimeout: cfg.ElicitationTimeout,
		Sample:             s.late.sample,
	}, s.logger)
	s.sessions = live.NewSessions(s.db, s.reg, s.box, s.rep.members, s.rep.pool, cfg.MaxSessions, s.logger)
	s.late.sessions = s.sessions
	s.router = live.NewRouter(s.rep.owners, s.rep.pool, s.reg)
	router := s.router
	s.rep.members.OnChange(func([]cluster.Member) { router.Moved() })
	agent, model, embedder, err := newAgent(cfg, s.reg, s.obs.meters, s.tp, s.logger)
	if err != nil {
		return err
	}
	s.agent = agent
	lv := live.New(s.db, src, s.reg, live.Owned(s.rep.owners, s.logger), live.Config{Logger: s.logger, Embedder: embedder,
		EmbeddingModel: cfg.EmbeddingsModel, ReconcileInterval: cfg.Cluster.ReconcileInterval})
	s.lv = lv
	if model != nil {
		s.late.sampler = newSampler(cfg, model, lv, s.db, s.obs.meters, s.tp, s.logger)
	}
	s.rep.owners.OnGained(func(id, _ int64) { lv.Touch(id) })
	s.rep.owners.OnLostOwnership(lv.Touch)
	return nil
}

// join registers this replica and claims its share before loading: a
// connector is then connected at once in its role, a stdio one where it
// runs.
func (s *parts) join(ctx context.Context) error {
	cc := s.cfg.Cluster
	if err := s.rep.checkPeers(ctx, s.db, cc.ReplicaID, cc.ReplicaTTL, s.logger); err != nil {
		return err
	}
	if err := s.rep.members.Register(ctx); err != nil {
		return fmt.Errorf("join the replicas on the database: %w", err)
	}
	if err := s.rep.owners.Sync(ctx); err != nil {
		return fmt.Errorf("claim this replica's connectors: %w", err)
	}
	return s.lv.Load(ctx)
}

// newListener is the process's one LISTEN connection: connector changes
// made by any replica (or by SQL), and API key changes when keys are
// checked.
func (s *parts) newListener() *store.Listener {
	interval := listenInterval
	if s.cfg.Auth.Guarded() {
		interval = min(interval, s.keys.ConfirmInterval())
	}
	listener := s.db.NewListener(interval, s.logger).Named(s.cfg.Cluster.ReplicaID)
	listener.Handle(store.ConnectorChangesChannel, s.lv.Notified)
	rep, router := s.rep, s.router
	listener.Handle(store.ClusterChannel, func(payload string) {
		rep.notified(payload)
		router.Moved() // an owner released a connector: ask again
	})
	listener.OnListen(s.lv.Resync)
	listener.OnListen(func() { rep.notified("") })
	if s.cfg.Auth.Guarded() { // follow key changes: revocations, and the first key in auto mode
		s.keys.Follow(listener)
	}
	return listener
}

// deps are the parts the gRPC server uses.
func (s *parts) deps() server.Deps {
	deps := server.Deps{DB: s.db, Box: s.box, Registry: s.reg, Live: s.lv, Router: s.router, Sessions: s.sessions,
		Replicas: s.rep.replicas, Agent: s.agent, Keys: s.keys, Logger: s.logger, TracerProvider: s.tp, MeterProvider: s.obs.meters}
	if s.cfg.OAuth.RedirectURL != "" { // without it, no user can be sent to authorize
		deps.OAuth = authorizations.NewAuthorizer(s.oauth)
	}
	return deps
}

func (s *parts) serverConfig() server.Config {
	cfg := s.cfg
	return server.Config{
		StdioAllowedCommands:  cfg.StdioAllowedCommands,
		DefaultRPCTimeout:     cfg.RPCTimeout,
		QueryTimeout:          cfg.QueryTimeout,
		ApprovalTimeout:       cfg.ApprovalTimeout,
		ReplicaID:             cfg.Cluster.ReplicaID,
		MaxToolResultBytes:    cfg.MaxToolResultBytes,
		MaxToolArgumentsBytes: cfg.MaxToolArgumentsBytes,
		MaxRecvBytes:          cfg.GRPCMaxRecvBytes,
		MaxSendBytes:          cfg.GRPCMaxSendBytes,
		Egress:                s.policy,
		Auth:                  cfg.Auth,
		OAuthWindow:           cfg.OAuth.StateTTL,
		SamplingBudget:        s.late.budget,
	}
}

func (s *parts) logServing(tracesExporter string) {
	cfg := s.cfg
	s.logger.Info("serving", slog.String("addr", s.lis.Addr().String()), slog.String("replica_id", cfg.Cluster.ReplicaID),
		slog.String("internal_addr", s.rep.members.Config().Addr),
		slog.Bool("tls", cfg.TLSCertFile != ""), slog.Bool("client_certificates_required", cfg.TLSClientCAFile != ""),
		slog.Bool("secret_key_set", s.box != nil), slog.Any("stdio_allowed_commands", cfg.StdioAllowedCommands),
		slog.Any("egress_allow_cidrs", cfg.EgressAllow), slog.Any("egress_deny_cidrs", cfg.EgressDeny),
		slog.String("auth", string(cfg.Auth)), slog.String("traces_exporter", tracesExporter),
		slog.String("oauth_redirect_url", cfg.OAuth.RedirectURL), slog.String("oauth_callback_addr", callbackAddr(s.callbackLis)),
		slog.String("version", s.obs.build.Version), slog.String("revision", s.obs.build.revision()))
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
	acfg := orchestrator.Config{NarrowAbove: cfg.NarrowToolsAbove, NarrowTo: cfg.NarrowToolsTo, ResourceBudget: cfg.AgentResourceBudget,
		MeterProvider: meters, TracerProvider: tp}
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
