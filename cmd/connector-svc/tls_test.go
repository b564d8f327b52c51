package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	"github.com/connector-svc/connector-svc/internal/store/storetest"
	"github.com/connector-svc/connector-svc/internal/tlsfiles/tlsfilestest"
)

// tlsFiles writes a server certificate named cn issued by ca into dir and
// returns the environment that serves it, with client certificates of
// clientCA required if it is not nil.
func tlsFiles(t *testing.T, dir string, ca *tlsfilestest.CA, cn string, clientCA *tlsfilestest.CA) map[string]string {
	t.Helper()
	env := map[string]string{"TLS_CERT_FILE": filepath.Join(dir, "cert.pem"), "TLS_KEY_FILE": filepath.Join(dir, "key.pem")}
	cert, key := ca.Issue(t, cn)
	tlsfilestest.WriteFile(t, env["TLS_KEY_FILE"], key)
	tlsfilestest.WriteFile(t, env["TLS_CERT_FILE"], cert)
	if clientCA != nil {
		env["TLS_CLIENT_CA_FILE"] = filepath.Join(dir, "client-ca.pem")
		tlsfilestest.WriteFile(t, env["TLS_CLIENT_CA_FILE"], clientCA.PEM)
	}
	return env
}

// checkOverTLS calls the health service over a new TLS connection trusting
// roots, with a client certificate if cert is not nil, and returns the
// common name of the certificate the server showed.
func checkOverTLS(t *testing.T, addr string, roots *x509.CertPool, cert *tls.Certificate) (string, error) {
	t.Helper()
	cfg := &tls.Config{RootCAs: roots}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var p peer.Peer
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p)); err != nil {
		return "", err
	}
	return p.AuthInfo.(credentials.TLSInfo).State.PeerCertificates[0].Subject.CommonName, nil
}

// TestEndToEndTLS serves TLS, then mutual TLS, from files, and replaces
// the certificate while the service runs.
func TestEndToEndTLS(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "ca")
	t.Run("TLS", func(t *testing.T) {
		dir := t.TempDir()
		env := tlsFiles(t, dir, ca, "first", nil)
		svc := start(t, storetest.NewURL(t), env)
		if cn, err := checkOverTLS(t, svc.addr, ca.Pool(), nil); err != nil || cn != "first" {
			t.Fatalf("health over TLS trusting the CA = %q, %v", cn, err)
		}
		if _, err := checkOverTLS(t, svc.addr, tlsfilestest.NewCA(t, "other").Pool(), nil); err == nil {
			t.Error("a client trusting another CA got an answer")
		}
		if _, err := healthpb.NewHealthClient(dial(t, svc.addr)).Check(testCtx(t), &healthpb.HealthCheckRequest{}); err == nil {
			t.Error("a plaintext client got an answer")
		}
		if _, err := healthcheckCmd(t, svc.addr, env); err != nil {
			t.Errorf("healthcheck over TLS: %v", err)
		}
		if _, err := healthcheckCmd(t, svc.addr, tlsFiles(t, t.TempDir(), ca, "impostor", nil)); err == nil {
			t.Error("healthcheck accepted a certificate other than the one in TLS_CERT_FILE")
		}

		tlsFiles(t, dir, ca, "rotated", nil)
		deadline := time.Now().Add(15 * time.Second)
		for {
			cn, err := checkOverTLS(t, svc.addr, ca.Pool(), nil)
			if err != nil {
				t.Fatalf("health over TLS during rotation: %v", err)
			}
			if cn == "rotated" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("new connections still see %q 15s after the files were replaced", cn)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	t.Run("mutual TLS", func(t *testing.T) {
		// One CA issues the server's and the clients' certificates, so the
		// healthcheck command can use the server's as a client certificate.
		env := tlsFiles(t, t.TempDir(), ca, "server", ca)
		svc := start(t, storetest.NewURL(t), env)
		client := ca.KeyPair(t, "client")
		if _, err := checkOverTLS(t, svc.addr, ca.Pool(), &client); err != nil {
			t.Errorf("health with a client certificate: %v", err)
		}
		if _, err := healthcheckCmd(t, svc.addr, env); err != nil {
			t.Errorf("healthcheck over mutual TLS: %v", err)
		}
		if _, err := checkOverTLS(t, svc.addr, ca.Pool(), nil); err == nil {
			t.Error("a client without a certificate got an answer")
		}
		stranger := tlsfilestest.NewCA(t, "other").KeyPair(t, "stranger")
		if _, err := checkOverTLS(t, svc.addr, ca.Pool(), &stranger); err == nil {
			t.Error("a client with another CA's certificate got an answer")
		}
	})
}

func TestTLSSettingsRefused(t *testing.T) {
	dir := t.TempDir()
	files := tlsFiles(t, dir, tlsfilestest.NewCA(t, "ca"), "s", nil)
	tests := map[string]struct {
		env  map[string]string
		want string
	}{
		"cert without key":     {map[string]string{"TLS_CERT_FILE": files["TLS_CERT_FILE"]}, "TLS_KEY_FILE"},
		"client CA alone":      {map[string]string{"TLS_CLIENT_CA_FILE": files["TLS_CERT_FILE"]}, "TLS_CLIENT_CA_FILE needs"},
		"missing key file":     {map[string]string{"TLS_CERT_FILE": files["TLS_CERT_FILE"], "TLS_KEY_FILE": dir + "/nope.pem"}, "nope.pem"},
		"key file as cert too": {map[string]string{"TLS_CERT_FILE": files["TLS_KEY_FILE"], "TLS_KEY_FILE": files["TLS_KEY_FILE"]}, "key.pem"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			// An unreachable database: bad TLS settings fail before any database work.
			args := []string{"-database-url", "postgres://postgres@127.0.0.1:1/x?sslmode=disable"}
			err := run(testCtx(t), args, getenv(tt.env), io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("run = %v; want an error mentioning %q", err, tt.want)
			}
		})
	}
}

// TestHealthcheckSaysTheCheckLacksTLS: a healthcheck without the TLS
// settings the service has says which ones to set, instead of gRPC's
// "error reading server preface: EOF" or "broken pipe"; a port that does
// not answer gets no TLS hint.
func TestHealthcheckSaysTheCheckLacksTLS(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "ca")
	tlsEnv := tlsFiles(t, t.TempDir(), ca, "server", nil)
	mutualEnv := tlsFiles(t, t.TempDir(), ca, "server", ca)
	tlsSvc := start(t, storetest.NewURL(t), tlsEnv)
	mutualSvc := start(t, storetest.NewURL(t), mutualEnv)
	withoutClientCA := map[string]string{"TLS_CERT_FILE": mutualEnv["TLS_CERT_FILE"], "TLS_KEY_FILE": mutualEnv["TLS_KEY_FILE"]}
	for _, tt := range []struct {
		name, addr string
		env        map[string]string
		want       []string
	}{
		{"TLS", tlsSvc.addr, nil, []string{"the port speaks TLS: set TLS_CERT_FILE and TLS_KEY_FILE"}},
		{"mutual TLS", mutualSvc.addr, nil, []string{"the port speaks mutual TLS", "TLS_CERT_FILE", "TLS_CLIENT_CA_FILE"}},
		{"mutual TLS, no client CA", mutualSvc.addr, withoutClientCA, []string{"asks for client certificates", "set TLS_CLIENT_CA_FILE"}},
	} {
		_, err := healthcheckCmd(t, tt.addr, tt.env)
		for _, w := range tt.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: healthcheck = %v; want it to say %q", tt.name, err, w)
			}
		}
	}
	if _, err := healthcheckCmd(t, mutualSvc.addr, mutualEnv); err != nil {
		t.Errorf("healthcheck with the service's settings: %v", err)
	}
	if err := tlsSvc.stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := healthcheckCmd(t, tlsSvc.addr, nil); err == nil || strings.Contains(err.Error(), "TLS") {
		t.Errorf("healthcheck of a closed port = %v; want an error without a TLS hint", err)
	}
}
