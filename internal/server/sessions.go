package server

import (
	"context"
	"errors"
	"strings"
	"unicode"
	"unicode/utf8"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/sessions"
)

const (
	defaultSessionPageSize = 100
	maxSessionIDLen        = 256
)

// ListSessions implements connector.v1.ConnectorService: the sessions of
// every replica, a page at a time.
func (s *Server) ListSessions(ctx context.Context, req *connectorv1.ListSessionsRequest) (*connectorv1.ListSessionsResponse, error) {
	var c checker
	c.ref(req.GetWorkspaceId(), req.GetConnectorId())
	size, after := c.page(req.GetPageSize(), req.GetPageToken(), defaultSessionPageSize)
	if err := c.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	infos, err := s.sessionsUC.List(ctx, req.GetWorkspaceId(), req.GetConnectorId())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	// Sessions come sorted by id: the page starts after the token's.
	for len(infos) > 0 && after != "" && infos[0].SessionID <= after {
		infos = infos[1:]
	}
	all := make([]*connectorv1.Session, 0, len(infos))
	for _, in := range infos {
		all = append(all, sessionToProto(in))
	}
	resp := &connectorv1.ListSessionsResponse{}
	resp.Sessions, resp.NextPageToken = nextPage(all, size, func(in *connectorv1.Session) string { return in.GetSessionId() })
	return resp, nil
}

// CloseSession implements connector.v1.ConnectorService. A session id is
// scoped to its workspace: only that workspace's connectors are searched.
// Closing a user's connection to an oauth_user connector (session id
// registry.UserSession) also has every replica forget that user's token.
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
	closed, err := s.sessionsUC.Close(ctx, req.GetWorkspaceId(), req.GetConnectorId(), req.GetSessionId())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	resp := &connectorv1.CloseSessionResponse{Closed: int32(len(closed))}
	for _, in := range closed {
		resp.Sessions = append(resp.Sessions, sessionToProto(in))
	}
	return resp, nil
}

// peers are the other replicas, as the sessions use case asks them, over
// the internal listener.
func (s *Server) peers(ctx context.Context) ([]sessions.Peer, error) {
	conns, err := s.sessions.Peers(ctx)
	if err != nil {
		return nil, err
	}
	peers := make([]sessions.Peer, len(conns))
	for i, conn := range conns {
		peers[i] = grpcPeer{connectorv1.NewConnectorServiceClient(conn)}
	}
	return peers, nil
}

// grpcPeer is another replica's sessions, over its gRPC API.
type grpcPeer struct {
	c connectorv1.ConnectorServiceClient
}

// List implements sessions.Peer.
func (p grpcPeer) List(ctx context.Context, workspaceID, connectorID string) ([]registry.SessionInfo, error) {
	resp, err := p.c.ListSessions(ctx, &connectorv1.ListSessionsRequest{WorkspaceId: workspaceID, ConnectorId: connectorID, PageSize: maxPageSize})
	if err != nil {
		return nil, errors.New(status.Convert(err).Message())
	}
	return sessionsFromProto(resp.GetSessions()), nil
}

// Close implements sessions.Peer.
func (p grpcPeer) Close(ctx context.Context, workspaceID, connectorID, sessionID string) ([]registry.SessionInfo, error) {
	resp, err := p.c.CloseSession(ctx, &connectorv1.CloseSessionRequest{WorkspaceId: workspaceID, ConnectorId: connectorID, SessionId: sessionID})
	if err != nil {
		return nil, errors.New(status.Convert(err).Message())
	}
	return sessionsFromProto(resp.GetSessions()), nil
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

// sessionsFromProto reads the sessions another replica rendered.
func sessionsFromProto(ps []*connectorv1.Session) []registry.SessionInfo {
	out := make([]registry.SessionInfo, len(ps))
	for i, p := range ps {
		out[i] = registry.SessionInfo{SessionID: p.GetSessionId(), ConnectorExternal: p.GetConnectorId(),
			OpenedAt: p.GetOpenTime().AsTime(), LastUsed: p.GetLastUsedTime().AsTime(), Calls: p.GetCallCount(),
			Errors: p.GetErrorCount(), State: registry.State(key(healthStates, p.GetState())), PID: int(p.GetPid())}
	}
	return out
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
