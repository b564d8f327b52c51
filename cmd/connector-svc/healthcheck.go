package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// healthcheckTimeout bounds the whole check.
const healthcheckTimeout = 5 * time.Second

// healthcheck asks the service at GRPC_ADDR for its gRPC health, for
// container health checks: nil if it is SERVING, an error otherwise. A
// wildcard host (0.0.0.0, ::, none) is dialled on loopback. It needs no
// database and no SECRET_KEY.
func healthcheck(ctx context.Context, cfg config, stdout io.Writer) error {
	addr, err := loopbackAddr(cfg.GRPCAddr)
	if err != nil {
		return err
	}
	creds, err := healthcheckCreds(cfg)
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return fmt.Errorf("health check of %s: %w", addr, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, healthcheckTimeout)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		if hint := tlsHint(ctx, cfg, addr); hint != "" {
			return fmt.Errorf("health check of %s: %s (%w)", addr, hint, err)
		}
		return fmt.Errorf("health check of %s: %w", addr, err)
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("health check of %s: %s", addr, resp.GetStatus())
	}
	fmt.Fprintln(stdout, resp.GetStatus())
	return nil
}

// loopbackAddr is the address to reach a service listening on addr from
// the same host.
func loopbackAddr(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("GRPC_ADDR %q: %w", addr, err)
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return net.JoinHostPort(host, port), nil
}

// healthcheckCreds speaks TLS when the service does. The service's own
// certificate is what it trusts, whatever the name it dials; under mutual
// TLS it also shows that certificate as its client certificate, so
// TLS_CLIENT_CA_FILE must hold the CA that issued it (and the certificate
// must allow client authentication).
func healthcheckCreds(cfg config) (credentials.TransportCredentials, error) {
	if cfg.TLSCertFile == "" {
		return insecure.NewCredentials(), nil
	}
	own, err := tls.LoadX509KeyPair(cfg.TLSCertFile, cfg.TLSKeyFile)
	if err != nil {
		return nil, fmt.Errorf("health check: TLS certificate: %w", err)
	}
	tc := &tls.Config{
		MinVersion: tls.VersionTLS12,
		// Verified below, against the service's own certificate instead of
		// a CA and a name.
		InsecureSkipVerify: true,
		VerifyPeerCertificate: func(rawCerts [][]byte, _ [][]*x509.Certificate) error {
			if len(rawCerts) == 0 || !bytes.Equal(rawCerts[0], own.Certificate[0]) {
				return errors.New("the server's certificate is not the one in TLS_CERT_FILE")
			}
			return nil
		},
	}
	if cfg.TLSClientCAFile != "" {
		tc.Certificates = []tls.Certificate{own}
	}
	return credentials.NewTLS(tc), nil
}

// tlsHint says which TLS settings the check lacks, when a check failed
// against a port that speaks TLS: it says so plainly instead of gRPC's
// "error reading server preface: EOF" (or "broken pipe" under mutual TLS).
// It sends the port a TLS ClientHello only to find out whether TLS answers
// and whether a client certificate is asked for; nothing it receives is
// trusted or used. "" when there is nothing to say.
func tlsHint(ctx context.Context, cfg config, addr string) string {
	speaksTLS, asksCert := probeTLS(ctx, addr)
	switch {
	case !speaksTLS:
		return ""
	case cfg.TLSCertFile == "" && asksCert:
		return "the port speaks mutual TLS: set TLS_CERT_FILE and TLS_KEY_FILE, and TLS_CLIENT_CA_FILE, as the service has them " +
			"(the check trusts the service's own certificate and presents it as its client certificate)"
	case cfg.TLSCertFile == "":
		return "the port speaks TLS: set TLS_CERT_FILE and TLS_KEY_FILE as the service has them " +
			"(the check trusts the service's own certificate)"
	case asksCert && cfg.TLSClientCAFile == "":
		return "the port asks for client certificates (mutual TLS): set TLS_CLIENT_CA_FILE as the service has it, " +
			"so that the check presents TLS_CERT_FILE as its client certificate"
	}
	return ""
}

// probeTLS sends addr a TLS ClientHello, verifying nothing, and reports
// whether a TLS server answered (a handshake, or a TLS alert) and whether
// it asked for a client certificate (none is sent).
func probeTLS(ctx context.Context, addr string) (speaksTLS, asksCert bool) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var asked atomic.Bool
	d := tls.Dialer{Config: &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // only to tell TLS from plaintext: the connection is closed at once
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			asked.Store(true)
			return &tls.Certificate{}, nil
		},
	}}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err == nil {
		conn.Close()
		return true, asked.Load()
	}
	var alert tls.AlertError
	return errors.As(err, &alert) || asked.Load(), asked.Load()
}
