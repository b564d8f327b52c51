// Package server is the gRPC adapter of connector-svc: it validates requests,
// converts between the connector.v1 API and the store, calls the store, and
// maps every error to a gRPC status in one place. It is the only package
// that imports gen/ and grpc/codes.
package server

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc/filters"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	noopmetric "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/calls"
	"github.com/connector-svc/connector-svc/internal/connectors"
	"github.com/connector-svc/connector-svc/internal/egress"
	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/pending"
	"github.com/connector-svc/connector-svc/internal/queries"
	"github.com/connector-svc/connector-svc/internal/ratelimit"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/runs"
	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/sessions"
	"github.com/connector-svc/connector-svc/internal/store"
)

var _ connectorv1.ConnectorServiceServer = (*Server)(nil)

// Config is the server's behaviour that operators set.
type Config struct {
	// StdioAllowedCommands are the only commands a stdio connector may run.
	StdioAllowedCommands []string
	// DefaultRPCTimeout is the deadline of an RPC whose caller set none.
	DefaultRPCTimeout time.Duration
	// QueryTimeout is the deadline of a query whose caller set none.
	QueryTimeout time.Duration
	// MaxToolResultBytes caps the content a CallTool response carries, and
	// the contexts a query response carries in total. Keep it below
	// MaxSendBytes.
	MaxToolResultBytes int
	// MaxToolArgumentsBytes caps the encoded arguments of a CallTool
	// request. Keep it below MaxRecvBytes, or gRPC refuses first.
	MaxToolArgumentsBytes int
	// MaxRecvBytes and MaxSendBytes are the gRPC message size limits.
	MaxRecvBytes, MaxSendBytes int
	// Egress refuses HTTP connectors whose host is, or resolves to, an
	// address it denies; nil means the default policy. Give the registry
	// the same policy: it checks every dial.
	Egress *egress.Policy
	// Auth is when callers need API keys (accessRules says which); the
	// empty mode, like auth.ModeNone, asks for none.
	Auth auth.Mode
	// ApprovalTimeout is how long a paused run waits for a decision before
	// it expires; 0 means DefaultApprovalTimeout.
	ApprovalTimeout time.Duration
	// ReplicaID names this replica in the runs it resumes, and in those it
	// holds paused live for input; "" makes one up.
	ReplicaID string
	// RunFlushInterval is how often run records that need not be written
	// at once (failed runs, failed writes) are written; 0 means a second.
	RunFlushInterval time.Duration
	// SamplingBudget is the sampling budget of one query run, or of one
	// direct tool call, of a connector (its per-run limits); nil, or a nil
	// budget, means none.
	SamplingBudget func(*store.Connector) *ask.Budget
	// OAuthWindow is how long an authorization started stays valid
	// (OAUTH_STATE_TTL): within it a user's step-ups (authorizations for
	// more scopes) of one connector are capped; 0 means
	// DefaultOAuthWindow.
	OAuthWindow time.Duration
}

// Size defaults. A default gRPC client receives at most 4 MiB, so that is
// what the server sends at most, and a tool result leaves 1 MiB of room.
const (
	DefaultMaxToolResultBytes    = 3 << 20
	DefaultMaxToolArgumentsBytes = 4 << 20
	DefaultMaxRecvBytes          = 8 << 20
	DefaultMaxSendBytes          = 4 << 20
)

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
	limits   rateLimits
	// oauth runs users' authorizations; nil: OAuth is not configured.
	oauth  Authorizer
	steps  stepUps
	counts *runs.Counters // calls' and queries' counters on their way to the store
	runs   *runs.Log      // query run records on their way to the store
	// asks are the servers' questions that wait here for an answer, of
	// query runs and direct calls alike.
	asks *pending.Table
	// calls runs direct tool calls.
	calls *calls.Service
	// sessionsUC lists and closes callers' sessions on every replica.
	sessionsUC *sessions.Service
	// queries runs queries and resumes them.
	queries *queries.Service
	// connectors writes connectors and applies them.
	connectors *connectors.Service
	cfg        Config
	logger     *slog.Logger
	tracer     trace.TracerProvider
	meters     metric.MeterProvider // nil: no RPC metrics
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
	if cfg.DefaultRPCTimeout <= 0 {
		cfg.DefaultRPCTimeout = 30 * time.Second
	}
	if cfg.QueryTimeout <= 0 {
		cfg.QueryTimeout = 2 * time.Minute
	}
	cfg.MaxToolResultBytes = orDefaultSize(cfg.MaxToolResultBytes, DefaultMaxToolResultBytes)
	cfg.MaxToolArgumentsBytes = orDefaultSize(cfg.MaxToolArgumentsBytes, DefaultMaxToolArgumentsBytes)
	cfg.MaxRecvBytes = orDefaultSize(cfg.MaxRecvBytes, DefaultMaxRecvBytes)
	cfg.MaxSendBytes = orDefaultSize(cfg.MaxSendBytes, DefaultMaxSendBytes)
	if cfg.Egress == nil {
		cfg.Egress = egress.New(egress.Config{})
	}
	cfg.ApprovalTimeout = cmp.Or(max(cfg.ApprovalTimeout, 0), DefaultApprovalTimeout)
	cfg.OAuthWindow = cmp.Or(max(cfg.OAuthWindow, 0), DefaultOAuthWindow)
	// A run paused live for input is held by its replica by name: one
	// made up stands for a replica that was given none.
	cfg.ReplicaID = cmp.Or(cfg.ReplicaID, "replica-"+uuid.NewString()[:8])
	if d.TracerProvider == nil {
		d.TracerProvider = otel.GetTracerProvider()
	}
	limits := ratelimit.Config{Replicas: d.Replicas, Logger: d.Logger}
	if d.DB != nil {
		limits.Exact = d.DB
	}
	s := &Server{db: d.DB, box: d.Box, reg: d.Registry, live: d.Live, place: live.NewPlacer(d.Live, d.Router, d.Sessions, d.DB),
		sessions: d.Sessions, keys: d.Keys, oauth: d.OAuth,
		limits: rateLimits{ratelimit.New(limits)}, counts: runs.NewCounters(d.DB, countsInterval, d.MeterProvider, d.Logger),
		runs: runs.NewLog(d.DB, runs.Config{Replica: cfg.ReplicaID, FlushInterval: cfg.RunFlushInterval, Logger: d.Logger}),
		asks: &pending.Table{},
		cfg:  cfg, logger: d.Logger, tracer: d.TracerProvider, meters: d.MeterProvider}
	s.connectors = connectors.New(connectors.Deps{Store: d.DB, Live: d.Live, Box: d.Box, Egress: cfg.Egress,
		AllowedCommands: cfg.StdioAllowedCommands, Revoker: revoker(d.OAuth), Logger: d.Logger})
	s.sessionsUC = sessions.New(sessions.Deps{Registry: d.Registry, Live: d.Live, Store: d.DB, Claims: d.Sessions,
		Peers: s.peers, Forget: forgetter(d.OAuth), Logger: d.Logger})
	s.calls = calls.New(calls.Deps{Registry: d.Registry, Live: d.Live, Store: d.DB, Limits: s.limits.Limiter, Counters: s.counts,
		Asks: s.asks, Placer: s.place, CheckCaller: checkCaller, SamplingBudget: cfg.SamplingBudget})
	s.queries = queries.New(queries.Deps{Agent: d.Agent, Registry: d.Registry, Live: d.Live, Connectors: s.calls, Runs: d.DB,
		Log: s.runs, Counters: s.counts, Limits: s.limits, Asks: s.asks, Placer: s.place, Authorizations: runAuthorizations{s},
		CheckCaller: checkCaller, SamplingBudget: cfg.SamplingBudget, ErrorMessage: s.runErrorMessage,
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

// NewGRPCServer returns a grpc.Server serving s, the standard health service
// (reported SERVING by the caller once ready) and server reflection, with
// the service's interceptors and message size limits. A request over
// MaxRecvBytes is refused by gRPC itself, before any interceptor or handler
// runs, with a bare RESOURCE_EXHAUSTED. With auth on, the auth.Guard runs
// right after panic recovery: a refused call is logged by the guard, and
// never reaches the other interceptors. Every RPC but health checks gets
// a server span (otelgrpc), in the caller's trace if it sent one; with a
// no-op TracerProvider no span is made, and the caller's trace context is
// only carried on (continueTrace). With a MeterProvider, the same otelgrpc
// handler records every RPC but health checks (refused ones too: it sees
// the status the caller got). opts come after the service's own, for
// transport credentials (TLS).
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

// serverOptions are the service's own: workers, message sizes, spans and
// metrics, and the interceptors (with the auth guard if guarded).
func (s *Server) serverOptions(guarded bool) []grpc.ServerOption {
	server := []grpc.ServerOption{
		// RPCs run on a goroutine per CPU that stays, while one is free,
		// on a new goroutine otherwise. A new goroutine starts with a small
		// stack and grows it several times through the interceptors, the
		// handler and the MCP client, copying it each time; a worker keeps
		// the stack it grew.
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
		grpc.MaxRecvMsgSize(s.cfg.MaxRecvBytes),
		grpc.MaxSendMsgSize(s.cfg.MaxSendBytes),
	}
	var unary []grpc.UnaryServerInterceptor
	var stream []grpc.StreamServerInterceptor
	if makesSpans(s.tracer) || recordsMetrics(s.meters) {
		var meters metric.MeterProvider = noopmetric.NewMeterProvider() // not otel's global one
		if recordsMetrics(s.meters) {
			meters = s.meters
		}
		server = append(server, grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(s.tracer),
			otelgrpc.WithMeterProvider(meters),
			otelgrpc.WithFilter(filters.Not(filters.HealthCheck())))))
	} else {
		t := newContinueTrace()
		unary, stream = append(unary, t.unary), append(stream, t.stream)
	}
	unary, stream = append(unary, s.recoverUnary), append(stream, s.recoverStream)
	if guarded && s.keys != nil && s.cfg.Auth.Guarded() {
		guard := auth.NewGuard(s.keys, s.cfg.Auth, accessRules(), s.logger)
		unary = append(unary, guard.Unary())
		stream = append(stream, guard.Stream())
	}
	return append(server,
		grpc.ChainUnaryInterceptor(append(unary, s.logUnary, s.deadlineUnary)...),
		grpc.ChainStreamInterceptor(append(stream, s.logStream)...))
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

func (s *Server) deadlineUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	if _, ok := ctx.Deadline(); !ok {
		timeout := s.cfg.DefaultRPCTimeout
		switch info.FullMethod {
		case connectorv1.ConnectorService_QueryConnector_FullMethodName, connectorv1.ConnectorService_ResumeQuery_FullMethodName:
			timeout = s.cfg.QueryTimeout
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	return next(ctx, req)
}

func (s *Server) logUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	start := time.Now()
	names := namesOf(req)
	names.annotate(ctx)
	ctx = withCause(ctx)
	resp, err := next(ctx, req)
	s.logRPC(ctx, info.FullMethod, names, start, err)
	return resp, err
}

func (s *Server) logStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, next grpc.StreamHandler) error {
	start := time.Now()
	ns := &namingStream{ServerStream: ss, ctx: withCause(ss.Context())}
	err := next(srv, ns)
	s.logRPC(ns.ctx, info.FullMethod, ns.names, start, err)
	return err
}

// logRPC writes one line per RPC: its method, status (with reason, message
// and the cause of an INTERNAL), duration, what it names (workspace,
// connector, tool), the caller's address and key id, and its trace id.
// Requests are not logged: they may carry secrets and tool arguments.
func (s *Server) logRPC(ctx context.Context, method string, names rpcNames, start time.Time, err error) {
	code := callerCode(ctx, status.Code(err))
	level := rpcLevel(ctx, code)
	if !s.logger.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 12) // what a line has at most
	attrs = append(attrs,
		slog.String("method", method),
		slog.String("code", code.String()),
		slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000),
	)
	attrs = names.appendLogAttrs(attrs)
	if err != nil {
		attrs = appendStatusAttrs(ctx, attrs, err)
	}
	attrs = appendPeerAttrs(ctx, attrs)
	if key, ok := auth.KeyFrom(ctx); ok {
		attrs = append(attrs, slog.String("key_id", key.ID))
	}
	s.logger.LogAttrs(ctx, level, "rpc", attrs...)
}

func (s *Server) recoverUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (resp any, err error) {
	defer s.recoverPanic(ctx, info.FullMethod, &err)
	return next(ctx, req)
}

func (s *Server) recoverStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, next grpc.StreamHandler) (err error) {
	defer s.recoverPanic(ss.Context(), info.FullMethod, &err)
	return next(srv, ss)
}

// recoverPanic turns a panic in a handler into INTERNAL, so one bad request
// never takes the service down.
func (s *Server) recoverPanic(ctx context.Context, method string, err *error) {
	if r := recover(); r != nil {
		s.logger.ErrorContext(ctx, "panic in handler",
			slog.String("method", method), slog.Any("panic", r), slog.String("stack", string(debug.Stack())))
		*err = newStatus(codes.Internal, ReasonInternal, "internal error")
	}
}
