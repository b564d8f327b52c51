// Package server is the gRPC adapter of connector-svc: it validates requests,
// converts between the connector.v1 API and the store, calls the store, and
// maps every error to a gRPC status in one place. It is the only package
// that imports gen/ and grpc/codes.
package server

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/secret"
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
}

// Server implements connector.v1.ConnectorService. CloseSession, which
// needs per-session connections that are not built, falls through to the
// embedded Unimplemented server and returns UNIMPLEMENTED. Safe for
// concurrent use.
type Server struct {
	connectorv1.UnimplementedConnectorServiceServer

	db     *store.DB
	box    *secret.Box
	reg    *registry.Registry
	agent  *orchestrator.Agent
	source *Source
	limits limiter
	cfg    Config
	logger *slog.Logger
}

// Deps are the Server's collaborators.
type Deps struct {
	DB *store.DB
	// Box seals connector secrets; nil means no SECRET_KEY, and connectors
	// with headers or env values are refused.
	Box *secret.Box
	// Registry holds the live MCP connections; the caller runs it.
	Registry *registry.Registry
	// Agent answers queries; nil means no LLM is configured, and only the
	// query RPCs refuse (FAILED_PRECONDITION).
	Agent  *orchestrator.Agent
	Logger *slog.Logger
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
	return &Server{db: d.DB, box: d.Box, reg: d.Registry, agent: d.Agent, source: NewSource(d.DB, d.Box, d.Logger),
		cfg: cfg, logger: d.Logger}
}

// NewGRPCServer returns a grpc.Server serving s, the standard health service
// (reported SERVING by the caller once ready) and server reflection, with
// the service's interceptors.
func NewGRPCServer(s *Server) (*grpc.Server, *health.Server) {
	g := grpc.NewServer(
		grpc.ChainUnaryInterceptor(s.recoverUnary, s.logUnary, s.deadlineUnary),
		grpc.ChainStreamInterceptor(s.recoverStream, s.logStream),
	)
	connectorv1.RegisterConnectorServiceServer(g, s)
	hs := health.NewServer()
	SetServing(hs, false)
	healthpb.RegisterHealthServer(g, hs)
	reflection.Register(g)
	return g, hs
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
		if info.FullMethod == connectorv1.ConnectorService_QueryConnector_FullMethodName {
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
	resp, err := next(ctx, req)
	s.logRPC(ctx, info.FullMethod, start, err)
	return resp, err
}

func (s *Server) logStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, next grpc.StreamHandler) error {
	start := time.Now()
	err := next(srv, ss)
	s.logRPC(ss.Context(), info.FullMethod, start, err)
	return err
}

// logRPC writes one line per RPC. Requests are not logged: they may carry
// secrets.
func (s *Server) logRPC(ctx context.Context, method string, start time.Time, err error) {
	level := slog.LevelInfo
	if code := status.Code(err); code == codes.Internal || code == codes.Unknown {
		level = slog.LevelError
	}
	s.logger.Log(ctx, level, "rpc",
		slog.String("method", method),
		slog.String("code", status.Code(err).String()),
		slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000))
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

// allowCommand refuses a stdio command that is not on the allow-list.
func (s *Server) allowCommand(p *connectorv1.Connector) error {
	cmd := p.GetStdio().GetCommand()
	if p.GetTransport() != connectorv1.Transport_TRANSPORT_STDIO || slices.Contains(s.cfg.StdioAllowedCommands, cmd) {
		return nil
	}
	return newStatus(codes.FailedPrecondition, ReasonStdioCommandNotAllowed,
		fmt.Sprintf("connector.stdio.command %q is not allowed: the operator must add it to STDIO_ALLOWED_COMMANDS", cmd))
}

// SealContext binds sealed secrets to their connector's row.
func SealContext(workspaceID, connectorID string) string {
	return "connector/" + workspaceID + "/" + connectorID
}
