package rpcmw

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/registry"
)

// Names is what a request names: its workspace, connector and tool, ""
// for what it does not name. They are identifiers, never secrets or tool
// arguments, so they go into the RPC's log line and its span.
type Names struct{ Workspace, Connector, Tool string }

// annotate puts the names on the RPC's span, with the registry's and the
// agent's attribute keys.
func (n Names) annotate(ctx context.Context) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 3)
	for _, a := range []attribute.KeyValue{attribute.String("connector.workspace_id", n.Workspace),
		attribute.String("connector.id", n.Connector), attribute.String("mcp.tool", n.Tool)} {
		if a.Value.AsString() != "" {
			attrs = append(attrs, a)
		}
	}
	span.SetAttributes(attrs...)
}

// appendLogAttrs appends the names given to attrs.
func (n Names) appendLogAttrs(attrs []slog.Attr) []slog.Attr {
	if n.Workspace != "" {
		attrs = append(attrs, slog.String("workspace_id", n.Workspace))
	}
	if n.Connector != "" {
		attrs = append(attrs, slog.String("connector_id", n.Connector))
	}
	if n.Tool != "" {
		attrs = append(attrs, slog.String("tool", n.Tool))
	}
	return attrs
}

func (m *middleware) logUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	start := time.Now()
	names := m.cfg.Names(req)
	names.annotate(ctx)
	ctx = withCause(ctx)
	resp, err := next(ctx, req)
	m.logRPC(ctx, info.FullMethod, names, start, err)
	return resp, err
}

func (m *middleware) logStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, next grpc.StreamHandler) error {
	start := time.Now()
	ns := &namingStream{ServerStream: ss, ctx: withCause(ss.Context()), namesOf: m.cfg.Names}
	err := next(srv, ns)
	m.logRPC(ns.ctx, info.FullMethod, ns.names, start, err)
	return err
}

// logRPC writes one line per RPC: its method, status (with reason, message
// and the cause of an INTERNAL), duration, what it names (workspace,
// connector, tool), the caller's address and key id, and its trace id.
// Requests are not logged: they may carry secrets and tool arguments.
func (m *middleware) logRPC(ctx context.Context, method string, names Names, start time.Time, err error) {
	code := callerCode(ctx, status.Code(err))
	level := rpcLevel(ctx, code)
	if !m.logger.Enabled(ctx, level) {
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
		attrs = m.appendStatusAttrs(ctx, attrs, err)
	}
	attrs = appendPeerAttrs(ctx, attrs)
	if key, ok := auth.KeyFrom(ctx); ok {
		attrs = append(attrs, slog.String("key_id", key.ID))
	}
	m.logger.LogAttrs(ctx, level, "rpc", attrs...)
}

// callerCode is the code the caller got for an RPC that ended with code:
// a caller whose deadline passed got DEADLINE_EXCEEDED from its own
// client, even where the service saw the cancel that deadline sent before
// its own copy of it expired, and answered CANCELED.
func callerCode(ctx context.Context, code codes.Code) codes.Code {
	if code == codes.Canceled && registry.EndedByDeadline(ctx) {
		return codes.DeadlineExceeded
	}
	return code
}

// rpcLevel is the level of an RPC's log line: error or warn when the
// service failed the caller, info when the caller asked for what could not
// be (bad arguments, unknown connectors, missing keys, limits) or gave up.
// A deadline is the caller's if ctx, which has only the caller's deadline,
// is past it; the service's default deadline and the connector's call
// timeout are the service's.
func rpcLevel(ctx context.Context, code codes.Code) slog.Level {
	switch code {
	case codes.Internal, codes.Unknown, codes.DataLoss:
		return slog.LevelError
	case codes.Unavailable, codes.Aborted:
		return slog.LevelWarn
	case codes.DeadlineExceeded:
		if ctx.Err() == nil {
			return slog.LevelWarn
		}
	}
	return slog.LevelInfo
}

// appendStatusAttrs appends what describes a failed RPC: its reason and
// message (but of the reasons of HideMessageOf), and the cause the handler
// noted (NoteCause).
func (m *middleware) appendStatusAttrs(ctx context.Context, attrs []slog.Attr, err error) []slog.Attr {
	st := status.Convert(err)
	var reason string
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			reason = info.GetReason()
		}
	}
	if reason != "" {
		attrs = append(attrs, slog.String("reason", reason))
	}
	if !m.hidesMessage(reason) {
		attrs = append(attrs, slog.String("error", st.Message()))
	}
	if n, ok := ctx.Value(causeKey{}).(*rpcCause); ok {
		if cause := n.Load(); cause != nil {
			attrs = append(attrs, slog.String("cause", *cause))
		}
	}
	return attrs
}

// appendPeerAttrs appends the caller's address and the RPC's trace id.
func appendPeerAttrs(ctx context.Context, attrs []slog.Attr) []slog.Attr {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		attrs = append(attrs, slog.String("peer", p.Addr.String()))
	}
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		attrs = append(attrs, slog.String("trace_id", sc.TraceID().String()))
	}
	return attrs
}

// rpcCause is where a handler leaves the cause of its failure, for the
// RPC's log line.
type rpcCause struct{ atomic.Pointer[string] }

type causeKey struct{}

func withCause(ctx context.Context) context.Context {
	return context.WithValue(ctx, causeKey{}, &rpcCause{})
}

// NoteCause keeps cause, why the RPC of ctx failed, for its log line (the
// last one noted wins), and reports whether there is a line to take it:
// false outside an RPC served with these interceptors, where the caller
// must log the cause itself. The cause is logged as it is: keep secrets
// out of it.
func NoteCause(ctx context.Context, cause string) bool {
	n, ok := ctx.Value(causeKey{}).(*rpcCause)
	if ok {
		n.Store(&cause)
	}
	return ok
}

// namingStream is a server stream that names its RPC after the first
// request it receives, and whose context takes a cause.
type namingStream struct {
	grpc.ServerStream
	ctx     context.Context
	namesOf func(any) Names
	names   Names
	named   bool
}

func (s *namingStream) Context() context.Context { return s.ctx }

func (s *namingStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err == nil && !s.named {
		s.names, s.named = s.namesOf(m), true
		s.names.annotate(s.ctx)
	}
	return err
}
