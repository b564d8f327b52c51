package server_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/mark3labs/mcp-go/mcp"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/cluster"
	"github.com/connector-svc/connector-svc/internal/egress"
	"github.com/connector-svc/connector-svc/internal/forward"
	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/llm"
	"github.com/connector-svc/connector-svc/internal/oauth"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/runs"
	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/server"
	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
	"github.com/connector-svc/connector-svc/internal/telemetry/telemetrytest"
)

func TestMain(m *testing.M) { os.Exit(storetest.Main(m)) }

// distinctive is a secret value no response, log line or row may contain.
const distinctive = "sk-LEAKCHECK-b81f2e7d"

// syncBuffer collects log output written from RPC goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type fixture struct {
	client connectorv1.ConnectorServiceClient
	conn   *grpc.ClientConn
	db     *store.DB
	reg    *registry.Registry
	live   *live.Connectors
	logs   *syncBuffer
	keys   *auth.Keys
	srv    *server.Server
	// stop ends the server's background writes, writing what is left.
	stop func()
	// url is the database's connection string, for reading tables the
	// store has no method for.
	url string
	// members is the replica's cluster membership (options.replica).
	members *cluster.Membership
}

type options struct {
	noKey       bool
	llmURL      string         // a fake LLM endpoint: the server gets an agent
	maxSessions int            // the registry's cap per per_session connector; 0 is its default
	egress      *egress.Policy // nil: the default policy
	auth        auth.Mode
	tracer      trace.TracerProvider // nil: otel's global one
	// embeddings gives the agent the fake LLM's embeddings model; narrowTo
	// is how many tools a narrowed query is offered (0: the default).
	embeddings bool
	narrowTo   int
	// approvalTimeout, runRetention and runSweep set the server's run
	// record settings (0: defaults).
	approvalTimeout, runRetention, runSweep time.Duration
	// replicas is how many live replicas the server shares rate limits
	// with (0: it alone).
	replicas int
	// oauth, when set, runs the authorizations (Deps.OAuth) and puts the
	// tokens on OAuth connectors' requests (the registry's Authorize).
	oauth oauthSide
	// realOAuth gives the server and the registry an oauth.Manager on the
	// test's database (oauth is then ignored).
	realOAuth bool
	// replica, when set, makes the server a replica of that name on its
	// database, as main does with several: a cluster membership, the
	// sessions table routing per-session and per-user connections, and an
	// internal listener other replicas forward calls to and ask (signed
	// with forwardKey). Connectors are not shared out among the replicas:
	// each serves every connector (so stdio connectors, RefreshTools and
	// CheckConnector cannot be routed).
	replica string
	// shared, when set, is the fixture whose database this one uses, for
	// a second replica.
	shared *fixture
	// elicitationTimeout is the registry's ElicitationTimeout (0: its
	// default).
	elicitationTimeout time.Duration
	// sample answers the servers' sampling requests (the registry's
	// Sample); samplingBudget is the server's SamplingBudget.
	sample         func(ctx context.Context, id int64, a ask.Asker, call ask.Call, req mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error)
	samplingBudget func(*store.Connector) *ask.Budget
	// meters records the server's metrics (Deps.MeterProvider).
	meters *telemetrytest.Meters
	// maxResultBytes is MAX_TOOL_RESULT_BYTES, given to the server and the
	// registry as main does (0: the default).
	maxResultBytes int
}

// forwardKey signs the calls replicas forward to each other.
var forwardKey = forward.Key(bytes.Repeat([]byte{9}, 32))

// oauthSide is what the server and the registry use of an oauth.Manager.
type oauthSide interface {
	server.Authorizer
	live.Transporter
}

// setup serves a Server on a fresh database over an in-memory gRPC
// connection and returns a client and the server's collaborators.
func setup(t testing.TB, opts ...options) *fixture {
	t.Helper()
	var o options
	if len(opts) > 0 {
		o = opts[0]
	}
	var db *store.DB
	var url string
	if o.shared != nil {
		db, url = o.shared.db, o.shared.url
	} else {
		url = storetest.NewURL(t)
		var err error
		if db, err = store.Open(context.Background(), url, slog.New(slog.DiscardHandler)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(db.Close)
	}
	var box *secret.Box
	if !o.noKey {
		var err error
		if box, err = secret.ParseKey(base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{9}, 32))); err != nil {
			t.Fatal(err)
		}
	}
	logs := &syncBuffer{}
	// As in main: errors of MCP connections carry their URLs.
	logger := slog.New(secret.NewRedactingHandler(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if o.realOAuth {
		// As main wires it: one Manager both runs the authorizations and
		// authorizes the registry's requests.
		m, err := oauth.New(oauth.Config{DB: db, Box: box, RedirectURL: "http://127.0.0.1:9/oauth/callback",
			ReturnToAllowed: []string{"https://chat.test/"}, Logger: logger})
		if err != nil {
			t.Fatal(err)
		}
		o.oauth = server.NewAuthorizer(m)
	}
	src := live.NewSource(db, box, logger)
	var sessions *live.Sessions // a replica's; its hooks run once the registry serves
	regCfg := registry.Config{
		HealthInterval: 200 * time.Millisecond, BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		DiscoverTimeout: 300 * time.Millisecond, CloseGrace: 500 * time.Millisecond, UsageInterval: 20 * time.Millisecond,
		Egress:         o.egress,
		MaxSessions:    o.maxSessions,
		TracerProvider: o.tracer,
		Authorize:      authorizeWith(o.oauth),

		ElicitationTimeout: o.elicitationTimeout,
		Sample:             o.sample,
		MaxResultBytes:     o.maxResultBytes,
	}
	if o.replica != "" {
		regCfg.OnSessionOpened = func(id int64, sid string, h registry.SessionHandle) { sessions.Opened(id, sid, h) }
		regCfg.OnSessionClosed = func(id int64, sid string) { sessions.Closed(id, sid) }
	}
	reg := registry.New(src, regCfg, logger)
	if err := reg.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	regCtx, stopReg := context.WithCancel(context.Background())
	regDone := make(chan error, 1)
	go func() { regDone <- reg.Run(regCtx) }()
	t.Cleanup(func() {
		stopReg()
		if err := <-regDone; err != nil {
			t.Errorf("registry Run: %v", err)
		}
	})
	var agent *orchestrator.Agent
	var embedder orchestrator.Embedder
	var embeddingModel string
	if o.llmURL != "" {
		if o.embeddings {
			embeddingModel = "fake-embeddings"
		}
		model, err := llm.New(llm.Config{BaseURL: o.llmURL, APIKey: distinctive + "-llm", Model: "fake-model",
			EmbeddingModel: embeddingModel, MaxRetries: 1, BackoffBase: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if o.embeddings {
			embedder = model
		}
		agent = orchestrator.New(model, server.ToolCaller{Registry: reg}, orchestrator.Config{TracerProvider: o.tracer, NarrowTo: o.narrowTo, Embedder: embedder}, logger)
	}
	// As in main, the live copies follow changes made anywhere, on the
	// process's one LISTEN connection.
	lv := live.New(db, src, reg, nil, live.Config{Logger: logger, Embedder: embedder, EmbeddingModel: embeddingModel})
	if err := lv.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	listener := db.NewListener(100*time.Millisecond, logger)
	listener.Handle(store.ConnectorChangesChannel, lv.Notified)
	listener.OnListen(lv.Resync)
	liveCtx, stopLive := context.WithCancel(context.Background())
	jobs := []func(context.Context) error{lv.Run, listener.Run}
	// A replica, as main makes one (cluster.go).
	var router *live.Router
	var members *cluster.Membership
	var internal net.Listener
	if o.replica != "" {
		var err error
		if internal, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		members = cluster.New(db, cluster.Config{ID: o.replica, Addr: internal.Addr().String(), Logger: logger})
		if err := members.Register(context.Background()); err != nil {
			t.Fatal(err)
		}
		listener.Handle(store.ClusterChannel, members.Notified)
		pool, err := forward.NewPool(forwardKey, o.replica)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pool.Close() })
		sessionCap := o.maxSessions
		if sessionCap == 0 {
			sessionCap = 64 // the registry's default
		}
		sessions = live.NewSessions(db, reg, box, members, pool, sessionCap, logger)
		router = live.NewRouter(cluster.NewOwners(db, members, db.ActiveConnectorIDs), pool, reg)
		members.OnChange(func([]cluster.Member) { router.Moved() })
		jobs = append(jobs, members.Run)
	}
	liveDone := make(chan error, len(jobs))
	for _, job := range jobs {
		go func() { liveDone <- job(liveCtx) }()
	}
	t.Cleanup(func() {
		stopLive()
		for range jobs {
			if err := <-liveDone; err != nil {
				t.Errorf("live Run: %v", err)
			}
		}
	})
	// As in main, the keys follow changes (Run); revocations wait less.
	keys := auth.NewKeys(db, auth.Config{Confirm: 100 * time.Millisecond}, logger)
	keysCtx, stopKeys := context.WithCancel(context.Background())
	keysDone := make(chan error, 1)
	go func() { keysDone <- keys.Run(keysCtx) }()
	t.Cleanup(func() {
		stopKeys()
		if err := <-keysDone; err != nil {
			t.Errorf("keys Run: %v", err)
		}
	})
	var replicas func() int
	if o.replicas > 0 {
		replicas = func() int { return o.replicas }
	}
	var authorizer server.Authorizer
	if o.oauth != nil {
		authorizer = o.oauth
	}
	var meters metric.MeterProvider
	if o.meters != nil {
		meters = o.meters.Provider
	}
	srv := server.New(server.Deps{DB: db, Box: box, Registry: reg, Live: lv, Agent: agent, Keys: keys, Logger: logger, TracerProvider: o.tracer,
		Replicas: replicas, OAuth: authorizer, Router: router, Sessions: sessions, MeterProvider: meters},
		server.Config{StdioAllowedCommands: []string{"npx", "/usr/bin/mcp-server"}, Egress: o.egress, Auth: o.auth,
			ApprovalTimeout: o.approvalTimeout, RunFlushInterval: min(orDur(o.runSweep, time.Second), time.Second),
			SamplingBudget: o.samplingBudget, MaxToolResultBytes: o.maxResultBytes})
	// As in main: the counters and run records are written in the
	// background until the gRPC server stops (cleanups run last first),
	// and a sweeper (the leader's) ends and purges runs.
	sweeper := runs.NewSweeper(db, orDur(o.runSweep, time.Minute), orDur(o.runRetention, server.DefaultRunRetention), 30*time.Second, logger)
	srvCtx, stopSrv := context.WithCancel(context.Background())
	srvDone := make(chan error, 2)
	go func() { srvDone <- srv.Run(srvCtx, 5*time.Second) }()
	go func() { srvDone <- sweeper.Run(srvCtx) }()
	stop := sync.OnceFunc(func() {
		stopSrv()
		for range 2 {
			if err := <-srvDone; err != nil {
				t.Errorf("server Run: %v", err)
			}
		}
	})
	t.Cleanup(stop)
	g, _ := server.NewGRPCServer(srv)
	lis := bufconn.Listen(1 << 20)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if internal != nil {
		ig := server.NewInternalGRPCServer(srv, forward.ServerOptions(forwardKey, 0)...)
		go func() { _ = ig.Serve(internal) }()
		t.Cleanup(ig.Stop)
	}
	return &fixture{client: connectorv1.NewConnectorServiceClient(conn), conn: conn, db: db, reg: reg, live: lv, logs: logs, keys: keys,
		srv: srv, stop: stop, url: url, members: members}
}

// waitReplicas waits until each of fs sees them all live.
func waitReplicas(t *testing.T, fs ...*fixture) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, f := range fs {
		for len(f.members.Live()) != len(fs) {
			if time.Now().After(deadline) {
				t.Fatalf("replica %s sees %d live replicas, want %d", f.members.Self(), len(f.members.Live()), len(fs))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// authorizeWith is the registry's Authorize over o; nil without one.
func authorizeWith(o oauthSide) func(http.RoundTripper, registry.Spec, string) http.RoundTripper {
	if o == nil {
		return nil
	}
	return live.Authorize(o)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

func httpConnector(id string) *connectorv1.Connector {
	return &connectorv1.Connector{
		ConnectorId: id,
		Name:        "Connector " + id,
		Transport:   connectorv1.Transport_TRANSPORT_STREAMABLE_HTTP,
		Connection: &connectorv1.Connector_Http{Http: &connectorv1.HttpConfig{
			Url:     "http://127.0.0.1:9/mcp",
			Headers: map[string]string{"Authorization": "Bearer " + distinctive, "X-Team": distinctive},
		}},
	}
}

// create creates c. A connector that names no approval policy gets
// APPROVAL_POLICY_NONE, not the service's default, so that tests of other
// things call their tools freely; approval tests name their policy.
func (f *fixture) create(t *testing.T, ws string, c *connectorv1.Connector) *connectorv1.Connector {
	t.Helper()
	if c.GetApprovalPolicy() == connectorv1.ApprovalPolicy_APPROVAL_POLICY_UNSPECIFIED {
		c = proto.CloneOf(c)
		c.ApprovalPolicy = connectorv1.ApprovalPolicy_APPROVAL_POLICY_NONE
	}
	resp, err := f.client.CreateConnector(ctx(t), &connectorv1.CreateConnectorRequest{WorkspaceId: ws, Connector: c})
	if err != nil {
		t.Fatalf("CreateConnector(%s): %v", c.GetConnectorId(), err)
	}
	return resp.GetConnector()
}

// wantStatus checks an error's code, ErrorInfo reason and, if field is set,
// that a BadRequest violation or the message names it.
func wantStatus(t *testing.T, err error, code codes.Code, reason, field string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != code {
		t.Fatalf("code = %v (%s), want %v", st.Code(), st.Message(), code)
	}
	var gotReason string
	var fields []string
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			gotReason = d.GetReason()
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				fields = append(fields, v.GetField())
			}
		}
	}
	if gotReason != reason {
		t.Errorf("reason = %q, want %q (message %q)", gotReason, reason, st.Message())
	}
	if field != "" && !slices.Contains(fields, field) {
		t.Errorf("violations name %v, want %q (message %q)", fields, field, st.Message())
	}
	if field != "" && !strings.Contains(st.Message(), field) {
		t.Errorf("message %q does not name %q", st.Message(), field)
	}
}

func TestLifecycle(t *testing.T) {
	f := setup(t)
	created := f.create(t, "acme", httpConnector("github"))
	if created.GetWorkspaceId() != "acme" || created.GetCallTimeout().AsDuration() != server.DefaultCallTimeout ||
		created.GetSessionMode() != connectorv1.SessionMode_SESSION_MODE_SHARED || !created.GetActive() {
		t.Errorf("created connector lacks defaults: %v", created)
	}
	if diff := cmp.Diff([]string{"Authorization", "X-Team"}, created.GetHttp().GetHeaderNames()); diff != "" {
		t.Errorf("header names (-want +got):\n%s", diff)
	}

	got, err := f.client.GetConnector(ctx(t), &connectorv1.GetConnectorRequest{WorkspaceId: "acme", ConnectorId: "github"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(created, got.GetConnector(), protocmp.Transform(),
		protocmp.IgnoreFields(&connectorv1.Connector{}, "health")); diff != "" {
		t.Errorf("GetConnector differs from CreateConnector's answer (-create +get):\n%s", diff)
	}

	upd, err := f.client.UpdateConnector(ctx(t), &connectorv1.UpdateConnectorRequest{
		WorkspaceId: "acme",
		Connector:   &connectorv1.Connector{ConnectorId: "github", Description: "Issues and PRs", CallTimeout: durationpb.New(5 * time.Second)},
		UpdateMask:  &fieldmaskpb.FieldMask{Paths: []string{"description", "call_timeout"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if c := upd.GetConnector(); c.GetDescription() != "Issues and PRs" || c.GetCallTimeout().AsDuration() != 5*time.Second ||
		c.GetName() != "Connector github" || c.GetHttp().GetUrl() != "http://127.0.0.1:9/mcp" || len(c.GetHttp().GetHeaderNames()) != 2 {
		t.Errorf("after update: %v", c)
	}

	deact, err := f.client.DeactivateConnector(ctx(t), &connectorv1.DeactivateConnectorRequest{WorkspaceId: "acme", ConnectorId: "github"})
	if err != nil {
		t.Fatal(err)
	}
	if c := deact.GetConnector(); c.GetActive() || c.GetHealth().GetState() != connectorv1.ConnectorState_CONNECTOR_STATE_INACTIVE {
		t.Errorf("after deactivate: active=%t state=%v", c.GetActive(), c.GetHealth().GetState())
	}
	act, err := f.client.ActivateConnector(ctx(t), &connectorv1.ActivateConnectorRequest{WorkspaceId: "acme", ConnectorId: "github"})
	if err != nil || !act.GetConnector().GetActive() {
		t.Fatalf("ActivateConnector = %v, %v", act, err)
	}

	if _, err := f.client.DeleteConnector(ctx(t), &connectorv1.DeleteConnectorRequest{WorkspaceId: "acme", ConnectorId: "github"}); err != nil {
		t.Fatal(err)
	}
	_, err = f.client.GetConnector(ctx(t), &connectorv1.GetConnectorRequest{WorkspaceId: "acme", ConnectorId: "github"})
	wantStatus(t, err, codes.NotFound, server.ReasonConnectorNotFound, "")
}

func TestCreateActiveFlag(t *testing.T) {
	f := setup(t)
	if c := f.create(t, "ws", httpConnector("default")); !c.GetActive() {
		t.Error("a connector created without active is inactive; want active by default")
	}
	resp, err := f.client.CreateConnector(ctx(t), &connectorv1.CreateConnectorRequest{
		WorkspaceId: "ws", Connector: httpConnector("off"), Active: proto.Bool(false)})
	if err != nil {
		t.Fatal(err)
	}
	if c := resp.GetConnector(); c.GetActive() || c.GetHealth().GetState() != connectorv1.ConnectorState_CONNECTOR_STATE_INACTIVE {
		t.Errorf("created with active=false: active=%t state=%v", c.GetActive(), c.GetHealth().GetState())
	}
}

func TestCreateValidation(t *testing.T) {
	f := setup(t)
	withHTTP := func(url string) *connectorv1.Connector {
		return &connectorv1.Connector{ConnectorId: "c", Transport: connectorv1.Transport_TRANSPORT_SSE,
			Connection: &connectorv1.Connector_Http{Http: &connectorv1.HttpConfig{Url: url}}}
	}
	stdio := func(cmd string) *connectorv1.Connector {
		return &connectorv1.Connector{ConnectorId: "c", Transport: connectorv1.Transport_TRANSPORT_STDIO,
			Connection: &connectorv1.Connector_Stdio{Stdio: &connectorv1.StdioConfig{Command: cmd}}}
	}
	mod := func(c *connectorv1.Connector, fn func(*connectorv1.Connector)) *connectorv1.Connector {
		fn(c)
		return c
	}
	tests := []struct {
		name      string
		workspace string
		connector *connectorv1.Connector
		field     string
	}{
		{"missing workspace", "", withHTTP("http://127.0.0.1:9/mcp"), "workspace_id"},
		{"bad workspace", "a b", withHTTP("http://127.0.0.1:9/mcp"), "workspace_id"},
		{"missing connector", "ws", nil, "connector"},
		{"empty connector id", "ws", mod(withHTTP("http://127.0.0.1:9/mcp"), func(c *connectorv1.Connector) { c.ConnectorId = "" }), "connector.connector_id"},
		{"connector id with slash", "ws", mod(withHTTP("http://127.0.0.1:9/mcp"), func(c *connectorv1.Connector) { c.ConnectorId = "a/b" }), "connector.connector_id"},
		{"other workspace in body", "ws", mod(withHTTP("http://127.0.0.1:9/mcp"), func(c *connectorv1.Connector) { c.WorkspaceId = "other" }), "connector.workspace_id"},
		{"no transport", "ws", mod(withHTTP("http://127.0.0.1:9/mcp"), func(c *connectorv1.Connector) { c.Transport = 0 }), "connector.transport"},
		{"unknown transport", "ws", mod(withHTTP("http://127.0.0.1:9/mcp"), func(c *connectorv1.Connector) { c.Transport = 9 }), "connector.transport"},
		{"stdio without config", "ws", &connectorv1.Connector{ConnectorId: "c", Transport: connectorv1.Transport_TRANSPORT_STDIO}, "connector.stdio"},
		{"stdio without command", "ws", stdio(""), "connector.stdio.command"},
		{"stdio command with args", "ws", stdio("npx -y server"), "connector.stdio.command"},
		{"stdio with http config", "ws", mod(withHTTP("http://127.0.0.1:9/mcp"), func(c *connectorv1.Connector) { c.Transport = connectorv1.Transport_TRANSPORT_STDIO }), "connector.http"},
		{"http without config", "ws", &connectorv1.Connector{ConnectorId: "c", Transport: connectorv1.Transport_TRANSPORT_STREAMABLE_HTTP}, "connector.http"},
		{"http without url", "ws", withHTTP(""), "connector.http.url"},
		{"ftp url", "ws", withHTTP("ftp://x/mcp"), "connector.http.url"},
		{"relative url", "ws", withHTTP("/mcp"), "connector.http.url"},
		{"url with credentials", "ws", withHTTP("https://user:pw@x/mcp"), "connector.http.url"},
		{"url without a host name", "ws", withHTTP("http://:3001/mcp"), "connector.http.url"},
		{"bad header name", "ws", mod(withHTTP("http://127.0.0.1:9/mcp"), func(c *connectorv1.Connector) { c.GetHttp().Headers = map[string]string{"Bad Name": "v"} }), "connector.http.headers"},
		{"negative connect timeout", "ws", mod(withHTTP("http://127.0.0.1:9/mcp"), func(c *connectorv1.Connector) { c.ConnectTimeout = durationpb.New(-time.Second) }), "connector.connect_timeout"},
		{"huge call timeout", "ws", mod(withHTTP("http://127.0.0.1:9/mcp"), func(c *connectorv1.Connector) { c.CallTimeout = durationpb.New(48 * time.Hour) }), "connector.call_timeout"},
		{"negative rate", "ws", mod(withHTTP("http://127.0.0.1:9/mcp"), func(c *connectorv1.Connector) {
			c.RateLimit = &connectorv1.RateLimit{RequestsPerSecond: -1}
		}), "connector.rate_limit.requests_per_second"},
		{"unknown session mode", "ws", mod(withHTTP("http://127.0.0.1:9/mcp"), func(c *connectorv1.Connector) { c.SessionMode = 7 }), "connector.session_mode"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := f.client.CreateConnector(ctx(t), &connectorv1.CreateConnectorRequest{WorkspaceId: tt.workspace, Connector: tt.connector})
			wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, tt.field)
		})
	}
	resp, err := f.client.ListConnectors(ctx(t), &connectorv1.ListConnectorsRequest{WorkspaceId: "ws"})
	if err != nil || len(resp.GetConnectors()) != 0 {
		t.Errorf("after invalid creates: %d connectors stored, err %v; want none", len(resp.GetConnectors()), err)
	}
}

func TestStdioCommandAllowList(t *testing.T) {
	f := setup(t)
	c := &connectorv1.Connector{ConnectorId: "fs", Transport: connectorv1.Transport_TRANSPORT_STDIO,
		Connection: &connectorv1.Connector_Stdio{Stdio: &connectorv1.StdioConfig{Command: "bash", Args: []string{"-c", "rm -rf /"}}}}
	_, err := f.client.CreateConnector(ctx(t), &connectorv1.CreateConnectorRequest{WorkspaceId: "ws", Connector: c})
	wantStatus(t, err, codes.FailedPrecondition, server.ReasonStdioCommandNotAllowed, "")
	if !strings.Contains(status.Convert(err).Message(), "STDIO_ALLOWED_COMMANDS") {
		t.Errorf("message %q does not name STDIO_ALLOWED_COMMANDS", status.Convert(err).Message())
	}

	// Allowed, and absent from the machine: the registry's spawn fails at once.
	c.GetStdio().Command, c.GetStdio().Args = "/usr/bin/mcp-server", []string{"--stdio"}
	c.GetStdio().Env = map[string]string{"API_TOKEN": distinctive}
	created := f.create(t, "ws", c)
	if diff := cmp.Diff([]string{"API_TOKEN"}, created.GetStdio().GetEnvKeys()); diff != "" {
		t.Errorf("env keys (-want +got):\n%s", diff)
	}
	// Changing the command later goes through the same list.
	_, err = f.client.UpdateConnector(ctx(t), &connectorv1.UpdateConnectorRequest{
		WorkspaceId: "ws",
		Connector: &connectorv1.Connector{ConnectorId: "fs",
			Connection: &connectorv1.Connector_Stdio{Stdio: &connectorv1.StdioConfig{Command: "sh"}}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"stdio.command"}},
	})
	wantStatus(t, err, codes.FailedPrecondition, server.ReasonStdioCommandNotAllowed, "")
}

func TestCreateDuplicate(t *testing.T) {
	f := setup(t)
	f.create(t, "ws", httpConnector("a"))
	dup := httpConnector("a")
	dup.Name = "Impostor"
	_, err := f.client.CreateConnector(ctx(t), &connectorv1.CreateConnectorRequest{WorkspaceId: "ws", Connector: dup})
	wantStatus(t, err, codes.AlreadyExists, server.ReasonConnectorAlreadyExists, "")
	got, err := f.client.GetConnector(ctx(t), &connectorv1.GetConnectorRequest{WorkspaceId: "ws", ConnectorId: "a"})
	if err != nil || got.GetConnector().GetName() != "Connector a" {
		t.Errorf("first connector after duplicate create: %v, %v", got.GetConnector().GetName(), err)
	}
}

func TestOtherWorkspaceIsNotFound(t *testing.T) {
	f := setup(t)
	f.create(t, "acme", httpConnector("a"))
	yes := true
	calls := map[string]func() error{
		"Get": func() error {
			_, err := f.client.GetConnector(ctx(t), &connectorv1.GetConnectorRequest{WorkspaceId: "evil", ConnectorId: "a"})
			return err
		},
		"Update": func() error {
			_, err := f.client.UpdateConnector(ctx(t), &connectorv1.UpdateConnectorRequest{WorkspaceId: "evil",
				Connector: &connectorv1.Connector{ConnectorId: "a", Name: "x"}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"name"}}})
			return err
		},
		"Delete": func() error {
			_, err := f.client.DeleteConnector(ctx(t), &connectorv1.DeleteConnectorRequest{WorkspaceId: "evil", ConnectorId: "a"})
			return err
		},
		"Activate": func() error {
			_, err := f.client.ActivateConnector(ctx(t), &connectorv1.ActivateConnectorRequest{WorkspaceId: "evil", ConnectorId: "a"})
			return err
		},
		"Deactivate": func() error {
			_, err := f.client.DeactivateConnector(ctx(t), &connectorv1.DeactivateConnectorRequest{WorkspaceId: "evil", ConnectorId: "a"})
			return err
		},
		"ListTools": func() error {
			_, err := f.client.ListTools(ctx(t), &connectorv1.ListToolsRequest{WorkspaceId: "evil", ConnectorId: "a"})
			return err
		},
		"UpdateTool": func() error {
			_, err := f.client.UpdateTool(ctx(t), &connectorv1.UpdateToolRequest{WorkspaceId: "evil", ConnectorId: "a", ToolName: "t", Enabled: &yes})
			return err
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) { wantStatus(t, call(), codes.NotFound, server.ReasonConnectorNotFound, "") })
	}
	got, err := f.client.GetConnector(ctx(t), &connectorv1.GetConnectorRequest{WorkspaceId: "acme", ConnectorId: "a"})
	if err != nil || got.GetConnector().GetName() != "Connector a" || !got.GetConnector().GetActive() {
		t.Errorf("acme's connector after another workspace's calls: %v, %v", got.GetConnector(), err)
	}
}

func TestSecretsNeverLeave(t *testing.T) {
	f := setup(t)
	var responses []proto.Message
	var errs []error
	// Nothing listens on port 9: the connection errors carry the URL.
	h := httpConnector("h")
	h.GetHttp().Url += "?api_key=" + distinctive
	created := f.create(t, "ws", h)
	responses = append(responses, created)
	stdio := &connectorv1.Connector{ConnectorId: "s", Transport: connectorv1.Transport_TRANSPORT_STDIO,
		Connection: &connectorv1.Connector_Stdio{Stdio: &connectorv1.StdioConfig{Command: "/usr/bin/mcp-server", Env: map[string]string{"TOKEN": distinctive}}}}
	responses = append(responses, f.create(t, "ws", stdio))
	upd, err := f.client.UpdateConnector(ctx(t), &connectorv1.UpdateConnectorRequest{WorkspaceId: "ws",
		Connector: &connectorv1.Connector{ConnectorId: "h",
			Connection: &connectorv1.Connector_Http{Http: &connectorv1.HttpConfig{Headers: map[string]string{"X-Key": distinctive + "-2"}}}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"http.headers"}}})
	if err != nil {
		t.Fatal(err)
	}
	responses = append(responses, upd)
	list, err := f.client.ListConnectors(ctx(t), &connectorv1.ListConnectorsRequest{WorkspaceId: "ws"})
	if err != nil {
		t.Fatal(err)
	}
	responses = append(responses, list)
	down := f.waitError(t, "ws", "h")
	if !strings.Contains(down.GetHealth().GetLastError(), "api_key=REDACTED") {
		t.Errorf("last error %q does not show the URL redacted", down.GetHealth().GetLastError())
	}
	responses = append(responses, down)
	check, err := f.client.CheckConnector(ctx(t), &connectorv1.CheckConnectorRequest{WorkspaceId: "ws", ConnectorId: "h"})
	responses, errs = append(responses, check), append(errs, err)
	row, _ := f.db.GetConnector(ctx(t), "ws", "h")
	if _, err := f.db.SyncTools(ctx(t), row.ID, []store.ToolSpec{{Name: "echo"}}, nil); err != nil {
		t.Fatal(err)
	}
	_, err = f.call(t, "ws", "h", "echo", nil)
	wantStatus(t, err, codes.Unavailable, server.ReasonConnectorUnavailable, "")
	if !strings.Contains(status.Convert(err).Message(), "api_key=REDACTED") {
		t.Errorf("CallTool error %q does not show the URL redacted", status.Convert(err).Message())
	}
	errs = append(errs, err)
	// A rejected request carrying a secret must not echo it either.
	bad := httpConnector("bad")
	bad.GetHttp().Headers["Bad Header"] = distinctive
	_, err = f.client.CreateConnector(ctx(t), &connectorv1.CreateConnectorRequest{WorkspaceId: "ws", Connector: bad})
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "connector.http.headers")
	errs = append(errs, err)
	for _, query := range []string{"?api_key=" + distinctive + "%zz", "?api_key=" + distinctive + " x", "?api_key=" + distinctive + ";x=1"} {
		bad := httpConnector("bad")
		bad.GetHttp().Url += query
		_, err = f.client.CreateConnector(ctx(t), &connectorv1.CreateConnectorRequest{WorkspaceId: "ws", Connector: bad})
		wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "connector.http.url")
		errs = append(errs, err)
	}

	for i, r := range responses {
		if b, _ := protojson.Marshal(r); strings.Contains(string(b), distinctive) {
			t.Errorf("response %d contains the secret value", i)
		}
	}
	for i, err := range errs {
		if strings.Contains(status.Convert(err).String(), distinctive) {
			t.Errorf("error %d contains the secret value", i)
		}
	}
	if strings.Contains(f.logs.String(), distinctive) {
		t.Error("the service's logs contain the secret value")
	}
	if diff := cmp.Diff([]string{"X-Key"}, upd.GetConnector().GetHttp().GetHeaderNames()); diff != "" {
		t.Errorf("header names after replacing headers (-want +got):\n%s", diff)
	}
	for _, id := range []string{"h", "s"} {
		row, err := f.db.GetConnector(ctx(t), "ws", id)
		if err != nil {
			t.Fatal(err)
		}
		if len(row.SealedSecrets) == 0 || bytes.Contains(row.SealedSecrets, []byte(distinctive)) {
			t.Errorf("connector %s: sealed secrets are missing or hold the plaintext", id)
		}
		config, _ := json.Marshal(row.Config)
		if strings.Contains(string(config)+row.Health.LastError, distinctive) {
			t.Errorf("connector %s: the stored config or last error holds the plaintext: %s %s", id, config, row.Health.LastError)
		}
	}
}

// waitError waits until a connector's health is ERROR.
func (f *fixture) waitError(t *testing.T, ws, id string) *connectorv1.Connector {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := f.client.GetConnector(ctx(t), &connectorv1.GetConnectorRequest{WorkspaceId: ws, ConnectorId: id})
		if err != nil {
			t.Fatal(err)
		}
		if c := resp.GetConnector(); c.GetHealth().GetState() == connectorv1.ConnectorState_CONNECTOR_STATE_ERROR {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("connector %s never reached ERROR: %v", id, resp.GetConnector().GetHealth())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestSecretsNeedKey(t *testing.T) {
	f := setup(t, options{noKey: true})
	_, err := f.client.CreateConnector(ctx(t), &connectorv1.CreateConnectorRequest{WorkspaceId: "ws", Connector: httpConnector("a")})
	wantStatus(t, err, codes.FailedPrecondition, server.ReasonSecretKeyMissing, "")
	plain := httpConnector("a")
	plain.GetHttp().Headers = nil
	withQuery := proto.CloneOf(plain)
	withQuery.GetHttp().Url += "?api_key=" + distinctive
	_, err = f.client.CreateConnector(ctx(t), &connectorv1.CreateConnectorRequest{WorkspaceId: "ws", Connector: withQuery})
	wantStatus(t, err, codes.FailedPrecondition, server.ReasonSecretKeyMissing, "")
	// Parameters without values hold nothing to seal.
	plain.GetHttp().Url += "?debug&verbose="
	if got := f.create(t, "ws", plain).GetHttp().GetUrl(); got != "http://127.0.0.1:9/mcp?debug=&verbose=" {
		t.Errorf("url = %q", got)
	}
}

func update(f *fixture, t *testing.T, c *connectorv1.Connector, paths ...string) (*connectorv1.Connector, error) {
	resp, err := f.client.UpdateConnector(ctx(t), &connectorv1.UpdateConnectorRequest{WorkspaceId: "ws", Connector: c,
		UpdateMask: &fieldmaskpb.FieldMask{Paths: paths}})
	return resp.GetConnector(), err
}

func TestUpdateConnectorMask(t *testing.T) {
	f := setup(t)
	f.create(t, "ws", httpConnector("a"))
	before, _ := f.db.GetConnector(ctx(t), "ws", "a")

	// A field outside the connection keeps the sealed secrets as they are.
	if _, err := update(f, t, &connectorv1.Connector{ConnectorId: "a", Name: "Renamed"}, "name"); err != nil {
		t.Fatal(err)
	}
	c, err := update(f, t, &connectorv1.Connector{ConnectorId: "a",
		Connection: &connectorv1.Connector_Http{Http: &connectorv1.HttpConfig{Url: "http://127.0.0.2:9/mcp"}}}, "http.url")
	if err != nil {
		t.Fatal(err)
	}
	after, _ := f.db.GetConnector(ctx(t), "ws", "a")
	if c.GetName() != "Renamed" || c.GetHttp().GetUrl() != "http://127.0.0.2:9/mcp" || len(c.GetHttp().GetHeaderNames()) != 2 ||
		!bytes.Equal(before.SealedSecrets, after.SealedSecrets) {
		t.Errorf("after name and url updates: %v (secrets kept: %t)", c, bytes.Equal(before.SealedSecrets, after.SealedSecrets))
	}

	invalid := []struct {
		name  string
		c     *connectorv1.Connector
		paths []string
		field string
	}{
		{"empty mask", &connectorv1.Connector{ConnectorId: "a"}, nil, "update_mask"},
		{"unknown path", &connectorv1.Connector{ConnectorId: "a"}, []string{"health"}, "update_mask"},
		{"immutable id", &connectorv1.Connector{ConnectorId: "a"}, []string{"connector_id"}, "update_mask"},
		{"invalid url", &connectorv1.Connector{ConnectorId: "a",
			Connection: &connectorv1.Connector_Http{Http: &connectorv1.HttpConfig{Url: "ftp://x"}}}, []string{"http.url"}, "connector.http.url"},
		{"stdio transport without stdio config", &connectorv1.Connector{ConnectorId: "a", Transport: connectorv1.Transport_TRANSPORT_STDIO},
			[]string{"transport"}, "connector.stdio"},
		{"stdio sub-path on http connector", &connectorv1.Connector{ConnectorId: "a",
			Connection: &connectorv1.Connector_Stdio{Stdio: &connectorv1.StdioConfig{Command: "npx"}}}, []string{"stdio.command"}, "update_mask"},
		{"negative timeout", &connectorv1.Connector{ConnectorId: "a", ConnectTimeout: durationpb.New(-time.Second)},
			[]string{"connect_timeout"}, "connector.connect_timeout"},
	}
	for _, tt := range invalid {
		t.Run(tt.name, func(t *testing.T) {
			_, err := update(f, t, tt.c, tt.paths...)
			wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, tt.field)
		})
	}
	unchanged, _ := f.db.GetConnector(ctx(t), "ws", "a")
	// Health and counters move on their own as the registry tries to connect.
	if diff := cmp.Diff(after, unchanged, cmpopts.IgnoreFields(store.Connector{}, "Health", "Counters")); diff != "" {
		t.Errorf("invalid updates changed the row (-before +after):\n%s", diff)
	}

	// Switching transport kind replaces the connection and its secrets.
	c, err = update(f, t, &connectorv1.Connector{ConnectorId: "a", Transport: connectorv1.Transport_TRANSPORT_STDIO,
		Connection: &connectorv1.Connector_Stdio{Stdio: &connectorv1.StdioConfig{Command: "/usr/bin/mcp-server", Args: []string{"srv"}}}},
		"transport", "stdio")
	if err != nil {
		t.Fatal(err)
	}
	row, _ := f.db.GetConnector(ctx(t), "ws", "a")
	if c.GetHttp() != nil || c.GetStdio().GetCommand() != "/usr/bin/mcp-server" || row.SealedSecrets != nil || row.Config.HeaderNames != nil {
		t.Errorf("after switching to stdio: %v; sealed secrets %d bytes", c, len(row.SealedSecrets))
	}

	_, err = update(f, t, &connectorv1.Connector{ConnectorId: "missing", Name: "x"}, "name")
	wantStatus(t, err, codes.NotFound, server.ReasonConnectorNotFound, "")
}

func TestListConnectorsPaging(t *testing.T) {
	f := setup(t)
	for _, id := range []string{"e", "b", "a", "d", "c"} {
		f.create(t, "ws", httpConnector(id))
	}
	f.create(t, "other", httpConnector("z"))
	var got []string
	token := ""
	for range 10 {
		resp, err := f.client.ListConnectors(ctx(t), &connectorv1.ListConnectorsRequest{WorkspaceId: "ws", PageSize: 2, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range resp.GetConnectors() {
			got = append(got, c.GetConnectorId())
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	if diff := cmp.Diff([]string{"a", "b", "c", "d", "e"}, got); diff != "" {
		t.Errorf("paged ids (-want +got):\n%s", diff)
	}
	_, err := f.client.ListConnectors(ctx(t), &connectorv1.ListConnectorsRequest{WorkspaceId: "ws", PageToken: "garbage"})
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "page_token")
	_, err = f.client.ListConnectors(ctx(t), &connectorv1.ListConnectorsRequest{WorkspaceId: "ws", PageSize: -1})
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "page_size")
}

func TestTools(t *testing.T) {
	f := setup(t)
	f.create(t, "ws", httpConnector("a"))
	row, _ := f.db.GetConnector(ctx(t), "ws", "a")
	readOnly := true
	_, err := f.db.SyncTools(ctx(t), row.ID, []store.ToolSpec{
		{Name: "search", Description: "Searches", InputSchema: []byte(`{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]}`),
			Annotations: store.ToolAnnotations{ReadOnlyHint: &readOnly}},
		{Name: "delete_repo", Description: "Deletes"},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	list, err := f.client.ListTools(ctx(t), &connectorv1.ListToolsRequest{WorkspaceId: "ws", ConnectorId: "a", PageSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.GetTools()) != 1 || list.GetTools()[0].GetName() != "delete_repo" || list.GetNextPageToken() == "" {
		t.Fatalf("first page = %v", list)
	}
	list, err = f.client.ListTools(ctx(t), &connectorv1.ListToolsRequest{WorkspaceId: "ws", ConnectorId: "a", PageToken: list.GetNextPageToken()})
	if err != nil {
		t.Fatal(err)
	}
	search := list.GetTools()[0]
	if search.GetName() != "search" || !search.GetAnnotations().GetReadOnlyHint() || search.GetAnnotations().DestructiveHint != nil ||
		search.GetInputSchema().GetFields()["type"].GetStringValue() != "object" || !search.GetEnabled() {
		t.Errorf("search tool = %v", search)
	}

	no := false
	upd, err := f.client.UpdateTool(ctx(t), &connectorv1.UpdateToolRequest{WorkspaceId: "ws", ConnectorId: "a", ToolName: "delete_repo", Enabled: &no})
	if err != nil || upd.GetTool().GetEnabled() || upd.GetTool().GetRequiresApproval() {
		t.Errorf("UpdateTool(enabled=false) = %v, %v", upd.GetTool(), err)
	}
	_, err = f.client.UpdateTool(ctx(t), &connectorv1.UpdateToolRequest{WorkspaceId: "ws", ConnectorId: "a", ToolName: "nope", Enabled: &no})
	wantStatus(t, err, codes.NotFound, server.ReasonToolNotFound, "")
	_, err = f.client.UpdateTool(ctx(t), &connectorv1.UpdateToolRequest{WorkspaceId: "ws", ConnectorId: "a", ToolName: "search"})
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "enabled")
	got, _ := f.client.GetConnector(ctx(t), &connectorv1.GetConnectorRequest{WorkspaceId: "ws", ConnectorId: "a"})
	if got.GetConnector().GetToolCount() != 2 {
		t.Errorf("tool_count = %d, want 2", got.GetConnector().GetToolCount())
	}
}

// orDur is d, or def when d is zero.
func orDur(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}
