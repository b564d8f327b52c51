package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/mcpserve"
	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/tlsfiles"
)

// mcpConfig is the MCP endpoint's listener (MCP_ADDR; off by default).
type mcpConfig struct {
	Addr           string
	AllowedOrigins []string
	MaxBodyBytes   int64
	RateLimit      float64
	RateBurst      int
}

func mcpFlags(fs *flag.FlagSet, cfg *mcpConfig, origins *string) {
	fs.StringVar(&cfg.Addr, "mcp-addr", "",
		"address to serve the connectors over MCP (streamable HTTP, /mcp/<workspace>[/<connector>]) on; empty is off. "+
			"A non-loopback address needs TLS_CERT_FILE and API keys (MCP_ADDR)")
	fs.StringVar(origins, "mcp-allowed-origins", "",
		"comma-separated Origin values browsers' requests may carry besides the endpoint's own (MCP_ALLOWED_ORIGINS)")
	fs.Int64Var(&cfg.MaxBodyBytes, "mcp-max-body-bytes", 4<<20, "largest request body the MCP endpoint reads (MCP_MAX_BODY_BYTES)")
	fs.Float64Var(&cfg.RateLimit, "mcp-rate-limit", 50, "requests per second each API key may send the MCP endpoint of one replica; 0 is no limit (MCP_RATE_LIMIT)")
	fs.IntVar(&cfg.RateBurst, "mcp-rate-burst", 100, "burst of MCP_RATE_LIMIT (MCP_RATE_BURST)")
}

// read checks the MCP settings: like the gRPC port, the endpoint stays on
// loopback unless callers are authenticated and the traffic encrypted.
func (c *mcpConfig) read(origins string, cfg config) error {
	for _, o := range strings.Split(origins, ",") {
		if o = strings.TrimSpace(o); o != "" {
			c.AllowedOrigins = append(c.AllowedOrigins, o)
		}
	}
	if c.MaxBodyBytes <= 0 {
		return fmt.Errorf("MCP_MAX_BODY_BYTES %d: want a positive number", c.MaxBodyBytes)
	}
	if c.RateLimit < 0 || c.RateBurst < 0 {
		return fmt.Errorf("MCP_RATE_LIMIT %g, MCP_RATE_BURST %d: want numbers of 0 or more", c.RateLimit, c.RateBurst)
	}
	if c.Addr == "" {
		return nil
	}
	loopback, err := isLoopback(c.Addr)
	if err != nil {
		return fmt.Errorf("MCP_ADDR %s: %w", c.Addr, err)
	}
	if !loopback && cfg.Auth != auth.ModeNoneAnyAddress && (cfg.TLSCertFile == "" || !cfg.Auth.Guarded()) {
		return fmt.Errorf("refusing MCP_ADDR %s, which is not a loopback address, without TLS (TLS_CERT_FILE, TLS_KEY_FILE) and "+
			"API keys (AUTH auto or keys): serve it on 127.0.0.1, or set both", c.Addr)
	}
	return nil
}

// mcpJob is the MCP endpoint's listener and handler.
type mcpJob struct {
	lis     net.Listener
	srv     *http.Server
	handler *mcpserve.Handler
	logger  *slog.Logger
	grace   time.Duration
}

// newMCPJob binds MCP_ADDR and builds the endpoint on the gRPC server's
// use cases; nil without MCP_ADDR.
func (s *parts) newMCPJob(keysExist bool) (*mcpJob, error) {
	cfg := s.cfg
	if cfg.MCP.Addr == "" {
		return nil, nil
	}
	if loopback, _ := isLoopback(cfg.MCP.Addr); !loopback && cfg.Auth == auth.ModeAuto && !keysExist {
		return nil, fmt.Errorf("refusing MCP_ADDR %s, which is not a loopback address, while no API key exists (AUTH=auto "+
			"serves without keys until one does): create one first (connector-svc keys create --workspace <workspace> --scope call)",
			cfg.MCP.Addr)
	}
	var sessionKey []byte
	if s.rep.key != nil {
		m := hmac.New(sha256.New, s.rep.key)
		m.Write([]byte("connector-svc mcp session ids"))
		sessionKey = m.Sum(nil)
	}
	uc := s.srv.UseCases()
	h := mcpserve.New(mcpserve.Deps{Calls: uc.Calls, Resources: uc.Resources, Watches: uc.Watches, Queries: uc.Queries, Placer: uc.Placer, Sessions: uc.Sessions,
		Authorizations: uc.Authorizations, Live: s.lv, Registry: s.reg, Tools: s.db, Keys: s.keys, Relay: s.db, Logger: s.logger},
		mcpserve.Config{Auth: cfg.Auth, SessionKey: sessionKey, AllowedOrigins: cfg.MCP.AllowedOrigins,
			MaxBodyBytes: cfg.MCP.MaxBodyBytes, RateLimit: cfg.MCP.RateLimit, Burst: cfg.MCP.RateBurst,
			CallTimeout: cfg.RPCTimeout, QueryTimeout: cfg.QueryTimeout, SessionIdleTTL: cfg.SessionIdleTTL, Agents: s.agent != nil, Version: readBuild().Version})
	// A client's answer that reaches another replica comes back here.
	s.listener.Handle(store.MCPAnswersChannel, h.Deliver)
	lis, err := listenHTTP(cfg, cfg.MCP.Addr, "MCP_ADDR", "-mcp-addr", s.logger)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp/", h)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: slog.NewLogLogger(s.logger.Handler(), slog.LevelWarn)}
	s.logger.Info("MCP endpoint serving", slog.String("addr", lis.Addr().String()), slog.Bool("tls", cfg.TLSCertFile != ""))
	return &mcpJob{lis: lis, srv: srv, handler: h, logger: s.logger, grace: cfg.ShutdownGrace}, nil
}

// run serves until ctx ends, then drains for the shutdown grace.
func (j *mcpJob) run(ctx context.Context) error {
	return serveHTTP(ctx, "MCP endpoint", j.srv, j.lis, j.grace, j.logger, nil)
}

// serveHTTP serves srv on lis until ctx ends, then drains it for grace;
// stopping (if not nil) is called as the drain starts.
func serveHTTP(ctx context.Context, name string, srv *http.Server, lis net.Listener, grace time.Duration, logger *slog.Logger,
	stopping func()) error {
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	select {
	case err := <-served:
		return fmt.Errorf("%s: %w", name, err)
	case <-ctx.Done():
	}
	if stopping != nil {
		stopping()
	}
	drain, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	if err := srv.Shutdown(drain); err != nil {
		logger.Warn(name+": requests still in flight after the shutdown grace were cut", slog.String("error", err.Error()))
		_ = srv.Close()
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// listenHTTP binds an HTTP front door's address (env names its setting,
// flag its flag), serving TLS from TLS_CERT_FILE and TLS_KEY_FILE when
// set, as gRPC does.
func listenHTTP(cfg config, addr, env, flag string, logger *slog.Logger) (net.Listener, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, inUse(fmt.Errorf("listen on %s %s: %w", env, addr, err), env+" ("+flag+")")
	}
	if cfg.TLSCertFile == "" {
		return lis, nil
	}
	r, err := tlsfiles.New(tlsfiles.Files{CertFile: cfg.TLSCertFile, KeyFile: cfg.TLSKeyFile, ClientCAFile: cfg.TLSClientCAFile},
		tlsfiles.DefaultCheckInterval, logger)
	if err != nil {
		lis.Close()
		return nil, err
	}
	return tls.NewListener(lis, r.ServerConfig()), nil
}
