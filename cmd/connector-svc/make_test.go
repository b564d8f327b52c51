package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/loudskip"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

// TestMakeRunStops runs `make run` as the README says, stops it the two
// ways a developer does, and checks the service itself stopped: it logged
// "stopped" and let go of its port. make's own status is then 0, or the
// signal it got, which GNU make re-raises on itself after its recipe ends.
func TestMakeRunStops(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		loudskip.Skip(t, "make is not on PATH")
	}
	for _, tt := range []struct {
		name  string
		sig   syscall.Signal
		group bool // as a terminal's Ctrl-C: to make, its shell and the service
	}{
		{"SIGTERM to make", syscall.SIGTERM, false},
		{"Ctrl-C", syscall.SIGINT, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cmd, addr, logs := startMakeRun(t)
			pid := cmd.Process.Pid
			if tt.group {
				pid = -pid
			}
			if err := syscall.Kill(pid, tt.sig); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			select {
			case err := <-exited:
				var exit *exec.ExitError
				if err != nil && !(errors.As(err, &exit) && exit.Sys().(syscall.WaitStatus).Signal() == tt.sig) {
					t.Errorf("make: %v; want 0 or the signal it got", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("make still running 30s after the signal")
			}
			select {
			case out := <-logs:
				if !strings.Contains(out, `"msg":"stopped"`) {
					t.Errorf("the service did not log that it stopped:\n%s", out)
				}
			case <-time.After(10 * time.Second):
				t.Error("the service's output is still open 10s after make ended: the service outlived make")
			}
			lis, err := net.Listen("tcp", addr)
			if err != nil {
				t.Fatalf("the service's port %s is still held after make ended: %v", addr, err)
			}
			lis.Close()
		})
	}
}

// startMakeRun starts `make run` at the repository root in its own process
// group, on a free port and a test database, and waits until the service
// serves. logs yields the service's output once it has closed it.
func startMakeRun(t *testing.T) (cmd *exec.Cmd, addr string, logs <-chan string) {
	t.Helper()
	cmd = exec.Command("make", "--no-print-directory", "run")
	cmd.Dir = "../.."
	// Every listener on a port of its own: a developer's own `make run`
	// holds the Makefile's defaults (50051, and 8081 for the OAuth
	// callback) while they run make test.
	callback := freeAddr(t)
	_, callbackPort, _ := net.SplitHostPort(callback)
	cmd.Env = append(os.Environ(), "MAKEFLAGS=", "MAKELEVEL=", "GRPC_ADDR=127.0.0.1:0", "ADMIN_ADDR=127.0.0.1:0",
		"INTERNAL_ADDR=127.0.0.1:0", "MCP_ADDR=127.0.0.1:0", "OAUTH_CALLBACK_ADDR="+callback,
		"OAUTH_REDIRECT_URL=http://localhost:"+callbackPort+"/oauth/callback",
		"DATABASE_URL="+storetest.NewURL(t), "SECRET_KEY="+testKey)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// An os.Pipe, not StdoutPipe: Wait closes a StdoutPipe as soon as make
	// exits, throwing away what the service wrote that was not read yet
	// (its last lines, under load). This one ends when every writer is gone.
	stdout, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	err = cmd.Start()
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdout.Close() })
	// Whatever happens, nothing of this make outlives the test.
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	serving := make(chan string, 1)
	out := make(chan string, 1)
	go func() {
		var all strings.Builder
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			all.WriteString(sc.Text() + "\n")
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "serving" {
				serving <- line.Addr
			}
		}
		out <- all.String()
	}()
	select {
	case addr = <-serving:
		return cmd, addr, out
	case all := <-out:
		// Every writer is gone before the service served: it exited
		// (a port taken, a bad setting). Say so now, with what it said.
		t.Fatalf("make run exited before it served; it printed:\n%s", all)
	case <-time.After(120 * time.Second):
		t.Fatal("make run did not serve within 120s")
	}
	return nil, "", nil
}
