package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
	"google.golang.org/protobuf/types/known/structpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

// echoMCP serves an MCP server with an echo tool over streamable HTTP that
// answers only requests whose Authorization header is wantAuth, and returns
// its URL.
func echoMCP(t *testing.T, wantAuth string) string {
	t.Helper()
	m := mcpserver.NewMCPServer("echo", "1.0")
	m.AddTool(mcp.NewTool("echo", mcp.WithDescription("Echoes text"), mcp.WithString("text", mcp.Required())),
		func(_ context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText("echo: " + r.GetString("text", "")), nil
		})
	mcpHandler := mcpserver.NewStreamableHTTPServer(m)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != wantAuth {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		mcpHandler.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/mcp"
}

// callEcho calls the echo tool of a connector and fails t unless it echoes.
func callEcho(t *testing.T, addr, ws, id string) {
	t.Helper()
	args, _ := structpb.NewStruct(map[string]any{"text": "hi"})
	resp, err := connectorv1.NewConnectorServiceClient(dial(t, addr)).CallTool(testCtx(t),
		&connectorv1.CallToolRequest{WorkspaceId: ws, ConnectorId: id, ToolName: "echo", Arguments: args})
	if err != nil {
		t.Fatalf("CallTool echo: %v", err)
	}
	if got := resp.GetContent()[0].GetText().GetText(); got != "echo: hi" {
		t.Fatalf("CallTool echo = %q", got)
	}
}

func keyOf(fill byte) string {
	return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{fill}, 32))
}

// createWithHeader serves databaseURL with secretKey just long enough to
// create a streamable-HTTP connector id of workspace acme whose
// Authorization header is auth.
func createWithHeader(t *testing.T, databaseURL, secretKey, id, mcpURL, auth string) {
	t.Helper()
	svc := start(t, databaseURL, map[string]string{"SECRET_KEY": secretKey})
	_, err := connectorv1.NewConnectorServiceClient(dial(t, svc.addr)).CreateConnector(testCtx(t), &connectorv1.CreateConnectorRequest{
		WorkspaceId: "acme", Connector: &connectorv1.Connector{ConnectorId: id, Transport: connectorv1.Transport_TRANSPORT_STREAMABLE_HTTP, ApprovalPolicy: noApproval,
			Connection: &connectorv1.Connector_Http{Http: &connectorv1.HttpConfig{Url: mcpURL, Headers: map[string]string{"Authorization": auth}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.stop(); err != nil {
		t.Fatal(err)
	}
}

// TestSecretKeyRotation stores a connector's header under key A, serves
// with "B,A", reseals, and serves with B alone. Each time the MCP server
// answers only if the header decrypted.
func TestSecretKeyRotation(t *testing.T) {
	const auth = "Bearer tok-ROTATION-5d1e"
	mcpURL := echoMCP(t, auth)
	url := storetest.NewURL(t)
	keyA, keyB := keyOf(0xA), keyOf(0xB)
	createWithHeader(t, url, keyA, "echo", mcpURL, auth)

	args := []string{"-grpc-addr", "127.0.0.1:0", "-database-url", url}
	if err := run(testCtx(t), args, getenv(map[string]string{"SECRET_KEY": keyB}), io.Discard); err == nil || !strings.Contains(err.Error(), "SECRET_KEY") {
		t.Fatalf("serve with only the new key before reseal = %v; want an error naming SECRET_KEY", err)
	}
	rotating := map[string]string{"SECRET_KEY": keyB + "," + keyA}
	svc := start(t, url, rotating)
	callEcho(t, svc.addr, "acme", "echo")
	if err := svc.stop(); err != nil {
		t.Fatal(err)
	}

	var out bytes.Buffer
	if err := run(testCtx(t), append(args, "reseal"), getenv(rotating), &out); err != nil {
		t.Fatalf("reseal: %v", err)
	}
	if !strings.Contains(out.String(), `"connectors":1`) {
		t.Errorf("reseal output does not count one connector:\n%s", &out)
	}
	svc = start(t, url, map[string]string{"SECRET_KEY": keyB})
	callEcho(t, svc.addr, "acme", "echo")
}

// TestResealAllOrNothing: a connector whose secrets no key opens stops the
// reseal, and the connectors resealed before it are left as they were.
func TestResealAllOrNothing(t *testing.T) {
	url := storetest.NewURL(t)
	createWithHeader(t, url, keyOf(2), "first", "http://127.0.0.1:9/mcp", "Bearer x")
	createWithHeader(t, url, keyOf(1)+","+keyOf(2), "second", "http://127.0.0.1:9/mcp", "Bearer y")
	args := []string{"-database-url", url, "reseal"}
	for name, tt := range map[string]struct{ key, want string }{
		"no key":        {"", "reseal needs SECRET_KEY"},
		"without key 1": {keyOf(3) + "," + keyOf(2), `connector "second" of workspace "acme": stored secrets do not decrypt`},
	} {
		err := run(testCtx(t), args, getenv(map[string]string{"SECRET_KEY": tt.key}), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: reseal = %v; want an error saying %q", name, err, tt.want)
		}
	}
	// "first" was resealed under key 3, then rolled back: key 2 alone, which
	// start-up checks it with, still opens it.
	if err := start(t, url, map[string]string{"SECRET_KEY": keyOf(2)}).stop(); err != nil {
		t.Fatal(err)
	}
}

// TestBadSecretKeyFailsFirst: a bad SECRET_KEY is refused before the
// database is touched (here one that cannot be reached), for every command
// that opens it.
func TestBadSecretKeyFailsFirst(t *testing.T) {
	for _, command := range []string{"serve", "migrate", "reseal"} {
		args := []string{"-database-url", "postgres://postgres@127.0.0.1:1/x?sslmode=disable", command}
		err := run(testCtx(t), args, getenv(map[string]string{"SECRET_KEY": keyOf(1) + ",short"}), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "SECRET_KEY key 2 of 2") || strings.Contains(err.Error(), "Postgres") {
			t.Errorf("%s with a bad SECRET_KEY = %v; want the key's error, before any database work", command, err)
		}
	}
}
