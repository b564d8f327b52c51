package main

import (
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/connector-svc/connector-svc/internal/tlsfiles"
)

// serverCreds returns the gRPC server option serving TLS from TLS_CERT_FILE
// and TLS_KEY_FILE (requiring client certificates of TLS_CLIENT_CA_FILE if
// set), or none without them. The files are loaded now, so bad ones fail
// start-up; later they are re-read when they change.
func serverCreds(cfg config, logger *slog.Logger) ([]grpc.ServerOption, error) {
	if cfg.TLSCertFile == "" {
		return nil, nil
	}
	r, err := tlsfiles.New(tlsfiles.Files{CertFile: cfg.TLSCertFile, KeyFile: cfg.TLSKeyFile, ClientCAFile: cfg.TLSClientCAFile},
		tlsfiles.DefaultCheckInterval, logger)
	if err != nil {
		return nil, err
	}
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(r.ServerConfig()))}, nil
}
