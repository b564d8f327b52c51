package main

// The gRPC server's policy for clients that balance over replicas (issue
// 19, item 3): its settings, connection age, the SIGTERM order, and a
// round-robin client with the documented service config over 3 replicas.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/protobuf/types/known/structpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
)

// TestConnectionSettings reads the connection settings, defaults the grace
// from the longest default deadline, and refuses a grace that would cut a
// call under way.
func TestConnectionSettings(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		want    connConfig
		wantErr string
	}{
		{"defaults", nil, nil, connConfig{MaxAge: 5 * time.Minute, MaxAgeGrace: 2*time.Minute + 30*time.Second,
			KeepaliveTime: time.Minute, KeepaliveTimeout: 20 * time.Second}, ""},
		{"grace follows QUERY_TIMEOUT", nil, map[string]string{"QUERY_TIMEOUT": "10m"}, connConfig{MaxAge: 5 * time.Minute,
			MaxAgeGrace: 10*time.Minute + 30*time.Second, KeepaliveTime: time.Minute, KeepaliveTimeout: 20 * time.Second}, ""},
		{"grace follows RPC_TIMEOUT when longer", nil, map[string]string{"RPC_TIMEOUT": "5m"}, connConfig{MaxAge: 5 * time.Minute,
			MaxAgeGrace: 5*time.Minute + 30*time.Second, KeepaliveTime: time.Minute, KeepaliveTimeout: 20 * time.Second}, ""},
		{"environment", nil, map[string]string{"GRPC_MAX_CONNECTION_AGE": "1m", "GRPC_MAX_CONNECTION_AGE_GRACE": "3m",
			"GRPC_KEEPALIVE_TIME": "30s", "GRPC_KEEPALIVE_TIMEOUT": "5s", "SHUTDOWN_DELAY": "2s"},
			connConfig{MaxAge: time.Minute, MaxAgeGrace: 3 * time.Minute, KeepaliveTime: 30 * time.Second,
				KeepaliveTimeout: 5 * time.Second, ShutdownDelay: 2 * time.Second}, ""},
		{"flag over environment", []string{"-grpc-max-connection-age", "30s"}, map[string]string{"GRPC_MAX_CONNECTION_AGE": "1m"},
			connConfig{MaxAge: 30 * time.Second, MaxAgeGrace: 2*time.Minute + 30*time.Second, KeepaliveTime: time.Minute,
				KeepaliveTimeout: 20 * time.Second}, ""},
		{"grace below QUERY_TIMEOUT", nil, map[string]string{"GRPC_MAX_CONNECTION_AGE_GRACE": "1m"}, connConfig{},
			"GRPC_MAX_CONNECTION_AGE_GRACE 1m0s is below QUERY_TIMEOUT"},
		{"zero age", nil, map[string]string{"GRPC_MAX_CONNECTION_AGE": "0s"}, connConfig{}, "GRPC_MAX_CONNECTION_AGE"},
		{"bad keepalive", nil, map[string]string{"GRPC_KEEPALIVE_TIME": "often"}, connConfig{}, "GRPC_KEEPALIVE_TIME"},
		{"negative delay", nil, map[string]string{"SHUTDOWN_DELAY": "-1s"}, connConfig{}, "SHUTDOWN_DELAY"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _, err := parseConfig(tc.args, getenv(tc.env), io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("parseConfig: %v, want an error with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Conn != tc.want {
				t.Errorf("Conn = %+v, want %+v", cfg.Conn, tc.want)
			}
		})
	}
}

// documentedServiceConfig is the client service config the docs and the
// examples point at.
const documentedServiceConfig = "../../examples/service-config.json"

// adminAddr is the admin listener's address from replica r's log.
func adminAddr(t *testing.T, r *replicaProc) string {
	t.Helper()
	for _, line := range strings.Split(r.out.String(), "\n") {
		var l struct{ Msg, Addr string }
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "admin serving" {
			return l.Addr
		}
	}
	t.Fatalf("replica %s logged no admin address", r.id)
	return ""
}

// readyz is the status code of GET /readyz at addr, or 0 if unreachable.
func readyz(addr string) int {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// accepts reports whether a TCP connection to addr is accepted.
func accepts(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// TestSIGTERMReportsNotServingFirst: a replica sent SIGTERM says
// NOT_SERVING on a health Watch stream, and /readyz answers 503, while its
// gRPC listener still accepts connections (for SHUTDOWN_DELAY); only then
// does the listener close, and the process exits 0.
func TestSIGTERMReportsNotServingFirst(t *testing.T) {
	c := newCluster(t, map[string]string{"SHUTDOWN_DELAY": "2s"}, "a")
	r := c.get("a")
	admin := adminAddr(t, r)
	if !poll(20*time.Second, func() bool { return readyz(admin) == http.StatusOK }) {
		t.Fatalf("/readyz = %d before SIGTERM, want 200", readyz(admin))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	watch, err := healthpb.NewHealthClient(r.conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := watch.Recv(); err != nil || m.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health Watch before SIGTERM = %v, %v; want SERVING", m.GetStatus(), err)
	}
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	m, err := watch.Recv()
	if err != nil || m.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health Watch after SIGTERM = %v, %v; want NOT_SERVING", m.GetStatus(), err)
	}
	// NOT_SERVING has been said: the listener must still be there, and
	// a new client must hear NOT_SERVING too.
	if !accepts(r.addr) {
		t.Fatal("the gRPC listener was closed when the health Watch said NOT_SERVING: balancers had no time to stop sending")
	}
	fresh, err := grpc.NewClient(r.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	check, err := healthpb.NewHealthClient(fresh).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || check.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health Check on a new connection during the delay = %v, %v; want NOT_SERVING", check.GetStatus(), err)
	}
	if code := readyz(admin); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz during the delay = %d, want 503", code)
	}
	cancel() // a Watch stream is a call under way: the drain would wait for it
	fresh.Close()
	if !poll(10*time.Second, func() bool { return !accepts(r.addr) }) {
		t.Fatal("the gRPC listener still accepts 10s after SIGTERM with SHUTDOWN_DELAY=2s")
	}
	select {
	case <-r.exited:
		if r.err != nil {
			t.Errorf("replica after SIGTERM: %v, want exit 0", r.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("replica still running 30s after SIGTERM")
	}
}

// slowServer is an MCP server with one tool, slow, that reports progress
// four times, 500 ms apart, then answers "slow done": 2 s in all.
func slowServer(t *testing.T) string {
	m := mcpserver.NewMCPServer("slow", "1.0")
	m.AddTool(mcp.NewTool("slow", mcp.WithDescription("Works for 2 seconds"), mcp.WithReadOnlyHintAnnotation(true)),
		func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var token mcp.ProgressToken
			if req.Params.Meta != nil {
				token = req.Params.Meta.ProgressToken
			}
			for i := 1; i <= 4; i++ {
				if token != nil {
					if err := m.SendNotificationToClient(ctx, string(mcp.MethodNotificationProgress), map[string]any{
						"progressToken": token, "progress": i, "total": 4}); err != nil {
						return nil, err
					}
				}
				select { // the work: its duration is what the test is about
				case <-time.After(500 * time.Millisecond):
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			return mcp.NewToolResultText("slow done"), nil
		})
	srv := httptest.NewServer(mcpserver.NewStreamableHTTPServer(m))
	t.Cleanup(srv.Close)
	return srv.URL + "/mcp"
}

// TestStreamOutlivesConnectionAge: with GRPC_MAX_CONNECTION_AGE=1s, a
// streaming query started 0.6 s into its connection, whose tool takes 2 s,
// completes with all its events (the connection's GOAWAY comes while it
// runs and does not cut it), and the client's next call is on a new
// connection (the age did close the first one).
func TestStreamOutlivesConnectionAge(t *testing.T) {
	model := llmtest.New(t, llmtest.CallTools(llmtest.Call{Tool: "slow", Args: `{}`}), llmtest.Answer("It is done."))
	c := newCluster(t, map[string]string{"LLM_BASE_URL": model.URL(), "LLM_MODEL": "fake-model",
		"GRPC_MAX_CONNECTION_AGE": "1s", "QUERY_TIMEOUT": "30s"}, "a")
	r := c.get("a")
	create(t, r.client, httpConnector("slow", slowServer(t)))
	if !poll(15*time.Second, func() bool {
		got, err := r.client.GetConnector(ctxFor(t, 5*time.Second), &connectorv1.GetConnectorRequest{WorkspaceId: "acme", ConnectorId: "slow"})
		return err == nil && got.GetConnector().GetHealth().GetState() == connectorv1.ConnectorState_CONNECTOR_STATE_READY
	}) {
		t.Fatal("connector slow not READY after 15s")
	}

	var dials atomic.Int32
	conn, err := grpc.NewClient(r.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			dials.Add(1)
			return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := connectorv1.NewConnectorServiceClient(conn)
	ctx := ctxFor(t, 30*time.Second)
	if _, err := client.GetConnector(ctx, &connectorv1.GetConnectorRequest{WorkspaceId: "acme", ConnectorId: "slow"}); err != nil {
		t.Fatal(err)
	}
	connected := time.Now()
	time.Sleep(600*time.Millisecond - time.Since(connected)) // the test's subject: a stream that starts near the age
	stream, err := client.StreamQueryConnector(ctx, &connectorv1.StreamQueryConnectorRequest{WorkspaceId: "acme",
		ConnectorId: "slow", Query: "do the slow thing"})
	if err != nil {
		t.Fatal(err)
	}
	var events []string
	var result *connectorv1.QueryResult
	for {
		m, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("the stream failed %v into its connection, after events %v: %v", time.Since(connected), events, err)
		}
		switch e := m.GetEvent().(type) {
		case *connectorv1.StreamQueryConnectorResponse_ToolCallStarted:
			events = append(events, "started "+e.ToolCallStarted.GetCall().GetTool())
		case *connectorv1.StreamQueryConnectorResponse_ToolCallProgress:
			events = append(events, fmt.Sprintf("progress %v", e.ToolCallProgress.GetProgress().GetProgress()))
		case *connectorv1.StreamQueryConnectorResponse_ToolCallFinished:
			events = append(events, "finished "+e.ToolCallFinished.GetCall().GetTool())
		case *connectorv1.StreamQueryConnectorResponse_Answer:
			events = append(events, "answer")
		case *connectorv1.StreamQueryConnectorResponse_Result:
			result = e.Result
		}
	}
	took := time.Since(connected)
	want := []string{"started slow", "progress 1", "progress 2", "progress 3", "progress 4", "finished slow", "answer"}
	if strings.Join(events, ", ") != strings.Join(want, ", ") {
		t.Errorf("events = %v, want %v", events, want)
	}
	if result.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_COMPLETED || result.GetAnswer() != "It is done." {
		t.Errorf("result = %v %q, want COMPLETED %q", result.GetStatus(), result.GetAnswer(), "It is done.")
	}
	if took < 1100*time.Millisecond {
		t.Errorf("the stream ended %v into its connection: not after the age (1s, +10%% jitter), so the test proves nothing", took)
	}
	if _, err := client.GetConnector(ctx, &connectorv1.GetConnectorRequest{WorkspaceId: "acme", ConnectorId: "slow"}); err != nil {
		t.Fatal(err)
	}
	if n := dials.Load(); n < 2 {
		t.Errorf("the client dialled %d time(s) in %v: GRPC_MAX_CONNECTION_AGE=1s did not close its first connection", n, time.Since(connected))
	}
}

// TestRoundRobinOverReplicas: a grpc-go client with the documented service
// config (examples/service-config.json) over a manual resolver holding
// three replicas' addresses spreads its calls over all three (each 20-45
// %), and loses no call while one of them is stopped with SIGTERM. The
// calls alternate ListTools, which the config retries on UNAVAILABLE, and
// CallTool of a read-only tool, which it does not: for CallTool, only the
// drain (GOAWAY, then the calls under way finish) and gRPC's transparent
// retry of streams the server never saw stand between the client and a
// lost call.
func TestRoundRobinOverReplicas(t *testing.T) {
	sc, err := os.ReadFile(documentedServiceConfig)
	if err != nil {
		t.Fatal(err)
	}
	up := newUpstream(t)
	ids := []string{"a", "b", "c"}
	c := newCluster(t, nil, ids...)
	c.waitMembers(ids...)
	create(t, c.client("a"), httpConnector("rr", up.url("/rr")))
	c.waitCallable(15*time.Second, "http", "rr", ids...)

	byAddr := map[string]string{}
	var state resolver.State
	for _, id := range ids {
		r := c.get(id)
		byAddr[r.addr] = id
		state.Addresses = append(state.Addresses, resolver.Address{Addr: r.addr})
	}
	res := manual.NewBuilderWithScheme("replicas")
	res.InitialState(state)
	conn, err := grpc.NewClient(res.Scheme()+":///connector-svc", grpc.WithResolvers(res),
		grpc.WithDefaultServiceConfig(string(sc)), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := connectorv1.NewConnectorServiceClient(conn)
	echoArgs, err := structpb.NewStruct(map[string]any{"text": "hi"})
	if err != nil {
		t.Fatal(err)
	}
	// call makes call i and returns the replica that answered it.
	call := func(i int) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var p peer.Peer
		if i%2 == 0 {
			_, err := client.ListTools(ctx, &connectorv1.ListToolsRequest{WorkspaceId: "acme", ConnectorId: "rr"}, grpc.Peer(&p))
			if err != nil {
				return "", fmt.Errorf("ListTools: %w", err)
			}
		} else {
			resp, err := client.CallTool(ctx, &connectorv1.CallToolRequest{WorkspaceId: "acme", ConnectorId: "rr", ToolName: "echo",
				Arguments: echoArgs}, grpc.Peer(&p))
			if err != nil {
				return "", fmt.Errorf("CallTool: %w", err)
			}
			if text(resp) != "echo: hi" {
				return "", fmt.Errorf("CallTool answered %q", text(resp))
			}
		}
		if p.Addr == nil {
			return "", fmt.Errorf("call %d: no peer", i)
		}
		return byAddr[p.Addr.String()], nil
	}

	// Every replica connected first, so the first calls do not all go
	// to the one that was quickest.
	for _, id := range ids {
		if _, err := healthpb.NewHealthClient(c.get(id).conn).Check(ctxFor(t, 10*time.Second), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	if !poll(10*time.Second, func() bool {
		seen := map[string]bool{}
		for i := range 6 {
			if id, err := call(i); err == nil {
				seen[id] = true
			}
		}
		return len(seen) == len(ids)
	}) {
		t.Fatal("the round-robin client did not reach all three replicas within 10s")
	}
	const n = 300
	got := map[string]int{}
	for i := range n {
		id, err := call(i)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		got[id]++
	}
	for _, id := range ids {
		if share := float64(got[id]) / n; share < 0.20 || share > 0.45 {
			t.Errorf("replica %s answered %d of %d calls (%.0f%%), want 20-45%% (all: %v)", id, got[id], n, 100*share, got)
		}
	}

	// Now stop c with SIGTERM while four callers keep calling.
	var (
		mu       sync.Mutex
		failed   []string
		after    = map[string]int{} // answers after c exited, by replica
		total    atomic.Int32
		cExited  atomic.Bool
		stop     = make(chan struct{})
		wg       sync.WaitGroup
		sinceEnd atomic.Int32
	)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; ; i += 4 {
				select {
				case <-stop:
					return
				default:
				}
				exited := cExited.Load()
				id, err := call(i)
				total.Add(1)
				mu.Lock()
				if err != nil {
					failed = append(failed, err.Error())
				} else if exited {
					after[id]++
					sinceEnd.Add(1)
				}
				mu.Unlock()
			}
		}()
	}
	if !poll(20*time.Second, func() bool { return total.Load() >= 100 }) {
		t.Fatalf("only %d calls in 20s before SIGTERM", total.Load())
	}
	c.term("c")
	cExited.Store(true)
	ok := poll(20*time.Second, func() bool { return sinceEnd.Load() >= 200 })
	close(stop)
	wg.Wait()
	if !ok {
		t.Errorf("only %d calls in 20s after c stopped", sinceEnd.Load())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(failed) > 0 {
		t.Errorf("%d of %d calls failed while c stopped, want none; first: %s", len(failed), total.Load(), failed[0])
	}
	if after["c"] > 0 || after["a"] == 0 || after["b"] == 0 {
		t.Errorf("answers after c exited: %v, want a and b only", after)
	}
}
