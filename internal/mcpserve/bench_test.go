package mcpserve_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	mcpclient "github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/benchgoal"
	"github.com/connector-svc/connector-svc/internal/live/livetest"
	"github.com/connector-svc/connector-svc/internal/mcpserve"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/server"
	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

// BenchmarkEndpoint measures what the MCP endpoint costs next to what it
// fronts, on one replica over a real Postgres, against a real mcp-go
// server over streamable HTTP on loopback:
//
//   - Latency: a tools/call of a trivial echo tool, in turn (each first
//     every other time, so all see the same noise) (a) straight to the
//     upstream with mcp-go's client, in both protocol generations; (b)
//     through /mcp/ws/echo with mcp-go's client, in both; (c) through the
//     same service's gRPC CallTool; (d) a bare HTTP round trip of a small
//     JSON body, the one loopback hop the endpoint adds; (e) a bare mcp-go
//     proxy (an mcp-go server whose echo calls the upstream with one
//     mcp-go client), in both generations. The endpoint's own work is (b) -
//     (a) - (d), reported as a share of (a) + (d); (b) - (e) is what of it
//     is the service's code rather than MCP in and out with mcp-go.
//   - Concurrent64: 64 mcp-go clients, each its own 2025-11-25 session,
//     calling echo at once through the endpoint, 64 straight to the
//     upstream, and 64 through the bare proxy, in alternating rounds:
//     calls per second of each.
//   - IdleSessions: 200 2025-11-25 sessions opened (initialize and
//     notifications/initialized, then nothing), heap and goroutines
//     before and after, on the endpoint and on a bare mcp-go server.
//
// MCPSERVE_BENCH_ONLY=<path> (endpoint-2025, say) times that one path of
// Latency alone, for a CPU profile of it.
//
// Auth is on (a key of scope admin, as a client in production sends one);
// logs are discarded. It reports numbers and goal lines and asserts no
// speed.
func BenchmarkEndpoint(b *testing.B) {
	r := newBenchRig(b)
	b.Run("Latency", r.latency)
	b.Run("Concurrent64", r.concurrent64)
	b.Run("IdleSessions", r.idleSessions)
}

// benchRig is the service, its two front doors and the upstream.
type benchRig struct {
	upURL    string // the upstream mcp-go server's streamable-HTTP URL
	endpoint string // /mcp/ws/echo on the MCP listener
	proxy    string // a bare mcp-go server whose echo calls the upstream's
	token    string // an API key of workspace "ws", scope admin
	version  string // the protocol generation the connector negotiated upstream
	grpc     connectorv1.ConnectorServiceClient
	gctx     context.Context // carries the key for gRPC
}

const (
	benchWS        = "ws"
	benchConnector = "echo"
)

func newBenchRig(b *testing.B) *benchRig {
	ctx := context.Background()
	m := mcpserver.NewMCPServer("up", "1.0", mcpserver.WithToolCapabilities(true))
	m.AddTool(mcp.NewTool("echo", mcp.WithString("message"), mcp.WithReadOnlyHintAnnotation(true)),
		func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText(req.GetString("message", "")), nil
		})
	up := httptest.NewServer(mcpserver.NewStreamableHTTPServer(m))
	b.Cleanup(up.Close)
	r := &benchRig{upURL: up.URL + "/mcp"}

	db := storetest.NewDB(b)
	reg, lv := livetest.Run(b, db)
	keys := auth.NewKeys(db, auth.Config{}, nil)
	if err := keys.Load(ctx); err != nil {
		b.Fatal(err)
	}
	_, token, err := keys.Create(ctx, benchWS, []auth.Scope{auth.ScopeAdmin}, "bench")
	if err != nil {
		b.Fatal(err)
	}
	r.token = token
	row, err := db.CreateConnector(ctx, &store.Connector{WorkspaceID: benchWS, ExternalID: benchConnector, Name: benchConnector,
		Active: true, Transport: store.TransportStreamableHTTP,
		Config: store.Config{URL: r.upURL, CallTimeout: store.Duration(20 * time.Second), ApprovalPolicy: "none"}})
	if err != nil {
		b.Fatal(err)
	}
	lv.Apply(ctx, row)

	srv := server.New(server.Deps{DB: db, Registry: reg, Live: lv, Keys: keys}, server.Config{Auth: auth.ModeKeys})
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	// As in main: the key cache is trusted while it follows the store, and
	// the counters and run records are written in the background.
	go func() { defer wg.Done(); _ = keys.Run(rctx) }()
	go func() { defer wg.Done(); _ = srv.Run(rctx, time.Second) }()

	g, hs := server.NewGRPCServer(srv)
	server.SetServing(hs, true)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = g.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	r.grpc = connectorv1.NewConnectorServiceClient(conn)
	r.gctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)

	uc := srv.UseCases()
	h := mcpserve.New(mcpserve.Deps{Calls: uc.Calls, Resources: uc.Resources, Watches: uc.Watches, Queries: uc.Queries, Placer: uc.Placer, Sessions: uc.Sessions,
		Authorizations: uc.Authorizations, Live: lv, Registry: reg, Tools: db, Keys: keys},
		mcpserve.Config{Auth: auth.ModeKeys, SessionKey: []byte("bench session key")})
	wg.Add(1)
	go func() { defer wg.Done(); _ = h.Run(rctx) }()
	mux := http.NewServeMux()
	mux.Handle("/mcp/", h)
	hsrv := httptest.NewServer(mux)
	r.endpoint = hsrv.URL + "/mcp/" + benchWS + "/" + benchConnector
	b.Cleanup(func() {
		hsrv.Close()
		conn.Close()
		g.Stop()
		cancel()
		wg.Wait()
	})

	testsupport.WaitFor(b, "the echo connector READY", func() bool {
		id, ok := reg.Lookup(benchWS, benchConnector)
		if !ok {
			return false
		}
		health, err := reg.Health(id)
		if err != nil || health.State != registry.StateReady {
			return false
		}
		r.version = health.ProtocolVersion
		return true
	})
	testsupport.WaitFor(b, "echo callable over gRPC", func() bool {
		_, err := r.grpc.CallTool(r.gctx, r.grpcRequest())
		return err == nil
	})
	r.proxy = serveProxy(b, r.upURL, r.version)
	return r
}

// serveProxy serves a bare mcp-go server whose echo tool calls the
// upstream's with one shared mcp-go client at version, as the registry
// holds one connection per connector: MCP in and MCP out with no service
// in between. The endpoint minus this is the service's own work; this
// minus the direct call is what any MCP-to-MCP hop costs with mcp-go.
func serveProxy(b *testing.B, upURL, version string) string {
	up := dial(b, upURL, version, httpClient(), "")
	m := mcpserver.NewMCPServer("proxy", "1.0", mcpserver.WithToolCapabilities(true))
	m.AddTool(mcp.NewTool("echo", mcp.WithString("message"), mcp.WithReadOnlyHintAnnotation(true)),
		func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var out mcp.CallToolRequest
			out.Params.Name = "echo"
			out.Params.Arguments = req.GetArguments()
			return up.CallTool(ctx, out)
		})
	hs := httptest.NewServer(mcpserver.NewStreamableHTTPServer(m))
	b.Cleanup(hs.Close)
	return hs.URL + "/mcp"
}

func (r *benchRig) grpcRequest() *connectorv1.CallToolRequest {
	args, _ := structpb.NewStruct(map[string]any{"message": "hi"})
	return &connectorv1.CallToolRequest{WorkspaceId: benchWS, ConnectorId: benchConnector, ToolName: "echo", Arguments: args}
}

// httpClient is a client of its own, keeping enough idle connections for
// 64 callers (net/http keeps 2 per host by default: the rest would dial
// anew on every call).
func httpClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = 256
	tr.MaxIdleConnsPerHost = 256
	return &http.Client{Transport: tr}
}

// dial starts an mcp-go client of url at version on hc (the classic
// handshake for a version before 2026-07-28), sending authorization (if
// set) as mcp-go's clients send static headers.
func dial(b *testing.B, url, version string, hc *http.Client, authorization string) *mcpclient.Client {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	opts := []transport.StreamableHTTPCOption{transport.WithHTTPBasicClient(hc)}
	if authorization != "" {
		opts = append(opts, transport.WithHTTPHeaders(map[string]string{"Authorization": authorization}))
	}
	tr, err := transport.NewStreamableHTTP(url, opts...)
	if err != nil {
		b.Fatal(err)
	}
	c := mcpclient.NewClient(tr, mcpclient.WithProtocolVersion(version))
	b.Cleanup(func() { _ = c.Close() })
	if err := c.Start(ctx); err != nil {
		b.Fatalf("start a client of %s: %v", url, err)
	}
	var init mcp.InitializeRequest
	init.Params.ClientInfo = mcp.Implementation{Name: "bench", Version: "1"}
	res, err := c.Initialize(ctx, init)
	if err != nil {
		b.Fatalf("initialize %s at %s: %v", url, version, err)
	}
	if res.ProtocolVersion != version {
		b.Fatalf("%s negotiated %s, want %s", url, res.ProtocolVersion, version)
	}
	return c
}

// echoCall returns one call of echo on c, failing on a tool error too.
func echoCall(c *mcpclient.Client) func() error {
	var req mcp.CallToolRequest
	req.Params.Name = "echo"
	req.Params.Arguments = map[string]any{"message": "hi"}
	return func() error {
		res, err := c.CallTool(context.Background(), req)
		if err != nil {
			return err
		}
		if res.IsError {
			return fmt.Errorf("echo answered a tool error: %v", res.Content)
		}
		return nil
	}
}

// httpEcho serves a bare HTTP handler on loopback that reads a small JSON
// body and answers one like a tools/call result, and returns a round trip
// of it: the cost of one more loopback HTTP hop, without MCP.
func httpEcho(b *testing.B) func() error {
	answer := []byte(`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"hi"}]}}`)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(answer)
	}))
	b.Cleanup(hs.Close)
	hc := httpClient()
	body := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"message":"hi"}}}`)
	return func() error {
		resp, err := hc.Post(hs.URL, "application/json", bytes.NewReader(body))
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return err
	}
}

// latency times the six ways of making one echo call, in turn.
func (r *benchRig) latency(b *testing.B) {
	hc, key := httpClient(), "Bearer "+r.token
	gens := []string{mcp.ProtocolVersion20251125, mcp.ProtocolVersion20260728}
	names := []string{"direct-2025", "direct-2026", "endpoint-2025", "endpoint-2026", "grpc", "httpecho",
		"proxy-2025", "proxy-2026"}
	fs := []func() error{
		echoCall(dial(b, r.upURL, gens[0], hc, "")),
		echoCall(dial(b, r.upURL, gens[1], hc, "")),
		echoCall(dial(b, r.endpoint, gens[0], hc, key)),
		echoCall(dial(b, r.endpoint, gens[1], hc, key)),
		func() error { _, err := r.grpc.CallTool(r.gctx, r.grpcRequest()); return err },
		httpEcho(b),
		echoCall(dial(b, r.proxy, gens[0], hc, "")),
		echoCall(dial(b, r.proxy, gens[1], hc, "")),
	}
	// Warm every path (connections, the endpoint's first request).
	for range 20 {
		for i, f := range fs {
			if err := f(); err != nil {
				b.Fatalf("%s: %v", names[i], err)
			}
		}
	}
	if only := os.Getenv("MCPSERVE_BENCH_ONLY"); only != "" {
		// For a profile of one path alone: time it, and nothing else.
		i := slices.Index(names, only)
		if i < 0 {
			b.Fatalf("MCPSERVE_BENCH_ONLY=%s: not one of %v", only, names)
		}
		l := inTurnN(b, fs[i])[0]
		b.ReportMetric(float64(l[len(l)/2].Nanoseconds())/1e3, only+"-p50-µs")
		return
	}
	lat := inTurnN(b, fs...)
	mean, p50 := make([]float64, len(fs)), make([]float64, len(fs))
	for i, l := range lat {
		var sum time.Duration
		for _, d := range l {
			sum += d
		}
		mean[i] = float64(sum.Nanoseconds()) / float64(len(l))
		p50[i] = float64(l[len(l)/2].Nanoseconds())
		b.ReportMetric(mean[i], names[i]+"-ns/op")
		b.ReportMetric(p50[i]/1e3, names[i]+"-p50-µs")
	}
	// The endpoint's hop upstream is a call in the generation the
	// connector negotiated: that is the direct call it contains.
	upstream := 0
	if r.version == mcp.ProtocolVersion20260728 {
		upstream = 1
	}
	// Few lines: a benchmark's log is cut after 10 lines without -v.
	var table strings.Builder
	fmt.Fprintf(&table, "connector's upstream generation %s; %d calls each; p50 µs (mean):", r.version, len(lat[0]))
	for i := range fs {
		fmt.Fprintf(&table, " %s %.1f (%.1f)", names[i], p50[i]/1e3, mean[i]/1e3)
	}
	table.WriteString("\n")
	echo := 5
	for g := range gens {
		ep := 2 + g
		ratio := p50[ep] / p50[g]
		work := p50[ep] - p50[upstream] - p50[echo]
		share := work / (p50[echo] + p50[upstream])
		workMean := mean[ep] - mean[upstream] - mean[echo]
		shareMean := workMean / (mean[echo] + mean[upstream])
		fmt.Fprintf(&table, "%s: endpoint/direct %.2fx (p50; mean %.2fx); own work %.1f µs p50 = %.3f of echo+direct "+
			"(mean: %.1f µs = %.3f);", names[ep], ratio, mean[ep]/mean[g], work/1e3, share, workMean/1e3, shareMean)
		b.ReportMetric(ratio, names[ep]+"/direct")
		// What a bare mcp-go proxy costs over the direct call, and what
		// the endpoint costs over that proxy: the latter is the service's
		// own code (auth, session ids, placing, calls.Service).
		px := 6 + g
		hop := p50[px] - p50[upstream] - p50[echo]
		svc := p50[ep] - p50[px]
		fmt.Fprintf(&table, " of which a bare mcp-go proxy's hop %.1f µs (%.3f of echo+direct) and the service's own %.1f µs "+
			"(%.3f of echo+direct; endpoint/proxy %.2fx)\n", hop/1e3, hop/(p50[echo]+p50[upstream]), svc/1e3,
			svc/(p50[echo]+p50[upstream]), p50[ep]/p50[px])
		b.ReportMetric(svc/(p50[echo]+p50[upstream]), "service-share-"+gens[g][:4])
		benchgoal.Report(b, "mcp-endpoint-work-share-p50-"+gens[g], share, "of-echo+direct-"+gens[g][:4], benchgoal.AtMost, 0.25)
	}
	fmt.Fprintf(&table, "grpc CallTool/direct-%s %.2fx (p50)", r.version[:4], p50[4]/p50[upstream])
	b.Log(table.String())
}

// concurrent64 compares 64 concurrent sessions through the endpoint with
// 64 straight to the upstream and 64 through the bare proxy: each b.Loop
// iteration runs one round of each (which goes first rotates), every
// client making perRound calls. All of it shares this machine's cores, so
// the rates say how much CPU a call takes on each path, not what the
// endpoint would serve on cores of its own.
func (r *benchRig) concurrent64(b *testing.B) {
	const clients, perRound = 64, 10
	hc, key := httpClient(), "Bearer "+r.token
	sides := []struct {
		name  string
		calls []func() error
		spent time.Duration
		n     int
	}{{name: "direct"}, {name: "endpoint"}, {name: "proxy"}}
	for range clients {
		sides[0].calls = append(sides[0].calls, echoCall(dial(b, r.upURL, mcp.ProtocolVersion20251125, hc, "")))
		sides[1].calls = append(sides[1].calls, echoCall(dial(b, r.endpoint, mcp.ProtocolVersion20251125, hc, key)))
		sides[2].calls = append(sides[2].calls, echoCall(dial(b, r.proxy, mcp.ProtocolVersion20251125, hc, "")))
	}
	round := func(calls []func() error) (time.Duration, error) {
		var wg sync.WaitGroup
		errs := make(chan error, len(calls))
		start := time.Now()
		for _, call := range calls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range perRound {
					if err := call(); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		return time.Since(start), <-errs
	}
	for i := range sides { // warm up: every session's connection
		if _, err := round(sides[i].calls); err != nil {
			b.Fatalf("%s: %v", sides[i].name, err)
		}
	}
	for i := 0; b.Loop(); i++ {
		for j := range sides {
			s := &sides[(i+j)%len(sides)]
			d, err := round(s.calls)
			if err != nil {
				b.Fatalf("%s: %v", s.name, err)
			}
			s.spent += d
			s.n += clients * perRound
		}
	}
	rate := func(k int) float64 { return float64(sides[k].n) / sides[k].spent.Seconds() }
	b.ReportMetric(rate(0), "direct-calls/s")
	b.ReportMetric(rate(1), "endpoint-calls/s")
	b.ReportMetric(rate(2), "proxy-calls/s")
	b.Logf("64 clients, 2025-11-25 sessions, %d calls each side: direct %.0f calls/s, endpoint %.0f calls/s, "+
		"bare mcp-go proxy %.0f calls/s (endpoint/proxy %.2fx, proxy/direct %.2fx)",
		sides[0].n, rate(0), rate(1), rate(2), rate(1)/rate(2), rate(2)/rate(0))
	benchgoal.Report(b, "mcp-endpoint-throughput-64-ratio", rate(1)/rate(0), "endpoint/direct", benchgoal.AtLeast, 0.8)
}

// idleSessions opens 200 sessions on the endpoint and as many on the bare
// upstream, with raw HTTP (so that no client object stays in this
// process's heap), and reports what each session holds: heap bytes and
// goroutines, after a GC. The sessions are deleted at the end of each
// iteration.
func (r *benchRig) idleSessions(b *testing.B) {
	const n = 200
	hc := httpClient()
	targets := []struct{ name, url, key string }{{"endpoint", r.endpoint, "Bearer " + r.token}, {"upstream", r.upURL, ""}}
	type result struct{ bytes, goroutines float64 }
	sum := make([]result, len(targets))
	iterations := 0
	for b.Loop() {
		iterations++
		for i, t := range targets {
			heap0, g0 := settle()
			ids := make([]string, 0, n)
			for range n {
				id, err := openSession(hc, t.url, t.key)
				if err != nil {
					b.Fatalf("%s: %v", t.name, err)
				}
				ids = append(ids, id)
			}
			heap1, g1 := settle()
			held := 0 // the ids this loop holds are not the server's
			for _, id := range ids {
				held += len(id)
			}
			sum[i].bytes += (float64(heap1) - float64(heap0) - float64(held)) / n
			sum[i].goroutines += float64(g1-g0) / n
			for _, id := range ids {
				deleteSession(hc, t.url, t.key, id)
			}
			runtime.KeepAlive(ids)
		}
	}
	for i, t := range targets {
		perSession, gs := sum[i].bytes/float64(iterations), sum[i].goroutines/float64(iterations)
		b.ReportMetric(perSession, t.name+"-B/session")
		b.ReportMetric(gs, t.name+"-goroutines/session")
		b.Logf("%s: %d idle 2025-11-25 sessions: %.0f heap bytes and %.2f goroutines per session", t.name, n, perSession, gs)
	}
}

// settle lets background work end and collects garbage, then returns the
// live heap and the goroutines.
func settle() (uint64, int) {
	time.Sleep(50 * time.Millisecond)
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc, runtime.NumGoroutine()
}

// openSession starts a 2025-11-25 session as a client would (initialize,
// then notifications/initialized) and returns its id.
func openSession(hc *http.Client, url, key string) (string, error) {
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},` +
		`"clientInfo":{"name":"bench","version":"1"}}}`
	resp, err := post(hc, url, key, "", init)
	if err != nil {
		return "", err
	}
	id := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || id == "" {
		return "", fmt.Errorf("initialize answered %s without a session id", resp.Status)
	}
	resp, err = post(hc, url, key, id, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusAccepted {
		return "", fmt.Errorf("notifications/initialized answered %s", resp.Status)
	}
	return id, nil
}

// post sends body and reads the whole answer (closing the body).
func post(hc *http.Client, url, key, session, body string) (*http.Response, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if key != "" {
		req.Header.Set("Authorization", key)
	}
	if session != "" {
		req.Header.Set("Mcp-Session-Id", session)
		req.Header.Set("Mcp-Protocol-Version", mcp.ProtocolVersion20251125)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp, err
}

func deleteSession(hc *http.Client, url, key, id string) {
	req, err := http.NewRequest(http.MethodDelete, url, nil)
	if err != nil {
		return
	}
	req.Header.Set("Mcp-Session-Id", id)
	req.Header.Set("Mcp-Protocol-Version", mcp.ProtocolVersion20251125)
	if key != "" {
		req.Header.Set("Authorization", key)
	}
	if resp, err := hc.Do(req); err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// inTurnN runs each of fs once per b.Loop iteration, starting with a
// different one each time so that all see the same noise, and returns
// their latencies, each sorted.
func inTurnN(b *testing.B, fs ...func() error) [][]time.Duration {
	lat := make([][]time.Duration, len(fs))
	for i := 0; b.Loop(); i++ {
		for j := range fs {
			k := (i + j) % len(fs)
			start := time.Now()
			if err := fs[k](); err != nil {
				b.Fatal(err)
			}
			lat[k] = append(lat[k], time.Since(start))
		}
	}
	for _, l := range lat {
		slices.Sort(l)
	}
	return lat
}
