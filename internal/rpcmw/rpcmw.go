// Package rpcmw owns the gRPC middleware every RPC of the service passes:
// trace-context continuation (or otelgrpc's spans and metrics), panic
// recovery, the API key guard, one log line per RPC with what it names and
// why it failed, and a default deadline. It knows no RPC of its own: what a
// request names, the deadlines by method and the status of a panic are the
// caller's (Config).
package rpcmw

import (
	"context"
	"log/slog"
	"runtime"
	"runtime/debug"
	"slices"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc/filters"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	noopmetric "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/connector-svc/connector-svc/internal/auth"
)

// Config is what the middleware needs. The zero value logs nothing, makes
// spans with otel's global TracerProvider, records no metrics, sets no
// deadline and names nothing.
type Config struct {
	Logger *slog.Logger // nil: discard
	// TracerProvider makes the RPCs' server spans; nil means otel's global
	// one.
	TracerProvider trace.TracerProvider
	// MeterProvider records the RPCs' metrics; nil records none.
	MeterProvider metric.MeterProvider
	// MaxRecvBytes and MaxSendBytes are the gRPC message size limits; 0
	// leaves gRPC's own.
	MaxRecvBytes, MaxSendBytes int
	// DefaultTimeout is the deadline of a unary RPC whose caller set none,
	// but for the methods (full names) of Timeouts, which have their own;
	// 0 sets none.
	DefaultTimeout time.Duration
	Timeouts       map[string]time.Duration
	// Names says what a request names, for its log line and span; nil
	// names nothing. It must not return secrets or tool arguments.
	Names func(req any) Names
	// HideMessageOf are the reasons (the ErrorInfo of a status) whose
	// message the log line leaves out: it may repeat what the caller sent,
	// as a tool's failure in its MCP server's words does.
	HideMessageOf []string
	// PanicError is the error of an RPC whose handler panicked; nil means
	// a bare INTERNAL "internal error".
	PanicError func() error
	// Guard checks the callers' API keys right after panic recovery; nil
	// checks none.
	Guard *auth.Guard
}

// ServerOptions are the service's own gRPC server options: workers,
// message sizes, spans and metrics, and the interceptors. A request over
// MaxRecvBytes is refused by gRPC itself, before any interceptor runs,
// with a bare RESOURCE_EXHAUSTED. The Guard runs right after panic
// recovery: a refused call is logged by the guard, and never reaches the
// other interceptors. Every RPC but health checks gets a server span
// (otelgrpc), in the caller's trace if it sent one; with a no-op
// TracerProvider no span is made, and the caller's trace context is only
// carried on (continueTrace). With a MeterProvider, the same otelgrpc
// handler records every RPC but health checks (rpc.server.call.duration,
// by method and status code, refused ones too: it sees the status the
// caller got).
func ServerOptions(cfg Config) []grpc.ServerOption {
	m := newMiddleware(cfg)
	server := []grpc.ServerOption{
		// RPCs run on a goroutine per CPU that stays, while one is free,
		// on a new goroutine otherwise. A new goroutine starts with a small
		// stack and grows it several times through the interceptors, the
		// handler and the MCP client, copying it each time; a worker keeps
		// the stack it grew.
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
	}
	if cfg.MaxRecvBytes > 0 {
		server = append(server, grpc.MaxRecvMsgSize(cfg.MaxRecvBytes))
	}
	if cfg.MaxSendBytes > 0 {
		server = append(server, grpc.MaxSendMsgSize(cfg.MaxSendBytes))
	}
	var unary []grpc.UnaryServerInterceptor
	var stream []grpc.StreamServerInterceptor
	if makesSpans(m.tracer) || recordsMetrics(cfg.MeterProvider) {
		var meters metric.MeterProvider = noopmetric.NewMeterProvider() // not otel's global one
		if recordsMetrics(cfg.MeterProvider) {
			meters = cfg.MeterProvider
		}
		server = append(server, grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(m.tracer),
			otelgrpc.WithMeterProvider(meters),
			otelgrpc.WithFilter(filters.Not(filters.HealthCheck())))))
	} else {
		t := newContinueTrace()
		unary, stream = append(unary, t.unary), append(stream, t.stream)
	}
	unary, stream = append(unary, m.recoverUnary), append(stream, m.recoverStream)
	if cfg.Guard != nil {
		unary, stream = append(unary, cfg.Guard.Unary()), append(stream, cfg.Guard.Stream())
	}
	return append(server,
		grpc.ChainUnaryInterceptor(append(unary, m.logUnary, m.deadlineUnary)...),
		grpc.ChainStreamInterceptor(append(stream, m.logStream)...))
}

// middleware is the interceptors of one Config, its defaults filled in.
type middleware struct {
	cfg    Config
	logger *slog.Logger
	tracer trace.TracerProvider
}

func newMiddleware(cfg Config) *middleware {
	m := &middleware{cfg: cfg, logger: cfg.Logger, tracer: cfg.TracerProvider}
	if m.logger == nil {
		m.logger = slog.New(slog.DiscardHandler)
	}
	if m.tracer == nil {
		m.tracer = otel.GetTracerProvider()
	}
	if m.cfg.Names == nil {
		m.cfg.Names = func(any) Names { return Names{} }
	}
	if m.cfg.PanicError == nil {
		m.cfg.PanicError = func() error { return status.Error(codes.Internal, "internal error") }
	}
	return m
}

func (m *middleware) deadlineUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	if _, ok := ctx.Deadline(); !ok {
		timeout, own := m.cfg.Timeouts[info.FullMethod]
		if !own {
			timeout = m.cfg.DefaultTimeout
		}
		if timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
	}
	return next(ctx, req)
}

func (m *middleware) recoverUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (resp any, err error) {
	defer m.recoverPanic(ctx, info.FullMethod, &err)
	return next(ctx, req)
}

func (m *middleware) recoverStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, next grpc.StreamHandler) (err error) {
	defer m.recoverPanic(ss.Context(), info.FullMethod, &err)
	return next(srv, ss)
}

// recoverPanic turns a panic in a handler into PanicError, so one bad
// request never takes the service down.
func (m *middleware) recoverPanic(ctx context.Context, method string, err *error) {
	if r := recover(); r != nil {
		m.logger.ErrorContext(ctx, "panic in handler",
			slog.String("method", method), slog.Any("panic", r), slog.String("stack", string(debug.Stack())))
		*err = m.cfg.PanicError()
	}
}

// hidesMessage reports whether the log line leaves out the message of a
// status with reason.
func (m *middleware) hidesMessage(reason string) bool {
	return slices.Contains(m.cfg.HideMessageOf, reason)
}
