package main

// The harness of the multi-replica tests (issue 18): the real binary run as
// several processes on one database, a counting upstream MCP server, the
// stdio test server announcing its processes, and the SQL that reads the
// replicas' coordination tables.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

// The coordination tables the tests read (migration 008).
const (
	// sqlLiveReplicas lists the replicas whose membership has not expired.
	sqlLiveReplicas = `SELECT id FROM replicas WHERE expires_at > now() ORDER BY id`
	// sqlOwners lists each connector's owner: external id, owner, epoch,
	// and whether the owner is a live replica.
	sqlOwners = `SELECT c.external_id, o.replica_id, o.epoch, coalesce(r.expires_at > now(), false)
		FROM connector_owners o JOIN connectors c ON c.id = o.connector_id
		LEFT JOIN replicas r ON r.id = o.replica_id`
	// listenerAppName is the application_name of a replica's LISTEN
	// connection, followed by ":" and its REPLICA_ID (proposed to the lead).
	listenerAppName = "connector-svc-listener"
)

// defaultSettings unsets what the harness lowers, for the tests that run
// with the service's defaults (REPLICA_TTL 15 s, HEALTH_INTERVAL 30 s).
var defaultSettings = map[string]string{"REPLICA_TTL": "", "HEALTH_INTERVAL": ""}

// replicaTTL is the membership TTL the tests run with (REPLICA_TTL).
const replicaTTL = 3 * time.Second

var (
	buildOnce          sync.Once
	svcBin, stdioBin   string
	buildErr           error
	raceDetectorIsOnIn = raceEnabled()
)

// raceEnabled reports whether this test binary runs under the race
// detector, so the replicas are built the same way.
func raceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" && s.Value == "true" {
			return true
		}
	}
	return false
}

// binaries builds the service and the stdio test server once per test
// binary, with -race when the tests run with it. They go beside the test
// binary, in the build directory go test removes when it is done.
func binaries(t testing.TB) (svc, stdio string) {
	t.Helper()
	buildOnce.Do(func() {
		exe, err := os.Executable()
		if err != nil {
			buildErr = err
			return
		}
		dir, err := os.MkdirTemp(filepath.Dir(exe), "replicas-bin-")
		if err != nil {
			buildErr = err
			return
		}
		args := []string{"build"}
		if raceDetectorIsOnIn {
			args = append(args, "-race")
		}
		svcBin, stdioBin = filepath.Join(dir, "connector-svc"), filepath.Join(dir, "stdioserver")
		for _, b := range [][2]string{{svcBin, "."}, {stdioBin, "../../internal/registry/testdata/stdioserver"}} {
			if out, err := exec.Command("go", append(args, "-o", b[0], b[1])...).CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("go build %s: %v\n%s", b[1], err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return svcBin, stdioBin
}

// replica is one process of the service.
type replicaProc struct {
	id   string
	cmd  *exec.Cmd
	addr string // gRPC
	// callback is the OAuth callback listener's address (OAUTH_CALLBACK_ADDR
	// as bound), "" when it serves none.
	callback string
	// mcp is the MCP endpoint's address (MCP_ADDR as bound), "" when it
	// serves none.
	mcp string
	// console is the console's address (CONSOLE_ADDR as bound), "" when
	// it serves none.
	console string
	out     *lockedBuffer
	exited  chan struct{} // closed when the process has exited
	err     error         // Wait's error, once exited is closed
	conn    *grpc.ClientConn
	client  connectorv1.ConnectorServiceClient
}

// cluster is a set of replicas on one database.
type testCluster struct {
	t     testing.TB
	url   string
	env   map[string]string
	stdio string // the stdio test server's path
	pids  string // directory of the stdio processes' pid files
	mu    sync.Mutex
	byID  map[string]*replicaProc
	all   []*replicaProc // every process started, restarted ones too
}

// newCluster starts replicas with the given ids on a fresh database. env
// adds to (or overrides) the defaults; a value "" leaves that setting at the
// service's default (defaultSettings).
func newCluster(t testing.TB, env map[string]string, ids ...string) *testCluster {
	t.Helper()
	_, stdio := binaries(t)
	c := &testCluster{t: t, url: storetest.NewURL(t), stdio: stdio, pids: t.TempDir(), byID: map[string]*replicaProc{},
		env: map[string]string{
			"SECRET_KEY": testKey, "GRPC_ADDR": "127.0.0.1:0", "ADMIN_ADDR": "127.0.0.1:0", "INTERNAL_ADDR": "127.0.0.1:0",
			"REPLICA_TTL": replicaTTL.String(), "HEALTH_INTERVAL": "1s", "STDIO_ALLOWED_COMMANDS": stdio,
			"SHUTDOWN_GRACE": "5s", "LOG_LEVEL": "info",
		}}
	for k, v := range env {
		c.env[k] = v
	}
	t.Cleanup(func() {
		c.mu.Lock()
		rs := slices.Collect(maps.Values(c.byID))
		c.mu.Unlock()
		for _, r := range rs {
			if r.running() {
				_ = r.cmd.Process.Kill()
				<-r.exited
			}
		}
		for id, out := range c.outputs() { // the stopped processes' too
			if strings.Contains(out, testKey) {
				t.Errorf("replica %s's output contains SECRET_KEY", id)
			}
		}
		if t.Failed() {
			for _, r := range rs {
				t.Logf("replica %s log (last lines):\n%s", r.id, tail(r.out.String(), 15))
				if errs := errorLines(r.out.String(), 20); errs != "" {
					t.Logf("replica %s log (its errors):\n%s", r.id, errs)
				}
			}
		}
	})
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		go func() { defer wg.Done(); c.start(id) }()
	}
	wg.Wait()
	return c
}

// start runs replica id (again, if it ran before) and waits until it
// serves gRPC. It must not call Fatal from another goroutine, so a replica
// that does not serve is reported with Error and left nil.
func (c *testCluster) start(id string) *replicaProc {
	svc, _ := binaries(c.t)
	cmd := exec.Command(svc)
	env := os.Environ()
	for k, v := range c.env {
		if v != "" { // "" leaves the setting at its default
			env = append(env, k+"="+v)
		}
	}
	cmd.Env = append(env, "DATABASE_URL="+c.url, "REPLICA_ID="+id)
	out := &lockedBuffer{}
	cmd.Stderr = out
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		c.t.Error(err)
		return nil
	}
	if err := cmd.Start(); err != nil {
		c.t.Errorf("start replica %s: %v", id, err)
		return nil
	}
	r := &replicaProc{id: id, cmd: cmd, out: out, exited: make(chan struct{})}
	type serving struct{ addr, callback string }
	addr := make(chan serving, 1)
	mcpAddr := make(chan string, 1) // logged after "serving"
	consoleAddr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			out.Write(append(sc.Bytes(), '\n'))
			var line struct {
				Msg, Addr string
				Callback  string `json:"oauth_callback_addr"`
			}
			if json.Unmarshal(sc.Bytes(), &line) != nil {
				continue
			}
			switch line.Msg {
			case "MCP endpoint serving":
				mcpAddr <- line.Addr
			case "console serving":
				consoleAddr <- line.Addr
			case "serving":
				addr <- serving{line.Addr, line.Callback}
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		r.err = cmd.Wait()
		close(r.exited)
	}()
	select {
	case a := <-addr:
		r.addr, r.callback = a.addr, a.callback
	case <-r.exited:
		c.t.Errorf("replica %s exited before serving: %v\n%s", id, r.err, tail(out.String(), 30))
		return nil
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		c.t.Errorf("replica %s did not serve within 60s:\n%s", id, tail(out.String(), 30))
		return nil
	}
	if c.env["MCP_ADDR"] != "" {
		select {
		case r.mcp = <-mcpAddr:
		case <-r.exited:
			c.t.Errorf("replica %s exited before serving MCP: %v\n%s", id, r.err, tail(out.String(), 30))
			return nil
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			c.t.Errorf("replica %s did not serve MCP_ADDR within 10s of gRPC:\n%s", id, tail(out.String(), 30))
			return nil
		}
	}
	if c.env["CONSOLE_ADDR"] != "" {
		select {
		case r.console = <-consoleAddr:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			c.t.Errorf("replica %s did not serve CONSOLE_ADDR within 10s of gRPC:\n%s", id, tail(out.String(), 30))
			return nil
		}
	}
	conn, err := grpc.NewClient(r.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		c.t.Error(err)
		return nil
	}
	c.t.Cleanup(func() { conn.Close() })
	r.conn, r.client = conn, connectorv1.NewConnectorServiceClient(conn)
	c.mu.Lock()
	c.byID[id] = r
	c.all = append(c.all, r)
	c.mu.Unlock()
	return r
}

// outputs is the output (stderr and stdout) of every replica process the
// cluster started, the stopped ones' too, by "id#n" (n counts id's starts
// from 1).
func (c *testCluster) outputs() map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	outs, n := map[string]string{}, map[string]int{}
	for _, r := range c.all {
		n[r.id]++
		outs[fmt.Sprintf("%s#%d", r.id, n[r.id])] = r.out.String()
	}
	return outs
}

func (r *replicaProc) running() bool {
	select {
	case <-r.exited:
		return false
	default:
		return true
	}
}

// get returns replica id, failing the test if it never started.
func (c *testCluster) get(id string) *replicaProc {
	c.t.Helper()
	c.mu.Lock()
	r := c.byID[id]
	c.mu.Unlock()
	if r == nil {
		c.t.Fatalf("replica %s is not running (it did not start)", id)
	}
	return r
}

// client is replica id's gRPC client.
func (c *testCluster) client(id string) connectorv1.ConnectorServiceClient { return c.get(id).client }

// kill9 kills replica id with SIGKILL and waits for the process to end.
func (c *testCluster) kill9(id string) {
	c.t.Helper()
	r := c.get(id)
	if err := r.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		c.t.Fatalf("kill -9 replica %s: %v", id, err)
	}
	<-r.exited
}

// term stops replica id with SIGTERM, waits for it to exit and fails the
// test unless it exits 0 within 30 s.
func (c *testCluster) term(id string) {
	c.t.Helper()
	r := c.get(id)
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		c.t.Fatalf("SIGTERM replica %s: %v", id, err)
	}
	select {
	case <-r.exited:
		if r.err != nil {
			c.t.Errorf("replica %s after SIGTERM: %v, want exit 0", id, r.err)
		}
	case <-time.After(30 * time.Second):
		c.t.Fatalf("replica %s still running 30s after SIGTERM", id)
	}
}

// restart starts replica id again after it stopped.
func (c *testCluster) restart(id string) *replicaProc {
	c.t.Helper()
	r := c.start(id)
	if r == nil {
		c.t.FailNow()
	}
	return r
}

// db opens a connection to the cluster's database for the test's own
// queries.
func (c *testCluster) db() *pgx.Conn {
	c.t.Helper()
	conn, err := pgx.Connect(context.Background(), c.url)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// liveReplicas is the sorted list of live replicas in the replicas table.
func liveReplicas(ctx context.Context, db *pgx.Conn) ([]string, error) {
	rows, err := db.Query(ctx, sqlLiveReplicas)
	if err != nil {
		return nil, fmt.Errorf("reading live replicas (%s): %w", sqlLiveReplicas, err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// owner is one row of connector_owners.
type owner struct {
	connector, replica string
	epoch              int64
	live               bool
}

// owners maps connector external ids to their owner rows.
func owners(ctx context.Context, db *pgx.Conn) (map[string]owner, error) {
	rows, err := db.Query(ctx, sqlOwners)
	if err != nil {
		return nil, fmt.Errorf("reading connector owners (%s): %w", sqlOwners, err)
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (owner, error) {
		var o owner
		err := row.Scan(&o.connector, &o.replica, &o.epoch, &o.live)
		return o, err
	})
	if err != nil {
		return nil, err
	}
	m := map[string]owner{}
	for _, o := range list {
		m[o.connector] = o
	}
	return m, nil
}

// waitMembers waits until exactly ids are the live replicas.
func (c *testCluster) waitMembers(ids ...string) {
	c.t.Helper()
	db := c.db()
	want := slices.Sorted(slices.Values(ids))
	var got []string
	var err error
	if !poll(20*time.Second, func() bool {
		got, err = liveReplicas(context.Background(), db)
		noTable(c.t, err)
		return err == nil && slices.Equal(got, want)
	}) {
		c.t.Fatalf("live replicas = %v (%v) after 20s, want %v", got, err, want)
	}
}

// noTable fails the test at once when err says a coordination table does
// not exist: the feature is not built, and waiting will not help.
func noTable(t testing.TB, err error) {
	t.Helper()
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		t.Fatalf("a coordination table of issue 18 is missing: %v", err)
	}
}

// poll calls cond every 10 ms until it holds or d has passed.
func poll(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// errorLines is the last n lines of s logged at level ERROR: what a test
// that failed on an INTERNAL status needs, which the tail may have lost.
func errorLines(s string, n int) string {
	var errs []string
	for line := range strings.Lines(s) {
		if strings.Contains(line, `"level":"ERROR"`) {
			errs = append(errs, strings.TrimRight(line, "\n"))
		}
	}
	return tail(strings.Join(errs, "\n"), n)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// upstream is an mcp-go streamable-HTTP server behind a handler that counts
// what reaches it: JSON-RPC methods per URL path (DELETE requests as
// "DELETE"), and requests per Mcp-Session-Id. Each connector of a test
// uses its own path, so counts are per connector.
type upstream struct {
	srv *httptest.Server
	mcp *mcpserver.MCPServer

	mu       sync.Mutex
	methods  map[string]map[string]int // path -> method -> count
	sessions map[string]int            // Mcp-Session-Id -> requests
	calls    map[string]int            // tool name -> tools/call requests
	counters map[string]int            // the count tool's per-session counter
}

// newUpstream serves tools echo, send_money (destructive) and count (one
// counter per MCP session: the state a session carries).
func newUpstream(t testing.TB) *upstream {
	u := &upstream{methods: map[string]map[string]int{}, sessions: map[string]int{}, calls: map[string]int{}, counters: map[string]int{}}
	m := mcpserver.NewMCPServer("upstream", "1.0")
	m.AddTool(mcp.NewTool("echo", mcp.WithDescription("Echoes text"), mcp.WithString("text", mcp.Required()),
		mcp.WithReadOnlyHintAnnotation(true)),
		func(_ context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText("echo: " + r.GetString("text", "")), nil
		})
	m.AddTool(mcp.NewTool("send_money", mcp.WithDescription("Sends money"), mcp.WithNumber("amount", mcp.Required()),
		mcp.WithDestructiveHintAnnotation(true)),
		func(_ context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText(fmt.Sprintf("sent %v", r.GetArguments()["amount"])), nil
		})
	m.AddTool(mcp.NewTool("count", mcp.WithDescription("Counts the calls of this MCP session")),
		func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			id := ""
			if s := mcpserver.ClientSessionFromContext(ctx); s != nil {
				id = s.SessionID()
			}
			u.mu.Lock()
			u.counters[id]++
			n := u.counters[id]
			u.mu.Unlock()
			return mcp.NewToolResultText(strconv.Itoa(n)), nil
		})
	u.mcp = m
	h := mcpserver.NewStreamableHTTPServer(m)
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.count(r)
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *upstream) count(r *http.Request) {
	var method, tool string
	if r.Method == http.MethodDelete {
		method = "DELETE"
	} else if r.Method == http.MethodPost {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		var msg struct {
			Method string
			Params struct{ Name string }
		}
		if json.Unmarshal(body, &msg) == nil {
			method, tool = msg.Method, msg.Params.Name
		}
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if method != "" {
		if u.methods[r.URL.Path] == nil {
			u.methods[r.URL.Path] = map[string]int{}
		}
		u.methods[r.URL.Path][method]++
	}
	if method == "tools/call" {
		u.calls[tool]++
	}
	if id := r.Header.Get("Mcp-Session-Id"); id != "" {
		u.sessions[id]++
	}
}

// url is the connector URL of path p ("/c1").
func (u *upstream) url(p string) string { return u.srv.URL + p }

// method returns how many requests of method reached path p.
func (u *upstream) method(p, method string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.methods[p][method]
}

// toolCalls returns how many tools/call requests named tool reached it.
func (u *upstream) toolCalls(tool string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls[tool]
}

// sessionIDs returns the Mcp-Session-Ids seen so far.
func (u *upstream) sessionIDs() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	var ids []string
	for id := range u.sessions {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// httpConnector is a streamable-HTTP connector of the upstream at path p.
func httpConnector(id, url string) *connectorv1.Connector {
	return &connectorv1.Connector{ConnectorId: id, Name: id, Transport: connectorv1.Transport_TRANSPORT_STREAMABLE_HTTP,
		ApprovalPolicy: noApproval, Connection: &connectorv1.Connector_Http{Http: &connectorv1.HttpConfig{Url: url}}}
}

// stdioConnector is a connector running the stdio test server, which
// appends its pid to a file of its own in the cluster's pid directory.
func (c *testCluster) stdioConnector(id string) *connectorv1.Connector {
	return &connectorv1.Connector{ConnectorId: id, Name: id, Transport: connectorv1.Transport_TRANSPORT_STDIO,
		ApprovalPolicy: noApproval, Connection: &connectorv1.Connector_Stdio{Stdio: &connectorv1.StdioConfig{
			Command: c.stdio, Args: []string{"-pidfile", c.pidFile(id)}}}}
}

func (c *testCluster) pidFile(connector string) string {
	return filepath.Join(c.pids, connector+".pids")
}

// liveProcesses returns the pids in connector's pid file whose process
// still runs (not a zombie).
func (c *testCluster) liveProcesses(connector string) []int {
	b, _ := os.ReadFile(c.pidFile(connector))
	var live []int
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: the state follows the last ')'.
		if i := bytes.LastIndexByte(stat, ')'); i > 0 && len(stat) > i+2 && stat[i+2] != 'Z' {
			live = append(live, pid)
		}
	}
	return live
}

// parentOf returns the parent pid of process pid, or 0.
func parentOf(pid int) int {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 2 {
		return 0
	}
	p, _ := strconv.Atoi(f[1])
	return p
}

// processWatch samples how many processes each stdio connector runs at
// once, every 10 ms, and keeps the most seen.
type processWatch struct {
	mu   sync.Mutex
	most map[string]int
	stop func()
}

func (c *testCluster) watchProcesses(connectors ...string) *processWatch {
	w := &processWatch{most: map[string]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			for _, id := range connectors {
				n := len(c.liveProcesses(id))
				w.mu.Lock()
				w.most[id] = max(w.most[id], n)
				w.mu.Unlock()
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	w.stop = sync.OnceFunc(func() { cancel(); <-done })
	c.t.Cleanup(w.stop)
	return w
}

// mostAtOnce returns the most processes seen at once per connector.
func (w *processWatch) mostAtOnce() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.most)
}

// create creates a connector through client and fails the test on error.
func create(t testing.TB, client connectorv1.ConnectorServiceClient, c *connectorv1.Connector) {
	t.Helper()
	if _, err := client.CreateConnector(ctxFor(t, 20*time.Second), &connectorv1.CreateConnectorRequest{WorkspaceId: "acme", Connector: c}); err != nil {
		t.Fatalf("CreateConnector %s: %v", c.GetConnectorId(), err)
	}
}

// callTool calls tool on connector through client with args.
func callTool(ctx context.Context, client connectorv1.ConnectorServiceClient, connector, session, tool string, args map[string]any) (*connectorv1.CallToolResponse, error) {
	st, err := structpb.NewStruct(args)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return client.CallTool(ctx, &connectorv1.CallToolRequest{WorkspaceId: "acme", ConnectorId: connector, ToolName: tool,
		Arguments: st, SessionId: session})
}

// text is a CallTool answer's first text.
func text(resp *connectorv1.CallToolResponse) string {
	for _, c := range resp.GetContent() {
		if t := c.GetText().GetText(); t != "" {
			return t
		}
	}
	return ""
}

// echo calls echo on connector and checks the answer.
func echo(ctx context.Context, client connectorv1.ConnectorServiceClient, connector, stdioOrHTTP string) error {
	resp, err := callTool(ctx, client, connector, "", "echo", map[string]any{"text": "hi"})
	if err != nil {
		return err
	}
	want := "echo: hi"
	if stdioOrHTTP == "stdio" {
		want = "hi"
	}
	if resp.GetIsError() || text(resp) != want {
		return fmt.Errorf("echo answered %q (is_error %v), want %q", text(resp), resp.GetIsError(), want)
	}
	return nil
}

// waitCallable waits until echo on connector works through every replica
// named, and fails the test after d.
func (c *testCluster) waitCallable(d time.Duration, kind, connector string, ids ...string) {
	c.t.Helper()
	for _, id := range ids {
		var err error
		client := c.client(id)
		if !poll(d, func() bool {
			err = echo(context.Background(), client, connector, kind)
			return err == nil
		}) {
			c.t.Fatalf("connector %s is not callable through replica %s after %v: %v", connector, id, d, err)
		}
	}
}

// retryUnavailable runs call as a client with the documented service
// config does (examples/service-config.json: 3 attempts, backoff from 50 ms
// doubling): again while it fails UNAVAILABLE, attempt counting from 0.
func retryUnavailable(call func(attempt int) error) error {
	backoff := 50 * time.Millisecond
	err := call(0)
	for attempt := 1; attempt < 3 && status.Code(err) == codes.Unavailable; attempt++ {
		time.Sleep(backoff)
		backoff *= 2
		err = call(attempt)
	}
	return err
}

// percentile returns the p-th percentile (0-100) of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p / 100)
	return s[i]
}
