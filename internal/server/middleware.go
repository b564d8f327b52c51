package server

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/rpcmw"
)

// middleware is the configuration of the service's gRPC middleware
// (rpcmw), without the API key guard: the RPCs' deadlines when their
// callers set none, what each request names, and the statuses whose
// message the log leaves out (a tool's failure may repeat its arguments).
func middleware(d Deps, cfg Config) rpcmw.Config {
	return rpcmw.Config{Logger: d.Logger, TracerProvider: d.TracerProvider, MeterProvider: d.MeterProvider,
		MaxRecvBytes: cfg.MaxRecvBytes, MaxSendBytes: cfg.MaxSendBytes,
		DefaultTimeout: cfg.DefaultRPCTimeout,
		Timeouts: map[string]time.Duration{
			connectorv1.ConnectorService_QueryConnector_FullMethodName: cfg.QueryTimeout,
			connectorv1.ConnectorService_ResumeQuery_FullMethodName:    cfg.QueryTimeout,
		},
		Names:         namesOf,
		HideMessageOf: []string{ReasonToolExecutionFailed},
		PanicError:    func() error { return newStatus(codes.Internal, ReasonInternal, "internal error") },
	}
}

// serverOptions are the service's own gRPC server options
// (rpcmw.ServerOptions), with the API key guard if guarded and auth is on.
func (s *Server) serverOptions(guarded bool) []grpc.ServerOption {
	mw := s.mw
	if guarded && s.keys != nil && s.cfg.Auth.Guarded() {
		mw.Guard = auth.NewGuard(s.keys, s.cfg.Auth, accessRules(), s.logger)
	}
	return rpcmw.ServerOptions(mw)
}

// namesOf is what req names, for the RPC's log line and span.
func namesOf(req any) rpcmw.Names {
	var n rpcmw.Names
	if r, ok := req.(interface{ GetWorkspaceId() string }); ok {
		n.Workspace = clip(r.GetWorkspaceId())
	}
	switch r := req.(type) {
	case interface{ GetConnectorId() string }:
		n.Connector = clip(r.GetConnectorId())
	case interface{ GetConnector() *connectorv1.Connector }: // create, update
		n.Connector = clip(r.GetConnector().GetConnectorId())
	}
	if r, ok := req.(interface{ GetToolName() string }); ok {
		n.Tool = clip(r.GetToolName())
	}
	return n
}

// clip bounds a name as logged: a request is logged whether or not it is
// valid.
func clip(s string) string {
	if len(s) > maxIDLen {
		return s[:maxIDLen] + "…"
	}
	return s
}

// noteCause keeps cause for the RPC's log line (rpcmw.NoteCause) and
// reports whether there is one to take it.
func noteCause(ctx context.Context, cause string) bool { return rpcmw.NoteCause(ctx, cause) }
