// Package mcpservetest drives an MCP endpoint from Go tests with clients
// that are not ours: the official MCP conformance suite
// (@modelcontextprotocol/conformance, server mode) and a small client on the
// TypeScript SDK (testdata/node/client.mjs). Both are pinned in
// internal/mcpserve/testdata/node (package.json and package-lock.json) and
// installed by scripts/install-mcp-conformance.sh. Without them the tests
// that need them skip loudly, and fail under CI=true (internal/loudskip).
//
// It also has a plain mcp-go server with the fixtures the conformance
// suite's server scenarios call (NewFixtureServer), for a baseline and as an
// upstream that a gateway can pass through.
package mcpservetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/loudskip"
)

// nodeDirInRepo is where the pinned Node packages live, from the repo root.
const nodeDirInRepo = "internal/mcpserve/testdata/node"

// installHint is what a developer runs when the packages are missing.
const installHint = "run scripts/install-mcp-conformance.sh (or make tools)"

// NodeDir returns the absolute path of internal/mcpserve/testdata/node, with
// its node_modules installed and node on PATH; otherwise it skips t loudly
// (fails it under CI=true).
func NodeDir(t testing.TB) string {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatalf("mcpservetest: %v", err)
	}
	dir := filepath.Join(root, nodeDirInRepo)
	for _, need := range []string{
		"node_modules/@modelcontextprotocol/conformance/package.json",
		"node_modules/@modelcontextprotocol/sdk/package.json",
		"node_modules/glob/package.json",
		"node_modules/tsx/package.json",
	} {
		if _, err := os.Stat(filepath.Join(dir, need)); err != nil {
			loudskip.Skip(t, fmt.Sprintf("the pinned MCP conformance suite and TypeScript SDK are not installed in %s "+
				"(%s is missing); %s", dir, need, installHint))
		}
	}
	if _, err := exec.LookPath("node"); err != nil {
		loudskip.Skip(t, "node is not on PATH; the MCP conformance suite and the TypeScript client need Node.js 20 or later")
	}
	return dir
}

// repoRoot walks up from the working directory (a package directory under
// go test) to the directory with go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory; run the test with go test from the repo")
		}
		dir = parent
	}
}

// nodeRun is one finished node process.
type nodeRun struct {
	stdout, stderr string
	exitCode       int
	timedOut       bool
}

// runNode runs node with args in dir, with env added to the test's
// environment, and kills its whole process group after timeout (the suite
// can leave streams open). An exit status other than 0 is not an error here:
// callers read it; a node that does not start is.
func runNode(t testing.TB, dir string, timeout time.Duration, env []string, args ...string) nodeRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	// NO_COLOR: the suite's pretty output is for terminals; the test log
	// reads better without escape codes.
	cmd.Env = append(cmd.Env, "NO_COLOR=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	run := nodeRun{stdout: stdout.String(), stderr: stderr.String(), timedOut: ctx.Err() != nil}
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		run.exitCode = exit.ExitCode()
	case run.timedOut:
		run.exitCode = -1
	default:
		t.Fatalf("mcpservetest: node %s: %v", strings.Join(args, " "), err)
	}
	return run
}
