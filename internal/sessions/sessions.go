// Package sessions is the use case of callers' sessions: listing a
// connector's open sessions and closing one, on every replica that holds
// some (each replica holds the connections of the sessions it served).
// Closing an oauth_user connector's user connection also has every replica
// forget that user's token, so that a revoked authorization stops at once
// everywhere. It knows nothing of gRPC: the other replicas are Peers, which
// a front door provides over the internal listener.
package sessions

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/store"
)

// Peer is another live replica.
type Peer interface {
	// List returns the sessions of a workspace's connector it holds.
	List(ctx context.Context, workspaceID, connectorID string) ([]registry.SessionInfo, error)
	// Close closes the session it holds (of one connector, or of any
	// of the workspace's when connectorID is empty) and returns them.
	Close(ctx context.Context, workspaceID, connectorID, sessionID string) ([]registry.SessionInfo, error)
}

// ConnectorStore reads a connector the registry does not hold.
type ConnectorStore interface {
	GetConnector(ctx context.Context, workspaceID, externalID string) (*store.Connector, error)
}

// Deps are a Service's collaborators.
type Deps struct {
	Registry *registry.Registry
	Live     *live.Connectors
	Store    ConnectorStore
	// Claims forgets the sessions whose replica is gone; nil: a single
	// replica.
	Claims *live.Sessions
	// Peers returns the other live replicas; nil: none (a single replica,
	// or a request another replica forwarded here).
	Peers func(ctx context.Context) ([]Peer, error)
	// Forget has this replica forget a user's token of a connector; nil:
	// OAuth is not configured.
	Forget func(connectorID int64, userID string)
	Logger *slog.Logger
}

// Service lists and closes sessions. Safe for concurrent use.
type Service struct{ d Deps }

// New returns a Service over d.
func New(d Deps) *Service {
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	return &Service{d: d}
}

// peerTimeout bounds how long List and Close wait for each other replica:
// one that just died (its row not expired yet) is left out.
const peerTimeout = 2 * time.Second

// List returns the open sessions of a workspace's connector on every
// replica, sorted by session id. Returns the store's error for a
// connector that does not exist.
func (s *Service) List(ctx context.Context, workspaceID, connectorID string) ([]registry.SessionInfo, error) {
	id, held, err := s.held(ctx, workspaceID, connectorID)
	if err != nil {
		return nil, err
	}
	var all []registry.SessionInfo
	if held {
		// ErrNotLoaded: deactivated meanwhile, so it has none.
		if all, err = s.d.Registry.Sessions(id); err != nil && !errors.Is(err, registry.ErrNotLoaded) {
			return nil, err
		}
	}
	err = s.eachPeer(ctx, "list", func(ctx context.Context, p Peer) error {
		theirs, err := p.List(ctx, workspaceID, connectorID)
		all = append(all, theirs...)
		return err
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(all, func(a, b registry.SessionInfo) int { return cmp.Compare(a.SessionID, b.SessionID) })
	return all, nil
}

// Close closes a caller's session of a workspace's connector (of any of
// its connectors when connectorID is empty) on every replica, and returns
// what was closed. A session id is scoped to its workspace. The registry
// logs each session it closes.
func (s *Service) Close(ctx context.Context, workspaceID, connectorID, sessionID string) ([]registry.SessionInfo, error) {
	var closed []registry.SessionInfo
	var id int64
	if connectorID == "" {
		closed = s.d.Registry.CloseSession(workspaceID, sessionID, 0)
	} else {
		var held bool
		var err error
		if id, held, err = s.held(ctx, workspaceID, connectorID); err != nil {
			return nil, err
		}
		if held { // one the registry does not hold has no sessions
			closed = s.d.Registry.CloseSession(workspaceID, sessionID, id)
		}
		s.forgetUserToken(workspaceID, connectorID, id, sessionID)
	}
	// The session may be held by another replica: ask each, and forget
	// those whose replica is gone.
	err := s.eachPeer(ctx, "close", func(ctx context.Context, p Peer) error {
		theirs, err := p.Close(ctx, workspaceID, connectorID, sessionID)
		closed = append(closed, theirs...)
		return err
	})
	if err != nil {
		return nil, err
	}
	if s.d.Claims != nil {
		if _, err := s.d.Claims.DropOrphans(ctx, workspaceID, sessionID, id); err != nil {
			return nil, err
		}
	}
	return closed, nil
}

// eachPeer runs f on each other replica, within peerTimeout each; a
// replica that fails is logged and left out (one that just died: its
// sessions move to whoever the next call reaches). Only finding the
// replicas can fail it.
func (s *Service) eachPeer(ctx context.Context, what string, f func(context.Context, Peer) error) error {
	if s.d.Peers == nil {
		return nil
	}
	peers, err := s.d.Peers(ctx)
	if err != nil {
		return err
	}
	for _, p := range peers {
		pctx, cancel := context.WithTimeout(ctx, peerTimeout)
		err := f(pctx, p)
		cancel()
		if err != nil {
			s.d.Logger.WarnContext(ctx, "a replica did not "+what+" its sessions", slog.String("error", err.Error()))
		}
	}
	return nil
}

// forgetUserToken forgets the token of the user whose connection to
// connector id sessionID is, if it is an oauth_user connector's user
// connection.
func (s *Service) forgetUserToken(workspaceID, connectorID string, id int64, sessionID string) {
	user, ok := registry.SessionUser(sessionID)
	if s.d.Forget == nil || !ok || id == 0 {
		return
	}
	if row, ok := s.d.Live.Lookup(workspaceID, connectorID); ok && row.Config.AuthMode() != store.AuthUser {
		return // a per_session connector's caller session that happens to be named so
	}
	s.d.Forget(id, user)
}

// held returns the id of a workspace's connector and whether the registry
// holds it, as it does every active connector whose secrets opened. Only
// a connector it does not hold goes to the store.
func (s *Service) held(ctx context.Context, workspaceID, connectorID string) (int64, bool, error) {
	if id, ok := s.d.Registry.Lookup(workspaceID, connectorID); ok {
		return id, true, nil
	}
	row, err := s.d.Store.GetConnector(ctx, workspaceID, connectorID)
	if err != nil {
		return 0, false, err
	}
	return row.ID, false, nil
}
