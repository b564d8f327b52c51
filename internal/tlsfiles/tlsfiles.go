// Package tlsfiles serves TLS from PEM files that may be replaced while the
// service runs: the server certificate and key, and optionally the CAs
// that client certificates must chain to (mutual TLS). A handshake sees
// what the files hold, read again at most once per check interval, so a
// rotated certificate is served without a restart.
package tlsfiles

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// DefaultCheckInterval is how often, at most, a handshake reads the files
// again to see whether they changed.
const DefaultCheckInterval = time.Second

// Files names the PEM files of a server's TLS.
type Files struct {
	// CertFile holds the server's certificate, then any intermediates;
	// KeyFile its private key.
	CertFile, KeyFile string
	// ClientCAFile, if set, holds the CAs that clients' certificates must
	// chain to; clients without one are refused.
	ClientCAFile string
}

// Reloader hands each TLS handshake the configuration the files hold. Files
// that fail to load after a change are logged and the previous
// configuration stays in use until they load again. Safe for concurrent
// use.
type Reloader struct {
	files    Files
	interval time.Duration
	logger   *slog.Logger

	mu        sync.Mutex
	current   *tls.Config
	seen      [][]byte // the files' contents last read, loaded or not
	checkedAt time.Time
	checking  bool   // one handshake at a time reads the files
	lastErr   string // of the last check, logged when it first appears
}

// New loads files and returns a Reloader that reads them again at most
// once per interval (every handshake if interval is 0). It fails if the
// files do not load: one is missing, the key does not match the
// certificate, or the client CA file holds no certificate.
func New(files Files, interval time.Duration, logger *slog.Logger) (*Reloader, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	contents, err := read(files)
	if err != nil {
		return nil, err
	}
	cfg, err := parse(files, contents)
	if err != nil {
		return nil, err
	}
	r := &Reloader{files: files, interval: interval, logger: logger, current: cfg, seen: contents, checkedAt: time.Now()}
	r.logLoaded("TLS certificate loaded", cfg)
	return r, nil
}

// ServerConfig returns the configuration to serve with; each handshake
// gets the files' configuration of the moment.
func (r *Reloader) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return r.config(), nil },
	}
}

// ClientConfig returns a configuration to dial a peer that serves the same
// kind of files (mutual TLS between replicas): the certificate is shown as
// the client certificate, and the peer's certificate must chain to the
// client CA file's CAs and carry serverName (a DNS name or an IP; empty
// refuses every peer).
// Both are what the files hold at each handshake, so a renewed
// certificate or CA is used without a restart. Without a client CA file
// every handshake fails.
func (r *Reloader) ClientConfig(serverName string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: serverName,
		// The peer's certificate is verified by VerifyConnection, against
		// the CAs of the moment: a tls.Config's RootCAs are fixed.
		InsecureSkipVerify: true,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &r.config().Certificates[0], nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			roots := r.config().ClientCAs
			if serverName == "" {
				return errors.New("tlsfiles: no server name to verify the peer's certificate for")
			}
			if roots == nil {
				return errors.New("tlsfiles: no CA file to verify the peer's certificate with")
			}
			if len(cs.PeerCertificates) == 0 {
				return errors.New("tlsfiles: the peer showed no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter,
				DNSName: serverName, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
			return err
		},
	}
}

// config is the files' configuration of the moment, read again if due.
func (r *Reloader) config() *tls.Config {
	r.checkFiles()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.current
}

// checkFiles reads the files if the last check is an interval old, and
// swaps in their configuration if they changed and load. The files are read
// outside the lock; concurrent handshakes use the current configuration
// meanwhile. An error is logged once, not at every check.
func (r *Reloader) checkFiles() {
	r.mu.Lock()
	due := !r.checking && time.Since(r.checkedAt) >= r.interval
	if due {
		r.checking = true
	}
	seen := r.seen
	r.mu.Unlock()
	if !due {
		return
	}
	contents, err := read(r.files)
	changed := err == nil && !equal(contents, seen)
	var cfg *tls.Config
	if changed {
		cfg, err = parse(r.files, contents)
	}
	errText := ""
	if err != nil {
		errText = err.Error()
	}
	r.mu.Lock()
	r.checking, r.checkedAt = false, time.Now()
	if changed {
		r.seen = contents
	}
	if cfg != nil {
		r.current = cfg
	}
	repeated := errText == r.lastErr
	r.lastErr = errText
	r.mu.Unlock()
	switch {
	case cfg != nil:
		r.logLoaded("TLS certificate reloaded", cfg)
	case err != nil && !repeated:
		r.logger.Error("TLS files changed but do not load; serving the previous certificate", slog.String("error", errText))
	}
}

func (r *Reloader) logLoaded(msg string, cfg *tls.Config) {
	leaf := cfg.Certificates[0].Leaf
	r.logger.Info(msg, slog.String("subject", leaf.Subject.String()), slog.Time("not_after", leaf.NotAfter),
		slog.Bool("client_certificates_required", cfg.ClientCAs != nil))
}

// read returns the contents of the cert, key and client CA files, in that
// order; the last is nil without a client CA file.
func read(files Files) ([][]byte, error) {
	contents := make([][]byte, 3)
	for i, name := range []string{files.CertFile, files.KeyFile, files.ClientCAFile} {
		if name == "" {
			continue
		}
		b, err := os.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("read TLS file: %w", err)
		}
		contents[i] = b
	}
	return contents, nil
}

func parse(files Files, contents [][]byte) (*tls.Config, error) {
	cert, err := tls.X509KeyPair(contents[0], contents[1])
	if err != nil {
		return nil, fmt.Errorf("TLS certificate %s with key %s: %w", files.CertFile, files.KeyFile, err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if files.ClientCAFile == "" {
		return cfg, nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(contents[2]) {
		return nil, fmt.Errorf("TLS client CA file %s: %w", files.ClientCAFile, errNoCertificates)
	}
	cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	return cfg, nil
}

var errNoCertificates = errors.New("no PEM certificate in it")

func equal(a, b [][]byte) bool {
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}
