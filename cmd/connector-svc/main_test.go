package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http/httptest"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

func TestMain(m *testing.M) { os.Exit(storetest.Main(m)) }

const distinctive = "sk-E2E-LEAKCHECK-41c9"

var testKey = base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{3}, 32))

// service is one run() of the service in this process.
type service struct {
	addr  string
	admin string // the admin listener's address
	// console is the console's address, when -console-addr was given.
	console string
	out     *lockedBuffer
	stop    func() error // cancels run's context and returns run's error
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func getenv(env map[string]string) func(string) string {
	return func(k string) string { return env[k] }
}

// start runs run() on databaseURL with free ports (gRPC and admin) and
// waits until it logs that it serves. args come after the defaults, so
// they may override them.
func start(t *testing.T, databaseURL string, env map[string]string, args ...string) *service {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	out := &lockedBuffer{}
	done := make(chan error, 1)
	go func() {
		err := run(ctx, append([]string{"-grpc-addr", "127.0.0.1:0", "-admin-addr", "127.0.0.1:0", "-database-url", databaseURL}, args...),
			getenv(env), pw)
		pw.CloseWithError(errors.New("run returned"))
		done <- err
	}()
	addr := make(chan string, 1)
	var admin string
	consoleAddr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			out.Write(append(sc.Bytes(), '\n'))
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "admin serving" {
				admin = line.Addr // logged before serving
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "console serving" {
				consoleAddr <- line.Addr // logged before serving
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "serving" {
				addr <- line.Addr
			}
		}
	}()
	stop := sync.OnceValue(func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(30 * time.Second):
			return errors.New("run did not return within 30s of cancel")
		}
	})
	t.Cleanup(func() { _ = stop() })
	select {
	case a := <-addr:
		svc := &service{addr: a, admin: admin, out: out, stop: stop}
		select {
		case svc.console = <-consoleAddr:
		default:
		}
		return svc
	case err := <-done:
		t.Fatalf("run returned before serving: %v\n%s", err, out.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("run did not serve within 30s:\n%s", out.String())
	}
	return nil
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// noApproval is the approval policy of the connectors these tests make:
// they test other things, and call their tools freely. The approval tests
// name their own.
const noApproval = connectorv1.ApprovalPolicy_APPROVAL_POLICY_NONE

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestEndToEndSurvivesRestart(t *testing.T) {
	url := storetest.NewURL(t)
	env := map[string]string{"SECRET_KEY": testKey}
	svc := start(t, url, env)
	conn := dial(t, svc.addr)

	health, err := healthpb.NewHealthClient(conn).Check(testCtx(t),
		&healthpb.HealthCheckRequest{Service: connectorv1.ConnectorService_ServiceDesc.ServiceName})
	if err != nil || health.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health = %v, %v; want SERVING", health, err)
	}

	client := connectorv1.NewConnectorServiceClient(conn)
	_, err = client.CreateConnector(testCtx(t), &connectorv1.CreateConnectorRequest{WorkspaceId: "acme",
		Connector: &connectorv1.Connector{ConnectorId: "github", Transport: connectorv1.Transport_TRANSPORT_STREAMABLE_HTTP, ApprovalPolicy: noApproval,
			Connection: &connectorv1.Connector_Http{Http: &connectorv1.HttpConfig{
				Url: "http://127.0.0.1:9/mcp", Headers: map[string]string{"Authorization": "Bearer " + distinctive}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.stop(); err != nil {
		t.Fatalf("run after cancel: %v", err)
	}

	svc2 := start(t, url, env)
	got, err := connectorv1.NewConnectorServiceClient(dial(t, svc2.addr)).GetConnector(testCtx(t),
		&connectorv1.GetConnectorRequest{WorkspaceId: "acme", ConnectorId: "github"})
	if err != nil {
		t.Fatalf("GetConnector after restart: %v", err)
	}
	if c := got.GetConnector(); c.GetName() != "github" || c.GetHttp().GetHeaderNames()[0] != "Authorization" {
		t.Errorf("connector after restart = %v", c)
	}
	if err := svc2.stop(); err != nil {
		t.Fatal(err)
	}
	for _, out := range []string{svc.out.String(), svc2.out.String()} {
		if strings.Contains(out, distinctive) || strings.Contains(out, testKey) {
			t.Error("the service's output contains a secret")
		}
		if !strings.Contains(out, `"msg":"stopped"`) {
			t.Errorf("no stopped line in output:\n%s", out)
		}
	}
}

func TestRunRefusesStoredSecretsWithoutTheirKey(t *testing.T) {
	url := storetest.NewURL(t)
	svc := start(t, url, map[string]string{"SECRET_KEY": testKey})
	_, err := connectorv1.NewConnectorServiceClient(dial(t, svc.addr)).CreateConnector(testCtx(t), &connectorv1.CreateConnectorRequest{
		WorkspaceId: "ws", Connector: &connectorv1.Connector{ConnectorId: "s", Transport: connectorv1.Transport_TRANSPORT_SSE, ApprovalPolicy: noApproval,
			Connection: &connectorv1.Connector_Http{Http: &connectorv1.HttpConfig{Url: "http://127.0.0.1:9/sse", Headers: map[string]string{"X-Key": distinctive}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.stop(); err != nil {
		t.Fatal(err)
	}
	otherKey := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{4}, 32))
	for name, env := range map[string]map[string]string{"no key": {}, "other key": {"SECRET_KEY": otherKey}} {
		err := run(testCtx(t), []string{"-grpc-addr", "127.0.0.1:0", "-database-url", url}, getenv(env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "SECRET_KEY") {
			t.Errorf("%s: run = %v; want an error naming SECRET_KEY", name, err)
			continue
		}
		// What to do in development: restore the key make run reads, or
		// drop this database.
		for _, want := range []string{".dev/secret_key", "DROP DATABASE " + dbName(t, url)} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: the error does not say %q:\n%v", name, want, err)
			}
		}
	}
}

// dbName is the database name of a Postgres URL.
func dbName(t *testing.T, databaseURL string) string {
	u, err := neturl.Parse(databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(u.Path, "/")
}

func TestRunUnreachableDatabase(t *testing.T) {
	start := time.Now()
	err := run(testCtx(t), []string{"-database-url", "postgres://postgres@127.0.0.1:1/x?sslmode=disable"}, getenv(nil), io.Discard)
	if err == nil {
		t.Fatal("run with an unreachable database returned nil")
	}
	for _, want := range []string{"127.0.0.1:1", "pg_ctlcluster", "DATABASE_URL"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("run took %v to give up", d)
	}
}

func TestRunMigrateCommand(t *testing.T) {
	url := storetest.NewURL(t)
	for range 2 {
		if err := run(testCtx(t), []string{"-database-url", url, "migrate"}, getenv(nil), io.Discard); err != nil {
			t.Fatalf("migrate: %v", err)
		}
	}
}

func TestRunBadConfig(t *testing.T) {
	tests := map[string]struct {
		args []string
		env  map[string]string
		want string
	}{
		"bad secret key":      {nil, map[string]string{"SECRET_KEY": "short"}, "SECRET_KEY"},
		"bad rpc timeout":     {nil, map[string]string{"RPC_TIMEOUT": "-1s"}, "RPC_TIMEOUT"},
		"bad grace flag":      {[]string{"-shutdown-grace", "soon"}, nil, "SHUTDOWN_GRACE"},
		"bad log level":       {nil, map[string]string{"LOG_LEVEL": "loud"}, "LOG_LEVEL"},
		"unknown command":     {[]string{"frobnicate"}, nil, "frobnicate"},
		"bad listen address":  {[]string{"-grpc-addr", "256.0.0.1:1"}, nil, "GRPC_ADDR"},
		"unknown flag":        {[]string{"-nope"}, nil, "nope"},
		"bad database url":    {[]string{"-database-url", "postgres://u:hunter2@[::1"}, nil, "database URL"},
		"bad size":            {nil, map[string]string{"MAX_TOOL_ARGUMENTS_BYTES": "4M"}, "MAX_TOOL_ARGUMENTS_BYTES"},
		"bad auth mode":       {nil, map[string]string{"AUTH": "maybe"}, "AUTH"},
		"bad keys command":    {[]string{"keys", "rotate"}, nil, "keys rotate"},
		"result cap too big":  {nil, map[string]string{"MAX_TOOL_RESULT_BYTES": "5000000"}, "GRPC_MAX_SEND_BYTES"},
		"args cap too big":    {[]string{"-grpc-max-recv-bytes", "1000000"}, nil, "GRPC_MAX_RECV_BYTES"},
		"bad egress allow":    {nil, map[string]string{"EGRESS_ALLOW_CIDRS": "10.0.0.0/8,metadata"}, "EGRESS_ALLOW_CIDRS"},
		"bad egress deny":     {[]string{"-egress-deny-cidrs", "127.0.0.0/33"}, nil, "EGRESS_DENY_CIDRS"},
		"bad session ttl":     {nil, map[string]string{"SESSION_IDLE_TTL": "0s"}, "SESSION_IDLE_TTL"},
		"bad session cap":     {[]string{"-max-sessions-per-connector", "0"}, nil, "MAX_SESSIONS_PER_CONNECTOR"},
		"number not a number": {nil, map[string]string{"NARROW_TOOLS_TO": "abc"}, `NARROW_TOOLS_TO "abc": want a whole number`},
		"bool not a bool":     {nil, map[string]string{"ADMIN_PPROF": "yes"}, `ADMIN_PPROF "yes": want true or false`},
		"bad advertise addr":  {nil, map[string]string{"INTERNAL_ADVERTISE_ADDR": "pod:ip:port"}, "INTERNAL_ADVERTISE_ADDR"},
	}
	url := storetest.NewURL(t)
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			args := append([]string{"-database-url", url}, tt.args...)
			err := run(testCtx(t), args, getenv(tt.env), io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("run = %v; want an error mentioning %q", err, tt.want)
			}
			if err != nil && strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error leaks the database password: %v", err)
			}
		})
	}
}

// TestSIGTERM builds the real binary, stops it with SIGTERM while a client
// holds a stream open, and checks it reports NOT_SERVING, exits 0 and
// bounds the drain by SHUTDOWN_GRACE.
func TestSIGTERM(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "connector-svc")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "-grpc-addr", "127.0.0.1:0", "-admin-addr", "127.0.0.1:0", "-database-url", storetest.NewURL(t), "-shutdown-grace", "1s")
	cmd.Env = append(os.Environ(), "SECRET_KEY="+testKey)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	sc := bufio.NewScanner(stdout)
	var addr string
	for addr == "" && sc.Scan() {
		var line struct{ Msg, Addr string }
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "serving" {
			addr = line.Addr
		}
	}
	if addr == "" {
		t.Fatalf("the binary never served; stderr:\n%s", stderr.String())
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()

	watch, err := healthpb.NewHealthClient(dial(t, addr)).Watch(testCtx(t), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if first, err := watch.Recv(); err != nil || first.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first health update = %v, %v; want SERVING", first, err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if next, err := watch.Recv(); err != nil || next.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health update after SIGTERM = %v, %v; want NOT_SERVING", next, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v; stderr:\n%s", err, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("still running 20s after SIGTERM with a 1s grace")
	}
}

// TestEndToEndQuery runs the real run() with an MCP server and a fake LLM,
// creates a connector over gRPC, and queries it unary and streaming.
func TestEndToEndQuery(t *testing.T) {
	m := mcpserver.NewMCPServer("e2e", "1.0")
	m.AddTool(mcp.NewTool("echo", mcp.WithDescription("Echoes text"), mcp.WithString("text", mcp.Required())),
		func(_ context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText("echo: " + r.GetString("text", "")), nil
		})
	mcpSrv := httptest.NewServer(mcpserver.NewStreamableHTTPServer(m))
	t.Cleanup(mcpSrv.Close)
	model := llmtest.New(t,
		llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"one"}`}), llmtest.Answer("It echoed one."),
		llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"two"}`}), llmtest.Answer("It echoed two."))
	svc := start(t, storetest.NewURL(t), map[string]string{
		"SECRET_KEY": testKey, "LLM_BASE_URL": model.URL(), "LLM_MODEL": "fake-model", "LLM_API_KEY": distinctive,
		"HEALTH_INTERVAL": "1s"})
	client := connectorv1.NewConnectorServiceClient(dial(t, svc.addr))

	_, err := client.CreateConnector(testCtx(t), &connectorv1.CreateConnectorRequest{WorkspaceId: "acme",
		Connector: &connectorv1.Connector{ConnectorId: "echo", Name: "Echo", Transport: connectorv1.Transport_TRANSPORT_STREAMABLE_HTTP, ApprovalPolicy: noApproval,
			Connection: &connectorv1.Connector_Http{Http: &connectorv1.HttpConfig{Url: mcpSrv.URL + "/mcp"}}}})
	if err != nil {
		t.Fatal(err)
	}
	waitTools(t, client, "acme", "echo", 1)

	resp, err := client.QueryConnector(testCtx(t), &connectorv1.QueryConnectorRequest{WorkspaceId: "acme", ConnectorId: "echo", Query: "echo one"})
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.GetResult(); r.GetAnswer() != "It echoed one." || r.GetSteps()[0].GetCalls()[0].GetResultExcerpt() != "echo: one" {
		t.Errorf("QueryConnector = %v", r)
	}

	stream, err := client.StreamQueryConnector(testCtx(t), &connectorv1.StreamQueryConnectorRequest{WorkspaceId: "acme", ConnectorId: "echo", Query: "echo two"})
	if err != nil {
		t.Fatal(err)
	}
	var events int
	var final *connectorv1.QueryResult
	for {
		msg, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		events++
		if r := msg.GetResult(); r != nil {
			final = r
		}
	}
	if events != 5 || final.GetAnswer() != "It echoed two." || final.GetToolsUsed()[0] != "echo" {
		t.Errorf("stream: %d events, final %v", events, final)
	}
	if err := svc.stop(); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(svc.out.String(), distinctive) {
		t.Error("the service's output contains the LLM API key")
	}
}

// waitTools waits until a connector has synced n tools.
func waitTools(t *testing.T, client connectorv1.ConnectorServiceClient, ws, id string, n int32) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := client.GetConnector(testCtx(t), &connectorv1.GetConnectorRequest{WorkspaceId: ws, ConnectorId: id})
		if err == nil && got.GetConnector().GetToolCount() == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("connector %s never synced its tools: %v", id, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestEndToEndSessionSettings checks the session settings reach the
// registry: a second session is over MAX_SESSIONS_PER_CONNECTOR, and an
// idle one closes after SESSION_IDLE_TTL.
func TestEndToEndSessionSettings(t *testing.T) {
	m := mcpserver.NewMCPServer("e2e", "1.0")
	m.AddTool(mcp.NewTool("ping", mcp.WithDescription("Pong")),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText("pong"), nil
		})
	mcpSrv := httptest.NewServer(mcpserver.NewStreamableHTTPServer(m))
	t.Cleanup(mcpSrv.Close)
	svc := start(t, storetest.NewURL(t), map[string]string{"MAX_SESSIONS_PER_CONNECTOR": "1", "SESSION_IDLE_TTL": "1s"})
	client := connectorv1.NewConnectorServiceClient(dial(t, svc.addr))
	_, err := client.CreateConnector(testCtx(t), &connectorv1.CreateConnectorRequest{WorkspaceId: "acme",
		Connector: &connectorv1.Connector{ConnectorId: "p", Transport: connectorv1.Transport_TRANSPORT_STREAMABLE_HTTP, ApprovalPolicy: noApproval,
			SessionMode: connectorv1.SessionMode_SESSION_MODE_PER_SESSION,
			Connection:  &connectorv1.Connector_Http{Http: &connectorv1.HttpConfig{Url: mcpSrv.URL + "/mcp"}}}})
	if err != nil {
		t.Fatal(err)
	}
	waitTools(t, client, "acme", "p", 1)
	call := func(session string) error {
		_, err := client.CallTool(testCtx(t), &connectorv1.CallToolRequest{WorkspaceId: "acme", ConnectorId: "p", ToolName: "ping", SessionId: session})
		return err
	}
	if err := call("a"); err != nil {
		t.Fatal(err)
	}
	if err := call("b"); status.Code(err) != codes.ResourceExhausted || reasonOf(err) != "SESSION_LIMIT" {
		t.Errorf("a second session with MAX_SESSIONS_PER_CONNECTOR=1: %v (reason %q), want RESOURCE_EXHAUSTED SESSION_LIMIT", err, reasonOf(err))
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := client.ListSessions(testCtx(t), &connectorv1.ListSessionsRequest{WorkspaceId: "acme", ConnectorId: "p"})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetSessions()) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("session a still open 20s into a SESSION_IDLE_TTL of 1s: %v", resp.GetSessions())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The closed session's row leaves the sessions table right after the
	// connection closes, a moment after ListSessions stops showing it.
	for err := call("b"); err != nil; err = call("b") {
		if status.Code(err) != codes.ResourceExhausted || time.Now().After(deadline) {
			t.Fatalf("a session after the idle one closed: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestEndToEndSizeSettings checks the size settings reach the server:
// arguments and results over their caps are refused with their reasons,
// and a request over GRPC_MAX_RECV_BYTES by gRPC itself.
func TestEndToEndSizeSettings(t *testing.T) {
	m := mcpserver.NewMCPServer("e2e", "1.0")
	m.AddTool(mcp.NewTool("text", mcp.WithDescription("Text of n bytes"), mcp.WithNumber("n", mcp.Required())),
		func(_ context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText(strings.Repeat("x", r.GetInt("n", 0))), nil
		})
	mcpSrv := httptest.NewServer(mcpserver.NewStreamableHTTPServer(m))
	t.Cleanup(mcpSrv.Close)
	svc := start(t, storetest.NewURL(t), map[string]string{"MAX_TOOL_RESULT_BYTES": "4000", "GRPC_MAX_SEND_BYTES": "64000",
		"MAX_TOOL_ARGUMENTS_BYTES": "1000", "GRPC_MAX_RECV_BYTES": "2000"})
	client := connectorv1.NewConnectorServiceClient(dial(t, svc.addr))
	_, err := client.CreateConnector(testCtx(t), &connectorv1.CreateConnectorRequest{WorkspaceId: "acme",
		Connector: &connectorv1.Connector{ConnectorId: "t", Transport: connectorv1.Transport_TRANSPORT_STREAMABLE_HTTP, ApprovalPolicy: noApproval,
			Connection: &connectorv1.Connector_Http{Http: &connectorv1.HttpConfig{Url: mcpSrv.URL + "/mcp"}}}})
	if err != nil {
		t.Fatal(err)
	}
	waitTools(t, client, "acme", "t", 1)

	call := func(args map[string]any) error {
		st, err := structpb.NewStruct(args)
		if err != nil {
			t.Fatal(err)
		}
		_, err = client.CallTool(testCtx(t), &connectorv1.CallToolRequest{WorkspaceId: "acme", ConnectorId: "t", ToolName: "text", Arguments: st})
		return err
	}
	for _, tt := range []struct {
		name   string
		args   map[string]any
		code   codes.Code
		reason string
	}{
		{"result under MAX_TOOL_RESULT_BYTES", map[string]any{"n": 3000}, codes.OK, ""},
		{"result over MAX_TOOL_RESULT_BYTES", map[string]any{"n": 5000}, codes.ResourceExhausted, "TOOL_RESULT_TOO_LARGE"},
		{"arguments over MAX_TOOL_ARGUMENTS_BYTES", map[string]any{"n": 1, "pad": strings.Repeat("p", 1500)},
			codes.ResourceExhausted, "ARGUMENTS_TOO_LARGE"},
		{"request over GRPC_MAX_RECV_BYTES: gRPC's own error, no reason", map[string]any{"n": 1, "pad": strings.Repeat("p", 3000)},
			codes.ResourceExhausted, ""},
	} {
		err := call(tt.args)
		if status.Code(err) != tt.code || reasonOf(err) != tt.reason {
			t.Errorf("%s: CallTool = %v (reason %q), want %v %q", tt.name, err, reasonOf(err), tt.code, tt.reason)
		}
	}
}

func reasonOf(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}
