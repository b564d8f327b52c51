package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

// keysCLI runs `connector-svc keys …` through run() and returns its output.
func keysCLI(t *testing.T, url string, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := run(testCtx(t), append([]string{"-database-url", url, "keys"}, args...), getenv(nil), &out)
	return out.String(), err
}

// createKey makes a key with the CLI and returns its token.
func createKey(t *testing.T, url, workspace, scope string) string {
	t.Helper()
	out, err := keysCLI(t, url, "create", "--workspace", workspace, "--scope", scope, "--name", "test "+scope)
	if err != nil {
		t.Fatalf("keys create: %v", err)
	}
	return strings.TrimSuffix(out, "\n")
}

var (
	tokenPattern = regexp.MustCompile(`^csk_([a-z2-7]{8})_[A-Za-z0-9_-]{43}$`)
	anyToken     = regexp.MustCompile(`csk_[a-z2-7]{8}_[A-Za-z0-9_-]{43}`)
)

func keyID(t *testing.T, token string) string {
	t.Helper()
	m := tokenPattern.FindStringSubmatch(token)
	if m == nil {
		t.Fatalf("%q is not a token", token)
	}
	return m[1]
}

func withKey(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

func TestKeysCLI(t *testing.T) {
	url := storetest.NewURL(t)
	admin := createKey(t, url, "acme", "admin,query")
	query := createKey(t, url, "acme", "query")
	createKey(t, url, "globex", "admin")
	adminID, queryID := keyID(t, admin), keyID(t, query)

	if _, err := keysCLI(t, url, "revoke", queryID); err != nil {
		t.Fatal(err)
	}
	list, err := keysCLI(t, url, "list", "--workspace", "acme")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(list), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID ") {
		t.Fatalf("keys list shows %d lines, want a header and 2 keys:\n%s", len(lines), list)
	}
	for _, want := range []string{adminID, "admin,query", "csk_" + adminID + "_…" + admin[len(admin)-4:], queryID, "test query"} {
		if !strings.Contains(list, want) {
			t.Errorf("keys list does not show %q:\n%s", want, list)
		}
	}
	if strings.Contains(list, admin) || strings.Contains(list, query) {
		t.Errorf("keys list shows a token:\n%s", list)
	}
	if revoked := lines[1:]; strings.HasSuffix(revoked[0], " -") == strings.HasSuffix(revoked[1], " -") {
		t.Errorf("keys list does not tell the revoked key from the valid one:\n%s", list)
	}

	for name, tt := range map[string]struct {
		args []string
		want string // what the error says is wrong
	}{
		"no scope":          {[]string{"create", "--workspace", "acme"}, "keys create: --scope is missing"},
		"bad scope":         {[]string{"create", "--workspace", "acme", "--scope", "root"}, "keys create: --scope:"},
		"no workspace":      {[]string{"create", "--scope", "admin"}, "keys create: --workspace is missing"},
		"list no workspace": {[]string{"list"}, "keys list: --workspace is missing"},
		"list extra":        {[]string{"list", "--workspace", "acme", "all"}, `keys list takes flags only, not ["all"]`},
		"revoke unknown":    {[]string{"revoke", "aaaaaaaa"}, `no API key "aaaaaaaa"`},
		"revoke no id":      {[]string{"revoke"}, "keys revoke: the key ID is missing"},
	} {
		out, err := keysCLI(t, url, tt.args...)
		if err == nil || anyToken.MatchString(out) {
			t.Errorf("keys %s: %q, %v; want an error and no token", name, out, err)
			continue
		}
		if !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "<nil>") {
			t.Errorf("keys %s: %v; want an error saying %q", name, err, tt.want)
		}
	}
}

// rpc is one method of ConnectorService, called with a request that names
// a workspace and is otherwise empty: enough to pass or fail the guard.
type rpc struct {
	name   string
	desc   protoreflect.MethodDescriptor
	stream bool
}

func allRPCs(t *testing.T) []rpc {
	t.Helper()
	sd := connectorv1.File_connector_v1_connector_service_proto.Services().ByName("ConnectorService")
	var out []rpc
	for i := range sd.Methods().Len() {
		m := sd.Methods().Get(i)
		out = append(out, rpc{name: "/" + string(sd.FullName()) + "/" + string(m.Name()), desc: m, stream: m.IsStreamingServer()})
	}
	if len(out) < 15 {
		t.Fatalf("found %d RPCs", len(out))
	}
	return out
}

func (r rpc) call(ctx context.Context, conn *grpc.ClientConn, workspace string) error {
	req := dynamicpb.NewMessage(r.desc.Input())
	if f := r.desc.Input().Fields().ByName("workspace_id"); f != nil {
		req.Set(f, protoreflect.ValueOfString(workspace))
	}
	if !r.stream {
		return conn.Invoke(ctx, r.name, req, dynamicpb.NewMessage(r.desc.Output()))
	}
	s, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, r.name)
	if err != nil {
		return err
	}
	if err := s.SendMsg(req); err != nil && err != io.EOF { // io.EOF: RecvMsg has the status
		return err
	}
	if err := s.CloseSend(); err != nil {
		return err
	}
	for {
		if err := s.RecvMsg(dynamicpb.NewMessage(r.desc.Output())); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
	}
}

// queryRPCs are the RPCs a query key may call (scopes query and call); the others need admin.
var queryRPCs = map[string]bool{"CallTool": true, "StreamCallTool": true, "QueryConnector": true, "StreamQueryConnector": true,
	"ListSessions": true, "CloseSession": true, "ResumeQuery": true, "StreamResumeQuery": true, "GetQueryRun": true, "ListQueryRuns": true,
	"StartAuthorization": true, "CompleteAuthorization": true, "ListAuthorizations": true, "RevokeAuthorization": true, "AnswerInput": true,
	// Resources, prompts and completions are read as tools are called (scope call, which query implies).
	"ListResources": true, "ListResourceTemplates": true, "ReadResource": true, "ListPrompts": true, "GetPrompt": true, "Complete": true,
	"WatchResources": true}

// TestEndToEndAuth runs the real run() with keys and checks who may call
// what, over gRPC.
func TestEndToEndAuth(t *testing.T) {
	url := storetest.NewURL(t)
	admin := createKey(t, url, "acme", "admin")
	query := createKey(t, url, "acme", "query")
	globex := createKey(t, url, "globex", "admin,query")
	svc := start(t, url, map[string]string{"SECRET_KEY": testKey})
	conn := dial(t, svc.addr)

	health, err := healthpb.NewHealthClient(conn).Check(testCtx(t), &healthpb.HealthCheckRequest{})
	if err != nil || health.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health without a key = %v, %v; want SERVING", health, err)
	}
	for _, r := range allRPCs(t) {
		if err := r.call(testCtx(t), conn, "acme"); status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s without a key = %v; want UNAUTHENTICATED", r.name, err)
		}
		// CompleteAuthorization names no workspace: the state it completes
		// has one, checked against the key's (TestCompleteAuthorizationWorkspace).
		named := r.desc.Input().Fields().ByName("workspace_id") != nil
		if err := r.call(withKey(testCtx(t), globex), conn, "acme"); named && (status.Code(err) != codes.PermissionDenied ||
			!strings.Contains(err.Error(), `for workspace "globex"`)) {
			t.Errorf("%s with a key of another workspace = %v; want PERMISSION_DENIED naming its workspace", r.name, err)
		}
		err := r.call(withKey(testCtx(t), query), conn, "acme")
		switch denied := status.Code(err) == codes.Unauthenticated || status.Code(err) == codes.PermissionDenied; {
		case queryRPCs[string(r.desc.Name())] && denied:
			t.Errorf("%s with a query key = %v; it is a query RPC", r.name, err)
		case !queryRPCs[string(r.desc.Name())] && (status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "needs scope admin")):
			t.Errorf("%s with a query key = %v; want PERMISSION_DENIED naming scope admin", r.name, err)
		}
		if err := r.call(withKey(testCtx(t), admin), conn, "acme"); status.Code(err) == codes.Unauthenticated || status.Code(err) == codes.PermissionDenied {
			t.Errorf("%s with an admin key = %v", r.name, err)
		}
	}

	if err := listServices(testCtx(t), conn); status.Code(err) != codes.Unauthenticated {
		t.Errorf("reflection without a key = %v; want UNAUTHENTICATED", err)
	}
	if err := listServices(withKey(testCtx(t), query), conn); err != nil {
		t.Errorf("reflection with a key = %v", err)
	}

	client := connectorv1.NewConnectorServiceClient(conn)
	get := func(token string) error {
		_, err := client.ListConnectors(withKey(testCtx(t), token), &connectorv1.ListConnectorsRequest{WorkspaceId: "acme"})
		return err
	}
	if err := get(admin); err != nil {
		t.Fatal(err)
	}
	second, err := client.CreateApiKey(withKey(testCtx(t), admin), &connectorv1.CreateApiKeyRequest{WorkspaceId: "acme",
		Scopes: []connectorv1.ApiKeyScope{connectorv1.ApiKeyScope_API_KEY_SCOPE_ADMIN}, Name: "second"})
	if err != nil {
		t.Fatal(err)
	}
	if err := get(second.GetToken()); err != nil {
		t.Fatalf("with a key made by CreateApiKey: %v", err)
	}
	if _, err := client.RevokeApiKey(withKey(testCtx(t), admin), &connectorv1.RevokeApiKeyRequest{WorkspaceId: "acme",
		KeyId: second.GetApiKey().GetKeyId()}); err != nil {
		t.Fatal(err)
	}
	if err := get(second.GetToken()); status.Code(err) != codes.Unauthenticated { // at once: no waiting
		t.Errorf("right after RevokeApiKey, a call with the key = %v; want UNAUTHENTICATED", err)
	}
	if _, err := keysCLI(t, url, "revoke", keyID(t, admin)); err != nil { // another process, while the service runs
		t.Fatal(err)
	}
	waitUnauthenticated(t, "a call with the key revoked by the CLI", func() error { return get(admin) })
	if err := get(admin); !strings.Contains(err.Error(), "revoked") {
		t.Errorf("call with the revoked key = %v; want it named revoked", err)
	}

	if err := svc.stop(); err != nil {
		t.Fatal(err)
	}
	out := svc.out.String()
	for _, token := range []string{admin, query, globex, second.GetToken()} {
		if strings.Contains(out, token) {
			t.Fatal("the service's output contains a token")
		}
	}
	if !strings.Contains(out, `"key_id":"`+keyID(t, admin)+`"`) {
		t.Error("no log line names the key id")
	}
}

// waitUnauthenticated waits until call fails UNAUTHENTICATED. Key changes
// by another process reach the service by notification: 5 s is far below
// the cache TTL, so only the notification can pass it.
func waitUnauthenticated(t *testing.T, what string, call func() error) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := call()
		if status.Code(err) == codes.Unauthenticated {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s = %v; want UNAUTHENTICATED", what, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func listServices(ctx context.Context, conn *grpc.ClientConn) error {
	s, err := reflectionv1.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		return err
	}
	// io.EOF from Send means the server ended the stream: Recv has its status.
	if err := s.Send(&reflectionv1.ServerReflectionRequest{
		MessageRequest: &reflectionv1.ServerReflectionRequest_ListServices{}}); err != nil && err != io.EOF {
		return err
	}
	_, err = s.Recv()
	return err
}

// TestAutoModeTurnsOnWithTheFirstKey: without keys the service serves
// everyone on loopback; the first key, made by the CLI while it runs,
// turns auth on at once.
func TestAutoModeTurnsOnWithTheFirstKey(t *testing.T) {
	url := storetest.NewURL(t)
	svc := start(t, url, nil)
	if !strings.Contains(svc.out.String(), "serving without authentication, on loopback only") {
		t.Errorf("no warning that auth is off:\n%s", svc.out.String())
	}
	client := connectorv1.NewConnectorServiceClient(dial(t, svc.addr))
	list := func(ctx context.Context) error {
		_, err := client.ListConnectors(ctx, &connectorv1.ListConnectorsRequest{WorkspaceId: "acme"})
		return err
	}
	if err := list(testCtx(t)); err != nil {
		t.Fatalf("without keys: %v", err)
	}
	token := createKey(t, url, "acme", "admin")
	waitUnauthenticated(t, "a call without a key, after the first key was created", func() error { return list(testCtx(t)) })
	if err := list(withKey(testCtx(t), token)); err != nil {
		t.Errorf("with the key: %v", err)
	}
}

// TestRunRefusesToServeEveryoneOnANonLoopbackAddress checks the refusal, and
// what lifts it: a key, AUTH=keys, or the explicit opt-out.
func TestRunRefusesToServeEveryoneOnANonLoopbackAddress(t *testing.T) {
	url := storetest.NewURL(t)
	for name, env := range map[string]map[string]string{"auto, no key": nil, "AUTH=none": {"AUTH": "none"}} {
		err := run(testCtx(t), []string{"-database-url", url, "-grpc-addr", "0.0.0.0:0"}, getenv(env), io.Discard)
		for _, want := range []string{"0.0.0.0:0", "not a loopback address", "connector-svc keys create", "AUTH=keys", "AUTH=none-any-address"} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: run on 0.0.0.0 = %v; want an error saying %q", name, err, want)
			}
		}
	}

	optOut := start(t, url, map[string]string{"AUTH": "none-any-address"}, "-grpc-addr", "0.0.0.0:0")
	if !strings.Contains(optOut.out.String(), "WITHOUT authentication on any address") {
		t.Errorf("AUTH=none-any-address does not warn:\n%s", optOut.out.String())
	}
	if _, err := connectorv1.NewConnectorServiceClient(dial(t, optOut.addr)).ListConnectors(testCtx(t),
		&connectorv1.ListConnectorsRequest{WorkspaceId: "acme"}); err != nil {
		t.Errorf("AUTH=none-any-address, call without a key: %v", err)
	}
	if err := optOut.stop(); err != nil {
		t.Fatal(err)
	}

	keysMode := start(t, url, map[string]string{"AUTH": "keys"}, "-grpc-addr", "0.0.0.0:0")
	if !strings.Contains(keysMode.out.String(), "every call is refused until one is created") {
		t.Errorf("AUTH=keys without keys does not warn:\n%s", keysMode.out.String())
	}
	if err := keysMode.stop(); err != nil {
		t.Fatal(err)
	}
	createKey(t, url, "acme", "admin")
	withKeys := start(t, url, nil, "-grpc-addr", "0.0.0.0:0")
	if _, err := connectorv1.NewConnectorServiceClient(dial(t, withKeys.addr)).ListConnectors(testCtx(t),
		&connectorv1.ListConnectorsRequest{WorkspaceId: "acme"}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("auto with a key on 0.0.0.0, call without a key = %v; want UNAUTHENTICATED", err)
	}
}

// TestCheckAuth covers every start-up decision about auth: who may serve
// where, and what the log says.
func TestCheckAuth(t *testing.T) {
	for _, tt := range []struct {
		name      string
		mode      auth.Mode
		addr      string
		mutualTLS bool
		keys      bool
		refused   bool
		log       string
	}{
		{"auto, no key, loopback", auth.ModeAuto, "127.0.0.1:1", false, false, false, "without authentication, on loopback only"},
		{"auto, no key, localhost", auth.ModeAuto, "localhost:1", false, false, false, "on loopback only"},
		{"auto, no key, IPv6 loopback", auth.ModeAuto, "[::1]:1", false, false, false, "on loopback only"},
		{"auto, no key, every interface", auth.ModeAuto, ":1", false, false, true, ""},
		{"auto, no key, 0.0.0.0", auth.ModeAuto, "0.0.0.0:1", false, false, true, ""},
		{"auto, keys, 0.0.0.0", auth.ModeAuto, "0.0.0.0:1", false, true, false, "API keys required"},
		{"keys, no key, 0.0.0.0", auth.ModeKeys, "0.0.0.0:1", false, false, false, "every call is refused"},
		{"none, keys, loopback", auth.ModeNone, "127.0.0.1:1", false, true, false, "(AUTH=none), on loopback only"},
		{"none, 0.0.0.0", auth.ModeNone, "0.0.0.0:1", false, true, true, ""},
		{"none-any-address, 0.0.0.0", auth.ModeNoneAnyAddress, "0.0.0.0:1", false, false, false, "WITHOUT authentication on any address"},
		{"auto, no key, mutual TLS, 0.0.0.0", auth.ModeAuto, "0.0.0.0:1", true, false, false, "client certificates only"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := config{Auth: tt.mode, GRPCAddr: tt.addr}
			if tt.mutualTLS {
				cfg.TLSClientCAFile = "ca.pem"
			}
			var logs bytes.Buffer
			err := checkAuth(context.Background(), cfg, tt.keys, slog.New(slog.NewJSONHandler(&logs, nil)))
			if (err != nil) != tt.refused {
				t.Fatalf("checkAuth = %v; want refused %v", err, tt.refused)
			}
			if !strings.Contains(logs.String(), tt.log) {
				t.Errorf("log %q does not say %q", logs.String(), tt.log)
			}
		})
	}
}
