package server

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/store"
)

const (
	defaultSessionPageSize = 100
	maxSessionIDLen        = 256
)

// ListSessions implements connector.v1.ConnectorService.
func (s *Server) ListSessions(ctx context.Context, req *connectorv1.ListSessionsRequest) (*connectorv1.ListSessionsResponse, error) {
	var c checker
	c.ref(req.GetWorkspaceId(), req.GetConnectorId())
	size, after := c.page(req.GetPageSize(), req.GetPageToken(), defaultSessionPageSize)
	if err := c.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	id, held, err := s.heldConnector(ctx, req.GetWorkspaceId(), req.GetConnectorId())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	var infos []registry.SessionInfo
	if held {
		// ErrNotLoaded: deactivated meanwhile, so it has none.
		if infos, err = s.reg.Sessions(id); err != nil && !errors.Is(err, registry.ErrNotLoaded) {
			return nil, s.toStatus(ctx, err)
		}
	}
	all := make([]*connectorv1.Session, 0, len(infos))
	for _, in := range infos {
		all = append(all, sessionToProto(in))
	}
	// With several replicas, each holds some of the sessions: ask the others.
	peers, err := s.sessions.Peers(ctx)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	for _, conn := range peers {
		pctx, cancel := context.WithTimeout(ctx, peerTimeout)
		theirs, err := connectorv1.NewConnectorServiceClient(conn).ListSessions(pctx, &connectorv1.ListSessionsRequest{
			WorkspaceId: req.GetWorkspaceId(), ConnectorId: req.GetConnectorId(), PageSize: maxPageSize})
		cancel()
		if err != nil { // a replica that just died: its sessions move to whoever the next call reaches
			s.logger.WarnContext(ctx, "a replica did not list its sessions", slog.String("error", status.Convert(err).Message()))
			continue
		}
		all = append(all, theirs.GetSessions()...)
	}
	slices.SortFunc(all, func(a, b *connectorv1.Session) int { return strings.Compare(a.GetSessionId(), b.GetSessionId()) })
	// Sessions come sorted by id: the page starts after the token's.
	for len(all) > 0 && after != "" && all[0].GetSessionId() <= after {
		all = all[1:]
	}
	resp := &connectorv1.ListSessionsResponse{}
	resp.Sessions, resp.NextPageToken = nextPage(all, size, func(in *connectorv1.Session) string { return in.GetSessionId() })
	return resp, nil
}

// peerTimeout bounds how long ListSessions and CloseSession wait for each
// other replica: one that just died (its row not expired yet) is left out.
const peerTimeout = 2 * time.Second

// CloseSession implements connector.v1.ConnectorService. A session id is
// scoped to its workspace: only that workspace's connectors are searched.
// The registry logs each session it closes. Closing a user's connection
// to an oauth_user connector (session id registry.UserSession) also has
// every replica forget that user's token, those that hold no connection
// of theirs included, so that the next call reads it again: how a
// revoked authorization stops at once everywhere.
func (s *Server) CloseSession(ctx context.Context, req *connectorv1.CloseSessionRequest) (*connectorv1.CloseSessionResponse, error) {
	var c checker
	c.id("workspace_id", req.GetWorkspaceId())
	if req.GetConnectorId() != "" {
		c.id("connector_id", req.GetConnectorId())
	}
	if req.GetSessionId() == "" {
		c.add("session_id", "required")
	}
	c.sessionID(req.GetSessionId())
	if err := c.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	var closed []registry.SessionInfo
	var id int64
	if req.GetConnectorId() == "" {
		closed = s.reg.CloseSession(req.GetWorkspaceId(), req.GetSessionId(), 0)
	} else {
		var held bool
		var err error
		id, held, err = s.heldConnector(ctx, req.GetWorkspaceId(), req.GetConnectorId())
		if err != nil {
			return nil, s.toStatus(ctx, err)
		}
		if held { // one the registry does not hold has no sessions
			closed = s.reg.CloseSession(req.GetWorkspaceId(), req.GetSessionId(), id)
		}
		s.forgetUserToken(req.GetWorkspaceId(), req.GetConnectorId(), id, req.GetSessionId())
	}
	resp := &connectorv1.CloseSessionResponse{Closed: int32(len(closed))}
	for _, in := range closed {
		resp.Sessions = append(resp.Sessions, sessionToProto(in))
	}
	// With several replicas, the session may be held by another: ask each,
	// and forget those whose replica is gone.
	peers, err := s.sessions.Peers(ctx)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	for _, conn := range peers {
		pctx, cancel := context.WithTimeout(ctx, peerTimeout)
		theirs, err := connectorv1.NewConnectorServiceClient(conn).CloseSession(pctx, req)
		cancel()
		if err != nil { // a replica that just died holds nothing any more
			s.logger.WarnContext(ctx, "a replica did not close its sessions", slog.String("error", status.Convert(err).Message()))
			continue
		}
		resp.Closed += theirs.GetClosed()
		resp.Sessions = append(resp.Sessions, theirs.GetSessions()...)
	}
	if _, err := s.sessions.DropOrphans(ctx, req.GetWorkspaceId(), req.GetSessionId(), id); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return resp, nil
}

// forgetUserToken has the Authorizer forget the token of the user whose
// connection to connector id (a workspace's connectorID) sessionID is, if
// it is an oauth_user connector's user connection.
func (s *Server) forgetUserToken(workspaceID, connectorID string, id int64, sessionID string) {
	user, ok := registry.SessionUser(sessionID)
	if s.oauth == nil || !ok || id == 0 {
		return
	}
	if row, ok := s.live.Lookup(workspaceID, connectorID); ok && row.Config.AuthMode() != store.AuthUser {
		return // a per_session connector's caller session that happens to be named so
	}
	s.oauth.Forget(id, user)
}

// heldConnector returns the id of a workspace's connector and whether the
// registry holds it, as it does every active connector whose secrets
// opened. Only a connector it does not hold goes to the store, which
// returns store.ErrConnectorNotFound if the workspace has no such
// connector.
func (s *Server) heldConnector(ctx context.Context, workspaceID, connectorID string) (int64, bool, error) {
	if id, ok := s.reg.Lookup(workspaceID, connectorID); ok {
		return id, true, nil
	}
	row, err := s.db.GetConnector(ctx, workspaceID, connectorID)
	if err != nil {
		return 0, false, err
	}
	return row.ID, false, nil
}

// sessionID checks a caller's session id, which the service stores and
// routes on as it is; empty is checked by the caller, since only some
// requests need one.
func (c *checker) sessionID(v string) {
	switch {
	case len(v) > maxSessionIDLen:
		c.add("session_id", "longer than %d bytes", maxSessionIDLen)
	case !utf8.ValidString(v):
		c.add("session_id", "not valid UTF-8")
	case strings.ContainsFunc(v, unicode.IsControl):
		c.add("session_id", "contains a control character")
	}
}

// sessionRequired refuses a call without a session id to a per_session
// connector.
func sessionRequired() *invalidError {
	return &invalidError{violations: []violation{{field: "session_id",
		problem: "required: the connector's session_mode is SESSION_MODE_PER_SESSION, so each caller session gets its own connection"}}}
}

func sessionToProto(in registry.SessionInfo) *connectorv1.Session {
	return &connectorv1.Session{
		SessionId:    in.SessionID,
		ConnectorId:  in.ConnectorExternal,
		OpenTime:     timestamppb.New(in.OpenedAt),
		LastUsedTime: timestamppb.New(in.LastUsed),
		CallCount:    in.Calls,
		ErrorCount:   in.Errors,
		State:        healthStates[string(in.State)],
		Pid:          int32(in.PID),
	}
}
