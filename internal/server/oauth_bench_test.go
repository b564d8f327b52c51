package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/mark3labs/mcp-go/mcp"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/benchgoal"
	"github.com/connector-svc/connector-svc/internal/cluster"
	"github.com/connector-svc/connector-svc/internal/forward"
	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/mcptest"
	"github.com/connector-svc/connector-svc/internal/oauth"
	"github.com/connector-svc/connector-svc/internal/oauthtest"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/server"
	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

// What OAuth per user costs, measured against a real authorization
// server and the MCP server it guards (internal/oauthtest, on loopback),
// through the service wired as main wires one replica: an oauth.Manager
// both runs the authorizations and puts the tokens on the requests, and
// the replica's cluster membership and sessions table route per-user
// connections. The variants of each benchmark run in turn in one run, so
// that they see the same noise.

// oauthService is the service as main runs one replica with OAuth, and
// what the benchmarks read of it.
type oauthService struct {
	client connectorv1.ConnectorServiceClient
	db     *store.DB
	reg    *registry.Registry
}

// maxBenchSessions is the bench service's MAX_SESSIONS_PER_CONNECTOR:
// every user of an oauth_user connector counts under it.
const maxBenchSessions = 100_000

// serveOAuthService runs the whole service on a fresh database as main
// does one replica (settings at their defaults, no logs), served on a
// loopback port.
func serveOAuthService(b *testing.B) *oauthService {
	ctx := context.Background()
	db := storetest.NewDB(b)
	box, err := secret.ParseKey(base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32)))
	if err != nil {
		b.Fatal(err)
	}
	m, err := oauth.New(oauth.Config{DB: db, Box: box, RedirectURL: "http://127.0.0.1:9/oauth/callback",
		ReturnToAllowed: []string{"https://chat.test/"}})
	if err != nil {
		b.Fatal(err)
	}
	authorizer := server.NewAuthorizer(m)

	internal, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { internal.Close() })
	members := cluster.New(db, cluster.Config{ID: "bench", Addr: internal.Addr().String()})
	if err := members.Register(ctx); err != nil {
		b.Fatal(err)
	}
	pool, err := forward.NewPool(forwardKey, "bench")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pool.Close() })

	src := live.NewSource(db, box, nil)
	var sessions *live.Sessions // its hooks run once the registry serves
	reg := registry.New(src, registry.Config{
		MaxSessions:     maxBenchSessions,
		UsageInterval:   time.Second, // as main
		DetachSessions:  true,
		OnSessionOpened: func(id int64, sid string, h registry.SessionHandle) { sessions.Opened(id, sid, h) },
		OnSessionClosed: func(id int64, sid string) { sessions.Closed(id, sid) },
		Authorize:       live.Authorize(authorizer),
	}, nil)
	sessions = live.NewSessions(db, reg, box, members, pool, maxBenchSessions, nil)
	router := live.NewRouter(cluster.NewOwners(db, members, db.ActiveConnectorIDs), pool, reg)
	lv := live.New(db, src, reg, nil, live.Config{})
	listener := db.NewListener(5*time.Second, nil)
	listener.Handle(store.ConnectorChangesChannel, lv.Notified)
	listener.Handle(store.ClusterChannel, members.Notified)
	listener.OnListen(lv.Resync)
	keys := auth.NewKeys(db, auth.Config{}, nil)

	runCtx, cancel := context.WithCancel(ctx)
	jobs := []func(context.Context) error{reg.Run, lv.Run, listener.Run, members.Run, keys.Run}
	done := make(chan error, len(jobs))
	for _, job := range jobs {
		go func() { done <- job(runCtx) }()
	}
	b.Cleanup(func() {
		cancel()
		for range jobs {
			<-done
		}
	})
	srv := server.New(server.Deps{DB: db, Box: box, Registry: reg, Live: lv, Router: router, Sessions: sessions, Keys: keys,
		OAuth: authorizer}, server.Config{Auth: auth.ModeNone})
	g, hs := server.NewGRPCServer(srv)
	server.SetServing(hs, true)
	return &oauthService{client: connectorv1.NewConnectorServiceClient(serveLoopback(b, g)), db: db, reg: reg}
}

// create creates c, failing b if it cannot.
func (s *oauthService) create(b *testing.B, c *connectorv1.Connector) {
	if _, err := s.client.CreateConnector(context.Background(), &connectorv1.CreateConnectorRequest{WorkspaceId: "ws", Connector: c}); err != nil {
		b.Fatalf("CreateConnector(%s): %v", c.GetConnectorId(), err)
	}
}

// waitReachable waits until connector id is READY: for an oauth_user
// one, its unauthenticated probe got the server's 401.
func (s *oauthService) waitReachable(b *testing.B, id string) {
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := s.client.GetConnector(context.Background(), &connectorv1.GetConnectorRequest{WorkspaceId: "ws", ConnectorId: id})
		if err == nil && resp.GetConnector().GetHealth().GetState() == connectorv1.ConnectorState_CONNECTOR_STATE_READY {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("connector %s not READY within 20s: %v, %v", id, resp.GetConnector().GetHealth(), err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// start is StartAuthorization of user on connector id.
func (s *oauthService) start(id, user string) (string, error) {
	resp, err := s.client.StartAuthorization(context.Background(), &connectorv1.StartAuthorizationRequest{WorkspaceId: "ws",
		ConnectorId: id, UserId: user, ReturnTo: "https://chat.test/done"})
	return resp.GetAuthorizationUrl(), err
}

// complete hands the authorization server's redirect to
// CompleteAuthorization, as the chat backend that receives it does.
func (s *oauthService) complete(redirect *url.URL) error {
	q := redirect.Query()
	_, err := s.client.CompleteAuthorization(context.Background(), &connectorv1.CompleteAuthorizationRequest{
		State: q.Get("state"), Code: q.Get("code"), Iss: q.Get("iss"), Error: q.Get("error")})
	return err
}

// authorize runs user's whole authorization of connector id: started,
// consented at the authorization server, completed.
func (s *oauthService) authorize(b *testing.B, id, user string) {
	authURL, err := s.start(id, user)
	if err != nil {
		b.Fatalf("StartAuthorization for %s: %v", user, err)
	}
	redirect, err := consent(authURL, user)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.complete(redirect); err != nil {
		b.Fatalf("CompleteAuthorization for %s: %v", user, err)
	}
}

// whoami calls the whoami tool of connector id, as user (an oauth_user
// connector) or in session (a per_session one), and checks that the
// server saw the identity it should: want, when set.
func (s *oauthService) whoami(id, user, session, want string) error {
	resp, err := s.client.CallTool(context.Background(), &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: id,
		ToolName: "whoami", UserId: user, SessionId: session})
	if err != nil {
		return err
	}
	if want != "" && !strings.HasPrefix(resp.GetContent()[0].GetText().GetText(), "user="+want+" ") {
		return fmt.Errorf("whoami on %s = %q, want user %s", id, resp.GetContent()[0].GetText().GetText(), want)
	}
	return nil
}

// tokenReads is how many times Postgres read the oauth_tokens table, and
// how many transactions the database committed, by its statistics. A
// backend reports them within a second while busy and within 10 s once
// idle: settle first.
func (s *oauthService) tokenReads(b *testing.B) (reads, commits int64) {
	ctx := context.Background()
	err := s.db.InTx(ctx, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT coalesce(sum(coalesce(idx_scan, 0) + coalesce(seq_scan, 0)), 0)
			FROM pg_stat_user_tables WHERE relname = 'oauth_tokens'`).Scan(&reads); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&commits)
	})
	if err != nil {
		b.Fatal(err)
	}
	return reads, commits
}

// statsSettle is how long Postgres may hold an idle backend's statistics
// before it reports them.
const statsSettle = 11 * time.Second

// consent plays user's browser at authURL: logged in at the authorization
// server, consenting to every scope asked; it returns the redirect to the
// service's callback without following it (oauthtest's Authorize, for a
// server in another process too).
func consent(authURL, user string) (*url.URL, error) {
	req, err := http.NewRequest(http.MethodGet, authURL, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set(oauthtest.UserHeader, user)
	hc := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	loc, err := resp.Location()
	if err != nil {
		return nil, fmt.Errorf("the authorization server answered %s, not a redirect", resp.Status)
	}
	if e := loc.Query().Get("error"); e != "" {
		return nil, fmt.Errorf("the authorization server refused: %s", e)
	}
	return loc, nil
}

// staticClientID is the client the benchmarks get static tokens for.
const staticClientID = "bench-static"

// staticToken gets an access token for the MCP server by the client
// credentials grant as staticClientID, for a connector to send as a
// static Authorization header.
func staticToken(b *testing.B, issuer, resource, clientSecret string) string {
	form := url.Values{"grant_type": {"client_credentials"}, "resource": {resource}, "scope": {"mcp:tools"}}
	req, err := http.NewRequest(http.MethodPost, issuer+"/token", strings.NewReader(form.Encode()))
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(staticClientID, clientSecret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var tr struct {
		AccessToken string `json:"access_token"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&tr); err != nil || resp.StatusCode != http.StatusOK || tr.AccessToken == "" {
		b.Fatalf("client credentials token: %s, %v", resp.Status, err)
	}
	return tr.AccessToken
}

// countingProbes is o with an Observe that counts the requests to the
// MCP server without a token: an oauth_user connector's health checks
// probe the server so, and their 401s are not calls refused.
func countingProbes(o oauthtest.Options) (oauthtest.Options, *atomic.Int64) {
	var n atomic.Int64
	o.Observe = func(endpoint string, r *http.Request) {
		if endpoint == "mcp" && r.Header.Get("Authorization") == "" {
			n.Add(1)
		}
	}
	return o, &n
}

// userConnector is an oauth_user connector of the MCP server at mcpURL.
func userConnector(id, mcpURL string) *connectorv1.Connector {
	c := mcpConnector(id, mcpURL)
	c.Auth = &connectorv1.AuthConfig{Mode: connectorv1.AuthMode_AUTH_MODE_OAUTH_USER}
	return c
}

// staticConnector is an AUTH_MODE_NONE connector of the MCP server at
// mcpURL that sends token as a static Authorization header.
func staticConnector(id, mcpURL, token string, mode connectorv1.SessionMode) *connectorv1.Connector {
	c := mcpConnector(id, mcpURL)
	c.Connection = &connectorv1.Connector_Http{Http: &connectorv1.HttpConfig{Url: mcpURL,
		Headers: map[string]string{"Authorization": "Bearer " + token}}}
	c.SessionMode = mode
	return c
}

// bearerTransport puts a static bearer token on every request.
type bearerTransport struct {
	token string
	next  http.RoundTripper
}

func (t bearerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set("Authorization", "Bearer "+t.token)
	return t.next.RoundTrip(req)
}

// timed runs f and returns how long it took, failing b if it fails.
func timed(b *testing.B, what string, f func() error) time.Duration {
	start := time.Now()
	if err := f(); err != nil {
		b.Fatalf("%s: %v", what, err)
	}
	return time.Since(start)
}

// at is the q-quantile of sorted latencies, in µs.
func at(sorted []time.Duration, q float64) float64 {
	i := min(int(q*float64(len(sorted))), len(sorted)-1)
	return float64(sorted[i].Nanoseconds()) / 1e3
}

// reportLatencies sorts each side's latencies and reports its p50 and
// p99, named after it, and logs them.
func reportLatencies(b *testing.B, names []string, lat [][]time.Duration) {
	var line []string
	for k, name := range names {
		slices.Sort(lat[k])
		b.ReportMetric(at(lat[k], 0.5), "p50-"+name+"-µs")
		b.ReportMetric(at(lat[k], 0.99), "p99-"+name+"-µs")
		line = append(line, fmt.Sprintf("%s p50 %.0f µs p99 %.0f µs (%d)", name, at(lat[k], 0.5), at(lat[k], 0.99), len(lat[k])))
	}
	b.Logf("%s", strings.Join(line, "; "))
}

// BenchmarkOAuthUserCall measures what the token transport adds to a
// call: CallTool of whoami for an authorized user of an oauth_user
// connector, on their warm connection, and the same tool of the same
// server through AUTH_MODE_NONE connectors that send a valid token as a
// static Authorization header: a shared connector (the connector's own
// connection) and a per_session one (a connection of the caller's
// session, the machinery a user's connection runs on); and an mcp-go
// client of its own with the same static token, directly. Each iteration
// runs a block of 200 calls of each, the first rotating. It reports each
// one's p50 and p99, the user's p50 as a ratio of each static one and the
// µs it adds, and how often Postgres read the tokens table and committed
// during the blocks (the manager reads a user's token again every few
// seconds, not per call).
func BenchmarkOAuthUserCall(b *testing.B) {
	const block = 200
	ctx := context.Background()
	svc := serveOAuthService(b)
	opts, probes := countingProbes(oauthtest.Options{})
	as := oauthtest.Start(b, opts)
	clientSecret := "bench-static-secret-" + fmt.Sprint(time.Now().UnixNano())
	as.RegisterClient(staticClientID, clientSecret)
	token := staticToken(b, as.Issuer, as.MCPURL, clientSecret)

	svc.create(b, userConnector("user", as.MCPURL))
	svc.create(b, staticConnector("static", as.MCPURL, token, connectorv1.SessionMode_SESSION_MODE_SHARED))
	svc.create(b, staticConnector("static-session", as.MCPURL, token, connectorv1.SessionMode_SESSION_MODE_PER_SESSION))
	svc.waitReachable(b, "user")
	svc.authorize(b, "user", "alice")
	for _, id := range []string{"user", "static", "static-session"} {
		deadline := time.Now().Add(20 * time.Second)
		for {
			user, session, want := "", "", staticClientID
			switch id {
			case "user":
				user, want = "alice", "alice"
			case "static-session":
				session = "s1"
			}
			err := svc.whoami(id, user, session, want)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%s: %v", id, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	got, err := svc.client.GetConnector(ctx, &connectorv1.GetConnectorRequest{WorkspaceId: "ws", ConnectorId: "static"})
	if err != nil {
		b.Fatal(err)
	}
	version := got.GetConnector().GetHealth().GetProtocolVersion()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	b.Cleanup(tr.CloseIdleConnections)
	direct, err := mcptest.Dial(ctx, as.MCPURL, version, &http.Client{Transport: bearerTransport{token: token, next: tr}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { direct.Close() })
	var whoami mcp.CallToolRequest
	whoami.Params.Name = "whoami"

	names := []string{"direct", "static", "static-session", "user"}
	sides := []func() error{
		func() error { _, err := direct.CallTool(ctx, whoami); return err },
		func() error { return svc.whoami("static", "", "", "") },
		func() error { return svc.whoami("static-session", "", "s1", "") },
		func() error { return svc.whoami("user", "alice", "", "") },
	}
	time.Sleep(statsSettle) // the set-up's reads reported
	reads0, commits0 := svc.tokenReads(b)
	counts0, probes0 := as.Counts(), probes.Load()
	lat := make([][]time.Duration, len(sides))
	start := time.Now()
	for i := 0; b.Loop(); i++ {
		for j := range sides {
			k := (i + j) % len(sides)
			for range block {
				lat[k] = append(lat[k], timed(b, names[k], sides[k]))
			}
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	counts, probed := as.Counts(), probes.Load()-probes0
	time.Sleep(statsSettle)
	reads, commits := svc.tokenReads(b)
	reportLatencies(b, names, lat)
	user, static, session := at(lat[3], 0.5), at(lat[1], 0.5), at(lat[2], 0.5)
	b.ReportMetric(user/static, "user/static-p50")
	// The same machinery but the token transport: what OAuth adds.
	benchgoal.Report(b, "oauth-user-call-vs-static-session-p50", user/session, "x-static-session", benchgoal.AtMost, 1.1)
	b.ReportMetric(user-static, "user-added-vs-static-µs")
	b.ReportMetric(user-session, "user-added-vs-session-µs")
	calls := float64(len(lat[3]))
	b.ReportMetric(float64(reads-reads0), "token-reads")
	b.ReportMetric(float64(commits-commits0)/float64(len(sides))/calls*1000, "pg-commits/1000-calls")
	b.Logf("p50: user %.0f µs vs static %.0f µs (%.2fx, %+.0f µs) vs static per-session %.0f µs (%.2fx, %+.0f µs); direct %.0f µs. "+
		"During %d calls of each in %s: Postgres read oauth_tokens %d times, committed %d transactions; the MCP server got %d requests, "+
		"%d refused, %d of them health probes without a token",
		user, static, user/static, user-static, session, user/session, user-session, at(lat[0], 0.5),
		len(lat[3]), elapsed.Round(time.Millisecond), reads-reads0, commits-commits0,
		counts.MCPRequests-counts0.MCPRequests, counts.Unauthorized401-counts0.Unauthorized401, probed)
	if n := counts.Unauthorized401 - counts0.Unauthorized401 - probed; n != 0 {
		b.Errorf("the MCP server refused %d requests with a token", n)
	}
}

// oauthServerEnv, set, makes TestOAuthBenchServer serve: its value is
// the secret of the static client.
const oauthServerEnv = "CONNECTOR_SVC_BENCH_OAUTH_SERVER"

// TestOAuthBenchServer is not a test: BenchmarkOAuthUserOpen runs it in a
// process of its own, so that the memory of the authorization server and
// the MCP server is not counted as the service's. It serves them until
// its stdin closes.
func TestOAuthBenchServer(t *testing.T) {
	clientSecret := os.Getenv(oauthServerEnv)
	if clientSecret == "" {
		t.Skip("serves the authorization server of BenchmarkOAuthUserOpen in its own process")
	}
	as := oauthtest.Start(t, oauthtest.Options{})
	as.RegisterClient(staticClientID, clientSecret)
	fmt.Printf("OAUTHTEST %s %s\n", as.Issuer, as.MCPURL)
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// startOAuthServerProcess runs TestOAuthBenchServer in its own process
// and returns its issuer and MCP URL.
func startOAuthServerProcess(b *testing.B, clientSecret string) (issuer, mcpURL string) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestOAuthBenchServer$", "-test.count=1")
	cmd.Env = append(os.Environ(), oauthServerEnv+"="+clientSecret)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	})
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "OAUTHTEST "); ok {
			issuer, mcpURL, _ = strings.Cut(rest, " ")
			go func() { _, _ = io.Copy(io.Discard, stdout) }()
			return issuer, mcpURL
		}
	}
	b.Fatalf("the authorization server process ended before it served: %v", sc.Err())
	return "", ""
}

// settledHeap is the heap in use once garbage is collected.
func settledHeap() int64 {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// BenchmarkOAuthUserOpen measures what a user's connection costs to open
// and to hold. Each iteration authorizes a new user (not timed), then, in
// turn: the new user's first call (their connection opens: initialize and
// tools/list with their token, the session claimed in Postgres), a warm
// call of a user whose connection is open, the first call of a new
// session of a per_session AUTH_MODE_NONE connector of the same server
// (its connection opens: initialize, with a static token), and a warm
// call in a session. It reports each one's p50 and p99. After the loop it
// opens 200 more users' connections, and 200 more sessions', and reports
// the service's heap per open connection: the servers run in a process of
// their own (TestOAuthBenchServer), so only the service's memory counts.
func BenchmarkOAuthUserOpen(b *testing.B) {
	const n = 200
	clientSecret := "bench-static-secret-" + fmt.Sprint(time.Now().UnixNano())
	issuer, mcpURL := startOAuthServerProcess(b, clientSecret)
	token := staticToken(b, issuer, mcpURL, clientSecret)
	svc := serveOAuthService(b)
	svc.create(b, userConnector("user", mcpURL))
	svc.create(b, staticConnector("sessions", mcpURL, token, connectorv1.SessionMode_SESSION_MODE_PER_SESSION))
	svc.waitReachable(b, "user")
	svc.waitReachable(b, "sessions")
	svc.authorize(b, "user", "warm")
	if err := svc.whoami("user", "warm", "", "warm"); err != nil {
		b.Fatal(err)
	}
	if err := svc.whoami("sessions", "", "warm", staticClientID); err != nil {
		b.Fatal(err)
	}

	names := []string{"user-first", "user-warm", "session-first", "session-warm"}
	lat := make([][]time.Duration, len(names))
	users, sessions := 0, 0
	for i := 0; b.Loop(); i++ {
		user := fmt.Sprintf("u%d", users)
		users++
		b.StopTimer()
		svc.authorize(b, "user", user)
		b.StartTimer()
		session := fmt.Sprintf("s%d", sessions)
		sessions++
		sides := []func() error{
			func() error { return svc.whoami("user", user, "", user) },
			func() error { return svc.whoami("user", "warm", "", "") },
			func() error { return svc.whoami("sessions", "", session, "") },
			func() error { return svc.whoami("sessions", "", "warm", "") },
		}
		for j := range sides {
			k := (i + j) % len(sides)
			lat[k] = append(lat[k], timed(b, names[k], sides[k]))
		}
	}
	b.StopTimer()
	reportLatencies(b, names, lat)
	b.ReportMetric(at(lat[0], 0.5)/at(lat[1], 0.5), "user-first/warm-p50")
	b.ReportMetric(at(lat[0], 0.5)/at(lat[2], 0.5), "user-first/session-first-p50")

	// Heap per open connection: users authorized first, so that only
	// their connections' opening is between the two readings.
	for k := range n {
		svc.authorize(b, "user", fmt.Sprintf("h%d", k))
	}
	userID, ok := svc.reg.Lookup("ws", "user")
	sessID, ok2 := svc.reg.Lookup("ws", "sessions")
	if !ok || !ok2 {
		b.Fatal("the connectors are not in the registry")
	}
	open := func(call func(k int) error) (kib, goroutines float64) {
		heap0, g0 := settledHeap(), runtime.NumGoroutine()
		for k := range n {
			if err := call(k); err != nil {
				b.Fatal(err)
			}
		}
		heap1, g1 := settledHeap(), runtime.NumGoroutine()
		return float64(heap1-heap0) / n / 1024, float64(g1-g0) / n
	}
	userKiB, userG := open(func(k int) error { return svc.whoami("user", fmt.Sprintf("h%d", k), "", "") })
	sessKiB, sessG := open(func(k int) error { return svc.whoami("sessions", "", fmt.Sprintf("h%d", k), "") })
	b.ReportMetric(userKiB, "KiB-heap/user-connection")
	b.ReportMetric(sessKiB, "KiB-heap/session-connection")
	b.ReportMetric(userG, "goroutines/user-connection")
	b.Logf("%d users' connections open: %.1f KiB heap and %.2f goroutines each; %d sessions' (static token): %.1f KiB and %.2f goroutines each; held: %d users, %d sessions",
		n, userKiB, userG, n, sessKiB, sessG, svc.reg.SessionCount(userID), svc.reg.SessionCount(sessID))
	if got := svc.reg.SessionCount(userID); got != users+n+1 {
		b.Errorf("the user connector holds %d connections, want %d", got, users+n+1)
	}
}

// BenchmarkOAuthAuthorize measures StartAuthorization the first time the
// service meets an authorization server (cold: discovery, which follows
// the MCP server's 401 to its protected resource metadata and the
// server's metadata, and dynamic client registration; a new oauthtest
// server and connector each time, made untimed) and, in turn, once it
// knows it (warm: discovery cached, the registration stored), for a new
// user each time; then CompleteAuthorization of the warm one (the state
// consumed, the code exchanged, the tokens sealed and stored), the
// user's consent at the authorization server untimed.
func BenchmarkOAuthAuthorize(b *testing.B) {
	svc := serveOAuthService(b)
	as := oauthtest.Start(b, oauthtest.Options{})
	svc.create(b, userConnector("warm", as.MCPURL))
	svc.waitReachable(b, "warm")
	svc.authorize(b, "warm", "first")

	names := []string{"start-cold", "start-warm", "complete"}
	lat := make([][]time.Duration, len(names))
	var servers []*oauthtest.Server
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		cold := oauthtest.Start(b, oauthtest.Options{})
		servers = append(servers, cold)
		id := fmt.Sprintf("cold-%d", i)
		svc.create(b, userConnector(id, cold.MCPURL))
		svc.waitReachable(b, id)
		b.StartTimer()
		user := fmt.Sprintf("u%d", i)
		var warmURL string
		sides := []func() error{
			func() error { _, err := svc.start(id, user); return err },
			func() error { u, err := svc.start("warm", user); warmURL = u; return err },
		}
		for j := range sides {
			k := (i + j) % len(sides)
			lat[k] = append(lat[k], timed(b, names[k], sides[k]))
		}
		b.StopTimer()
		redirect, err := consent(warmURL, user)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		lat[2] = append(lat[2], timed(b, "complete", func() error { return svc.complete(redirect) }))
	}
	b.StopTimer()
	reportLatencies(b, names, lat)
	b.ReportMetric(at(lat[0], 0.5)/at(lat[1], 0.5), "cold/warm-start-p50")
	for _, s := range servers {
		if c := s.Counts(); c.Registrations != 1 || c.MetadataFetches < 1 || c.PRMFetches < 1 {
			b.Fatalf("a cold start: %d registrations, %d metadata and %d resource metadata fetches; want 1, at least 1, at least 1",
				c.Registrations, c.MetadataFetches, c.PRMFetches)
		}
	}
	if c := as.Counts(); c.Registrations != 1 || c.TokenCodeExchanges != int64(len(lat[2])+1) {
		b.Fatalf("the warm server: %d registrations, %d code exchanges; want 1 and %d", c.Registrations, c.TokenCodeExchanges, len(lat[2])+1)
	}
}

// BenchmarkOAuthRefresh measures calls that must refresh their user's
// token first against warm calls, in turn, in the two ways a token is
// refreshed. on-401: the server refuses the token (oauthtest's
// ExpireTokens ends every token it issued, untimed, before each
// refreshing call), so the request is refused with 401 invalid_token, the
// token refreshed (the row locked, the refresh token grant, the new tokens
// sealed and stored) and the request sent again; the warm calls are the
// same user's. ahead: the server issues 2 s tokens, which the manager
// refreshes before it sends a request once they are past half their
// life: 50 users' tokens are left to age (untimed), then each user's call
// refreshes first; the warm calls are a user's of a connector of another
// such server that issues 1 h tokens.
func BenchmarkOAuthRefresh(b *testing.B) {
	b.Run("on-401", benchRefreshOn401)
	b.Run("ahead", benchRefreshAhead)
}

func benchRefreshOn401(b *testing.B) {
	svc := serveOAuthService(b)
	opts, probes := countingProbes(oauthtest.Options{})
	as := oauthtest.Start(b, opts)
	svc.create(b, userConnector("user", as.MCPURL))
	svc.waitReachable(b, "user")
	svc.authorize(b, "user", "alice")
	call := func() error { return svc.whoami("user", "alice", "", "alice") }
	if err := call(); err != nil {
		b.Fatal(err)
	}
	names := []string{"warm", "refresh"}
	lat := make([][]time.Duration, len(names))
	before, probes0 := as.Counts(), probes.Load()
	for i := 0; b.Loop(); i++ {
		sides := []func(){
			func() { lat[0] = append(lat[0], timed(b, "warm call", call)) },
			func() {
				b.StopTimer()
				as.ExpireTokens()
				b.StartTimer()
				lat[1] = append(lat[1], timed(b, "refreshing call", call))
			},
		}
		sides[i%2]()
		sides[(i+1)%2]()
	}
	b.StopTimer()
	reportRefresh(b, names, lat, before, as.Counts(), int64(len(lat[1]))+probes.Load()-probes0)
}

func benchRefreshAhead(b *testing.B) {
	const users, ttl = 50, 2 * time.Second
	svc := serveOAuthService(b)
	opts, probes := countingProbes(oauthtest.Options{AccessTTL: ttl})
	short := oauthtest.Start(b, opts)
	long := oauthtest.Start(b, oauthtest.Options{})
	svc.create(b, userConnector("short", short.MCPURL))
	svc.create(b, userConnector("long", long.MCPURL))
	svc.waitReachable(b, "short")
	svc.waitReachable(b, "long")
	svc.authorize(b, "long", "warm")
	for k := range users {
		svc.authorize(b, "short", fmt.Sprintf("u%d", k))
	}
	if err := svc.whoami("long", "warm", "", "warm"); err != nil {
		b.Fatal(err)
	}
	names := []string{"warm", "refresh"}
	lat := make([][]time.Duration, len(names))
	before, probes0 := short.Counts(), probes.Load()
	roundEnd := time.Now()
	for i := 0; b.Loop(); i++ {
		k := i % users
		if k == 0 {
			// Every user's token past half its life (at most 1 s of 2 s).
			b.StopTimer()
			time.Sleep(time.Until(roundEnd.Add(ttl/2 + 100*time.Millisecond)))
			b.StartTimer()
		}
		user := fmt.Sprintf("u%d", k)
		sides := []func(){
			func() {
				lat[0] = append(lat[0], timed(b, "warm call", func() error { return svc.whoami("long", "warm", "", "") }))
			},
			func() {
				lat[1] = append(lat[1], timed(b, "refreshing call", func() error { return svc.whoami("short", user, "", user) }))
			},
		}
		sides[i%2]()
		sides[(i+1)%2]()
		roundEnd = time.Now()
	}
	b.StopTimer()
	reportRefresh(b, names, lat, before, short.Counts(), probes.Load()-probes0)
}

// reportRefresh reports warm and refreshing calls' latencies and checks
// that each refreshing call refreshed once, and that the server refused
// refused requests (the health probes' and those refreshing calls meet).
func reportRefresh(b *testing.B, names []string, lat [][]time.Duration, before, after oauthtest.Counts, refused int64) {
	reportLatencies(b, names, lat)
	b.ReportMetric(at(lat[1], 0.5)/at(lat[0], 0.5), "refresh/warm-p50")
	b.ReportMetric(at(lat[1], 0.5)-at(lat[0], 0.5), "refresh-added-µs")
	if got, want := after.Refreshes-before.Refreshes, int64(len(lat[1])); got != want {
		b.Errorf("%d refreshes, want %d (one per refreshing call)", got, want)
	}
	if got := after.Unauthorized401 - before.Unauthorized401; got != refused {
		b.Errorf("%d requests refused, want %d", got, refused)
	}
}
