package registry_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

// TestStartStopStress starts and stops the registry in a loop, with calls
// racing the shutdown, and checks that every Run returns, no stdio process
// survives and goroutines do not pile up.
func TestStartStopStress(t *testing.T) {
	srv := newMCPServer(t, legacyServer)
	pidfile := filepath.Join(t.TempDir(), "pids")
	before := runtime.NumGoroutine()
	for round := range 25 {
		specs := []registry.Spec{httpSpec(1, srv.url()), httpSpec(2, srv.url()), stdioSpec(3, "-pidfile", pidfile)}
		reg := registry.New(newSource(specs...), testConfig(), nil)
		if err := reg.Load(context.Background()); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- reg.Run(ctx) }()
		var wg sync.WaitGroup
		for id := range int64(3) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = reg.CallTool(context.Background(), id+1, "echo", map[string]any{"text": "x"}, registry.CallOptions{})
			}()
		}
		if round%2 == 1 {
			wg.Wait() // half the rounds stop while connected, half while connecting
		}
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("round %d: Run: %v", round, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: Run did not return within 30s of cancel", round)
		}
		wg.Wait()
	}
	if _, err := os.Stat(pidfile); err == nil {
		for _, pid := range readPIDs(t, pidfile) {
			testsupport.WaitFor(t, fmt.Sprintf("stdio server %d to be gone", pid), func() bool { return !running(pid) })
		}
	}
	// Connections to the test server close asynchronously; allow slack.
	t.Cleanup(func() {
		if t.Failed() {
			buf := make([]byte, 1<<20)
			t.Logf("goroutines before: %d, now:\n%s", before, buf[:runtime.Stack(buf, true)])
		}
	})
	testsupport.WaitFor(t, "goroutines to settle", func() bool { return runtime.NumGoroutine() <= before+10 })
}
