package registry_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/registry"
)

// taskServer is a real mcp-go MCP server over streamable HTTP whose tools
// require to be called as tasks (MCP 2025-11-25 tasks), and which keeps
// what it saw of them. mcp-go's server says only "working" until a task
// ends; this one, through its tasks/get hook, also says how many polls it
// answered (statusMessage "poll N") and asks for a poll every 100 ms.
type taskServer struct {
	url     string
	gets    atomic.Int64  // tasks/get requests
	polls   atomic.Int64  // tasks/get answered "working"
	results atomic.Int64  // tasks/result requests
	polled  chan struct{} // one per tasks/get answered "working"
	asked   chan struct{} // closed at the first tasks/result
	release chan struct{} // closed when the test ends: "hang" tasks return
	// sessions are the server's MCP sessions, which a test can expire.
	sessions *sessionIDs

	mu      sync.Mutex
	tools   map[string]string         // task id → tool
	ended   map[string]mcp.TaskStatus // task id → how it ended
	cancels []string                  // task ids of the tasks/cancel requests the server took
}

func newTaskServer(t *testing.T) *taskServer {
	t.Helper()
	s := &taskServer{
		polled: make(chan struct{}, 100), asked: make(chan struct{}),
		release: make(chan struct{}), tools: map[string]string{}, ended: map[string]mcp.TaskStatus{},
		sessions: &sessionIDs{live: map[string]bool{}},
	}
	hooks := &server.Hooks{}
	hooks.AddAfterGetTask(func(_ context.Context, _ any, req *mcp.GetTaskRequest, res *mcp.GetTaskResult) {
		s.gets.Add(1)
		if res.Status != mcp.TaskStatusWorking {
			return
		}
		interval := int64(100)
		res.PollInterval = &interval
		s.mu.Lock()
		tool := s.tools[req.Params.TaskId]
		s.mu.Unlock()
		if tool == "ask" && !s.wasAsked() {
			res.Status, res.StatusMessage = mcp.TaskStatusInputRequired, "waiting for an answer"
			return
		}
		res.StatusMessage = fmt.Sprint("poll ", s.polls.Add(1))
		select {
		case s.polled <- struct{}{}:
		default: // nobody waits for so many polls
		}
	})
	var once sync.Once
	hooks.AddBeforeTaskResult(func(context.Context, any, *mcp.TaskResultRequest) {
		s.results.Add(1)
		once.Do(func() { close(s.asked) })
	})
	hooks.AddAfterCancelTask(func(_ context.Context, _ any, req *mcp.CancelTaskRequest, res *mcp.CancelTaskResult) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if res.Status == mcp.TaskStatusCancelled {
			s.cancels = append(s.cancels, req.Params.TaskId)
		}
	})
	taskHooks := &server.TaskHooks{}
	taskHooks.AddOnTaskCreated(func(_ context.Context, m server.TaskMetrics) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.tools[m.TaskID] = m.ToolName
	})
	taskHooks.AddOnTaskStatusChanged(func(_ context.Context, m server.TaskMetrics) {
		if m.Status.IsTerminal() {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.ended[m.TaskID] = m.Status
		}
	})
	m := server.NewMCPServer("tasks", "1.0", server.WithToolCapabilities(true),
		server.WithTaskCapabilities(true, true, true), server.WithHooks(hooks), server.WithTaskHooks(taskHooks))
	required := mcp.WithTaskSupport(mcp.TaskSupportRequired)

	// slow answers its text after the client polled it three times.
	m.AddTaskTool(mcp.NewTool("slow", required, mcp.WithString("text")),
		func(_ context.Context, req mcp.CallToolRequest) (*mcp.CreateTaskResult, error) {
			for range 3 {
				<-s.polled
			}
			return &mcp.CreateTaskResult{Content: []mcp.Content{mcp.NewTextContent("slow: " + req.GetString("text", ""))}}, nil
		})
	// fail fails after the client polled it once.
	m.AddTaskTool(mcp.NewTool("fail", required),
		func(context.Context, mcp.CallToolRequest) (*mcp.CreateTaskResult, error) {
			<-s.polled
			return nil, errors.New("the disk is full")
		})
	// ask needs input: the server says so until the client asks for the
	// result, which is where a server sends what it asks of the client.
	m.AddTaskTool(mcp.NewTool("ask", required),
		func(context.Context, mcp.CallToolRequest) (*mcp.CreateTaskResult, error) {
			<-s.asked
			return &mcp.CreateTaskResult{Content: []mcp.Content{mcp.NewTextContent("answered")}}, nil
		})
	// hang runs until the test ends. (It cannot watch its context: mcp-go's
	// server runs a task on the context of the request that created it,
	// which ends as soon as the task is created.)
	m.AddTaskTool(mcp.NewTool("hang", required),
		func(context.Context, mcp.CallToolRequest) (*mcp.CreateTaskResult, error) {
			<-s.release
			return nil, errors.New("the test ended")
		})
	// optional may run as a task, and so runs plain.
	m.AddTool(mcp.NewTool("optional", mcp.WithTaskSupport(mcp.TaskSupportOptional), mcp.WithString("text")),
		func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText("plain: " + req.GetString("text", "")), nil
		})
	hs := httptest.NewServer(server.NewStreamableHTTPServer(m, server.WithSessionIdManager(s.sessions)))
	t.Cleanup(func() {
		close(s.release)
		hs.Close()
	})
	s.url = hs.URL + "/mcp"
	return s
}

func (s *taskServer) wasAsked() bool {
	select {
	case <-s.asked:
		return true
	default:
		return false
	}
}

// created returns the ids of the tasks the server created, and of each
// its tool.
func (s *taskServer) created() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]string{}
	for id, tool := range s.tools {
		out[id] = tool
	}
	return out
}

func (s *taskServer) endedAs(id string) mcp.TaskStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended[id]
}

func (s *taskServer) cancelled() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.cancels...)
}

// callTask calls tool of connector 1 with a progress callback and a task
// id to learn, and returns the messages of the progress it got.
func callTask(ctx context.Context, reg *registry.Registry, tool string, args map[string]any) (*mcp.CallToolResult, string, []string, error) {
	var taskID string
	var got []string
	opts := registry.CallOptions{TaskID: &taskID, Progress: func(p registry.Progress) { got = append(got, p.Message) }}
	res, err := reg.CallTool(ctx, 1, tool, args, opts)
	return res, taskID, got, err
}

func TestTaskToolCompletesThroughTheTaskPath(t *testing.T) {
	srv := newTaskServer(t)
	reg := run(t, newSource(httpSpec(1, srv.url)), testConfig())
	res, id, progress, err := callTask(ctxT(t), reg, "slow", map[string]any{"text": "hi"})
	if err != nil {
		t.Fatal(err)
	}
	if got := text(t, res); got != "slow: hi" || res.IsError {
		t.Errorf("result = %q (isError %v), want the task's result", got, res.IsError)
	}
	if want := map[string]string{id: "slow"}; !cmp.Equal(srv.created(), want) {
		t.Errorf("the server created tasks %v; the call said its task was %q", srv.created(), id)
	}
	if n := srv.gets.Load(); n < 4 {
		t.Errorf("tasks/get polled %d times, want at least 4: three working, one completed", n)
	}
	if n := srv.results.Load(); n != 1 {
		t.Errorf("tasks/result asked %d times, want once", n)
	}
	want := []string{"working", "working: poll 1", "working: poll 2", "working: poll 3", "completed"}
	if diff := cmp.Diff(want, progress); diff != "" {
		t.Errorf("statuses reported as progress (-want +got):\n%s", diff)
	}
	if len(srv.cancelled()) != 0 {
		t.Errorf("tasks cancelled: %v", srv.cancelled())
	}
}

// A task that fails answers as a tool error saying why; the call itself
// succeeds, and so the connector is not in trouble.
func TestFailedTaskIsAToolError(t *testing.T) {
	srv := newTaskServer(t)
	reg := run(t, newSource(httpSpec(1, srv.url)), testConfig())
	res, id, progress, err := callTask(ctxT(t), reg, "fail", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := text(t, res); !res.IsError || got != "the task failed: the disk is full" {
		t.Errorf("result = %q (isError %v), want a tool error saying why", got, res.IsError)
	}
	if got := srv.endedAs(id); got != mcp.TaskStatusFailed {
		t.Errorf("the server's task %q ended %q", id, got)
	}
	if last := progress[len(progress)-1]; last != "failed: the disk is full" {
		t.Errorf("last status reported %q", last)
	}
}

// A task that needs input has its result asked for at once (a server
// sends what it asks on that request), and is followed on to its end.
func TestInputRequiredTaskAsksForTheResultAtOnce(t *testing.T) {
	srv := newTaskServer(t)
	reg := run(t, newSource(httpSpec(1, srv.url)), testConfig())
	res, _, progress, err := callTask(ctxT(t), reg, "ask", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := text(t, res); got != "answered" {
		t.Errorf("result = %q", got)
	}
	if n := srv.results.Load(); n != 1 {
		t.Errorf("tasks/result asked %d times, want once", n)
	}
	want := []string{"working", "input_required: waiting for an answer", "completed"}
	if diff := cmp.Diff(want, progress); diff != "" {
		t.Errorf("statuses reported as progress (-want +got):\n%s", diff)
	}
}

// A caller that gives up, or a call whose time runs out, cancels its task
// on the server before the call returns.
func TestAbandonedTaskIsCancelled(t *testing.T) {
	for _, tt := range []struct {
		name    string
		timeout time.Duration // the call's, else the caller cancels
		want    error
	}{
		{"the caller cancels", 0, context.Canceled},
		{"the call times out", time.Second, context.DeadlineExceeded},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := newTaskServer(t)
			spec := httpSpec(1, srv.url)
			if tt.timeout > 0 {
				spec.CallTimeout = tt.timeout
			}
			reg := run(t, newSource(spec), testConfig())
			ctx, cancel := context.WithCancel(ctxT(t))
			defer cancel()
			var id string
			var statuses int
			opts := registry.CallOptions{TaskID: &id, Progress: func(registry.Progress) {
				if statuses++; statuses == 2 && tt.timeout == 0 {
					cancel() // the task runs: the server answered a poll
				}
			}}
			_, err := reg.CallTool(ctx, 1, "hang", nil, opts)
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if id == "" {
				t.Fatal("the call did not say its task's id")
			}
			if diff := cmp.Diff([]string{id}, srv.cancelled()); diff != "" {
				t.Errorf("tasks/cancel the server took (-want +got):\n%s", diff)
			}
			if got := srv.endedAs(id); got != mcp.TaskStatusCancelled {
				t.Errorf("the server's task ended %q, want cancelled", got)
			}
		})
	}
}

// A tool that may run as a task, but need not, runs as a plain call.
func TestOptionalTaskToolRunsPlain(t *testing.T) {
	srv := newTaskServer(t)
	reg := run(t, newSource(httpSpec(1, srv.url)), testConfig())
	res, id, progress, err := callTask(ctxT(t), reg, "optional", map[string]any{"text": "hi"})
	if err != nil {
		t.Fatal(err)
	}
	if got := text(t, res); got != "plain: hi" {
		t.Errorf("result = %q", got)
	}
	if id != "" || len(srv.created()) != 0 || srv.gets.Load() != 0 {
		t.Errorf("ran as a task: id %q, tasks %v, %d tasks/get", id, srv.created(), srv.gets.Load())
	}
	if len(progress) != 0 {
		t.Errorf("progress %q from a plain call of a server that sends none", progress)
	}
}

// Calls of task tools run at once on one connection, each following its
// own task.
func TestConcurrentTaskCalls(t *testing.T) {
	srv := newTaskServer(t)
	reg := run(t, newSource(httpSpec(1, srv.url)), testConfig())
	ctx := ctxT(t)
	var wg sync.WaitGroup
	ids := make([]string, 6)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, id, _, err := callTask(ctx, reg, "slow", map[string]any{"text": fmt.Sprint(i)})
			if err != nil {
				t.Error(err)
				return
			}
			if want := fmt.Sprint("slow: ", i); len(res.Content) != 1 || !cmp.Equal(res.Content[0], mcp.Content(mcp.NewTextContent(want))) {
				t.Errorf("call %d: result %v, want %q", i, res.Content, want)
			}
			ids[i] = id
		}()
	}
	wg.Wait()
	created := srv.created()
	for i, id := range ids {
		if created[id] != "slow" {
			t.Errorf("call %d says task %q, which the server did not create", i, id)
		}
		delete(created, id)
	}
	if len(created) != 0 {
		t.Errorf("tasks no call reported: %v", created)
	}
}

// A session the server forgets while the call's task runs is no sign that
// the call never ran (as it is for a plain call refused for its session):
// the call is not sent again, and so the tool does not run twice.
func TestTaskCallIsNotRepeatedAfterItsSessionIsLost(t *testing.T) {
	srv := newTaskServer(t)
	cfg := testConfig()
	cfg.HealthInterval = time.Hour // no health check mends the session first
	reg := run(t, newSource(httpSpec(1, srv.url)), cfg)
	var statuses int
	opts := registry.CallOptions{Progress: func(registry.Progress) {
		if statuses++; statuses == 1 {
			srv.sessions.expire() // the task is created: the next tasks/get gets 404
		}
	}}
	_, err := reg.CallTool(ctxT(t), 1, "hang", nil, opts)
	if !errors.Is(err, registry.ErrUnavailable) {
		t.Errorf("err = %v, want unavailable", err)
	}
	if n := len(srv.created()); n != 1 {
		t.Errorf("the server created %d tasks, want 1", n)
	}
	// The connector mends its session and serves the next call.
	res, _, _, err := callTask(ctxT(t), reg, "optional", map[string]any{"text": "again"})
	if err != nil {
		t.Fatal(err)
	}
	if got := text(t, res); got != "plain: again" {
		t.Errorf("result = %q", got)
	}
}

// On the sessionless protocol a task tool is refused before anything is
// sent, saying why, rather than sent plain for the server to refuse.
func TestTaskToolOnTheSessionlessProtocolIsRefused(t *testing.T) {
	srv := newTaskServer(t)
	spec := httpSpec(1, srv.url)
	spec.Protocol = registry.ProtocolSessionless
	reg := run(t, newSource(spec), testConfig())
	_, _, _, err := callTask(ctxT(t), reg, "slow", map[string]any{"text": "hi"})
	if !errors.Is(err, registry.ErrTaskUnsupported) {
		t.Errorf("err = %v, want ErrTaskUnsupported", err)
	}
	if len(srv.created()) != 0 {
		t.Errorf("tasks created: %v", srv.created())
	}
	// Its other tools serve.
	res, _, _, err := callTask(ctxT(t), reg, "optional", map[string]any{"text": "hi"})
	if err != nil {
		t.Fatal(err)
	}
	if got := text(t, res); got != "plain: hi" {
		t.Errorf("result = %q", got)
	}
}

var (
	taskServerOnce sync.Once
	taskServerBin  string
	taskServerErr  error
)

// taskServerCommand builds testdata/taskserver, once, beside the stdio
// test server (TestMain removes that directory).
func taskServerCommand(t *testing.T) string {
	t.Helper()
	taskServerOnce.Do(func() {
		taskServerBin = filepath.Join(filepath.Dir(stdioServer), "taskserver")
		if out, err := exec.Command("go", "build", "-o", taskServerBin, "./testdata/taskserver").CombinedOutput(); err != nil {
			taskServerErr = fmt.Errorf("build the task server: %v\n%s", err, out)
		}
	})
	if taskServerErr != nil {
		t.Fatal(taskServerErr)
	}
	return taskServerBin
}

// taskStats is what the stdio task server's "stats" tool says it saw.
type taskStats struct {
	Gets    int64    `json:"gets"`
	Results int64    `json:"results"`
	Cancels []string `json:"cancels"`
	Created []string `json:"created"`
}

func readTaskStats(t *testing.T, reg *registry.Registry) taskStats {
	t.Helper()
	res, err := reg.CallTool(ctxT(t), 1, "stats", nil, registry.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var st taskStats
	if err := json.Unmarshal([]byte(text(t, res)), &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// Over stdio a task completes, and one the caller gives up is cancelled on
// the server.
func TestTaskToolOverStdio(t *testing.T) {
	spec := stdioSpec(1)
	spec.Command = taskServerCommand(t)
	reg := run(t, newSource(spec), testConfig())
	ctx := ctxT(t)

	res, slowID, progress, err := callTask(ctx, reg, "slow", map[string]any{"text": "hi"})
	if err != nil {
		t.Fatal(err)
	}
	if got := text(t, res); got != "slow: hi" {
		t.Errorf("result = %q", got)
	}
	if diff := cmp.Diff([]string{"working", "completed"}, progress); diff != "" {
		t.Errorf("statuses reported as progress (-want +got):\n%s", diff)
	}

	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var hangID string
	cancelOnFirst := registry.CallOptions{TaskID: &hangID, Progress: func(registry.Progress) { cancel() }}
	if _, err := reg.CallTool(cctx, 1, "hang", nil, cancelOnFirst); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want the caller's cancellation", err)
	}
	st := readTaskStats(t, reg)
	if diff := cmp.Diff([]string{slowID, hangID}, st.Created); diff != "" {
		t.Errorf("tasks the server created (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{hangID}, st.Cancels); diff != "" {
		t.Errorf("tasks/cancel the server took (-want +got):\n%s", diff)
	}
	if st.Gets < 3 || st.Results != 1 {
		t.Errorf("tasks/get %d times, tasks/result %d times; want at least 3 and 1", st.Gets, st.Results)
	}
}

// The server's own progress notifications for a task (its request's
// progress token lasts as long as the task) reach the caller between the
// statuses, which carry the last progress on.
func TestTaskProgressOverStdio(t *testing.T) {
	spec := stdioSpec(1)
	spec.Command = taskServerCommand(t)
	reg := run(t, newSource(spec), testConfig())
	var got []registry.Progress
	opts := registry.CallOptions{Progress: func(p registry.Progress) { got = append(got, p) }}
	res, err := reg.CallTool(ctxT(t), 1, "report", nil, opts)
	if err != nil {
		t.Fatal(err)
	}
	if got := text(t, res); got != "reported" {
		t.Errorf("result = %q", got)
	}
	want := []registry.Progress{
		{Message: "working"},
		{Progress: 1, Total: 2, Message: "step 1"},
		{Progress: 2, Total: 2, Message: "step 2"},
		{Progress: 2, Total: 2, Message: "completed"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("progress (-want +got):\n%s", diff)
	}
}

// A per_session connector runs task tools as tasks too, on the caller
// session's own connection.
func TestTaskToolPerSession(t *testing.T) {
	srv := newTaskServer(t)
	spec := httpSpec(1, srv.url)
	spec.SessionMode = registry.SessionPerSession
	reg := run(t, newSource(spec), testConfig())
	var id string
	res, err := reg.CallTool(ctxT(t), 1, "slow", map[string]any{"text": "alice"}, registry.CallOptions{Session: "alice", TaskID: &id})
	if err != nil {
		t.Fatal(err)
	}
	if got := text(t, res); got != "slow: alice" {
		t.Errorf("result = %q", got)
	}
	if want := map[string]string{id: "slow"}; !cmp.Equal(srv.created(), want) {
		t.Errorf("the server created tasks %v; the call said its task was %q", srv.created(), id)
	}
}

// A task that asks its user for input, over stdio, reaches the Asker of
// the call running it, and goes on with the answer.
func TestTaskElicitsOverStdio(t *testing.T) {
	spec := stdioSpec(1)
	spec.Command = taskServerCommand(t)
	spec.SessionMode, spec.Elicitation = registry.SessionPerSession, true
	reg := run(t, newSource(spec), testConfig())
	asker := &fakeAsker{}
	ctx := ask.With(ctxT(t), asker, ask.Call{ID: "c1", Tool: "confirm"})
	var id string
	res, err := reg.CallTool(ctx, 1, "confirm", nil, registry.CallOptions{Session: "s1", TaskID: &id})
	if err != nil {
		t.Fatal(err)
	}
	if got := text(t, res); got != "accept by Ada" || id == "" {
		t.Errorf("result = %q, task %q; want the answer, through a task", got, id)
	}
	inputs, calls := asker.asked()
	if len(inputs) != 1 || inputs[0].Message != "Who confirms?" || calls[0].ID != "c1" {
		t.Errorf("asked %+v for %+v, want one input for call c1", inputs, calls)
	}
}
