// Command connector-svc serves the connector.v1.ConnectorService gRPC API:
// persistent MCP connectors stored in Postgres.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/oauth"
	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/store"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	var usage *usageError
	if errors.As(err, &usage) {
		fmt.Fprintf(os.Stderr, "connector-svc: %v\n\n%s", err, usage.usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "connector-svc: %v\n", err)
		os.Exit(1)
	}
}

// run is the whole program: main and the end-to-end tests call it. It
// returns when ctx is done (after a graceful stop) or on a start-up error.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	if len(args) > 0 && args[0] == "sleep" { // the chart's preStop hook (sleep.go): no settings, no database
		return runSleep(ctx, args[1:], stdout)
	}
	if dev := devCommand(args); dev != nil { // dev-model, dev-certs (devmodel.go): no service settings
		return dev(ctx, readDevConfig(getenv), stdout)
	}
	cfg, rest, err := parseConfig(args, getenv, stdout)
	if err != nil {
		return err
	}
	command := rest[0]
	if cfg.Version {
		_, err := fmt.Fprintln(stdout, readBuild())
		return err
	}
	if command == "keys" {
		return runKeys(ctx, cfg, rest[1:], stdout)
	}
	if command == "healthcheck" {
		return healthcheck(ctx, cfg, stdout)
	}
	// Errors of MCP connections carry their URLs: the handler redacts query values.
	logger := slog.New(secret.NewRedactingHandler(slog.NewJSONHandler(stdout, &slog.HandlerOptions{Level: cfg.LogLevel})))
	// Libraries that take no logger log through slog's default (mcp-go's
	// stdio transport does): make it the service's.
	defer slog.SetDefault(slog.Default())
	slog.SetDefault(logger)

	// A bad SECRET_KEY fails before any database work.
	box, err := secret.ParseKey(cfg.SecretKey)
	if err != nil {
		return err
	}
	var creds []grpc.ServerOption
	if command == "serve" {
		if creds, err = serverCreds(cfg, logger); err != nil {
			return err
		}
	}
	db, err := openDB(ctx, cfg.DatabaseURL, logger)
	if err != nil {
		return err
	}
	defer db.Close()
	switch command {
	case "migrate":
		logger.InfoContext(ctx, "migrations applied")
		return nil
	case "reseal":
		return reseal(ctx, db, box, logger)
	case "oauth":
		return runOAuth(ctx, cfg, db, box, rest[1], stdout)
	}
	if err := checkSecretKey(ctx, db, box); err != nil {
		return fmt.Errorf("%w\n\n%s", err, devSecretsHint(cfg.DatabaseURL))
	}
	keys := auth.NewKeys(db, auth.Config{OnFirstKey: func() { logFirstKey(ctx, cfg.Auth, logger) }}, logger)
	if err := keys.Load(ctx); err != nil {
		return err
	}
	if err := checkAuth(ctx, cfg, keys.Exist(), logger); err != nil {
		return err
	}
	if err := serve(ctx, cfg, db, box, keys, creds, logger); err != nil {
		return err
	}
	logger.Info("stopped")
	return nil
}

// logFirstKey says what the first API key, created while the service
// runs, changes for callers.
func logFirstKey(ctx context.Context, mode auth.Mode, logger *slog.Logger) {
	switch mode {
	case auth.ModeAuto:
		logger.InfoContext(ctx, "the first API key was created: API keys are now required (AUTH=auto); "+
			"calls without one fail with UNAUTHENTICATED", slog.String("auth", string(mode)))
	case auth.ModeKeys:
		logger.InfoContext(ctx, "the first API key was created: calls with it are now accepted (AUTH=keys)",
			slog.String("auth", string(mode)))
	default:
		logger.WarnContext(ctx, "an API key was created, but AUTH="+string(mode)+" asks callers for none; "+
			"restart with AUTH=auto or AUTH=keys to require keys", slog.String("auth", string(mode)))
	}
}

// openDB connects, creating the database if needed, and migrates. A
// refused connection says how to start Postgres; a malformed URL or a
// refused login says only what went wrong.
func openDB(ctx context.Context, url string, logger *slog.Logger) (*store.DB, error) {
	db, err := store.Open(ctx, url, logger)
	if err != nil && errors.Is(err, syscall.ECONNREFUSED) {
		return nil, fmt.Errorf("%w\n\nIs Postgres running, and is DATABASE_URL right? On a Debian machine start it with\n"+
			"  pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start\n"+
			"or point DATABASE_URL (or -database-url) at your server", err)
	}
	if err != nil {
		return nil, err
	}
	if err := db.Migrate(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// checkSecretKey fails start-up when stored secrets could not be used: no
// key, or a key that does not open them.
func checkSecretKey(ctx context.Context, db *store.DB, box *secret.Box) error {
	if err := oauth.CheckKey(ctx, db, box); err != nil {
		return fmt.Errorf("stored OAuth tokens: %w", err)
	}
	ws, id, sealed, err := db.AnySealedSecrets(ctx)
	if err != nil || sealed == nil {
		return err
	}
	if _, err := box.Open(sealed, live.SealContext(ws, id)); err != nil {
		if errors.Is(err, secret.ErrNoKey) {
			return fmt.Errorf("connector %q of workspace %q has encrypted headers or env values, but SECRET_KEY is not set; "+
				"set it to the key they were stored with", id, ws)
		}
		return fmt.Errorf("connector %q of workspace %q: %w", id, ws, err)
	}
	return nil
}

// devSecretsHint says how to get past stored secrets that do not open,
// in development: `make run` takes SECRET_KEY from .dev/secret_key.
func devSecretsHint(databaseURL string) string {
	name := "connector_svc"
	if u, err := url.Parse(databaseURL); err == nil && strings.Trim(u.Path, "/") != "" {
		name = strings.Trim(u.Path, "/")
	}
	return "In development (make run), SECRET_KEY comes from .dev/secret_key: restore that file (or set SECRET_KEY to the key\n" +
		"the secrets were sealed with), or start afresh by dropping the development database, which deletes its\n" +
		"connectors and keys:\n" +
		"  psql -h 127.0.0.1 -U postgres -c 'DROP DATABASE " + name + "'"
}

// reseal seals every stored secret again under the first SECRET_KEY, so
// that the keys after it can be retired.
func reseal(ctx context.Context, db *store.DB, box *secret.Box, logger *slog.Logger) error {
	if box == nil {
		return errors.New("reseal needs SECRET_KEY: the new key first, then the old ones (SECRET_KEY=new,old)")
	}
	n, err := db.ResealSecrets(ctx, func(ws, id string, sealed []byte) ([]byte, error) {
		resealed, err := box.Reseal(sealed, live.SealContext(ws, id))
		if err != nil {
			return nil, fmt.Errorf("connector %q of workspace %q: %w", id, ws, err)
		}
		return resealed, nil
	})
	if err != nil {
		return fmt.Errorf("reseal: %w; nothing was changed", err)
	}
	tokens, err := oauth.Reseal(ctx, db, box)
	if err != nil {
		return fmt.Errorf("reseal OAuth tokens and clients: %w; the connectors' secrets were resealed, run reseal again", err)
	}
	logger.InfoContext(ctx, "secrets resealed under the first SECRET_KEY", slog.Int("connectors", n), slog.Int("oauth_values", tokens))
	return nil
}

// runSweepInterval is how often the leader expires paused runs, fails
// runs whose replica stopped and purges old runs; runStaleAfter, how old a
// resumed run's heartbeat may be before it counts as abandoned (its holder
// touches it every 10 s). A run whose replica died fails within 40 s.
const (
	runSweepInterval = 10 * time.Second
	runStaleAfter    = 30 * time.Second
)

// listenInterval is how often the listening connection makes a round trip
// when no API key cache needs it more often: a dead connection is noticed
// within it.
const listenInterval = 5 * time.Second

// inUse says what a listen that failed with "address already in use"
// most likely means; setting is where to give another address.
func inUse(err error, setting string) error {
	if !errors.Is(err, syscall.EADDRINUSE) {
		return err
	}
	return fmt.Errorf("%w: another connector-svc is probably running there; stop it, or set %s to a free address", err, setting)
}
