package registry

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
)

// stdioEnvPassThrough are the service's environment variables a stdio server
// inherits; nothing else of the service's environment (database URL, keys)
// reaches it.
var stdioEnvPassThrough = []string{"PATH", "HOME", "USER", "LANG", "TMPDIR", "TZ", "NODE_PATH", "npm_config_cache"}

// stderrTail is how much of a stdio server's stderr is kept for errors.
const stderrTail = 4 << 10

// process is a stdio server run in its own process group, with a minimal
// environment and no tie to any context. The registry owns it rather than
// mcp-go so that its exit is noticed the moment it happens: a goroutine
// waits for it (reaping it at once, so it never lingers as a zombie) and a
// closed stdout is reported too.
type process struct {
	cmd    *exec.Cmd
	stdin  *os.File // our end of the server's stdin
	stdout *os.File // our end of the server's stdout
	stderr *tailBuffer

	stderrDone chan struct{} // closed when stderr reaches EOF
	exited     chan struct{} // closed when the process has been reaped
	exitErr    error         // what Wait returned; read after exited
}

// startProcess starts spec's command; onExit is told when the process has
// exited and been reaped, with its status and the tail of its stderr.
func startProcess(spec Spec, onExit func(error)) (*process, error) {
	var pipes [3][2]*os.File // stdin, stdout, stderr: {read, write}
	for i := range pipes {
		r, w, err := os.Pipe()
		if err != nil {
			closeAll(pipes[:i])
			return nil, fmt.Errorf("start %s: %w", spec.Command, err)
		}
		pipes[i] = [2]*os.File{r, w}
	}
	cmd := exec.Command(spec.Command, spec.Args...)
	cmd.Env = append(passThroughEnv(), envList(spec.Env)...)
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
		return nil, fmt.Errorf("start %s: %w", spec.Command, err)
	}
	p := &process{
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

func (p *process) drainStderr(r *os.File) {
	defer close(p.stderrDone)
	defer r.Close()
	_, _ = io.Copy(p.stderr, r)
}

func (p *process) wait(onExit func(error)) {
	p.exitErr = p.cmd.Wait()
	close(p.exited)
	onExit(p.exitError(0))
}

// exitError describes the exit of a process that has exited, waiting up to
// wait for it to do so; nil if it is still running.
func (p *process) exitError(wait time.Duration) error {
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
	err := fmt.Errorf("%w (%s)", errExited, status)
	if tail := p.stderrTail(); tail != "" {
		err = fmt.Errorf("%w (stderr: %s)", err, lastLines(tail, 5))
	}
	return err
}

// stderrTail is the last of what the server wrote to stderr. Once it has
// exited, its last words may still be in the pipe (children can hold it
// open), so they get a moment to arrive.
func (p *process) stderrTail() string {
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

// stdoutReader is the server's stdout for the MCP client, a line at most
// maxLine bytes long (see messageLimiter). When it ends, onClosed is told,
// unless the process is exiting, whose own report says more.
func (p *process) stdoutReader(maxLine int, onClosed func(error)) io.Reader {
	return newMessageLimiter(p.eofReader(onClosed), maxLine, false)
}

func (p *process) eofReader(onClosed func(error)) io.Reader {
	return &eofReader{r: p.stdout, onEOF: func() {
		go func() {
			if p.exitError(500*time.Millisecond) == nil {
				onClosed(errors.New("stdio server closed its stdout"))
			}
		}()
	}}
}

// stop closes the server's stdin, waits up to grace for it to exit, then
// kills its whole process group (children that outlived it too) and waits
// for it to be reaped.
func (p *process) stop(grace time.Duration) {
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

// killGroup sends SIGKILL to the server's process group.
func (p *process) killGroup() {
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

func lastLines(s string, n int) string {
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
