package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"

	"github.com/connector-svc/connector-svc/internal/auth"
)

// checkAuth refuses to serve without authentication on an address other
// hosts can reach, and says at start-up who may call. Mutual TLS counts as
// authentication: only holders of a client certificate get in.
func checkAuth(ctx context.Context, cfg config, keysExist bool, logger *slog.Logger) error {
	loopback, err := isLoopback(cfg.GRPCAddr)
	if err != nil {
		return fmt.Errorf("GRPC_ADDR %s: %w", cfg.GRPCAddr, err)
	}
	const create = "connector-svc keys create --workspace <workspace> --scope admin"
	switch {
	case cfg.Auth == auth.ModeKeys && !keysExist:
		logger.WarnContext(ctx, "AUTH=keys and no API key exists: every call is refused until one is created with: "+create)
	case cfg.Auth.Guarded() && (cfg.Auth == auth.ModeKeys || keysExist):
		logger.InfoContext(ctx, "API keys required", slog.String("auth", string(cfg.Auth)))
	case cfg.Auth == auth.ModeNoneAnyAddress:
		logger.WarnContext(ctx, "serving WITHOUT authentication on any address (AUTH=none-any-address): "+
			"whoever reaches "+cfg.GRPCAddr+" may run commands on this host through stdio connectors")
	case cfg.TLSClientCAFile != "":
		logger.WarnContext(ctx, "no API keys: callers are authenticated by their client certificates only (TLS_CLIENT_CA_FILE), "+
			"and each may do everything, in every workspace; create keys to scope them: "+create)
	case !loopback:
		return fmt.Errorf("refusing to serve without authentication on GRPC_ADDR %s, which is not a loopback address: "+
			"whoever reaches it could create stdio connectors, which run commands on this host. Either create an API key "+
			"first (`%s`; callers then send `authorization: Bearer <key>`), or set AUTH=keys, or serve on a loopback "+
			"address (127.0.0.1), or, only behind something else that authenticates callers, set AUTH=none-any-address",
			cfg.GRPCAddr, create)
	default:
		msg := "serving without authentication, on loopback only: create an API key to turn it on (" + create + ")"
		if cfg.Auth == auth.ModeNone {
			msg = "serving without authentication (AUTH=none), on loopback only"
		}
		logger.WarnContext(ctx, msg, slog.String("auth", string(cfg.Auth)))
	}
	return nil
}

// isLoopback reports whether addr (host:port) listens on a loopback
// address only, as net.Listen would resolve it. An empty host means every
// interface.
func isLoopback(addr string) (bool, error) {
	a, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return false, err
	}
	return a.IP != nil && a.IP.IsLoopback(), nil
}
