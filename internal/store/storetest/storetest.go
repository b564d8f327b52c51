// Package storetest gives each test its own migrated Postgres database,
// cloned from a template that is migrated once per test binary.
//
// The server is TEST_DATABASE_URL (default: postgres as user postgres on
// 127.0.0.1:5432). When it cannot be reached the tests skip with a loud
// message, except under CI=true, where they fail.
package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/connector-svc/connector-svc/internal/loudskip"
	"github.com/connector-svc/connector-svc/internal/store"
)

// DefaultAdminURL is the server tests use when TEST_DATABASE_URL is unset.
const DefaultAdminURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable&connect_timeout=5"

var template struct {
	once sync.Once
	name string
	err  error
}

// Main runs the package's tests and then drops the template database. Call it
// from TestMain: os.Exit(storetest.Main(m)).
func Main(m *testing.M) int {
	code := m.Run()
	if template.name != "" {
		if err := dropDatabase(context.Background(), template.name); err != nil {
			fmt.Fprintf(os.Stderr, "storetest: drop template: %v\n", err)
		}
	}
	return code
}

// AdminURL is the connection string of the test server's postgres database.
func AdminURL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultAdminURL
}

// NewURL creates a fresh migrated database for t, dropped when t ends, and
// returns its connection string.
func NewURL(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	template.once.Do(func() { template.name, template.err = createTemplate(ctx) })
	if template.err != nil {
		unavailable(t, template.err)
	}
	name := "cs_test_" + randomSuffix()
	if err := adminExec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", name, template.name)); err != nil {
		t.Fatalf("storetest: create database: %v", err)
	}
	DropOnCleanup(t, name)
	u, err := withDatabase(name)
	if err != nil {
		t.Fatalf("storetest: %v", err)
	}
	return u
}

// NewDB returns a store on a fresh migrated database, closed when t ends.
func NewDB(t testing.TB) *store.DB {
	t.Helper()
	db, err := store.Open(context.Background(), NewURL(t), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("storetest: open: %v", err)
	}
	t.Cleanup(db.Close)
	return db
}

// DropOnCleanup drops the database name on the test server when t ends.
func DropOnCleanup(t testing.TB, name string) {
	t.Cleanup(func() {
		if err := dropDatabase(context.Background(), name); err != nil {
			t.Errorf("storetest: drop database %s: %v", name, err)
		}
	})
}

// unavailable fails under CI and skips loudly elsewhere.
func unavailable(t testing.TB, err error) {
	t.Helper()
	msg := fmt.Sprintf("storetest: Postgres is not available (%v); start it with "+
		"`pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start` or set TEST_DATABASE_URL", err)
	loudskip.Skip(t, msg)
}

func createTemplate(ctx context.Context) (string, error) {
	name := "cs_template_" + randomSuffix()
	if err := adminExec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", err
	}
	u, err := withDatabase(name)
	if err != nil {
		return "", err
	}
	db, err := store.Open(ctx, u, nil)
	if err == nil {
		err = migrateAndClose(ctx, db, name)
	}
	if err != nil {
		_ = dropDatabase(ctx, name)
		return "", err
	}
	return name, nil
}

func migrateAndClose(ctx context.Context, db *store.DB, name string) error {
	defer db.Close()
	if err := db.Migrate(ctx); err != nil {
		return fmt.Errorf("migrate template %s: %w", name, err)
	}
	return nil
}

// withDatabase is AdminURL with its database replaced.
func withDatabase(database string) (string, error) {
	u, err := url.Parse(AdminURL())
	if err != nil || u.Scheme == "" {
		return "", fmt.Errorf("TEST_DATABASE_URL must be a postgres:// URL")
	}
	u.Path = "/" + database
	return u.String(), nil
}

func adminExec(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

func dropDatabase(ctx context.Context, name string) error {
	return adminExec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
}

func randomSuffix() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
