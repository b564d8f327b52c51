package server_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/store"
)

// The test binary doubles as the MCP server of the benchmarks below, in a
// process of its own, so that its time and memory are not the service's:
// run with stampStdioArg it serves stamp over stdio, with stampHTTPArg
// over streamable HTTP (classic sessions) on a loopback port it prints.
const (
	stampStdioArg = "askback-bench-stdio-server"
	stampHTTPArg  = "askback-bench-http-server"
)

func init() {
	if len(os.Args) < 2 {
		return
	}
	switch os.Args[1] {
	case stampStdioArg:
		// mcp-go's stdio server runs 5 requests at once by default, and
		// queues the rest: a sixth call that would ask waits until one of
		// the five is answered. 100 is its most.
		if err := mcpserver.ServeStdio(stampMCP(), mcpserver.WithWorkerPoolSize(100)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	case stampHTTPArg:
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("http://%s/mcp\n", lis.Addr())
		fmt.Fprintln(os.Stderr, http.Serve(lis, mcpserver.NewStreamableHTTPServer(stampMCP())))
		os.Exit(1)
	}
}

// stampMCP is an MCP server whose tool "ask" sends elicitation/create from
// its handler with, as its message, the time it sent it (Unix ns), and
// says the action it got back.
func stampMCP() *mcpserver.MCPServer {
	m := mcpserver.NewMCPServer("stamp", "1.0", mcpserver.WithToolCapabilities(true), mcpserver.WithElicitation())
	m.AddTool(mcp.NewTool("ask", mcp.WithDescription("Asks who you are")), func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		res, err := m.RequestElicitation(ctx, mcp.ElicitationRequest{Params: mcp.ElicitationParams{
			Message: strconv.FormatInt(time.Now().UnixNano(), 10), RequestedSchema: askSchema}})
		if err != nil {
			return nil, err
		}
		return mcp.NewToolResultText("action=" + string(res.Action)), nil
	})
	return m
}

// stampHTTP starts the stamp server over streamable HTTP in a process of
// its own and returns its URL.
func stampHTTP(b *testing.B) string {
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(exe, stampHTTPArg) // its log (mcp-go's, per request) is not kept
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	url, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		b.Fatalf("the stamp server said no URL: %v", err)
	}
	return strings.TrimSpace(url)
}

// stampConnectors creates, on f, the per-session connectors "http" (the
// stamp server over streamable HTTP, classic protocol) and "stdio" (the
// stamp server over stdio), both with elicitation on, and waits until a
// call of each asks. The stdio one is written to the database directly, as
// the service's allow-list of commands names no test binary; the service
// picks it up as it does any change.
func stampConnectors(b *testing.B, f *fixture) {
	ctx := context.Background()
	c := mcpConnector("http", stampHTTP(b))
	c.SessionMode, c.Elicitation = connectorv1.SessionMode_SESSION_MODE_PER_SESSION, true
	c.ProtocolPreference = connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_CLASSIC
	if _, err := f.client.CreateConnector(ctx, &connectorv1.CreateConnectorRequest{WorkspaceId: "ws", Connector: c}); err != nil {
		b.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	if _, err := f.db.CreateConnector(ctx, &store.Connector{WorkspaceID: "ws", ExternalID: "stdio", Name: "stdio",
		Transport: store.TransportStdio, Active: true, Config: store.Config{Command: exe, Args: []string{stampStdioArg},
			SessionMode: "per_session", ProtocolPreference: "classic", ApprovalPolicy: "none", Elicitation: true,
			ConnectTimeout: store.Duration(10 * time.Second), CallTimeout: store.Duration(30 * time.Second)}}); err != nil {
		b.Fatal(err)
	}
	for _, id := range []string{"http", "stdio"} {
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			_, err := streamCallLatency(ctx, f, id)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("connector %s never asked: %v", id, err)
			}
		}
	}
}

// sentAt is the time the stamp server sent in, from its message.
func sentAt(in *connectorv1.InputRequest) (time.Time, error) {
	ns, err := strconv.ParseInt(in.GetMessage(), 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("input request %v carries no send time", in)
	}
	return time.Unix(0, ns), nil
}

// streamCallLatency runs a StreamCallTool of "ask" on connector id in
// session s1, and returns the time from the server's elicitation/create to
// the stream's input_required; it then answers and reads the call's end.
func streamCallLatency(ctx context.Context, f *fixture, id string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	stream, err := f.client.StreamCallTool(ctx, &connectorv1.StreamCallToolRequest{WorkspaceId: "ws", ConnectorId: id, ToolName: "ask", SessionId: "s1"})
	if err != nil {
		return 0, err
	}
	var in *connectorv1.InputRequest
	for in == nil {
		msg, err := stream.Recv()
		if err != nil {
			return 0, fmt.Errorf("before input_required: %w", err)
		}
		in = msg.GetInputRequired()
	}
	got := time.Now()
	sent, err := sentAt(in)
	if err != nil {
		return 0, err
	}
	if _, err := f.client.AnswerInput(ctx, &connectorv1.AnswerInputRequest{WorkspaceId: "ws", ConnectorId: id, SessionId: "s1",
		Answer: accept(in.GetInputId(), map[string]any{"name": "bench"})}); err != nil {
		return 0, err
	}
	var last *connectorv1.StreamCallToolResponse
	for {
		msg, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, err
		}
		last = msg
	}
	if text := last.GetResult().GetContent()[0].GetText().GetText(); text != "action=accept" {
		return 0, fmt.Errorf("the call ended with %v", last)
	}
	return got.Sub(sent), nil
}

// streamQueryLatency runs a StreamQueryConnector on connector id in
// session s1 whose model calls "ask", and returns the time from the
// server's elicitation/create to the stream's input_required; it then
// answers with ResumeQuery, which must finish the run.
func streamQueryLatency(ctx context.Context, f *fixture, id string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	stream, err := f.client.StreamQueryConnector(ctx, &connectorv1.StreamQueryConnectorRequest{WorkspaceId: "ws", ConnectorId: id,
		Query: "who am I?", SessionId: "s1"})
	if err != nil {
		return 0, err
	}
	var ir *connectorv1.InputRequired
	for ir == nil {
		msg, err := stream.Recv()
		if err != nil {
			return 0, fmt.Errorf("before input_required: %w", err)
		}
		ir = msg.GetInputRequired()
	}
	got := time.Now()
	if len(ir.GetInputRequests()) != 1 {
		return 0, fmt.Errorf("input_required = %v", ir)
	}
	in := ir.GetInputRequests()[0]
	sent, err := sentAt(in)
	if err != nil {
		return 0, err
	}
	for {
		if _, err := stream.Recv(); err == io.EOF {
			break
		} else if err != nil {
			return 0, err
		}
	}
	resp, err := f.client.ResumeQuery(ctx, &connectorv1.ResumeQueryRequest{WorkspaceId: "ws", RunId: ir.GetRunId(),
		Inputs: []*connectorv1.InputAnswer{accept(in.GetInputId(), map[string]any{"name": "bench"})}})
	if err != nil {
		return 0, err
	}
	if resp.GetResult().GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_COMPLETED {
		return 0, fmt.Errorf("answered run = %v", resp.GetResult())
	}
	return got.Sub(sent), nil
}

// quantiles returns the p50 and p99 of d in µs.
func quantiles(d []time.Duration) (p50, p99 float64) {
	slices.Sort(d)
	at := func(q float64) float64 { return float64(d[min(len(d)-1, int(q*float64(len(d))))].Nanoseconds()) / 1e3 }
	return at(0.5), at(0.99)
}

// BenchmarkInputRequiredLatency measures the time from the moment an MCP
// server's tool handler sends elicitation/create (its clock, in the
// request) to the moment the caller receives the input_required stream
// event (the caller's clock, the same machine's), on a classic
// per-session connection over streamable HTTP and over stdio, for
// StreamCallTool and StreamQueryConnector. Each iteration then answers, so
// that the next one starts with nothing open. The MCP servers run in
// processes of their own.
func BenchmarkInputRequiredLatency(b *testing.B) {
	ctx := context.Background()
	f := setup(b, options{llmURL: askingModel(b)})
	stampConnectors(b, f)
	for _, id := range []string{"http", "stdio"} {
		for _, rpc := range []struct {
			name string
			run  func(context.Context, *fixture, string) (time.Duration, error)
		}{{"StreamCallTool", streamCallLatency}, {"StreamQueryConnector", streamQueryLatency}} {
			b.Run(id+"/"+rpc.name, func(b *testing.B) {
				var ds []time.Duration
				for b.Loop() {
					d, err := rpc.run(ctx, f, id)
					if err != nil {
						b.Fatal(err)
					}
					ds = append(ds, d)
				}
				p50, p99 := quantiles(ds)
				b.ReportMetric(p50, "p50-µs")
				b.ReportMetric(p99, "p99-µs")
			})
		}
	}
}

// livePauses is how many runs BenchmarkLivePauseMemory holds paused at
// once.
const livePauses = 200

// pauseSessions is how many sessions BenchmarkLivePauseMemory spreads its
// pauses over (a stdio server process holds up to 100 calls at once).
const pauseSessions = 4

// BenchmarkLivePauseMemory measures what a live pause holds in the
// service: livePauses queries over pauseSessions per-session connections,
// each paused on a form its tool call waits on, held at once; the heap
// (after a GC) and goroutines they add, per pause. The MCP servers run in processes of
// their own, so their share is not counted; the gRPC client's is (it
// holds nothing per finished query). Each iteration answers them all.
func BenchmarkLivePauseMemory(b *testing.B) {
	ctx := context.Background()
	f := setup(b, options{llmURL: askingModel(b)})
	stampConnectors(b, f)
	// Over stdio, livePauses calls open at once on the stamp server's
	// processes do not all reach the caller (the query waits past its
	// pause); only the streamable-HTTP connection is measured.
	for _, id := range []string{"http"} {
		b.Run(id, func(b *testing.B) {
			query := func(i int) (*connectorv1.QueryResult, error) {
				resp, err := f.client.QueryConnector(ctx, &connectorv1.QueryConnectorRequest{WorkspaceId: "ws", ConnectorId: id,
					Query: "who am I?", SessionId: fmt.Sprint("s", i%pauseSessions)})
				if err == nil && resp.GetResult().GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_AWAITING_INPUT {
					return nil, fmt.Errorf("query = %v; want AWAITING_INPUT", resp.GetResult())
				}
				return resp.GetResult(), err
			}
			answer := func(p *connectorv1.QueryResult) error {
				resp, err := f.client.ResumeQuery(ctx, &connectorv1.ResumeQueryRequest{WorkspaceId: "ws", RunId: p.GetRunId(),
					Inputs: []*connectorv1.InputAnswer{accept(p.GetInputRequests()[0].GetInputId(), map[string]any{"name": "bench"})}})
				if err == nil && resp.GetResult().GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_COMPLETED {
					return fmt.Errorf("answered run = %v", resp.GetResult())
				}
				return err
			}
			settle := func() (heap uint64, goroutines int) {
				var ms runtime.MemStats
				for range 2 {
					runtime.GC()
				}
				runtime.ReadMemStats(&ms)
				return ms.HeapAlloc, runtime.NumGoroutine()
			}
			// One pause per session answered first: what the first pause
			// sets up once (the session's connection, pools) is not counted.
			for i := range pauseSessions {
				p, err := query(i)
				if err != nil {
					b.Fatal(err)
				}
				if err := answer(p); err != nil {
					b.Fatal(err)
				}
			}
			var heaps, gors []float64
			for b.Loop() {
				time.Sleep(100 * time.Millisecond) // the last iteration's calls wind down
				heap0, g0 := settle()
				paused := make([]*connectorv1.QueryResult, livePauses)
				var wg sync.WaitGroup
				errs := make(chan error, livePauses)
				for i := range paused {
					wg.Add(1)
					go func() {
						defer wg.Done()
						p, err := query(i)
						if err != nil {
							errs <- err
						}
						paused[i] = p
					}()
					if i%8 == 7 {
						wg.Wait() // 8 at a time: the 2 cores, not a burst, decide
					}
				}
				wg.Wait()
				close(errs)
				if err := <-errs; err != nil {
					b.Fatal(err)
				}
				time.Sleep(100 * time.Millisecond) // the queries' own goroutines end
				heap1, g1 := settle()
				heaps = append(heaps, (float64(heap1)-float64(heap0))/livePauses/1024)
				gors = append(gors, float64(g1-g0)/livePauses)
				for _, p := range paused {
					if err := answer(p); err != nil {
						b.Fatal(err)
					}
				}
			}
			slices.Sort(heaps)
			slices.Sort(gors)
			b.ReportMetric(heaps[len(heaps)/2], "heap-KiB/pause")
			b.ReportMetric(gors[len(gors)/2], "goroutines/pause")
		})
	}
}

// BenchmarkDurableInput measures a durable pause: a query on the
// sessionless protocol whose tool call asks (the server's input_required
// ends the call; the run keeps what it needs to send it again in its row),
// against a query of the same shape whose tool asks nothing; the paused
// row's size; and the ResumeQuery that sends the call again with the
// answer and finishes the run.
func BenchmarkDurableInput(b *testing.B) {
	ctx := context.Background()
	oa := newFakeOAuth()
	f := setup(b, options{llmURL: askingModel(b), oauth: oa})
	for _, c := range []*connectorv1.Connector{oauthUserConnector("plain", benchMCP(b, 0)), oauthUserConnector("asks", newAskMCPB(b).url)} {
		c.ProtocolPreference, c.Elicitation = connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_SESSIONLESS, true
		if _, err := f.client.CreateConnector(ctx, &connectorv1.CreateConnectorRequest{WorkspaceId: "ws", Connector: c}); err != nil {
			b.Fatal(err)
		}
	}
	query := func(id string) (*connectorv1.QueryResult, error) {
		resp, err := f.client.QueryConnector(ctx, &connectorv1.QueryConnectorRequest{WorkspaceId: "ws", ConnectorId: id, Query: "q", UserId: "u1"})
		return resp.GetResult(), err
	}
	answer := func(p *connectorv1.QueryResult) error {
		resp, err := f.client.ResumeQuery(ctx, &connectorv1.ResumeQueryRequest{WorkspaceId: "ws", RunId: p.GetRunId(),
			Inputs: []*connectorv1.InputAnswer{accept(p.GetInputRequests()[0].GetInputId(), map[string]any{"name": "bench"})}})
		if err == nil && resp.GetResult().GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_COMPLETED {
			return fmt.Errorf("answered run = %v", resp.GetResult())
		}
		return err
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		for _, id := range []string{"plain", "asks"} {
			if cid, ok := f.reg.Lookup("ws", id); ok {
				oa.grant(cid, "u1", "read")
			}
		}
		a, errA := query("plain")
		p, errP := query("asks")
		if errA == nil && errP == nil && len(a.GetToolsUsed()) == 1 && p.GetStatus() == connectorv1.QueryStatus_QUERY_STATUS_AWAITING_INPUT {
			if !p.GetInputRequests()[0].GetDurable() {
				b.Fatalf("input request %v is not durable", p.GetInputRequests()[0])
			}
			if err := answer(p); err != nil {
				b.Fatal(err)
			}
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("the connectors did not answer: %v, %v", errA, errP)
		}
	}
	plainD, pauseD, answerD, row := pauseLoop(b, f, query, answer)
	b.StopTimer()
	plain, _ := quantiles(plainD)
	pause, _ := quantiles(pauseD)
	resume, _ := quantiles(answerD)
	b.ReportMetric(plain, "plain-query-p50-µs")
	b.ReportMetric(pause, "paused-query-p50-µs")
	b.ReportMetric(resume, "resume-p50-µs")
	b.ReportMetric(float64(row), "paused-row-bytes")
}

// pauseLoop times, in turn each iteration, a query on connector "plain"
// (its tool asks nothing), one on "asks" that must pause for input, and
// the answer that finishes the paused run; it returns their times and the
// paused run's row size in Postgres.
func pauseLoop(b *testing.B, f *fixture, query func(id string) (*connectorv1.QueryResult, error),
	answer func(*connectorv1.QueryResult) error) (plainD, pauseD, answerD []time.Duration, row int64) {
	ctx := context.Background()
	for b.Loop() {
		start := time.Now()
		if _, err := query("plain"); err != nil {
			b.Fatal(err)
		}
		plainD = append(plainD, time.Since(start))
		start = time.Now()
		p, err := query("asks")
		if err != nil || p.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_AWAITING_INPUT {
			b.Fatalf("asking query = %v, %v", p, err)
		}
		pauseD = append(pauseD, time.Since(start))
		if row == 0 {
			if err := f.db.InTx(ctx, func(tx pgx.Tx) error {
				return tx.QueryRow(ctx, `SELECT pg_column_size(q.*) FROM query_runs q WHERE id = $1`, p.GetRunId()).Scan(&row)
			}); err != nil {
				b.Fatal(err)
			}
		}
		start = time.Now()
		if err := answer(p); err != nil {
			b.Fatal(err)
		}
		answerD = append(answerD, time.Since(start))
	}
	return plainD, pauseD, answerD, row
}
