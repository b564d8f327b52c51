package registry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
)

// Transports a Spec may name.
const (
	TransportStdio          = "stdio"
	TransportSSE            = "sse"
	TransportStreamableHTTP = "streamable_http"
)

// stdioEnvPassThrough are the service's environment variables a stdio server
// inherits; nothing else of the service's environment (database URL, keys)
// reaches it.
var stdioEnvPassThrough = []string{"PATH", "HOME", "USER", "LANG", "TMPDIR", "TZ", "NODE_PATH", "npm_config_cache"}

// session is one live MCP client and what must be torn down with it.
type session struct {
	client *client.Client
	proc   *process // stdio only
	cancel context.CancelFunc
}

// newSession builds the transport for spec and starts it; the client is not
// initialized yet. life bounds the transport's background streams. HTTP
// transports use hc, the connector's own connection pool, which outlives
// any one session.
func newSession(life context.Context, spec Spec, hc *http.Client, opts []client.ClientOption, startTimeout time.Duration) (*session, error) {
	ctx, cancel := context.WithCancel(life)
	s := &session{cancel: cancel}
	var tr transport.Interface
	switch spec.Transport {
	case TransportStdio:
		s.proc = &process{stderr: newTailBuffer(stderrTail)}
		tr = transport.NewStdioWithOptions(spec.Command, envList(spec.Env), spec.Args,
			transport.WithCommandFunc(s.proc.command))
	case TransportSSE:
		sse, err := transport.NewSSE(spec.URL, transport.WithHeaders(spec.Headers), transport.WithHTTPClient(hc))
		if err != nil {
			cancel()
			return nil, fmt.Errorf("sse transport: %w", err)
		}
		tr = sse
	case TransportStreamableHTTP:
		h, err := transport.NewStreamableHTTP(spec.URL, transport.WithHTTPHeaders(spec.Headers), transport.WithHTTPBasicClient(hc))
		if err != nil {
			cancel()
			return nil, fmt.Errorf("streamable http transport: %w", err)
		}
		tr = h
	default:
		cancel()
		return nil, fmt.Errorf("unknown transport %q", spec.Transport)
	}
	s.client = client.NewClient(tr, opts...)
	// Start binds background streams to its context, so it gets the
	// session's lifetime and is bounded by a timer instead.
	started := make(chan error, 1)
	go func() { started <- s.client.Start(ctx) }()
	select {
	case err := <-started:
		if err != nil {
			s.close(time.Second)
			return nil, fmt.Errorf("start: %w", err)
		}
	case <-time.After(startTimeout):
		s.close(time.Second)
		<-started
		return nil, fmt.Errorf("start: no answer within %s", startTimeout)
	}
	return s, nil
}

// close closes the client and, for stdio, kills the server's whole process
// group once grace has passed. It returns when everything is gone.
func (s *session) close(grace time.Duration) {
	done := make(chan struct{})
	go func() {
		_ = s.client.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(grace):
	}
	s.cancel()
	if s.proc == nil {
		return
	}
	// The leader may be gone while its children live on: kill the group
	// either way, then wait for the client to reap the leader.
	s.proc.killGroup()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
	}
}

// stderrTail is how much of a stdio server's stderr is kept for errors.
const stderrTail = 4 << 10

// process is a stdio server run in its own process group.
type process struct {
	mu     sync.Mutex
	cmd    *exec.Cmd
	stderr *tailBuffer
}

// command is mcp-go's CommandFunc: a fresh process group, a minimal
// environment, stderr kept in a bounded tail, and no tie to a context.
func (p *process) command(_ context.Context, name string, env, args []string) (*exec.Cmd, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = append(passThroughEnv(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stderr = p.stderr
	// Children that keep stderr open must not hold up Wait.
	cmd.WaitDelay = 2 * time.Second
	p.mu.Lock()
	p.cmd = cmd
	p.mu.Unlock()
	return cmd, nil
}

// killGroup sends SIGKILL to the server's process group.
func (p *process) killGroup() {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		_ = cmd.Process.Kill()
	}
}

// stderrText is the tail of the server's stderr, for health errors.
func (s *session) stderrText() string {
	if s == nil || s.proc == nil {
		return ""
	}
	return s.proc.stderr.String()
}

func passThroughEnv() []string {
	var env []string
	for _, k := range stdioEnvPassThrough {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

func envList(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// tailBuffer keeps the last n bytes written to it. Safe for concurrent use.
type tailBuffer struct {
	mu  sync.Mutex
	n   int
	buf []byte
}

func newTailBuffer(n int) *tailBuffer { return &tailBuffer{n: n} }

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.n; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
