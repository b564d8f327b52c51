package registry_test

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/mcptest"
)

// callerBlocks add up blocks of calls made by concurrent callers.
type callerBlocks struct {
	calls   int
	elapsed time.Duration
	errs    int64
	conns   int64 // new TCP connections the server accepted during the blocks
	lat     []time.Duration
}

func (t callerBlocks) callsPerSecond() float64 { return float64(t.calls) / t.elapsed.Seconds() }

// connsPer is how many new connections calls calls opened, on average.
func (t callerBlocks) connsPer(calls int) float64 {
	return float64(t.conns) * float64(calls) / float64(t.calls)
}

// callBlock makes calls calls of call from callers goroutines, the i-th
// calling call(i), and adds them to t. mcpURL is the test server process
// (startHTTPServerProcess), which counts the connections it accepts.
func (t *callerBlocks) callBlock(b *testing.B, mcpURL string, callers, calls int, call func(i int) error) {
	before := acceptedConns(b, mcpURL)
	var next, errs atomic.Int64
	lats := make([][]time.Duration, callers)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(calls) {
				t0 := time.Now()
				if err := call(i); err != nil {
					errs.Add(1)
				}
				lats[i] = append(lats[i], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	t.elapsed += time.Since(start)
	// The second count's own connection is not the callers'.
	t.conns += acceptedConns(b, mcpURL) - before - 1
	t.calls += calls
	t.errs += errs.Load()
	t.lat = slices.Concat(append(lats, t.lat)...)
}

// acceptedConns asks the test server process how many TCP connections it
// has accepted so far, this request's own included.
func acceptedConns(b *testing.B, mcpURL string) int64 {
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Get(strings.TrimSuffix(mcpURL, "/mcp") + "/accepted")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		b.Fatal(err)
	}
	n, err := strconv.ParseInt(string(body), 10, 64)
	if err != nil {
		b.Fatalf("GET /accepted: %q: %v", body, err)
	}
	return n
}

// directSessions opens n mcp-go clients of url, initialized at version,
// each on an HTTP connection pool of its own, as n separate client
// programs would be (mcp-go's default, http.DefaultTransport, would share
// 2 idle connections among them all). It returns a call of the echo tool
// on the i-th.
func directSessions(b *testing.B, url, version string, n int) func(i int) error {
	ctx := context.Background()
	clients := make([]*client.Client, n)
	for i := range clients {
		hc := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
		c, err := mcptest.Dial(ctx, url, version, hc)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		clients[i] = c
	}
	var req mcp.CallToolRequest
	req.Params.Name = "echo"
	req.Params.Arguments = map[string]any{"text": "hi"}
	return func(i int) error {
		_, err := clients[i].CallTool(ctx, req)
		return err
	}
}
