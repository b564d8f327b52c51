package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/tlsfiles/tlsfilestest"
)

// TestReplicasForwardOverMutualTLS: two replicas with INTERNAL_TLS_* set
// forward a stdio connector's calls to its owner over mutual TLS, and
// their internal listeners refuse a plaintext client.
func TestReplicasForwardOverMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := tlsfilestest.NewCA(t, "internal ca")
	cert, key := ca.Issue(t, "replicas")
	env := map[string]string{
		"INTERNAL_TLS_CERT_FILE": filepath.Join(dir, "internal.pem"),
		"INTERNAL_TLS_KEY_FILE":  filepath.Join(dir, "internal-key.pem"),
		"INTERNAL_TLS_CA_FILE":   filepath.Join(dir, "internal-ca.pem"),
	}
	tlsfilestest.WriteFile(t, env["INTERNAL_TLS_CERT_FILE"], cert)
	tlsfilestest.WriteFile(t, env["INTERNAL_TLS_KEY_FILE"], key)
	tlsfilestest.WriteFile(t, env["INTERNAL_TLS_CA_FILE"], ca.PEM)
	ids := []string{"a", "b"}
	c := newCluster(t, env, ids...)
	c.waitMembers(ids...)
	create(t, c.client("a"), c.stdioConnector("s"))
	// One of the two is not the owner: its calls are forwarded.
	c.waitCallable(15*time.Second, "stdio", "s", ids...)

	db := c.db()
	rows, err := db.Query(context.Background(), `SELECT internal_addr FROM replicas WHERE expires_at > now()`)
	if err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for rows.Next() {
		var a string
		if err := rows.Scan(&a); err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, a)
	}
	if rows.Err() != nil || len(addrs) != 2 {
		t.Fatalf("internal addresses %q, %v; want 2", addrs, rows.Err())
	}
	for _, a := range addrs {
		cc, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = connectorv1.NewConnectorServiceClient(cc).ListSessions(ctx, &connectorv1.ListSessionsRequest{WorkspaceId: "-", ConnectorId: "-"})
		cancel()
		cc.Close()
		if status.Code(err) != codes.Unavailable {
			t.Errorf("a plaintext client of the internal listener %s: %v, want UNAVAILABLE (no handshake)", a, err)
		}
	}
	for id, out := range c.outputs() {
		if !strings.Contains(out, "TLS certificate loaded") || !strings.Contains(out, "internal") {
			t.Errorf("replica %s does not log its internal TLS certificate:\n%s", id, tail(out, 20))
		}
	}
}

// TestInternalTLSSettingsRefused: the three files go together, and a
// server name needs them.
func TestInternalTLSSettingsRefused(t *testing.T) {
	for _, c := range []struct {
		cfg  internalTLSConfig
		want string // "" accepts
	}{
		{internalTLSConfig{}, ""},
		{internalTLSConfig{CertFile: "c", KeyFile: "k", CAFile: "ca", ServerName: "replicas"}, ""},
		{internalTLSConfig{CertFile: "c", KeyFile: "k"}, "together"},
		{internalTLSConfig{CAFile: "ca"}, "together"},
		{internalTLSConfig{ServerName: "replicas"}, "INTERNAL_TLS_SERVER_NAME needs"},
	} {
		err := c.cfg.check()
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("check(%+v) = %v, want %q", c.cfg, err, c.want)
		}
	}
}
