package live

import (
	"context"

	"google.golang.org/grpc"

	"github.com/connector-svc/connector-svc/internal/store"
)

// Where a call runs is decided here, once, for every front door: a front
// door asks Place (or PlaceRun for a paused run) and either serves the
// call itself or hands it, one hop, to the replica Place names. The
// caller's session and user ids are checked here too, once per call and
// replica, before any session is claimed for them: the use cases behind a
// front door (calls, queries) take them as checked.

// Target is what a call, a query, or an answer to one names.
type Target struct {
	WorkspaceID, ConnectorID string
	// SessionID and UserID are the caller's session (per_session
	// connectors) and end user (oauth_user connectors): the call runs on
	// the replica that holds that session's, or that user's, connection.
	SessionID, UserID string
	// OwnerOnly sends the call to the connector's owner whatever its
	// transport: refreshes and checks, which the owner alone runs; their
	// caller ids are not checked.
	OwnerOnly bool
}

// CallerCheck checks a call's session and user ids against its
// connector's row: the session id's form, and for an oauth_user
// connector the user id, which it requires. Its error is Place's, as the
// front door maps it.
type CallerCheck func(row *store.Connector, sessionID, userID string) error

// RunReader reads a paused run's row: PlaceRun routes its resume as its
// calls were.
type RunReader interface {
	GetRun(ctx context.Context, workspaceID, id string) (*store.Run, error)
}

// Placer decides where calls run. A nil *Placer, or one without a router
// (a single replica), places every call here. Safe for concurrent use.
type Placer struct {
	conns    *Connectors
	router   *Router   // nil: a single replica, nothing to forward
	sessions *Sessions // nil: sessions are this replica's alone
	runs     RunReader
	check    CallerCheck // nil: no check
}

// NewPlacer places calls of conns' connectors by router's ownership and
// sessions' claims, their caller ids checked by check; runs reads paused
// runs. router and sessions may be nil (a single replica).
func NewPlacer(conns *Connectors, router *Router, sessions *Sessions, runs RunReader, check CallerCheck) *Placer {
	return &Placer{conns: conns, router: router, sessions: sessions, runs: runs, check: check}
}

// Place returns the connection to the replica t's call runs on, or nil to
// run it here: this replica owns what the call needs, the connector is
// not active here (the call then fails here as it should), or the call
// was forwarded here already. A stdio connector's calls run on its owner
// (the one replica that runs its processes, its sessions' included); with
// OwnerOnly, every connector's. A per_session connector's call with a
// session, or an oauth_user connector's call for a user, otherwise runs
// on the replica that holds that session's (that user's) connection.
// Unless OwnerOnly, the caller's ids are checked first, a single replica
// too: the check's error is Place's.
func (p *Placer) Place(ctx context.Context, t Target) (*grpc.ClientConn, error) {
	if p == nil || p.conns == nil {
		return nil, nil
	}
	if p.router == nil && (t.OwnerOnly || p.check == nil) {
		return nil, nil
	}
	row, ok := p.conns.LookupOrLearn(ctx, t.WorkspaceID, t.ConnectorID)
	if !ok || !row.Active {
		return nil, nil
	}
	if !t.OwnerOnly && p.check != nil {
		if err := p.check(row, t.SessionID, t.UserID); err != nil {
			return nil, err
		}
	}
	if p.router == nil {
		return nil, nil
	}
	conn, err := p.router.ToOwner(ctx, row, t.OwnerOnly)
	if err != nil || conn != nil || t.OwnerOnly {
		return conn, err
	}
	return p.sessions.Route(ctx, row, SessionKey(row, t.SessionID, t.UserID))
}

// PlaceRun is Place for the resume of a paused run: resuming a stdio
// connector's run runs its tool calls on the owner, and a run held live
// for input is resumed where its session (or user) is held. A run that is
// not found is resumed here, which says so. The run's ids, checked when
// it started, are checked again only where there is a choice of replica.
func (p *Placer) PlaceRun(ctx context.Context, workspaceID, runID string) (*grpc.ClientConn, error) {
	if p == nil || p.router == nil || workspaceID == "" || runID == "" {
		return nil, nil
	}
	run, err := p.runs.GetRun(ctx, workspaceID, runID)
	if err != nil {
		return nil, nil
	}
	return p.Place(ctx, Target{WorkspaceID: workspaceID, ConnectorID: run.ConnectorExternalID,
		SessionID: run.SessionID, UserID: run.UserID})
}

// Settle drops the claim of t's session that a call served here left
// unopened (it was refused before it ran).
func (p *Placer) Settle(t Target) {
	if p == nil || p.sessions == nil || (t.SessionID == "" && t.UserID == "") {
		return
	}
	if row, ok := p.conns.Lookup(t.WorkspaceID, t.ConnectorID); ok {
		p.sessions.Settle(row, SessionKey(row, t.SessionID, t.UserID))
	}
}
