// Package server is the gRPC adapter of connector-svc: each handler
// validates its request, calls one use case, and converts between the
// connector.v1 API and the use case's types; every error becomes a gRPC
// status in one table (errors.go). The middleware every RPC passes (the
// log line, trace context, panic recovery, deadlines) is rpcmw's, set up
// here. Besides the binary's main package, it is the only package that
// imports gen/.
package server

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/authorizations"
	"github.com/connector-svc/connector-svc/internal/calls"
	"github.com/connector-svc/connector-svc/internal/connectors"
	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/pending"
	"github.com/connector-svc/connector-svc/internal/queries"
	"github.com/connector-svc/connector-svc/internal/ratelimit"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/resources"
	"github.com/connector-svc/connector-svc/internal/rpcmw"
	"github.com/connector-svc/connector-svc/internal/runs"
	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/sessions"
	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/watches"
)

var _ connectorv1.ConnectorServiceServer = (*Server)(nil)

// Server implements connector.v1.ConnectorService. Safe for concurrent use.
type Server struct {
	connectorv1.UnimplementedConnectorServiceServer

	db   *store.DB
	box  *secret.Box
	reg  *registry.Registry
	keys *auth.Keys
	// live keeps the connectors' connections, catalogs and agents in line
	// with their rows: every handler that writes a row calls it after.
	live *live.Connectors
	// place says where a call runs: here, or on the replica it is
	// forwarded to.
	place    *live.Placer
	sessions *live.Sessions // nil: sessions are this replica's alone
	limits   calls.Limits
	// authz runs users' OAuth authorizations.
	authz  *authorizations.Service
	counts *runs.Counters // calls' and queries' counters on their way to the store
	runs   *runs.Log      // query run records on their way to the store
	// asks are the servers' questions that wait here for an answer, of
	// query runs and direct calls alike.
	asks *pending.Table
	// calls runs direct tool calls.
	calls *calls.Service
	// resources serves connectors' resources, prompts and completions.
	resources *resources.Service
	// watches holds the watches of connectors' resources served here.
	watches *watches.Hub
	// sessionsUC lists and closes callers' sessions on every replica.
	sessionsUC *sessions.Service
	// queries runs queries and resumes them.
	queries *queries.Service
	// connectors writes connectors and applies them.
	connectors *connectors.Service
	cfg        Config
	logger     *slog.Logger
	// mw is the gRPC middleware's configuration, the guard aside.
	mw rpcmw.Config
}

// Deps are the Server's collaborators.
type Deps struct {
	DB *store.DB
	// Box seals connector secrets; nil means no SECRET_KEY, and connectors
	// with headers or env values are refused.
	Box *secret.Box
	// Registry holds the live MCP connections; the caller runs it.
	Registry *registry.Registry
	// Live keeps the connectors' live copies in line with their rows; the
	// caller loads and runs it.
	Live *live.Connectors
	// Router sends the calls another replica must serve there (stdio
	// connectors' calls to their owner); nil serves every call here.
	Router *live.Router
	// Sessions routes a per-session connector's calls to the replica that
	// holds the caller's session; nil keeps every session here.
	Sessions *live.Sessions
	// Agent answers queries; nil means no LLM is configured, and only the
	// query RPCs refuse (FAILED_PRECONDITION).
	Agent *orchestrator.Agent
	// Keys are the API keys; nil means none, and auth stays off whatever
	// Config.Auth says.
	Keys *auth.Keys
	// OAuth runs the authorizations of OAuth connectors' users
	// (ManagerAuthorizer over the oauth.Manager whose Transport the
	// registry's Config.Authorize uses); nil: OAuth is not configured, and
	// the authorization RPCs say so.
	OAuth  Authorizer
	Logger *slog.Logger
	// TracerProvider makes the RPCs' server spans; nil means otel's global
	// one. A caller's W3C trace context (otel's global propagator) is
	// continued.
	TracerProvider trace.TracerProvider
	// MeterProvider records the RPCs' metrics (otelgrpc's
	// rpc.server.call.duration, by method and status code, refused calls
	// included); nil records none.
	MeterProvider metric.MeterProvider
	// Replicas is the number of live replicas, among which each
	// connector's rate_limit is shared (ratelimit.Config.Replicas); nil
	// means this one alone.
	Replicas func() int
}

// New returns a Server.
func New(d Deps, cfg Config) *Server {
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	cfg = cfg.withDefaults()
	limits := ratelimit.Config{Replicas: d.Replicas, Logger: d.Logger}
	if d.DB != nil {
		limits.Exact = d.DB
	}
	s := &Server{db: d.DB, box: d.Box, reg: d.Registry, live: d.Live,
		place: live.NewPlacer(d.Live, d.Router, d.Sessions, d.DB, checkCaller), sessions: d.Sessions, keys: d.Keys,
		limits: calls.Limits{Limiter: ratelimit.New(limits)}, counts: runs.NewCounters(d.DB, countsInterval, d.MeterProvider, d.Logger),
		runs: runs.NewLog(d.DB, runs.Config{Replica: cfg.ReplicaID, FlushInterval: cfg.RunFlushInterval, Logger: d.Logger}),
		asks: &pending.Table{},
		cfg:  cfg, logger: d.Logger, mw: middleware(d, cfg)}
	s.connectors = connectors.New(connectors.Deps{Store: d.DB, Live: d.Live, Box: d.Box, Egress: cfg.Egress,
		AllowedCommands: cfg.StdioAllowedCommands, Revoker: revoker(d.OAuth), Logger: d.Logger})
	s.sessionsUC = sessions.New(sessions.Deps{Registry: d.Registry, Live: d.Live, Store: d.DB, Claims: d.Sessions,
		Peers: s.peers, Forget: forgetter(d.OAuth), Logger: d.Logger})
	s.authz = authorizations.New(authorizations.Deps{OAuth: d.OAuth, Connectors: d.DB, Box: d.Box, Sessions: s.sessionsUC,
		Window: cfg.OAuthWindow, Logger: d.Logger})
	s.calls = calls.New(calls.Deps{Registry: d.Registry, Live: d.Live, Store: d.DB, Limits: s.limits, Counters: s.counts,
		Asks: s.asks, Placer: s.place, MaxArgumentsBytes: cfg.MaxToolArgumentsBytes, MaxResultBytes: cfg.MaxToolResultBytes,
		SamplingBudget: cfg.SamplingBudget})
	s.resources = resources.New(resources.Deps{Registry: d.Registry, Calls: s.calls, MaxResultBytes: cfg.MaxToolResultBytes})
	s.watches = watches.New(d.Registry, d.Logger)
	if d.Registry != nil {
		d.Registry.OnResourceEvent(s.watches.Notify)
	}
	s.queries = queries.New(queries.Deps{Agent: d.Agent, Registry: d.Registry, Live: d.Live, Connectors: s.calls, Runs: d.DB,
		Log: s.runs, Counters: s.counts, Limits: s.limits, Asks: s.asks, Placer: s.place, Authorizations: s.authz,
		SamplingBudget: cfg.SamplingBudget, ErrorMessage: s.runErrorMessage,
		QueryTimeout: cfg.QueryTimeout, ApprovalTimeout: cfg.ApprovalTimeout, Logger: d.Logger})
	return s
}

// StopLiveRuns fails the query runs still going on here once the gRPC
// server has drained (queries.Service.StopLiveRuns), within grace.
func (s *Server) StopLiveRuns(grace time.Duration) { s.queries.StopLiveRuns(grace) }

// countsInterval is how often query counters are written to the store.
const countsInterval = time.Second

// Run writes the queries' counters and run records in the background
// until ctx is done, and then what is left, within grace. Stop it once the
// gRPC server has stopped: the Server serves no query after.
func (s *Server) Run(ctx context.Context, grace time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- s.runs.Run(ctx) }()
	err := s.counts.Run(ctx, grace)
	return errors.Join(err, <-done)
}

// UseCases are the use cases a Server's handlers call, for another front
// door (the MCP endpoint) to call the same instances: the same pending
// questions, limits, counters and run records.
type UseCases struct {
	Calls          *calls.Service
	Resources      *resources.Service
	Watches        *watches.Hub
	Queries        *queries.Service
	Placer         *live.Placer
	Sessions       *sessions.Service
	Authorizations *authorizations.Service
}

// UseCases returns the Server's use cases.
func (s *Server) UseCases() UseCases {
	return UseCases{Calls: s.calls, Resources: s.resources, Watches: s.watches, Queries: s.queries, Placer: s.place, Sessions: s.sessionsUC, Authorizations: s.authz}
}

// NewGRPCServer returns a grpc.Server serving s, the standard health service
// (reported SERVING by the caller once ready) and server reflection, with
// the service's middleware (rpcmw.ServerOptions: spans, metrics, panic
// recovery, the API key guard when auth is on, the RPC log line, default
// deadlines) and message size limits. opts come after the service's own,
// for transport credentials (TLS).
func NewGRPCServer(s *Server, opts ...grpc.ServerOption) (*grpc.Server, *health.Server) {
	g := grpc.NewServer(append(s.serverOptions(true), opts...)...)
	connectorv1.RegisterConnectorServiceServer(g, s)
	hs := health.NewServer()
	SetServing(hs, false)
	healthpb.RegisterHealthServer(g, hs)
	reflection.Register(g)
	return g, hs
}

// NewInternalGRPCServer returns the grpc.Server of the internal listener,
// where other replicas forward the calls this one serves: s with the
// service's interceptors but no API key guard (the caller's key was
// checked by the replica it called), no health or reflection. opts must
// authenticate the replicas (forward.ServerOptions): nothing else does.
func NewInternalGRPCServer(s *Server, opts ...grpc.ServerOption) *grpc.Server {
	g := grpc.NewServer(append(s.serverOptions(false), opts...)...)
	connectorv1.RegisterConnectorServiceServer(g, s)
	return g
}

// SetServing reports every service of hs as serving or not.
func SetServing(hs *health.Server, serving bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		st = healthpb.HealthCheckResponse_SERVING
	}
	hs.SetServingStatus("", st)
	hs.SetServingStatus(connectorv1.ConnectorService_ServiceDesc.ServiceName, st)
}
