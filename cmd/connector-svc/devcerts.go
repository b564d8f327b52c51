package main

import (
	"cmp"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// devCertFiles are the files dev-certs writes, in its directory.
var devCertFiles = []string{"ca.pem", "ca-key.pem", "server.pem", "server-key.pem", "client.pem", "client-key.pem"}

// devCertsDir is where dev-certs writes unless told otherwise: under .dev,
// which git ignores.
const devCertsDir = ".dev/tls"

const devCertsUsage = `Usage: connector-svc dev-certs [-dir dir] [-force]

Makes certificates for trying TLS and mutual TLS on a development machine,
in dir (default ` + devCertsDir + `, git-ignored), valid for a year:

  ca.pem, ca-key.pem           a certificate authority of its own
  server.pem, server-key.pem   the service's certificate, for localhost,
                               127.0.0.1 and ::1 (TLS_CERT_FILE, TLS_KEY_FILE)
  client.pem, client-key.pem   a client certificate (grpcurl -cert, -key)

Private keys are written 0600. When the files exist already they are kept,
so a service and clients that use them go on working; -force makes new ones.
Never use them beyond a development machine.
`

// runDevCerts makes the development certificates.
func runDevCerts(args []string, dev devConfig, stdout io.Writer) error {
	fset := flag.NewFlagSet("connector-svc dev-certs", flag.ContinueOnError)
	fset.SetOutput(io.Discard)
	dir := fset.String("dir", cmp.Or(dev.CertsDir, devCertsDir), "")
	force := fset.Bool("force", false, "")
	if err := fset.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, devCertsUsage)
			return err
		}
		return &usageError{err: fmt.Errorf("dev-certs: %w", err), usage: devCertsUsage}
	}
	if fset.NArg() > 0 {
		return &usageError{err: fmt.Errorf("dev-certs takes flags only, not %q", fset.Args()), usage: devCertsUsage}
	}
	existing := 0
	for _, f := range devCertFiles {
		switch _, err := os.Stat(filepath.Join(*dir, f)); {
		case err == nil:
			existing++
		case !errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("dev-certs: %w", err)
		}
	}
	if existing == len(devCertFiles) && !*force {
		fmt.Fprintf(stdout, "kept the development certificates in %s (-force makes new ones)\n", *dir)
		return devCertsHint(*dir, stdout)
	}
	if err := os.MkdirAll(*dir, 0o700); err != nil {
		return fmt.Errorf("dev-certs: %w", err)
	}
	files, err := makeDevCerts(time.Now())
	if err != nil {
		return fmt.Errorf("dev-certs: %w", err)
	}
	for _, name := range devCertFiles {
		mode := os.FileMode(0o644)
		if strings.HasSuffix(name, "-key.pem") {
			mode = 0o600
		}
		if err := writeFileAtomic(filepath.Join(*dir, name), files[name], mode); err != nil {
			return fmt.Errorf("dev-certs: %w", err)
		}
	}
	fmt.Fprintf(stdout, "wrote a CA, a server certificate for localhost, 127.0.0.1 and ::1, and a client certificate into %s: %s\n",
		*dir, strings.Join(devCertFiles, ", "))
	return devCertsHint(*dir, stdout)
}

// devCertsHint says how to use the certificates in dir.
func devCertsHint(dir string, stdout io.Writer) error {
	_, err := fmt.Fprintf(stdout, "TLS:        TLS_CERT_FILE=%[1]s/server.pem TLS_KEY_FILE=%[1]s/server-key.pem make run\n"+
		"mutual TLS: TLS_CERT_FILE=%[1]s/server.pem TLS_KEY_FILE=%[1]s/server-key.pem TLS_CLIENT_CA_FILE=%[1]s/ca.pem make run\n"+
		"grpcurl:    grpcurl -cacert %[1]s/ca.pem [-cert %[1]s/client.pem -key %[1]s/client-key.pem] …\n", dir)
	return err
}

// makeDevCerts returns the PEM files of a new CA and of a server and a
// client certificate it signed, by file name, valid for a year from now.
func makeDevCerts(now time.Time) (map[string][]byte, error) {
	files := map[string][]byte{}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl, err := devCertTemplate("connector-svc development CA", now)
	if err != nil {
		return nil, err
	}
	caTmpl.IsCA, caTmpl.BasicConstraintsValid, caTmpl.MaxPathLenZero = true, true, true
	caTmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	if files["ca.pem"], files["ca-key.pem"], err = devPEM(caDER, caKey); err != nil {
		return nil, err
	}
	for _, leaf := range []struct {
		name, cn string
		usage    x509.ExtKeyUsage
	}{
		{"server", "localhost", x509.ExtKeyUsageServerAuth},
		{"client", "connector-svc development client", x509.ExtKeyUsageClientAuth},
	} {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		tmpl, err := devCertTemplate(leaf.cn, now)
		if err != nil {
			return nil, err
		}
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{leaf.usage}
		if leaf.name == "server" {
			tmpl.DNSNames = []string{"localhost"}
			tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
		if err != nil {
			return nil, err
		}
		if files[leaf.name+".pem"], files[leaf.name+"-key.pem"], err = devPEM(der, key); err != nil {
			return nil, err
		}
	}
	return files, nil
}

func devCertTemplate(cn string, now time.Time) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	return &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: cn, Organization: []string{"connector-svc development"}},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(1, 0, 0)}, nil
}

// devPEM encodes a certificate and its private key (PKCS #8) as PEM.
func devPEM(der []byte, key *ecdsa.PrivateKey) (certPEM, keyPEM []byte, err error) {
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}

// writeFileAtomic writes data to a new file beside path, then renames it
// over path: a service that re-reads its TLS files sees the old file or
// the new one, never half of one.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
