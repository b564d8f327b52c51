// Package stdio runs a connector's stdio server: a process in its own
// process group, with a minimal environment (a few of the service's
// variables and the connector's own), tied to no context. Its exit is
// noticed the moment it happens (a goroutine waits for it, reaping it at
// once, so it never lingers as a zombie), a closed stdout is reported too,
// and stopping it kills the whole group. The tail of its stderr is kept
// for errors. Restarting is its caller's: a Process runs once.
package stdio

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/connector-svc/connector-svc/internal/registry/msglimit"
)

// envPassThrough are the service's environment variables a stdio server
// inherits; nothing else of the service's environment (database URL, keys)
// reaches it.
var envPassThrough = []string{"PATH", "HOME", "USER", "LANG", "TMPDIR", "TZ", "NODE_PATH", "npm_config_cache"}

// stderrTail is how much of a stdio server's stderr is kept for errors.
const stderrTail = 4 << 10

// Process is a stdio server run in its own process group, with a minimal
// environment and no tie to any context. The registry owns it rather than
// mcp-go so that its exit is noticed the moment it happens: a goroutine
// waits for it (reaping it at once, so it never lingers as a zombie) and a
// closed stdout is reported too.
type Process struct {
	cmd    *exec.Cmd
	stdin  *os.File // our end of the server's stdin
	stdout *os.File // our end of the server's stdout
	stderr *tailBuffer

	stderrDone chan struct{} // closed when stderr reaches EOF
	exited     chan struct{} // closed when the process has been reaped
	exitErr    error         // what Wait returned; read after exited
}

// ErrExited is the cause of a stdio server's death when it exited.
var ErrExited = errors.New("stdio server exited")

// Start starts command with args, in an environment of the pass-through
// variables and env; onExit is told when the process has exited and been
// reaped, with its status and the tail of its stderr.
func Start(command string, args []string, env map[string]string, onExit func(error)) (*Process, error) {
	var pipes [3][2]*os.File // stdin, stdout, stderr: {read, write}
	for i := range pipes {
		r, w, err := os.Pipe()
		if err != nil {
			closeAll(pipes[:i])
			return nil, fmt.Errorf("start %s: %w", command, err)
		}
		pipes[i] = [2]*os.File{r, w}
	}
	cmd := exec.Command(command, args...)
	cmd.Env = append(passThroughEnv(), envList(env)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = pipes[0][0], pipes[1][1], pipes[2][1]
	err := cmd.Start()
	// The child holds its own copies of its ends.
	pipes[0][0].Close()
	pipes[1][1].Close()
	pipes[2][1].Close()
	if err != nil {
		pipes[0][1].Close()
		pipes[1][0].Close()
		pipes[2][0].Close()
		return nil, fmt.Errorf("start %s: %w", command, err)
	}
	p := &Process{
		cmd: cmd, stdin: pipes[0][1], stdout: pipes[1][0], stderr: newTailBuffer(stderrTail),
		stderrDone: make(chan struct{}), exited: make(chan struct{}),
	}
	go p.drainStderr(pipes[2][0])
	go p.wait(onExit)
	return p, nil
}

func closeAll(pipes [][2]*os.File) {
	for _, p := range pipes {
		p[0].Close()
		p[1].Close()
	}
}

func (p *Process) drainStderr(r *os.File) {
	defer close(p.stderrDone)
	defer r.Close()
	_, _ = io.Copy(p.stderr, r)
}

func (p *Process) wait(onExit func(error)) {
	p.exitErr = p.cmd.Wait()
	close(p.exited)
	onExit(p.ExitError(0))
}

// ExitError describes the exit of a process that has exited, waiting up to
// wait for it to do so; nil if it is still running.
func (p *Process) ExitError(wait time.Duration) error {
	select {
	case <-p.exited:
	default:
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-p.exited:
		case <-t.C:
			return nil
		}
	}
	status := "exit status 0"
	if p.exitErr != nil {
		status = p.exitErr.Error()
	}
	err := fmt.Errorf("%w (%s)", ErrExited, status)
	if tail := p.StderrTail(); tail != "" {
		err = fmt.Errorf("%w (stderr: %s)", err, LastLines(tail, 5))
	}
	return err
}

// StderrTail is the last of what the server wrote to stderr. Once it has
// exited, its last words may still be in the pipe (children can hold it
// open), so they get a moment to arrive.
func (p *Process) StderrTail() string {
	select {
	case <-p.exited:
		select {
		case <-p.stderrDone:
		case <-time.After(200 * time.Millisecond):
		}
	default:
	}
	return strings.TrimSpace(p.stderr.String())
}

// StdoutReader is the server's stdout for the MCP client, a line at most
// maxLine bytes long (see package msglimit). When it ends, onClosed is told,
// unless the process is exiting, whose own report says more.
func (p *Process) StdoutReader(maxLine int, onClosed func(error)) io.Reader {
	return msglimit.NewMessages(p.eofReader(onClosed), maxLine, false)
}

func (p *Process) eofReader(onClosed func(error)) io.Reader {
	return &eofReader{r: p.stdout, onEOF: func() {
		go func() {
			if p.ExitError(500*time.Millisecond) == nil {
				onClosed(errors.New("stdio server closed its stdout"))
			}
		}()
	}}
}

// Stop closes the server's stdin, waits up to grace for it to exit, then
// kills its whole process group (children that outlived it too) and waits
// for it to be reaped.
func (p *Process) Stop(grace time.Duration) {
	_ = p.stdin.Close()
	select {
	case <-p.exited:
	case <-time.After(grace):
	}
	p.killGroup()
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
	}
	_ = p.stdout.Close()
}

// Stdin is the server's stdin, for the MCP client to write to.
func (p *Process) Stdin() io.WriteCloser { return p.stdin }

// PID is the server's process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// killGroup sends SIGKILL to the server's process group.
func (p *Process) killGroup() {
	if err := syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		_ = p.cmd.Process.Kill()
	}
}

// eofReader calls onEOF once when its reader ends.
type eofReader struct {
	r     io.Reader
	once  sync.Once
	onEOF func()
}

func (e *eofReader) Read(b []byte) (int, error) {
	n, err := e.r.Read(b)
	if err != nil {
		e.once.Do(e.onEOF)
	}
	return n, err
}

func passThroughEnv() []string {
	var env []string
	for _, k := range envPassThrough {
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

// LastLines is the last n lines of s, joined with " | ", for an error.
func LastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
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
