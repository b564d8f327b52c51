package mcpservetest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/testsupport"
)

// StartTSFixture runs the conformance suite's own fixture server
// (testdata/node/everything-server.ts, a TypeScript SDK server from the
// suite's repository) on a free localhost port until t ends, and returns
// its URL (http://127.0.0.1:PORT/mcp). Unlike NewFixtureServer it has
// test_reconnection, an event store and Last-Event-ID resumption, so
// server-sse-polling applies; it also adds a tool, a resource and a prompt
// 2 s after it starts and updates test://watched-resource every 3 s.
func StartTSFixture(t testing.TB) string {
	t.Helper()
	dir := NodeDir(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	port := lis.Addr().(*net.TCPAddr).Port
	lis.Close()

	cmd := exec.Command("node", "--import", "tsx", "everything-server.ts")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), fmt.Sprint("PORT=", port))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	logs := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("mcpservetest: starting the TypeScript fixture server: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	})
	testsupport.WaitFor(t, "the TypeScript fixture server to listen on "+addr, func() bool {
		select {
		case <-exited:
			t.Fatalf("mcpservetest: the TypeScript fixture server exited:\n%s", logs.String())
		default:
		}
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
	return "http://" + addr + "/mcp"
}

// lockedBuffer collects a child's output, written from exec's copying
// goroutines and read by the test.
type lockedBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	return len(p), nil
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
