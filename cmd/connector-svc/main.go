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
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/connector-svc/connector-svc/internal/llm"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/server"
	"github.com/connector-svc/connector-svc/internal/store"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "connector-svc: %v\n", err)
		os.Exit(1)
	}
}

// run is the whole program: main and the end-to-end tests call it. It
// returns when ctx is done (after a graceful stop) or on a start-up error.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	cfg, rest, err := parseConfig(args, getenv, stdout)
	if err != nil {
		return err
	}
	command := "serve"
	if len(rest) > 0 {
		command = rest[0]
	}
	if len(rest) > 1 || (command != "serve" && command != "migrate") {
		return fmt.Errorf("unknown command %q: want serve or migrate", rest)
	}
	logger := slog.New(slog.NewJSONHandler(stdout, &slog.HandlerOptions{Level: cfg.LogLevel}))

	db, err := openDB(ctx, cfg.DatabaseURL, logger)
	if err != nil {
		return err
	}
	defer db.Close()
	if command == "migrate" {
		logger.InfoContext(ctx, "migrations applied")
		return nil
	}
	box, err := secret.ParseKey(cfg.SecretKey)
	if err != nil {
		return err
	}
	if err := checkSecretKey(ctx, db, box); err != nil {
		return err
	}
	if err := serve(ctx, cfg, db, box, logger); err != nil {
		return err
	}
	logger.Info("stopped")
	return nil
}

// openDB connects, creating the database if needed, and migrates.
func openDB(ctx context.Context, url string, logger *slog.Logger) (*store.DB, error) {
	db, err := store.Open(ctx, url, logger)
	if err != nil {
		return nil, fmt.Errorf("%w\n\nIs Postgres running, and is DATABASE_URL right? On a Debian machine start it with\n"+
			"  pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start\n"+
			"or run `docker compose up -d postgres`, or point DATABASE_URL (or -database-url) at your server", err)
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
	ws, id, sealed, err := db.AnySealedSecrets(ctx)
	if err != nil || sealed == nil {
		return err
	}
	if _, err := box.Open(sealed, server.SealContext(ws, id)); err != nil {
		if errors.Is(err, secret.ErrNoKey) {
			return fmt.Errorf("connector %q of workspace %q has encrypted headers or env values, but SECRET_KEY is not set; "+
				"set it to the key they were stored with", id, ws)
		}
		return fmt.Errorf("connector %q of workspace %q: %w", id, ws, err)
	}
	return nil
}

// serve runs the registry and the gRPC server until ctx is done, then
// drains gRPC and only then closes the MCP connections.
func serve(ctx context.Context, cfg config, db *store.DB, box *secret.Box, logger *slog.Logger) error {
	reg := registry.New(server.NewSource(db, box, logger), registry.Config{
		HealthInterval: cfg.HealthInterval,
		Concurrency:    cfg.HealthConcurrency,
	}, logger)
	if err := reg.Load(ctx); err != nil {
		return err
	}
	agent, err := newAgent(cfg, reg, logger)
	if err != nil {
		return err
	}
	srv := server.New(server.Deps{DB: db, Box: box, Registry: reg, Agent: agent, Logger: logger}, server.Config{
		StdioAllowedCommands: cfg.StdioAllowedCommands,
		DefaultRPCTimeout:    cfg.RPCTimeout,
		QueryTimeout:         cfg.QueryTimeout,
	})
	g, hs := server.NewGRPCServer(srv)
	lis, err := net.Listen("tcp", cfg.GRPCAddr)
	if err != nil {
		return fmt.Errorf("listen on GRPC_ADDR %s: %w", cfg.GRPCAddr, err)
	}
	regCtx, stopRegistry := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRegistry()
	regDone := make(chan error, 1)
	go func() { regDone <- reg.Run(regCtx) }()
	defer func() {
		stopRegistry()
		if err := <-regDone; err != nil {
			logger.Error("registry", slog.String("error", err.Error()))
		}
	}()
	server.SetServing(hs, true)
	logger.InfoContext(ctx, "serving", slog.String("addr", lis.Addr().String()),
		slog.Bool("secret_key_set", box != nil), slog.Any("stdio_allowed_commands", cfg.StdioAllowedCommands))

	eg, ctx := errgroup.WithContext(ctx)
	eg.Go(func() error { return g.Serve(lis) })
	eg.Go(func() error {
		<-ctx.Done()
		server.SetServing(hs, false)
		logger.Info("shutting down", slog.String("grace", cfg.ShutdownGrace.String()))
		stopGracefully(g, cfg.ShutdownGrace)
		return nil
	})
	if err := eg.Wait(); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// newAgent returns the connector agent, or nil when no LLM is configured:
// then the query RPCs refuse and everything else works.
func newAgent(cfg config, reg *registry.Registry, logger *slog.Logger) (*orchestrator.Agent, error) {
	model, err := llm.New(llm.Config{BaseURL: cfg.LLMBaseURL, APIKey: cfg.LLMAPIKey, Model: cfg.LLMModel})
	if errors.Is(err, llm.ErrNotConfigured) {
		logger.Info("no LLM configured: QueryConnector and StreamQueryConnector are disabled; set LLM_BASE_URL and LLM_MODEL")
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	logger.Info("LLM configured", slog.String("base_url", cfg.LLMBaseURL), slog.String("model", cfg.LLMModel),
		slog.Bool("api_key_set", cfg.LLMAPIKey != ""))
	return orchestrator.New(model, reg, orchestrator.Config{}, logger), nil
}

// stopGracefully lets in-flight RPCs finish within grace, then cuts the rest.
func stopGracefully(g *grpc.Server, grace time.Duration) {
	done := make(chan struct{})
	go func() {
		g.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(grace):
		g.Stop()
		<-done
	}
}
