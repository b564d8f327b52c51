package main

import (
	"flag"
	"fmt"
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/connector-svc/connector-svc/internal/forward"
	"github.com/connector-svc/connector-svc/internal/tlsfiles"
)

// internalTLSConfig is mutual TLS on the internal hop between replicas
// (INTERNAL_ADDR): each replica serves it with its certificate and shows
// the same certificate when it forwards, and both ends require the
// other's to chain to the CA file.
type internalTLSConfig struct {
	// CertFile and KeyFile are this replica's certificate (with both
	// server and client authentication usages) and key; CAFile the CAs
	// the other replicas' certificates chain to. All re-read on change.
	CertFile, KeyFile, CAFile string
	// ServerName is the name a peer's certificate must carry; "" means
	// the host of its advertised address (its IP on Kubernetes).
	ServerName string
}

func internalTLSFlags(fs *flag.FlagSet, cfg *internalTLSConfig) {
	fs.StringVar(&cfg.CertFile, "internal-tls-cert-file", "",
		"PEM certificate of this replica on the internal hop, served on INTERNAL_ADDR and shown when forwarding; empty keeps the hop plaintext (INTERNAL_TLS_CERT_FILE)")
	fs.StringVar(&cfg.KeyFile, "internal-tls-key-file", "", "PEM private key of INTERNAL_TLS_CERT_FILE (INTERNAL_TLS_KEY_FILE)")
	fs.StringVar(&cfg.CAFile, "internal-tls-ca-file", "",
		"PEM CAs every replica's internal certificate must chain to, both ways (INTERNAL_TLS_CA_FILE)")
	fs.StringVar(&cfg.ServerName, "internal-tls-server-name", "",
		"the name (DNS or IP) every replica's internal certificate must carry; empty is the host of the replica's advertised internal address (INTERNAL_TLS_SERVER_NAME)")
}

// check refuses a partial configuration: the three files go together.
func (cfg internalTLSConfig) check() error {
	set := 0
	for _, f := range []string{cfg.CertFile, cfg.KeyFile, cfg.CAFile} {
		if f != "" {
			set++
		}
	}
	switch {
	case set != 0 && set != 3:
		return fmt.Errorf("set INTERNAL_TLS_CERT_FILE, INTERNAL_TLS_KEY_FILE and INTERNAL_TLS_CA_FILE together, or none (the internal hop's TLS is mutual)")
	case set == 0 && cfg.ServerName != "":
		return fmt.Errorf("INTERNAL_TLS_SERVER_NAME needs INTERNAL_TLS_CERT_FILE, INTERNAL_TLS_KEY_FILE and INTERNAL_TLS_CA_FILE")
	}
	return nil
}

// load loads the internal hop's files, or returns nil without
// them. Bad files fail start-up; later they are re-read when they change.
func (cfg internalTLSConfig) load(logger *slog.Logger) (*tlsfiles.Reloader, error) {
	if cfg.CertFile == "" {
		return nil, nil
	}
	r, err := tlsfiles.New(tlsfiles.Files{CertFile: cfg.CertFile, KeyFile: cfg.KeyFile, ClientCAFile: cfg.CAFile},
		tlsfiles.DefaultCheckInterval, logger.With(slog.String("listener", "internal")))
	if err != nil {
		return nil, fmt.Errorf("INTERNAL_TLS_*: %w", err)
	}
	return r, nil
}

// internalServerCreds is the internal listener's TLS option, none
// without r.
func internalServerCreds(r *tlsfiles.Reloader) []grpc.ServerOption {
	if r == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(r.ServerConfig()))}
}

// use makes pool's connections mutual TLS with r, if set.
func (cfg internalTLSConfig) use(pool *forward.Pool, r *tlsfiles.Reloader) {
	if r != nil {
		pool.UseTLS(r.ClientConfig, cfg.ServerName)
	}
}
