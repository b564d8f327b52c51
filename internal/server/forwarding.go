package server

import (
	"context"
	"errors"
	"io"
	"log/slog"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/store"
)

// With several replicas, a call of a stdio connector runs on the replica
// that owns it (the one that runs its process), and so do refreshes and
// checks of any connector (the owner syncs its catalog and writes its
// health); a per-session (per-user) connection's calls run where it is
// held. live.Placer decides where; the handlers below hand such a call to
// that replica over the internal listener, one hop, with the caller's
// request and deadline, through forwardUnary or forwardStream; the
// replica's answer, error included, goes back as it is.

// unaryRPC is a unary method of the generated client, as a method
// expression (connectorv1.ConnectorServiceClient.CallTool).
type unaryRPC[Req, Resp any] func(connectorv1.ConnectorServiceClient, context.Context, Req, ...grpc.CallOption) (Resp, error)

// streamRPC is a server-streaming method of the generated client.
type streamRPC[Req, Resp any] func(connectorv1.ConnectorServiceClient, context.Context, Req, ...grpc.CallOption) (grpc.ServerStreamingClient[Resp], error)

// forwardUnary runs rpc with req on the replica place names: done is
// false when place says here, and the handler serves it.
func forwardUnary[Req, Resp any](ctx context.Context, s *Server, place func(context.Context) (*grpc.ClientConn, error),
	req Req, rpc unaryRPC[Req, Resp]) (resp Resp, done bool, err error) {
	conn, err := place(ctx)
	if err != nil {
		return resp, true, s.toStatus(ctx, err)
	}
	if conn == nil {
		return resp, false, nil
	}
	resp, err = rpc(connectorv1.NewConnectorServiceClient(conn), ctx, req)
	return resp, true, s.forwardErr(ctx, err)
}

// forwardStream is forwardUnary for a server stream: the replica's
// messages are relayed to send until it ends the stream.
func forwardStream[Req, Resp any](ctx context.Context, s *Server, place func(context.Context) (*grpc.ClientConn, error),
	req Req, rpc streamRPC[Req, Resp], send func(*Resp) error) (done bool, err error) {
	conn, err := place(ctx)
	if err != nil {
		return true, s.toStatus(ctx, err)
	}
	if conn == nil {
		return false, nil
	}
	up, err := rpc(connectorv1.NewConnectorServiceClient(conn), ctx, req)
	if err != nil {
		return true, s.forwardErr(ctx, err)
	}
	return true, s.forwardErr(ctx, relay(up.Recv, send))
}

// callerRequest is what calls, queries and answers name of their caller.
type callerRequest interface {
	GetWorkspaceId() string
	GetConnectorId() string
	GetSessionId() string
	GetUserId() string
}

// toCaller places a request's call where its session's (user's)
// connection is held, its ids checked there against the connector
// (checkCaller).
func (s *Server) toCaller(req callerRequest) func(context.Context) (*grpc.ClientConn, error) {
	return func(ctx context.Context) (*grpc.ClientConn, error) {
		return s.place.Place(ctx, live.Target{WorkspaceID: req.GetWorkspaceId(), ConnectorID: req.GetConnectorId(),
			SessionID: req.GetSessionId(), UserID: req.GetUserId()})
	}
}

// toOwner places a request on its connector's owner.
func (s *Server) toOwner(workspaceID, connectorID string) func(context.Context) (*grpc.ClientConn, error) {
	return func(ctx context.Context) (*grpc.ClientConn, error) {
		return s.place.Place(ctx, live.Target{WorkspaceID: workspaceID, ConnectorID: connectorID, OwnerOnly: true})
	}
}

// toRun places the resume of a paused run as its calls were.
func (s *Server) toRun(workspaceID, runID string) func(context.Context) (*grpc.ClientConn, error) {
	return func(ctx context.Context) (*grpc.ClientConn, error) {
		return s.place.PlaceRun(ctx, workspaceID, runID)
	}
}

// checkCaller is the Placer's live.CallerCheck: the session and user ids
// of a call or query of row's connector, in the terms of the request's
// other checks; the user id matters (and is required) for an oauth_user
// connector only.
func checkCaller(row *store.Connector, sessionID, userID string) error {
	var c checker
	c.sessionID(sessionID)
	if row.Config.AuthMode() == store.AuthUser {
		c.userID(row.ExternalID, userID)
	}
	return c.err()
}

// relay passes a forwarded stream's messages on to the caller until the
// owner ends it; the owner's error is the caller's.
func relay[T any](recv func() (*T, error), send func(*T) error) error {
	for {
		msg, err := recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := send(msg); err != nil {
			return err
		}
	}
}

// settleSession drops the claim of a caller's session that the call
// served here left unopened (it was refused before it ran).
func (s *Server) settleSession(workspaceID, connectorID, sessionID, userID string) {
	s.place.Settle(live.Target{WorkspaceID: workspaceID, ConnectorID: connectorID, SessionID: sessionID, UserID: userID})
}

// forwardErr is what the caller of a forwarded call gets for err: the
// owner's own error as it is (it carries the service's ErrorInfo), the
// caller's deadline or cancellation, and otherwise, the hop having
// failed (the owner stopped, or refused this replica's signature), a
// retryable UNAVAILABLE that names no internal address.
func (s *Server) forwardErr(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	st := status.Convert(err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == errorDomain {
			return err
		}
	}
	switch st.Code() {
	case codes.Canceled, codes.DeadlineExceeded:
		return err
	case codes.Unauthenticated:
		s.logger.ErrorContext(ctx, "another replica refused a forwarded call: do the replicas share SECRET_KEY?",
			slog.String("error", st.Message()))
		return newStatus(codes.Unavailable, ReasonConnectorUnavailable,
			"the replica that serves this call refused this one's forwarded call (the replicas' SECRET_KEYs differ?); retry, and tell the operator")
	}
	s.logger.WarnContext(ctx, "forwarded call failed on the way", slog.String("error", st.Message()))
	return newStatus(codes.Unavailable, ReasonConnectorUnavailable,
		"the replica that serves this call could not be reached (it may have just stopped); retry")
}
