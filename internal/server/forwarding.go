package server

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc"
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
// connector's call with a session otherwise runs on the session's owner.
func (s *Server) routeCall(ctx context.Context, workspaceID, connectorID, sessionID string, ownerOnly bool) (*grpc.ClientConn, error) {
	if s.router == nil {
		return nil, nil
	}
	row, ok := s.live.Lookup(workspaceID, connectorID)
	if !ok || !row.Active {
		return nil, nil
	}
	conn, err := s.router.ToOwner(ctx, row, ownerOnly)
	if err != nil || conn != nil || ownerOnly {
		return conn, err
	}
	return s.sessions.Route(ctx, row, sessionID)
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
	return s.routeCall(ctx, workspaceID, run.ConnectorExternalID, run.SessionID, false)
}
