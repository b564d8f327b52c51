package live

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"

	"google.golang.org/grpc"

	"github.com/connector-svc/connector-svc/internal/cluster"
	"github.com/connector-svc/connector-svc/internal/forward"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/store"
)

// A caller's session of a per_session connector has one owner replica,
// recorded in Postgres (store.ClaimSession): the first replica it reaches
// claims it, and the others forward its calls there. When the owner stops
// or dies, the next replica the session reaches takes it over: a classic
// streamable-HTTP session is adopted (the owner recorded its
// Mcp-Session-Id, sealed), so the server's state for it survives; a stdio
// or SSE session starts anew, and the call says session_restarted.

// Sessions keeps the sessions table in line with this replica's
// per-session connections, and routes a session's calls to its owner.
type Sessions struct {
	db      SessionStore
	reg     *registry.Registry
	box     *secret.Box // nil: handles are not recorded, sessions not adopted
	members *cluster.Membership
	pool    *forward.Pool
	max     int
	logger  *slog.Logger
}

// NewSessions routes the sessions of reg's per_session connectors among
// the live replicas of members, at most max per connector across them.
func NewSessions(db SessionStore, reg *registry.Registry, box *secret.Box, members *cluster.Membership, pool *forward.Pool,
	max int, logger *slog.Logger) *Sessions {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Sessions{db: db, reg: reg, box: box, members: members, pool: pool, max: max, logger: logger}
}

// Route returns the connection to the replica that owns a caller's
// session of row's connector, or nil when this replica serves it: it owns
// it, or has just claimed it. The sessions of a stdio connector live on
// the connector's owner, which runs their processes: call Route there
// only, and it claims them whoever held them before. A session taken over
// whose MCP session cannot be adopted reports session_restarted on its
// first call here (registry.Registry.Restarted).
func (s *Sessions) Route(ctx context.Context, row *store.Connector, sessionID string) (conn *grpc.ClientConn, err error) {
	if s == nil || sessionID == "" || !OwnConnections(row) || s.reg.HasSession(row.ID, sessionID) {
		return nil, nil
	}
	if !s.reg.Has(row.ID) {
		return nil, nil // not held here: the call fails here as it should
	}
	self := s.members.Self()
	// A stdio connector's sessions live on its owner, this replica; a
	// forwarded call was sent here as the session's owner: either way it
	// is served here, whoever held the session before.
	force := row.Transport == registry.TransportStdio || forward.Forwarded(ctx)
	claim, err := s.db.ClaimSession(ctx, row.ID, sessionID, row.WorkspaceID, self, s.max, force)
	switch {
	case errors.Is(err, store.ErrSessionCap):
		return nil, &registry.SessionLimitError{Limit: s.max}
	case err != nil:
		return nil, fmt.Errorf("%w: %v", ErrNoRoute, err)
	case claim.Owner != self:
		if s.pool == nil {
			return nil, fmt.Errorf("%w: session %q is held by replica %s, and this replica cannot forward without SECRET_KEY",
				ErrNoRoute, sessionID, claim.Owner)
		}
		return s.pool.Conn(claim.OwnerAddr)
	case claim.Previous == "":
		return nil, nil
	}
	// Taken over from a replica that stopped or died.
	h, ok := s.openHandle(row.ID, sessionID, claim.SealedHandle)
	h.OpenedAt = claim.OpenedAt // ListSessions keeps the session's open time
	if ok && s.reg.Adopt(row.ID, sessionID, h) {
		s.logger.InfoContext(ctx, "session adopted", append(ConnectorAttrs(row), slog.String("from_replica", claim.Previous))...)
		return nil, nil
	}
	s.reg.Restarted(row.ID, sessionID)
	s.logger.InfoContext(ctx, "session taken over; it starts anew", append(ConnectorAttrs(row), slog.String("from_replica", claim.Previous))...)
	return nil, nil
}

// Opened records the MCP session a per-session connection opened, sealed,
// for another replica to adopt (registry.Config.OnSessionOpened).
func (s *Sessions) Opened(id int64, sessionID string, h registry.SessionHandle) {
	if s.box == nil || h.MCPSessionID == "" {
		return
	}
	sealed, err := s.box.Seal(secret.Values{Headers: map[string]string{"Mcp-Session-Id": h.MCPSessionID,
		"Mcp-Protocol-Version": h.ProtocolVersion}}, handleContext(id, sessionID))
	if err == nil {
		err = s.db.SetSessionHandle(context.Background(), id, sessionID, s.members.Self(), sealed)
	}
	if err != nil {
		s.logger.Warn("record a session's MCP session; another replica cannot adopt it", slog.Int64("id", id), slog.String("error", err.Error()))
	}
}

// Settle forgets a session this replica claimed for a call that opened
// nothing (refused before it ran: approval, an unknown tool, the rate
// limit), so that a refused call holds no place under the cap.
func (s *Sessions) Settle(row *store.Connector, sessionID string) {
	if s == nil || sessionID == "" || !OwnConnections(row) || s.reg.HasSession(row.ID, sessionID) {
		return
	}
	s.Closed(row.ID, sessionID)
}

// Closed forgets a session this replica closed (registry.Config.OnSessionClosed).
func (s *Sessions) Closed(id int64, sessionID string) {
	if err := s.db.DropSession(context.Background(), id, sessionID, s.members.Self()); err != nil {
		s.logger.Warn("forget a closed session", slog.Int64("id", id), slog.String("error", err.Error()))
	}
}

func (s *Sessions) openHandle(id int64, sessionID string, sealed []byte) (registry.SessionHandle, bool) {
	if s.box == nil || len(sealed) == 0 {
		return registry.SessionHandle{}, false
	}
	v, err := s.box.Open(sealed, handleContext(id, sessionID))
	if err != nil {
		return registry.SessionHandle{}, false
	}
	return registry.SessionHandle{MCPSessionID: v.Headers["Mcp-Session-Id"], ProtocolVersion: v.Headers["Mcp-Protocol-Version"]}, true
}

// handleContext binds a sealed MCP session to its caller's session.
func handleContext(id int64, sessionID string) string {
	return "session/" + strconv.FormatInt(id, 10) + "/" + sessionID
}

// Peers returns connections to the other live replicas, for the requests
// that ask each of them (listing and closing sessions); none for a call
// forwarded here, or without a way to forward.
func (s *Sessions) Peers(ctx context.Context) ([]*grpc.ClientConn, error) {
	if s == nil || s.pool == nil || forward.Forwarded(ctx) {
		return nil, nil
	}
	var conns []*grpc.ClientConn
	for _, m := range s.members.Live() {
		if m.ID == s.members.Self() {
			continue
		}
		conn, err := s.pool.Conn(m.Addr)
		if err != nil {
			return nil, err
		}
		conns = append(conns, conn)
	}
	return conns, nil
}

// DropOrphans forgets a workspace's sessions with that id whose owner is
// gone (of connector id, or of any when id is 0), for CloseSession.
func (s *Sessions) DropOrphans(ctx context.Context, workspaceID, sessionID string, id int64) (int64, error) {
	if s == nil {
		return 0, nil
	}
	return s.db.DropOrphanSessions(ctx, workspaceID, sessionID, id)
}
