package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// A rate bucket is the one shared token bucket of a connector whose
// rate_limit the replicas enforce exactly (see migration 009): one row,
// refilled at rate per second up to burst for the time since it was last
// taken from, and taken from in one statement, so concurrent replicas
// never take the same token. Times come from the replicas' clocks: a
// replica behind the last writer sees no refill, never a negative one,
// and moves updated_at only forward.

// bucketLevel is the tokens of rate bucket b at $4: its tokens refilled at
// $2 per second since updated_at, capped at the burst $3.
const bucketLevel = `least($3::float8, b.tokens + $2::float8 *
	greatest(0, extract(epoch FROM ($4::timestamptz - b.updated_at)))::float8)`

// takeToken takes a token from connector $1's bucket at $4, creating it
// full on first use; when $5 is false, only if one is there.
const takeToken = `
	INSERT INTO rate_buckets AS b (connector_id, tokens, updated_at) VALUES ($1, $3::float8 - 1, $4)
	ON CONFLICT (connector_id) DO UPDATE SET
		tokens = ` + bucketLevel + ` - 1,
		updated_at = greatest(b.updated_at, $4)
	WHERE $5 OR ` + bucketLevel + ` >= 1
	RETURNING tokens`

// TakeRateToken takes one token at at from connector id's shared bucket,
// which refills at rate tokens per second up to burst (at least 1) and
// starts full, if one is there. Returns whether it took one and, if so,
// the tokens left.
func (db *DB) TakeRateToken(ctx context.Context, id int64, rate float64, burst int, at time.Time) (taken bool, left float64, err error) {
	err = db.pool.QueryRow(ctx, takeToken, id, rate, max(burst, 1), at, false).Scan(&left)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, 0, nil
	}
	if err != nil {
		return false, 0, fmt.Errorf("take a rate token of connector %d: %w", id, err)
	}
	return true, left, nil
}

// OweRateToken takes one token at at from connector id's shared bucket
// whether or not one is there, leaving it in debt (below zero) if not:
// for a query's tool call that runs rather than wait past its deadline.
// Returns the tokens left.
func (db *DB) OweRateToken(ctx context.Context, id int64, rate float64, burst int, at time.Time) (left float64, err error) {
	if err := db.pool.QueryRow(ctx, takeToken, id, rate, max(burst, 1), at, true).Scan(&left); err != nil {
		return 0, fmt.Errorf("owe a rate token of connector %d: %w", id, err)
	}
	return left, nil
}

// RateTokens returns the tokens at at in connector id's shared bucket
// (refilled at rate per second up to burst): how long to wait for the next
// one. A bucket not used yet is full.
func (db *DB) RateTokens(ctx context.Context, id int64, rate float64, burst int, at time.Time) (float64, error) {
	var tokens float64
	err := db.pool.QueryRow(ctx, `SELECT `+bucketLevel+` FROM rate_buckets b WHERE connector_id = $1`,
		id, rate, max(burst, 1), at).Scan(&tokens)
	if errors.Is(err, pgx.ErrNoRows) {
		return float64(max(burst, 1)), nil
	}
	if err != nil {
		return 0, fmt.Errorf("read the rate tokens of connector %d: %w", id, err)
	}
	return tokens, nil
}
