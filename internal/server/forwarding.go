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

	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/store"
)

// With several replicas, a call of a stdio connector runs on the replica
// that owns it (the one that runs its process), and so do refreshes and
// checks of any connector (the owner syncs its catalog and writes its
// health). The handlers below hand such a call to the owner over the
// internal listener, one hop, with the caller's request and deadline; the
// owner's answer, error included, goes back as it is.

// routeCall returns the connection to the replica a call of a workspace's
// connector runs on, or nil to run it here: this replica owns what the
// call needs, the connector is not known here (the call then fails here as
// it should), or the call was forwarded here already. A stdio connector's
// calls run on its owner (the one replica that runs its processes, its
// sessions' included); with ownerOnly, every connector's. A per_session
// connector's call with a session, or an oauth_user connector's call for
// a user, otherwise runs on the replica that holds that session's (that
// user's) connection. The session and user ids are checked first: they
// are claimed in the sessions table and sent on as they are.
func (s *Server) routeCall(ctx context.Context, workspaceID, connectorID, sessionID, userID string, ownerOnly bool) (*grpc.ClientConn, error) {
	if s.router == nil {
		return nil, nil
	}
	row, ok := s.live.Lookup(workspaceID, connectorID)
	if !ok || !row.Active {
		return nil, nil
	}
	if !ownerOnly {
		if err := checkCaller(row, sessionID, userID); err != nil {
			return nil, err
		}
	}
	conn, err := s.router.ToOwner(ctx, row, ownerOnly)
	if err != nil || conn != nil || ownerOnly {
		return conn, err
	}
	return s.sessions.Route(ctx, row, live.SessionKey(row, sessionID, userID))
}

// checkCaller checks the session and user ids of a call or query of row's
// connector, as the handlers do once it is routed: the user id matters
// (and is required) for an oauth_user connector only.
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

// runOwnerConn is ownerConn for the connector of a paused run: resuming a
// stdio connector's run runs its tool calls on the owner. A run that is
// not found is resumed here, which says so.
func (s *Server) runOwnerConn(ctx context.Context, workspaceID, runID string) (*grpc.ClientConn, error) {
	if s.router == nil || workspaceID == "" || runID == "" {
		return nil, nil
	}
	run, err := s.db.GetRun(ctx, workspaceID, runID)
	if err != nil {
		return nil, nil
	}
	return s.routeCall(ctx, workspaceID, run.ConnectorExternalID, run.SessionID, run.UserID, false)
}

// settleSession drops the claim of a caller's session that the call
// served here left unopened (it was refused before it ran).
func (s *Server) settleSession(workspaceID, connectorID, sessionID, userID string) {
	if s.sessions == nil || (sessionID == "" && userID == "") {
		return
	}
	if row, ok := s.live.Lookup(workspaceID, connectorID); ok {
		s.sessions.Settle(row, live.SessionKey(row, sessionID, userID))
	}
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
