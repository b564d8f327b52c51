package main

import (
	"bytes"
	"errors"
	"flag"
	"net/url"
	"strings"
	"testing"
	"time"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

// planted are secret values a lifecycle run is given; none may show up in
// its output.
type planted map[string]string

// check fails t for each planted value in out, naming where it was seen.
func (p planted) check(t *testing.T, where, out string) {
	t.Helper()
	for name, v := range p {
		if strings.Contains(out, v) {
			t.Errorf("%s shows the %s", where, name)
		}
	}
}

// withPassword is databaseURL with a password; the test server trusts
// local connections, so any password works.
func withPassword(t *testing.T, databaseURL, password string) string {
	t.Helper()
	u, err := url.Parse(databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), password)
	return u.String()
}

func TestHelpShowsNoEnvironmentValues(t *testing.T) {
	secrets := planted{"DATABASE_URL password": "pw-PLANTED-db-7c2e", "LLM_API_KEY": "sk-PLANTED-llm-91af",
		"SECRET_KEY": keyOf(0x5A), "LLM_BASE_URL password": "pw-PLANTED-llmurl-3b0d"}
	env := map[string]string{
		"DATABASE_URL": "postgres://postgres:" + secrets["DATABASE_URL password"] + "@db:5432/x",
		"LLM_API_KEY":  secrets["LLM_API_KEY"], "SECRET_KEY": secrets["SECRET_KEY"],
		"LLM_BASE_URL": "http://me:" + secrets["LLM_BASE_URL password"] + "@llm/v1", "LLM_MODEL": "m",
		"GRPC_ADDR": "10.9.8.7:1234",
	}
	for _, args := range [][]string{{"-h"}, {"-nope"}, {"-health-concurrency", "many"}} {
		var out bytes.Buffer
		err := run(testCtx(t), args, getenv(env), &out)
		if err == nil {
			t.Fatalf("run %v = nil; want an error", args)
		}
		if args[0] == "-h" && !errors.Is(err, flag.ErrHelp) {
			t.Errorf("run -h = %v; want flag.ErrHelp", err)
		}
		var usage *usageError
		if errors.As(err, &usage) { // main prints it to stderr
			out.WriteString(usage.usage)
		}
		secrets.check(t, "the output of run "+strings.Join(args, " "), out.String()+err.Error())
		for _, want := range []string{"SECRET_KEY", "LLM_API_KEY", "DATABASE_URL", defaultDatabaseURL, "127.0.0.1:50051"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("the output of run %v does not show %q:\n%s", args, want, &out)
			}
		}
		if strings.Contains(out.String(), env["GRPC_ADDR"]) {
			t.Errorf("the output of run %v shows GRPC_ADDR's value instead of the built-in default", args)
		}
	}
}

// TestLogsShowNoSecrets runs a whole lifecycle with secrets planted in
// every setting and connector field that takes one, and looks for them in
// everything the service wrote.
func TestLogsShowNoSecrets(t *testing.T) {
	secrets := planted{"DATABASE_URL password": "pw-PLANTED-db-7c2e", "LLM_API_KEY": "sk-PLANTED-llm-91af",
		"LLM_BASE_URL password": "pw-PLANTED-llmurl-3b0d", "new SECRET_KEY": keyOf(0x5A), "old SECRET_KEY": keyOf(0x5B),
		"header value": "hdr-PLANTED-5e4a", "URL query value": "q-PLANTED-a17d", "env value": "env-PLANTED-0c6f"}
	mcpURL := echoMCP(t, "Bearer "+secrets["header value"])
	model := llmtest.New(t, llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"x"}`}), llmtest.Answer("done"))
	llmURL := strings.Replace(model.URL(), "http://", "http://me:"+secrets["LLM_BASE_URL password"]+"@", 1)
	databaseURL := withPassword(t, storetest.NewURL(t), secrets["DATABASE_URL password"])
	env := map[string]string{"DATABASE_URL": databaseURL, "SECRET_KEY": secrets["new SECRET_KEY"] + "," + secrets["old SECRET_KEY"],
		"LLM_BASE_URL": llmURL, "LLM_MODEL": "m", "LLM_API_KEY": secrets["LLM_API_KEY"], "STDIO_ALLOWED_COMMANDS": "sh"}

	svc := start(t, databaseURL, env)
	client := connectorv1.NewConnectorServiceClient(dial(t, svc.addr))
	for _, c := range []*connectorv1.Connector{
		{ConnectorId: "http", Transport: connectorv1.Transport_TRANSPORT_STREAMABLE_HTTP, ApprovalPolicy: noApproval, Connection: &connectorv1.Connector_Http{Http: &connectorv1.HttpConfig{
			Url: mcpURL + "?key=" + secrets["URL query value"], Headers: map[string]string{"Authorization": "Bearer " + secrets["header value"]}}}},
		// A server that prints its secret to stderr and dies: its last lines reach the health error and the log.
		{ConnectorId: "stdio", Transport: connectorv1.Transport_TRANSPORT_STDIO, ApprovalPolicy: noApproval, Connection: &connectorv1.Connector_Stdio{Stdio: &connectorv1.StdioConfig{
			Command: "sh", Args: []string{"-c", `echo "token is $TOKEN" >&2; exit 3`}, Env: map[string]string{"TOKEN": secrets["env value"]}}}},
	} {
		if _, err := client.CreateConnector(testCtx(t), &connectorv1.CreateConnectorRequest{WorkspaceId: "acme", Connector: c}); err != nil {
			t.Fatal(err)
		}
	}
	callEcho(t, svc.addr, "acme", "http")
	if _, err := client.QueryConnector(testCtx(t), &connectorv1.QueryConnectorRequest{WorkspaceId: "acme", ConnectorId: "http", Query: "q"}); err != nil {
		t.Fatalf("QueryConnector: %v", err)
	}
	waitLastError(t, client, "acme", "stdio", "token is REDACTED")
	health, err := healthcheckCmd(t, svc.addr, env)
	if err != nil {
		t.Fatalf("healthcheck: %v", err)
	}
	if err := svc.stop(); err != nil {
		t.Fatal(err)
	}
	var reseal bytes.Buffer
	if err := run(testCtx(t), []string{"reseal"}, getenv(env), &reseal); err != nil {
		t.Fatalf("reseal: %v", err)
	}
	again := start(t, databaseURL, env)
	if err := again.stop(); err != nil {
		t.Fatal(err)
	}
	for where, out := range map[string]string{"the first run's log": svc.out.String(), "reseal's log": reseal.String(),
		"healthcheck's output": health, "the second run's log": again.out.String()} {
		secrets.check(t, where, out)
	}
	for _, want := range []string{`"msg":"LLM configured"`, "me:REDACTED@127.0.0.1", "token is REDACTED"} {
		if !strings.Contains(svc.out.String(), want) {
			t.Errorf("the first run's log has no %q: the test missed what it looks at", want)
		}
	}
}

// waitLastError waits until a connector's health error contains want.
func waitLastError(t *testing.T, client connectorv1.ConnectorServiceClient, ws, id, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := client.GetConnector(testCtx(t), &connectorv1.GetConnectorRequest{WorkspaceId: ws, ConnectorId: id})
		if err == nil && strings.Contains(got.GetConnector().GetHealth().GetLastError(), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("connector %s: health error never had %q: %v %v", id, want, got.GetConnector().GetHealth(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
