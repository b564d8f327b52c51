package server

import (
	"context"
	"log/slog"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/registry"
)

// rpcNames is what a request names: its workspace, connector and tool.
// They are identifiers, never secrets or tool arguments, so they go into
// the RPC's log line and its span.
type rpcNames struct{ workspace, connector, tool string }

func namesOf(req any) rpcNames {
	var n rpcNames
	if r, ok := req.(interface{ GetWorkspaceId() string }); ok {
		n.workspace = clip(r.GetWorkspaceId())
	}
	switch r := req.(type) {
	case interface{ GetConnectorId() string }:
		n.connector = clip(r.GetConnectorId())
	case interface{ GetConnector() *connectorv1.Connector }: // create, update
		n.connector = clip(r.GetConnector().GetConnectorId())
	}
	if r, ok := req.(interface{ GetToolName() string }); ok {
		n.tool = clip(r.GetToolName())
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

// annotate puts the names on the RPC's span, with the registry's and the
// agent's attribute keys.
func (n rpcNames) annotate(ctx context.Context) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 3)
	for _, a := range []attribute.KeyValue{attribute.String("connector.workspace_id", n.workspace),
		attribute.String("connector.id", n.connector), attribute.String("mcp.tool", n.tool)} {
		if a.Value.AsString() != "" {
			attrs = append(attrs, a)
		}
	}
	span.SetAttributes(attrs...)
}

// appendLogAttrs appends the names given to attrs.
func (n rpcNames) appendLogAttrs(attrs []slog.Attr) []slog.Attr {
	if n.workspace != "" {
		attrs = append(attrs, slog.String("workspace_id", n.workspace))
	}
	if n.connector != "" {
		attrs = append(attrs, slog.String("connector_id", n.connector))
	}
	if n.tool != "" {
		attrs = append(attrs, slog.String("tool", n.tool))
	}
	return attrs
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
// is past it; RPC_TIMEOUT and the connector's call timeout are ours.
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

// appendStatusAttrs appends what describes a failed RPC: its reason and message, and the cause
// toStatus noted for an INTERNAL. A tool's failure is described by its
// reason only: the MCP server's words may repeat the arguments.
func appendStatusAttrs(ctx context.Context, attrs []slog.Attr, err error) []slog.Attr {
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
	if reason != ReasonToolExecutionFailed {
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

// rpcCause is where toStatus leaves the cause of an INTERNAL it makes, for
// the RPC's log line.
type rpcCause struct{ atomic.Pointer[string] }

type causeKey struct{}

func withCause(ctx context.Context) context.Context {
	return context.WithValue(ctx, causeKey{}, &rpcCause{})
}

// noteCause keeps cause for the RPC's log line and reports whether there
// is one to take it.
func noteCause(ctx context.Context, cause string) bool {
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
	ctx   context.Context
	names rpcNames
	named bool
}

func (s *namingStream) Context() context.Context { return s.ctx }

func (s *namingStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err == nil && !s.named {
		s.names, s.named = namesOf(m), true
		s.names.annotate(s.ctx)
	}
	return err
}
