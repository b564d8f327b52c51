package registry_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/mcptest"
	"github.com/connector-svc/connector-svc/internal/registry"
)

// wantProgress is what mcptest's progress tool sends for steps and label.
func wantProgress(steps int, label string) []registry.Progress {
	var want []registry.Progress
	for i := 1; i <= steps; i++ {
		want = append(want, registry.Progress{Progress: float64(i), Total: float64(steps), Message: fmt.Sprint(label, " ", i)})
	}
	return want
}

// callProgress calls the progress tool with a Progress callback, in the
// caller session of opts, and returns what reached the callback by the
// time CallTool returned, and the result text.
func callProgress(ctx context.Context, reg *registry.Registry, opts registry.CallOptions, steps int, label string) ([]registry.Progress, string, error) {
	var got []registry.Progress
	opts.Progress = func(p registry.Progress) { got = append(got, p) }
	res, err := reg.CallTool(ctx, 1, mcptest.ProgressTool, map[string]any{"steps": steps, "label": label}, opts)
	if err != nil {
		return nil, "", fmt.Errorf("call %s: %w", label, err)
	}
	if len(res.Content) != 1 {
		return nil, "", fmt.Errorf("call %s: result %v", label, res.Content)
	}
	tc, _ := res.Content[0].(mcp.TextContent)
	return got, tc.Text, nil
}

func TestProgressReachesTheCaller(t *testing.T) {
	perSession := func(s registry.Spec) registry.Spec { s.SessionMode = registry.SessionPerSession; return s }
	for _, tt := range []struct {
		name string
		spec func(t *testing.T) registry.Spec
	}{
		{"streamable http", func(t *testing.T) registry.Spec { return httpSpec(1, newMCPServer(t, progressServer).url()) }},
		{"streamable http, classic sessions", func(t *testing.T) registry.Spec {
			return httpSpec(1, newMCPServer(t, progressServer, legacyServer).url())
		}},
		{"sse", func(t *testing.T) registry.Spec {
			spec := httpSpec(1, newMCPServer(t, progressServer, sseServer).url())
			spec.Transport = registry.TransportSSE
			return spec
		}},
		{"streamable http, per session", func(t *testing.T) registry.Spec {
			return perSession(httpSpec(1, newMCPServer(t, progressServer, legacyServer).url()))
		}},
		{"stdio", func(*testing.T) registry.Spec { return stdioSpec(1) }},
		{"stdio, per session", func(*testing.T) registry.Spec { return perSession(stdioSpec(1)) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			reg := run(t, newSource(tt.spec(t)), testConfig())
			ctx, alice := ctxT(t), registry.CallOptions{Session: "alice"}
			for _, steps := range []int{5, 3} { // a second call gets a token of its own
				got, res, err := callProgress(ctx, reg, alice, steps, "step")
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(wantProgress(steps, "step"), got); diff != "" {
					t.Errorf("progress before the call returned (-want +got):\n%s", diff)
				}
				if want := fmt.Sprint("done ", steps); res != want {
					t.Errorf("result = %q, want %q", res, want)
				}
			}
			// Without a Progress callback the request carries no token.
			res, err := reg.CallTool(ctx, 1, mcptest.ProgressTool, map[string]any{"steps": 2}, alice)
			if err != nil {
				t.Fatal(err)
			}
			if got := text(t, res); got != "done 2 without a token" {
				t.Errorf("a call without a Progress callback: %q", got)
			}
		})
	}
}

// Concurrent calls on one shared connection each get their own updates,
// round after round, over a stdio pipe and over streamable HTTP, where
// each call is a request of its own, on a TCP connection of its own.
func TestProgressRoutesByToken(t *testing.T) {
	for _, tt := range []struct {
		name string
		spec func(t *testing.T) registry.Spec
	}{
		{"stdio", func(*testing.T) registry.Spec { return stdioSpec(1) }},
		{"streamable http", func(t *testing.T) registry.Spec { return httpSpec(1, newMCPServer(t, progressServer).url()) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			reg := run(t, newSource(tt.spec(t)), testConfig())
			ctx := ctxT(t)
			for round := range 5 {
				var wg sync.WaitGroup
				for i := range 6 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						label, steps := fmt.Sprint("round", round, " call", i), 3+i
						got, _, err := callProgress(ctx, reg, registry.CallOptions{}, steps, label)
						if err != nil {
							t.Error(err)
							return
						}
						if diff := cmp.Diff(wantProgress(steps, label), got); diff != "" {
							t.Errorf("%s (-want +got):\n%s", label, diff)
						}
					}()
				}
				wg.Wait()
			}
		})
	}
}

// A callback that takes its time holds up neither the connection's other
// calls nor its own updates, which wait for it in order.
func TestSlowProgressCallbackHoldsNothingUp(t *testing.T) {
	reg := run(t, newSource(stdioSpec(1)), testConfig())
	blocked, release := make(chan struct{}), make(chan struct{})
	var got []registry.Progress
	slow := registry.CallOptions{Progress: func(p registry.Progress) {
		if len(got) == 0 {
			close(blocked)
			<-release
		}
		got = append(got, p)
	}}
	ctx := ctxT(t)
	done := make(chan error, 1)
	go func() {
		_, err := reg.CallTool(ctx, 1, mcptest.ProgressTool, map[string]any{"steps": 4, "label": "slow"}, slow)
		done <- err
	}()
	select {
	case <-blocked:
	case err := <-done:
		t.Fatalf("the call returned (%v) without reporting progress", err)
	}
	// The stdio server writes progress and results on the one pipe that
	// every call shares: the echo is answered only if the callback holds up
	// no reader.
	echoCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := reg.CallTool(echoCtx, 1, "echo", map[string]any{"text": "meanwhile"}, registry.CallOptions{})
	if err != nil {
		t.Fatalf("echo while a progress callback blocks: %v", err)
	}
	if got := text(t, res); got != "meanwhile" {
		t.Fatalf("echo = %q", got)
	}
	select {
	case err := <-done:
		t.Fatalf("the call returned (%v) before its callback had seen its updates", err)
	default:
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(wantProgress(4, "slow"), got); diff != "" {
		t.Errorf("progress (-want +got):\n%s", diff)
	}
}

// Progress reaches the caller while the tool still runs, not when it ends:
// the tool here never answers, and the caller cancels it on its first
// update.
func TestProgressArrivesWhileTheToolRuns(t *testing.T) {
	reg := run(t, newSource(httpSpec(1, newMCPServer(t, progressServer).url())), testConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got []registry.Progress
	cancelOnFirst := registry.CallOptions{Progress: func(p registry.Progress) {
		got = append(got, p)
		cancel()
	}}
	_, err := reg.CallTool(ctx, 1, mcptest.ProgressTool, map[string]any{"steps": 1, "label": "live", "hold": true}, cancelOnFirst)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want the cancellation its progress callback made", err)
	}
	if diff := cmp.Diff(wantProgress(1, "live"), got); diff != "" {
		t.Errorf("progress (-want +got):\n%s", diff)
	}
}

// The reference TypeScript server's long-running tool reports progress
// through every transport.
func TestInteropTypeScriptProgress(t *testing.T) {
	for _, mode := range []string{"stdio", "streamableHttp", "sse"} {
		t.Run(mode, func(t *testing.T) {
			var spec registry.Spec
			switch mode {
			case "stdio":
				spec = registry.Spec{ID: 1, WorkspaceID: "ws", ConnectorID: "everything", Transport: registry.TransportStdio,
					Command: "node", Args: []string{everythingJS(t), "stdio"}, ConnectTimeout: 30 * time.Second, CallTimeout: 30 * time.Second}
			case "streamableHttp":
				spec = httpSpec(1, startTSServer(t, mode).url("/mcp"))
			case "sse":
				spec = httpSpec(1, startTSServer(t, mode).url("/sse"))
				spec.Transport = registry.TransportSSE
			}
			reg := run(t, newSource(spec), testConfig())
			var got []registry.Progress
			collect := registry.CallOptions{Progress: func(p registry.Progress) { got = append(got, p) }}
			res, err := reg.CallTool(ctxT(t), 1, "trigger-long-running-operation", map[string]any{"duration": 0.3, "steps": 3}, collect)
			if err != nil {
				t.Fatal(err)
			}
			if out := text(t, res); !strings.Contains(out, "Long running operation completed") {
				t.Errorf("result = %q", out)
			}
			want := []registry.Progress{{Progress: 1, Total: 3}, {Progress: 2, Total: 3}, {Progress: 3, Total: 3}}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("progress (-want +got):\n%s", diff)
			}
		})
	}
}
