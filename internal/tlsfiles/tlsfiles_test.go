package tlsfiles_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/tlsfiles"
	"github.com/connector-svc/connector-svc/internal/tlsfiles/tlsfilestest"
)

// setup writes a server certificate named cn issued by ca (and, if
// clientCA is set, a client CA file) into a temporary directory.
func setup(t *testing.T, ca *tlsfilestest.CA, cn string, clientCA *tlsfilestest.CA) tlsfiles.Files {
	t.Helper()
	dir := t.TempDir()
	files := tlsfiles.Files{CertFile: filepath.Join(dir, "cert.pem"), KeyFile: filepath.Join(dir, "key.pem")}
	issue(t, files, ca, cn)
	if clientCA != nil {
		files.ClientCAFile = filepath.Join(dir, "client-ca.pem")
		tlsfilestest.WriteFile(t, files.ClientCAFile, clientCA.PEM)
	}
	return files
}

// issue replaces the server certificate and key of files with a new pair.
func issue(t *testing.T, files tlsfiles.Files, ca *tlsfilestest.CA, cn string) {
	t.Helper()
	cert, key := ca.Issue(t, cn)
	tlsfilestest.WriteFile(t, files.KeyFile, key)
	tlsfilestest.WriteFile(t, files.CertFile, cert)
}

// serve accepts TLS connections with r's configuration and writes "ok" on
// each that completes its handshake. It returns the address.
func serve(t *testing.T, r *tlsfiles.Reloader) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer conn.Close()
				tc := tls.Server(conn, r.ServerConfig())
				if tc.Handshake() == nil {
					_, _ = tc.Write([]byte("ok"))
				}
			})
		}
	})
	t.Cleanup(func() {
		lis.Close()
		wg.Wait()
	})
	return lis.Addr().String()
}

// hello connects trusting roots, with client certificate cert if not nil,
// and returns the common name of the server's certificate once the server
// has accepted the connection.
func hello(addr string, roots *x509.CertPool, cert *tls.Certificate) (string, error) {
	cfg := &tls.Config{RootCAs: roots, ServerName: "localhost"}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	// Under TLS 1.3 a refused client certificate shows on the first read.
	if b, err := io.ReadAll(conn); err != nil || string(b) != "ok" {
		return "", errors.Join(errors.New("server did not accept the connection"), err)
	}
	return conn.ConnectionState().PeerCertificates[0].Subject.CommonName, nil
}

func TestServesAndReloads(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "ca")
	files := setup(t, ca, "one", nil)
	var logs bytes.Buffer
	r, err := tlsfiles.New(files, 0, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, r)
	want := func(cn string) {
		t.Helper()
		if got, err := hello(addr, ca.Pool(), nil); err != nil || got != cn {
			t.Fatalf("server certificate = %q, %v; want %q", got, err, cn)
		}
	}
	want("one")
	if _, err := hello(addr, tlsfilestest.NewCA(t, "other").Pool(), nil); err == nil {
		t.Error("a client trusting another CA connected")
	}

	issue(t, files, ca, "two")
	want("two")

	// Half a rotation (a new certificate, the old key) keeps the last good
	// pair, and says so once.
	cert, key := ca.Issue(t, "three")
	tlsfilestest.WriteFile(t, files.CertFile, cert)
	want("two")
	want("two")
	if n := strings.Count(logs.String(), "do not load"); n != 1 {
		t.Errorf("%d log lines about files that do not load, want 1:\n%s", n, &logs)
	}
	tlsfilestest.WriteFile(t, files.KeyFile, key)
	want("three")
}

func TestChecksAtMostOncePerInterval(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "ca")
	files := setup(t, ca, "one", nil)
	r, err := tlsfiles.New(files, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, r)
	issue(t, files, ca, "two")
	if got, err := hello(addr, ca.Pool(), nil); err != nil || got != "one" {
		t.Errorf("server certificate within the interval = %q, %v; want the one loaded, %q", got, err, "one")
	}
}

func TestClientCertificates(t *testing.T) {
	ca, clientCA := tlsfilestest.NewCA(t, "server ca"), tlsfilestest.NewCA(t, "client ca")
	files := setup(t, ca, "server", clientCA)
	r, err := tlsfiles.New(files, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, r)
	client, stranger := clientCA.KeyPair(t, "client"), tlsfilestest.NewCA(t, "other").KeyPair(t, "stranger")
	if _, err := hello(addr, ca.Pool(), &client); err != nil {
		t.Errorf("a client with a certificate of the client CA: %v", err)
	}
	for name, cert := range map[string]*tls.Certificate{"no certificate": nil, "another CA's certificate": &stranger} {
		if _, err := hello(addr, ca.Pool(), cert); err == nil {
			t.Errorf("a client with %s connected", name)
		}
	}

	// The client CA file is re-read too.
	newClientCA := tlsfilestest.NewCA(t, "new client ca")
	tlsfilestest.WriteFile(t, files.ClientCAFile, newClientCA.PEM)
	newClient := newClientCA.KeyPair(t, "new client")
	if _, err := hello(addr, ca.Pool(), &newClient); err != nil {
		t.Errorf("a client of the rotated client CA: %v", err)
	}
	if _, err := hello(addr, ca.Pool(), &client); err == nil {
		t.Error("a client of the replaced client CA connected")
	}
}

func TestNewRefuses(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "ca")
	good := setup(t, ca, "s", ca)
	otherKey := setup(t, ca, "other", nil).KeyFile
	tests := map[string]struct {
		change func(*tlsfiles.Files)
		want   string
	}{
		"missing certificate":  {func(f *tlsfiles.Files) { f.CertFile += ".missing" }, "cert.pem.missing"},
		"another key":          {func(f *tlsfiles.Files) { f.KeyFile = otherKey }, "private key does not match"},
		"client CA not a cert": {func(f *tlsfiles.Files) { f.ClientCAFile = f.KeyFile }, "no PEM certificate"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			files := good
			tt.change(&files)
			if _, err := tlsfiles.New(files, 0, nil); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New = %v; want an error saying %q", err, tt.want)
			}
		})
	}
}

// TestConcurrentHandshakesDuringRotation runs under -race: handshakes
// never fail while the files are replaced again and again.
func TestConcurrentHandshakesDuringRotation(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "ca")
	files := setup(t, ca, "0", nil)
	r, err := tlsfiles.New(files, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, r)
	pairs := make([][2][]byte, 5)
	for i := range pairs {
		pairs[i][0], pairs[i][1] = ca.Issue(t, "rotated")
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 10 {
				if _, err := hello(addr, ca.Pool(), nil); err != nil {
					t.Errorf("handshake during rotation: %v", err)
					return
				}
			}
		})
	}
	for _, p := range pairs {
		// Key first, then certificate: each moment is a pair that loads, or
		// a mismatch that keeps the last good pair.
		tlsfilestest.WriteFile(t, files.KeyFile, p[1])
		tlsfilestest.WriteFile(t, files.CertFile, p[0])
	}
	wg.Wait()
}
