package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/structpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

// forgetfulMCP is an MCP server with an echo tool over streamable HTTP, on
// the session-based protocol only, that answers only requests with the
// Authorization header wantAuth. forget ends every session, as a server's
// idle expiry does: requests with an old session id get 404.
type forgetfulMCP struct {
	http  *httptest.Server
	epoch atomic.Int64
}

func newForgetfulMCP(t *testing.T, wantAuth string) *forgetfulMCP {
	t.Helper()
	m := mcpserver.NewMCPServer("forgetful", "1.0")
	m.AddTool(mcp.NewTool("echo", mcp.WithDescription("Echoes text"), mcp.WithString("text", mcp.Required())),
		func(_ context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText("echo: " + r.GetString("text", "")), nil
		})
	f := &forgetfulMCP{}
	h := mcpserver.NewStreamableHTTPServer(m, mcpserver.WithSessionIdManager(f),
		mcpserver.WithStreamableHTTPProtocolVersions(mcp.LegacyProtocolVersions()...))
	f.http = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != wantAuth {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(f.http.Close)
	return f
}

func (f *forgetfulMCP) url() string { return f.http.URL + "/mcp" }
func (f *forgetfulMCP) forget()     { f.epoch.Add(1) }

// Generate, Validate and Terminate make it its own session id manager:
// a session id is the epoch it was made in, a dash and a random number.
func (f *forgetfulMCP) Generate() string {
	return strconv.FormatInt(f.epoch.Load(), 10) + "-" + strconv.FormatUint(rand.Uint64(), 16)
}

func (f *forgetfulMCP) Validate(id string) (terminated bool, err error) {
	epoch, _, ok := strings.Cut(id, "-")
	if !ok {
		return false, errors.New("malformed session id")
	}
	return epoch != strconv.FormatInt(f.epoch.Load(), 10), nil
}

func (f *forgetfulMCP) Terminate(string) (bool, error) { return false, nil }

// TestDebugLogs runs a connector's lifecycle at LOG_LEVEL=debug: create,
// call, query, update, a session the server forgot, a call of a tool that
// does not exist, a connector that never connects, the server gone, delete.
// Every line is JSON, mcp-go's included; none holds a secret or a tool
// argument; the registry's decisions show; the NotFound's line names the
// connector and the tool.
func TestDebugLogs(t *testing.T) {
	secrets := planted{"header value": "hdr-PLANTED-d41c", "URL query value": "q-PLANTED-8e2b", "LLM_API_KEY": "sk-PLANTED-llm-c3a9",
		"CallTool argument": "arg-PLANTED-call-5f1e", "query's tool argument": "arg-PLANTED-query-9b7d",
		"argument after the expiry": "arg-PLANTED-retry-2a6c"}
	srv := newForgetfulMCP(t, "Bearer "+secrets["header value"])
	model := llmtest.New(t, llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"` + secrets["query's tool argument"] + `"}`}),
		llmtest.Answer("done"))
	svc := start(t, storetest.NewURL(t), map[string]string{"SECRET_KEY": testKey, "LOG_LEVEL": "debug",
		"LLM_BASE_URL": model.URL(), "LLM_MODEL": "m", "LLM_API_KEY": secrets["LLM_API_KEY"]})
	client := connectorv1.NewConnectorServiceClient(dial(t, svc.addr))
	for id, url := range map[string]string{"http": srv.url(), "dead": "http://127.0.0.1:9/mcp"} {
		_, err := client.CreateConnector(testCtx(t), &connectorv1.CreateConnectorRequest{WorkspaceId: "acme", Connector: &connectorv1.Connector{
			ConnectorId: id, Transport: connectorv1.Transport_TRANSPORT_STREAMABLE_HTTP, ApprovalPolicy: noApproval, Connection: &connectorv1.Connector_Http{Http: &connectorv1.HttpConfig{
				Url: url + "?key=" + secrets["URL query value"], Headers: map[string]string{"Authorization": "Bearer " + secrets["header value"]}}}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	waitTools(t, client, "acme", "http", 1)
	call := func(tool, text string) error {
		args, _ := structpb.NewStruct(map[string]any{"text": text})
		_, err := client.CallTool(testCtx(t), &connectorv1.CallToolRequest{WorkspaceId: "acme", ConnectorId: "http", ToolName: tool, Arguments: args})
		return err
	}
	if err := call("echo", secrets["CallTool argument"]); err != nil {
		t.Fatal(err)
	}
	if _, err := client.QueryConnector(testCtx(t), &connectorv1.QueryConnectorRequest{WorkspaceId: "acme", ConnectorId: "http", Query: "echo"}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.UpdateConnector(testCtx(t), &connectorv1.UpdateConnectorRequest{WorkspaceId: "acme",
		Connector:  &connectorv1.Connector{ConnectorId: "http", Description: "echoes"},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"description"}}}); err != nil {
		t.Fatal(err)
	}
	srv.forget()
	if err := call("echo", secrets["argument after the expiry"]); err != nil {
		t.Fatalf("a call after the server forgot the session: %v", err)
	}
	if err := call("nope", "x"); status.Code(err) != codes.NotFound {
		t.Fatalf("a call of an unknown tool: %v; want NotFound", err)
	}
	srv.http.Close() // the session's close request now fails: mcp-go logs it
	for _, id := range []string{"http", "dead"} {
		if _, err := client.DeleteConnector(testCtx(t), &connectorv1.DeleteConnectorRequest{WorkspaceId: "acme", ConnectorId: id}); err != nil {
			t.Fatal(err)
		}
	}
	if err := svc.stop(); err != nil {
		t.Fatal(err)
	}

	out := svc.out.String()
	secrets.check(t, "the debug log", out)
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var line map[string]any
		if err := json.Unmarshal([]byte(l), &line); err != nil {
			t.Errorf("a log line is not JSON: %s", l)
		}
		lines = append(lines, line)
	}
	for _, want := range []struct {
		what  string
		attrs map[string]string
	}{
		{"the NotFound's rpc line", map[string]string{"msg": "rpc", "code": "NotFound", "workspace_id": "acme", "connector_id": "http", "tool": "nope"}},
		{"a reconnect's backoff delay", map[string]string{"level": "DEBUG", "msg": "connector reconnect scheduled", "connector_id": "dead", "delay": ""}},
		{"the connect", map[string]string{"level": "DEBUG", "msg": "connector connecting", "connector_id": "http"}},
		{"the re-initialize", map[string]string{"level": "DEBUG", "msg": "connector session unknown to the server; re-initializing", "connector_id": "http"}},
		{"the retry", map[string]string{"level": "DEBUG", "msg": "retrying call on the renewed session", "connector_id": "http", "tool": "echo"}},
		{"mcp-go's own line", map[string]string{"component": "mcp-go", "connector_id": "http"}},
	} {
		if !hasLine(lines, want.attrs) {
			t.Errorf("no line for %s: want one with %v", want.what, want.attrs)
		}
	}
}

// hasLine reports whether a line has every attribute of want; an empty
// value wants the attribute, whatever its value.
func hasLine(lines []map[string]any, want map[string]string) bool {
next:
	for _, line := range lines {
		for k, v := range want {
			got, ok := line[k]
			if !ok || v != "" && fmt.Sprint(got) != v {
				continue next
			}
		}
		return true
	}
	return false
}
