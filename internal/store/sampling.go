package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// A connector's sampling is counted per minute in one row per minute (see
// migration 013), so that its per-minute limits hold over all replicas: a
// request takes one request and its tokens from the row in one statement,
// only while both stay within the limits, so concurrent replicas never
// both take the last one. Minutes come from the replicas' clocks.

// SamplingMinute is a connector's sampling in one minute, over all
// replicas.
type SamplingMinute struct {
	Minute   time.Time // the minute's start, UTC
	Requests int
	Tokens   int64 // reserved by requests in flight, used by answered ones
}

// reserveSampling takes one request and $3 tokens from connector $1's row
// of minute $2, creating it, while that leaves at most $4 requests and $5
// tokens; it drops the connector's rows of more than a day before.
const reserveSampling = `
	WITH pruned AS (DELETE FROM sampling_usage WHERE connector_id = $1 AND minute < $2::timestamptz - interval '1 day')
	INSERT INTO sampling_usage AS u (connector_id, minute, requests, tokens)
		SELECT $1, $2::timestamptz, 1, $3::bigint WHERE $4::integer >= 1 AND $3::bigint <= $5::bigint
	ON CONFLICT (connector_id, minute) DO UPDATE SET requests = u.requests + 1, tokens = u.tokens + $3::bigint
		WHERE u.requests < $4::integer AND u.tokens + $3::bigint <= $5::bigint
	RETURNING requests, tokens`

// ReserveSampling takes one request and tokens tokens from connector id's
// sampling in the minute of at, unless the minute would then have more
// than maxRequests requests or maxTokens tokens. It returns whether it
// took them, and the minute's use: after the reservation if taken, as it
// stands if not (to say which limit refused).
func (db *DB) ReserveSampling(ctx context.Context, id int64, at time.Time, tokens, maxRequests, maxTokens int) (SamplingMinute, bool, error) {
	m := SamplingMinute{Minute: at.UTC().Truncate(time.Minute)}
	err := db.pool.QueryRow(ctx, reserveSampling, id, m.Minute, int64(tokens), maxRequests, int64(maxTokens)).Scan(&m.Requests, &m.Tokens)
	if err == nil {
		return m, true, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return m, false, fmt.Errorf("reserve sampling of connector %d: %w", id, err)
	}
	m, err = db.SamplingUse(ctx, id, at)
	return m, false, err
}

// SettleSampling adds delta tokens (negative: gives them back) to
// connector id's sampling in minute: a reservation replaced by the tokens
// used.
func (db *DB) SettleSampling(ctx context.Context, id int64, minute time.Time, delta int) error {
	if delta == 0 {
		return nil
	}
	_, err := db.pool.Exec(ctx, `UPDATE sampling_usage SET tokens = greatest(0, tokens + $3) WHERE connector_id = $1 AND minute = $2`,
		id, minute.UTC().Truncate(time.Minute), int64(delta))
	if err != nil {
		return fmt.Errorf("settle sampling of connector %d: %w", id, err)
	}
	return nil
}

// SamplingUse returns connector id's sampling in the minute of at.
func (db *DB) SamplingUse(ctx context.Context, id int64, at time.Time) (SamplingMinute, error) {
	m := SamplingMinute{Minute: at.UTC().Truncate(time.Minute)}
	err := db.pool.QueryRow(ctx, `SELECT requests, tokens FROM sampling_usage WHERE connector_id = $1 AND minute = $2`,
		id, m.Minute).Scan(&m.Requests, &m.Tokens)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return m, fmt.Errorf("read the sampling of connector %d: %w", id, err)
	}
	return m, nil
}
