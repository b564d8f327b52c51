package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrSessionCap means a connector has as many sessions, across replicas,
// as it may have.
var ErrSessionCap = errors.New("the connector has the most sessions it may have")

// SessionClaim is the outcome of ClaimSession.
type SessionClaim struct {
	// Owner is the replica that owns the session now, and OwnerAddr its
	// internal address; Owner is the claimer when it won.
	Owner, OwnerAddr string
	// Previous is the owner the claimer took the session over from (""
	// for a new session or one already its own), and SealedHandle the MCP
	// session it recorded, if any.
	Previous     string
	SealedHandle []byte
	// OpenedAt is when the caller's session was first opened, on
	// whichever replica: a session taken over keeps it.
	OpenedAt time.Time
}

// ClaimSession makes replica the owner of a caller's session of connector
// id, unless another live replica owns it: a new session (at most max per
// connector; ErrSessionCap beyond), one whose owner left or died, or one it
// owns already. Otherwise the claim names the live owner, for forwarding;
// with force it takes the session from a live owner too (a stdio
// connector's sessions follow the connector's owner).
func (db *DB) ClaimSession(ctx context.Context, id int64, sessionID, workspaceID, replica string, max int, force bool) (SessionClaim, error) {
	for range 3 { // a claim lost to a concurrent one reads again
		var owner, addr *string
		var live bool
		var sealed []byte
		var opened time.Time
		err := db.pool.QueryRow(ctx, `
			SELECT s.replica_id, r.internal_addr, coalesce(r.expires_at > now(), false), s.sealed_handle, s.opened_at
			FROM sessions s LEFT JOIN replicas r ON r.id = s.replica_id
			WHERE s.connector_id = $1 AND s.session_id = $2`, id, sessionID).Scan(&owner, &addr, &live, &sealed, &opened)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			tag, err := db.pool.Exec(ctx, `
				INSERT INTO sessions (connector_id, session_id, workspace_id, replica_id)
				SELECT $1, $2, $3, $4 WHERE (SELECT count(*) FROM sessions WHERE connector_id = $1) < $5
				ON CONFLICT (connector_id, session_id) DO NOTHING`, id, sessionID, workspaceID, replica, max)
			if err != nil {
				return SessionClaim{}, fmt.Errorf("claim session: %w", err)
			}
			if tag.RowsAffected() == 1 {
				return SessionClaim{Owner: replica}, nil
			}
			var n int
			if err := db.pool.QueryRow(ctx, `SELECT count(*) FROM sessions WHERE connector_id = $1`, id).Scan(&n); err != nil {
				return SessionClaim{}, fmt.Errorf("claim session: %w", err)
			}
			if n >= max {
				return SessionClaim{}, ErrSessionCap
			}
			continue
		case err != nil:
			return SessionClaim{}, fmt.Errorf("claim session: %w", err)
		case owner != nil && *owner == replica:
			return SessionClaim{Owner: replica, SealedHandle: sealed}, nil
		case owner != nil && live && !force:
			return SessionClaim{Owner: *owner, OwnerAddr: deref(addr)}, nil
		}
		tag, err := db.pool.Exec(ctx, `
			UPDATE sessions SET replica_id = $3, claimed_at = now()
			WHERE connector_id = $1 AND session_id = $2 AND replica_id IS NOT DISTINCT FROM $4`,
			id, sessionID, replica, owner)
		if err != nil {
			return SessionClaim{}, fmt.Errorf("take over session: %w", err)
		}
		if tag.RowsAffected() == 1 {
			return SessionClaim{Owner: replica, Previous: cmpOr(deref(owner), "(left)"), SealedHandle: sealed, OpenedAt: opened}, nil
		}
	}
	return SessionClaim{}, errors.New("claim session: lost three races in a row")
}

// SetSessionHandle records the sealed MCP session the owner opened for a
// caller's session.
func (db *DB) SetSessionHandle(ctx context.Context, id int64, sessionID, replica string, sealed []byte) error {
	_, err := db.pool.Exec(ctx, `UPDATE sessions SET sealed_handle = $4
		WHERE connector_id = $1 AND session_id = $2 AND replica_id = $3`, id, sessionID, replica, sealed)
	if err != nil {
		return fmt.Errorf("record session handle: %w", err)
	}
	return nil
}

// DropSession forgets a caller's session its owner closed.
func (db *DB) DropSession(ctx context.Context, id int64, sessionID, replica string) error {
	_, err := db.pool.Exec(ctx, `DELETE FROM sessions WHERE connector_id = $1 AND session_id = $2 AND replica_id = $3`,
		id, sessionID, replica)
	if err != nil {
		return fmt.Errorf("forget session: %w", err)
	}
	return nil
}

// DropOrphanSessions forgets a workspace's sessions with that id whose
// owner is no longer live (of connector id, or of any connector when id is
// 0), and returns how many.
func (db *DB) DropOrphanSessions(ctx context.Context, workspaceID, sessionID string, id int64) (int64, error) {
	tag, err := db.pool.Exec(ctx, `DELETE FROM sessions s WHERE s.workspace_id = $1 AND s.session_id = $2
		AND ($3 = 0 OR s.connector_id = $3)
		AND NOT EXISTS (SELECT 1 FROM replicas r WHERE r.id = s.replica_id AND r.expires_at > now())`, workspaceID, sessionID, id)
	if err != nil {
		return 0, fmt.Errorf("forget sessions: %w", err)
	}
	return tag.RowsAffected(), nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// ExpireFreeSessions forgets the sessions nobody holds (their replica
// stopped) that nobody took over within idle: they would have closed by
// now anyway. Returns how many.
func (db *DB) ExpireFreeSessions(ctx context.Context, idle time.Duration) (int64, error) {
	tag, err := db.pool.Exec(ctx, `DELETE FROM sessions WHERE replica_id IS NULL AND claimed_at < now() - $1::interval`, idle)
	if err != nil {
		return 0, fmt.Errorf("expire free sessions: %w", err)
	}
	return tag.RowsAffected(), nil
}
