package main

import (
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/store/storetest"
	"github.com/connector-svc/connector-svc/internal/tlsfiles/tlsfilestest"
)

// TestMCPEndpointServesTLS: with TLS_* set, MCP_ADDR speaks HTTPS with the
// same certificate as gRPC, and nothing else.
func TestMCPEndpointServesTLS(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "ca")
	env := tlsFiles(t, t.TempDir(), ca, "localhost", nil)
	addr := freeAddr(t)
	env["MCP_ADDR"] = addr
	start(t, storetest.NewURL(t), env)
	initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	post := func(c *http.Client, url string) (*http.Response, error) {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(initialize))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		return c.Do(req)
	}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}
	resp, err := post(c, "https://"+addr+"/mcp/demo")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Mcp-Session-Id") == "" || resp.TLS == nil ||
		resp.TLS.PeerCertificates[0].Subject.CommonName != "localhost" {
		t.Fatalf("initialize over HTTPS: %d %s (session %q)", resp.StatusCode, body, resp.Header.Get("Mcp-Session-Id"))
	}
	if resp, err := post(&http.Client{Timeout: 10 * time.Second}, "http://"+addr+"/mcp/demo"); err == nil {
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Errorf("plain HTTP to the TLS endpoint answered %d", resp.StatusCode)
		}
	}
}

// TestMCPSettingsRefused: MCP_ADDR off loopback needs TLS and keys.
func TestMCPSettingsRefused(t *testing.T) {
	args := []string{"-database-url", "postgres://postgres@127.0.0.1:1/x?sslmode=disable"}
	for name, env := range map[string]map[string]string{
		"any address, plaintext":    {"MCP_ADDR": "0.0.0.0:8090"},
		"any address, AUTH=none":    {"MCP_ADDR": "0.0.0.0:8090", "AUTH": "none"},
		"a body cap of 0":           {"MCP_MAX_BODY_BYTES": "0"},
		"a negative rate limit":     {"MCP_RATE_LIMIT": "-1"},
		"an address that is no one": {"MCP_ADDR": "nowhere"},
	} {
		t.Run(name, func(t *testing.T) {
			err := run(testCtx(t), args, getenv(env), io.Discard)
			if err == nil || !strings.Contains(err.Error(), "MCP_") {
				t.Errorf("run = %v; want an error naming the MCP setting", err)
			}
		})
	}
}
