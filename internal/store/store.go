// Package store owns the service's Postgres database: the pgx pool, the schema
// migrations, and the SQL for connectors, their tools and API keys. It
// returns its own types and sentinel errors and knows nothing of gRPC, MCP or
// encryption: secrets arrive already sealed and leave still sealed, and API
// keys arrive already hashed.
package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/tern/v2/migrate"

	"github.com/connector-svc/connector-svc/migrations"
)

var (
	// ErrNotFound means the row does not exist (in that workspace).
	ErrNotFound = errors.New("not found")
	// ErrConnectorNotFound is ErrNotFound for a connector.
	ErrConnectorNotFound = fmt.Errorf("connector %w", ErrNotFound)
	// ErrToolNotFound is ErrNotFound for a tool of an existing connector.
	ErrToolNotFound = fmt.Errorf("tool %w", ErrNotFound)
	// ErrConflict means a unique key is taken.
	ErrConflict = errors.New("already exists")
)

// defaultConnectTimeout bounds connecting when DATABASE_URL sets none, so an
// unreachable server fails start-up in seconds instead of hanging.
const defaultConnectTimeout = 5 * time.Second

// DB is the service's database. Safe for concurrent use.
type DB struct {
	pool   *pgxpool.Pool
	logger *slog.Logger
}

// Open connects to the database named by databaseURL, creating the database
// first if the server exists but the database does not. It does not migrate.
func Open(ctx context.Context, databaseURL string, logger *slog.Logger) (*DB, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		// pgx's parse errors can echo the URL, password included.
		return nil, errors.New("parse database URL: not a valid postgres:// URL or key=value string")
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = defaultConnectTimeout
	}
	if err := ensureDatabase(ctx, cfg.ConnConfig, logger); err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open pool: %w", err)
	}
	return &DB{pool: pool, logger: logger}, nil
}

// ensureDatabase connects once to check the server and database; if the
// database is missing, it creates it through the server's "postgres" database.
func ensureDatabase(ctx context.Context, cfg *pgx.ConnConfig, logger *slog.Logger) error {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err == nil {
		return conn.Close(ctx)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "3D000" { // invalid_catalog_name
		return fmt.Errorf("connect to Postgres at %s:%d as %q: %w", cfg.Host, cfg.Port, cfg.User, err)
	}
	admin := cfg.Copy()
	admin.Database = "postgres"
	conn, err = pgx.ConnectConfig(ctx, admin)
	if err != nil {
		return fmt.Errorf("connect to Postgres at %s:%d to create database %q: %w", cfg.Host, cfg.Port, cfg.Database, err)
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{cfg.Database}.Sanitize())
	if err != nil && !isCode(err, "42P04") { // duplicate_database: another process won the race
		return fmt.Errorf("create database %q: %w", cfg.Database, err)
	}
	logger.InfoContext(ctx, "created database", slog.String("database", cfg.Database))
	return nil
}

// Close closes the pool, waiting for acquired connections. Safe to call twice.
func (db *DB) Close() { db.pool.Close() }

// Ping checks that the database answers.
func (db *DB) Ping(ctx context.Context) error { return db.pool.Ping(ctx) }

// Migrate applies the embedded migrations that have not been applied yet.
// Concurrent callers are serialized by an advisory lock; a second run is a
// no-op.
func (db *DB) Migrate(ctx context.Context) error {
	conn, err := db.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer conn.Release()
	m, err := migrate.NewMigrator(ctx, conn.Conn(), "schema_version")
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if err := m.LoadMigrations(migrations.FS); err != nil {
		return fmt.Errorf("migrate: load: %w", err)
	}
	m.OnStart = func(seq int32, name, _, _ string) {
		db.logger.InfoContext(ctx, "applying migration", slog.Int("sequence", int(seq)), slog.String("name", name))
	}
	if err := m.Migrate(ctx); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

// InTx runs fn in a transaction, committing if fn returns nil and rolling
// back otherwise.
func (db *DB) InTx(ctx context.Context, fn func(pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, db.pool, pgx.TxOptions{}, fn)
}

// translate turns driver errors into the package's sentinels, once, at the
// edge of each query; pgx.ErrNoRows becomes notFound.
// ConnectorNotFoundError names the connector a lookup by workspace and
// connector id did not find. It Is ErrConnectorNotFound (and ErrNotFound).
type ConnectorNotFoundError struct{ WorkspaceID, ConnectorID string }

func (e *ConnectorNotFoundError) Error() string {
	return fmt.Sprintf("connector %q not found in workspace %q", e.ConnectorID, e.WorkspaceID)
}

// Is makes the error match ErrConnectorNotFound and ErrNotFound.
func (e *ConnectorNotFoundError) Is(target error) bool {
	return target == ErrConnectorNotFound || target == ErrNotFound
}

func connectorNotFound(workspaceID, connectorID string) error {
	return &ConnectorNotFoundError{WorkspaceID: workspaceID, ConnectorID: connectorID}
}

func translate(err error, notFound error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, pgx.ErrNoRows):
		return notFound
	case isCode(err, "23505"): // unique_violation
		return ErrConflict
	default:
		return err
	}
}

func isCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}
