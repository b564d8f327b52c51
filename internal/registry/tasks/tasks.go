// Package tasks runs task tools: a tool whose execution.taskSupport is
// "required" runs as a task (MCP 2025-11-25, experimental tasks). The call asks for a task,
// polls its status at the server's interval, reports each new status as
// progress and fetches the result once the task ends; a caller that gives
// up cancels the task. mcp-go's client has the task requests (tasks/get,
// tasks/result, tasks/cancel) but its CallTool cannot read the answer of a
// task-augmented tools/call (a CreateTaskResult has no content), so that
// one request goes out raw, over the session's transport. It is given the
// session's client, protocol version, progress routes and two hooks (see
// Session), and asks nothing else of the registry.
package tasks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/connector-svc/connector-svc/internal/registry/msglimit"
	"github.com/connector-svc/connector-svc/internal/registry/progress"
)

// Polling a task: at the interval the server asks for, kept within
// taskPollMin and taskPollMax; when it asks for none, at taskPollMin
// first, doubling up to taskPollDefault.
const (
	taskPollMin     = 100 * time.Millisecond
	taskPollMax     = 5 * time.Second
	taskPollDefault = 500 * time.Millisecond
	// taskCancelTimeout bounds the tasks/cancel sent for a call whose
	// caller gave up (or whose time ran out): best effort, after the fact.
	taskCancelTimeout = 2 * time.Second
)

// Required reports whether a call of t runs as a task: only a tool that
// requires it. One that allows it ("optional") runs as a plain call, which
// answers at once and costs no polling.
func Required(t mcp.Tool) bool {
	return t.Execution != nil && t.Execution.TaskSupport == mcp.TaskSupportRequired
}

// ErrUnsupported is the error of a call of a tool that must run as a
// task, on a connection that cannot run it so: tasks are run on the
// classic protocol (2025-11-25); on the sessionless one (2026-07-28) they
// are an extension of another shape (resultType "task", tasks/update), which
// neither mcp-go nor the service speak yet.
var ErrUnsupported = errors.New("the tool must run as a task, which the service supports on the classic MCP protocol (2025-11-25) only")

// taskRequests numbers the raw task-augmented tools/call requests. mcp-go
// numbers its own requests with integers; these ids are strings, so the
// two never meet.
var taskRequests atomic.Uint64

// taskRanError is an error of a call after the server accepted its task:
// the tool runs, or ran, so a session lost meanwhile is no sign that it
// never did, and the call is not sent again as if it had not (see
// Ran).
type taskRanError struct {
	id  string
	err error
}

func (e *taskRanError) Error() string { return "task " + e.id + ": " + e.err.Error() }
func (e *taskRanError) Unwrap() error { return e.err }

// Ran reports whether err ended a call whose task the server had
// accepted.
func Ran(err error) bool {
	var e *taskRanError
	return errors.As(err, &e)
}

// Session is the session a task runs on.
type Session struct {
	Client  *client.Client
	Version string // the protocol version negotiated
	// Progress routes the session's progress notifications.
	Progress *progress.Routes
	// Relate records that the call made under ctx runs as task id: the
	// server's requests that name the task go to that call.
	Relate func(ctx context.Context, id string)
	// Broken reports whether an error came from the connection rather
	// than from the server's answer.
	Broken func(error) bool
}

// Options are what the caller asks of one task call.
type Options struct {
	// Progress, if set, gets the server's progress and each new status
	// of the task (see registry.CallOptions.Progress).
	Progress func(progress.Progress)
	// TaskID, if set, learns the task's id as soon as the server gives
	// one (see registry.CallOptions.TaskID).
	TaskID *string
}

// Call runs a tool as a task on s. A caller that asked for progress
// gets the server's progress notifications (the request's progress token
// lasts as long as the task) and, between them, each new status of the
// task, with the last progress the server reported; opts.TaskID learns the
// task's id as soon as the server accepts it. A task that fails, or that
// the server cancels, is a tool error result. When ctx ends first, the
// task is cancelled on the server.
func Call(ctx context.Context, s Session, name string, args map[string]any, opts Options) (*mcp.CallToolResult, error) {
	if mcp.IsModernProtocol(s.Version) {
		return nil, fmt.Errorf("%w; this connection speaks %s", ErrUnsupported, s.Version)
	}
	t := &taskRun{s: s, progress: opts.Progress}
	if opts.Progress != nil {
		var token string
		token, t.queue = s.Progress.Add()
		defer s.Progress.Remove(token)
		t.token = token
	}
	task, res, err := t.create(ctx, name, args)
	if err != nil || res != nil {
		t.deliver()
		return res, err // refused, or the server ran it plain
	}
	t.id = task.TaskId
	s.Relate(ctx, t.id) // on stdio, the server's requests for the task come to this call
	if opts.TaskID != nil {
		*opts.TaskID = t.id
	}
	trace.SpanFromContext(ctx).SetAttributes(attribute.String("mcp.task.id", t.id))
	fetchCtx, stopFetch := context.WithCancel(ctx)
	defer stopFetch() // a tasks/result still waiting is not needed any more
	t.fetchCtx = fetchCtx
	res, err = t.follow(ctx, *task)
	t.deliver()
	if err != nil && ctx.Err() == nil {
		err = &taskRanError{id: t.id, err: msglimit.AsTooLarge(err)}
	}
	return res, err
}

// taskRun is one task-augmented call under way. All but the tasks/result
// fetch run on the caller's goroutine, which alone calls progress.
type taskRun struct {
	s        Session
	id       string
	progress func(progress.Progress)
	token    string
	queue    *progress.Queue   // the server's progress notifications, if asked for
	last     progress.Progress // the last update reported
	status   mcp.TaskStatus
	message  string

	fetchCtx context.Context
	result   chan taskOutcome // the answer to the tasks/result in flight, if any
	done     *taskOutcome     // the result, once it came
}

type taskOutcome struct {
	res *mcp.CallToolResult
	err error
}

// create sends tools/call with a task. It returns the task the server
// created or, from a server that ran the call plain, its result.
func (t *taskRun) create(ctx context.Context, name string, args map[string]any) (*mcp.Task, *mcp.CallToolResult, error) {
	// No ttl: the call's end is not known (its clock stops while the user
	// answers what the server asks), and the server keeps a task as long
	// as it sees fit; an abandoned call cancels its task.
	params := map[string]any{"name": name, "task": map[string]any{}}
	if args != nil {
		params["arguments"] = args
	}
	if t.token != "" {
		params["_meta"] = map[string]any{"progressToken": t.token}
	}
	resp, err := t.s.Client.GetTransport().SendRequest(ctx, transport.JSONRPCRequest{
		JSONRPC: mcp.JSONRPC_VERSION,
		ID:      mcp.NewRequestId("connector-svc-task-" + strconv.FormatUint(taskRequests.Add(1), 10)),
		Method:  string(mcp.MethodToolsCall),
		Params:  params,
	})
	if err != nil {
		return nil, nil, transport.NewError(err) // as mcp-go's own requests wrap it
	}
	if resp.Error != nil {
		return nil, nil, resp.Error.AsError()
	}
	var created struct {
		Task    *mcp.Task       `json:"task"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(resp.Result, &created); err != nil {
		return nil, nil, fmt.Errorf("read the answer to a task tools/call: %w", err)
	}
	switch {
	case created.Task != nil && created.Task.TaskId != "":
		return created.Task, nil, nil
	case created.Content != nil:
		res, err := mcp.ParseCallToolResult(&resp.Result)
		return nil, res, err
	}
	return nil, nil, errors.New("the server answered a task tools/call with neither a task nor a result")
}

// follow polls the task from its first state until it ends, and returns
// its outcome.
func (t *taskRun) follow(ctx context.Context, task mcp.Task) (*mcp.CallToolResult, error) {
	unnamed := taskPollMin
	for {
		t.report(ctx, task)
		if task.Status.IsTerminal() {
			return t.finish(ctx, task)
		}
		if task.Status == mcp.TaskStatusInputRequired {
			// The spec has the requestor ask for the result at once: a
			// server may send what it asks for on that request's stream
			// (streamable HTTP without a standing GET stream has no other
			// way), and answers it once the task ends.
			t.fetch()
		}
		wait := pollInterval(task.PollInterval)
		if task.PollInterval == nil || *task.PollInterval <= 0 {
			// Named by none: soon at first (a task may end at once), then
			// less often, up to taskPollDefault.
			wait, unnamed = unnamed, min(2*unnamed, taskPollDefault)
		}
		if err := t.wait(ctx, wait); err != nil {
			return nil, err
		}
		got, err := t.s.Client.GetTask(ctx, mcp.GetTaskRequest{Params: mcp.GetTaskParams{TaskId: t.id}})
		if err != nil {
			if ctx.Err() != nil {
				t.cancel(ctx)
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("tasks/get: %w", err)
		}
		task = got.Task
	}
}

// wait waits d, or less if the result arrives meanwhile, handing the
// server's progress to the caller as it comes. When ctx ends first it
// cancels the task and returns ctx's error.
func (t *taskRun) wait(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case <-timer.C:
			return nil
		case o := <-t.result:
			t.result = nil
			if o.err == nil {
				t.done = &o // kept for finish; poll now to learn how the task ended
			}
			// An error is left to finish, which asks again once the task
			// has ended, and gets the same error if that is the answer.
			return nil
		case <-t.wake():
			t.deliver()
		case <-ctx.Done():
			t.cancel(ctx)
			return ctx.Err()
		}
	}
}

// finish returns the outcome of a task that ended.
func (t *taskRun) finish(ctx context.Context, task mcp.Task) (*mcp.CallToolResult, error) {
	switch task.Status {
	case mcp.TaskStatusCancelled:
		return toolError("the server cancelled the task", task.StatusMessage), nil
	case mcp.TaskStatusFailed:
		o, err := t.outcome(ctx)
		switch {
		case err != nil:
			return nil, err
		case o.res != nil:
			o.res.IsError = true
			return o.res, nil
		case o.err != nil && !t.s.Broken(o.err):
			// The server answers tasks/result of a failed task with the
			// error the request failed with.
			msg := task.StatusMessage
			if msg == "" {
				msg = o.err.Error()
			}
			return toolError("the task failed", msg), nil
		}
		return nil, fmt.Errorf("tasks/result: %w", o.err)
	}
	o, err := t.outcome(ctx)
	if err != nil {
		return nil, err
	}
	if o.err != nil {
		return nil, fmt.Errorf("tasks/result: %w", o.err)
	}
	return o.res, nil
}

// fetch asks for the task's result, once, in the background: tasks/result
// answers only when the task has ended.
func (t *taskRun) fetch() {
	if t.result != nil || t.done != nil {
		return
	}
	ch := make(chan taskOutcome, 1)
	t.result = ch
	go func() {
		r, err := t.s.Client.TaskResult(t.fetchCtx, mcp.TaskResultRequest{Params: mcp.TaskResultParams{TaskId: t.id}})
		if err != nil {
			ch <- taskOutcome{err: err}
			return
		}
		ch <- taskOutcome{res: &mcp.CallToolResult{
			Result:            r.Result,
			Content:           r.Content,
			StructuredContent: r.StructuredContent,
			IsError:           r.IsError,
		}}
	}()
}

// outcome waits for the answer to tasks/result, asking for it if nobody
// has yet. When ctx ends first it cancels the task and returns ctx's
// error.
func (t *taskRun) outcome(ctx context.Context) (taskOutcome, error) {
	if t.done != nil {
		return *t.done, nil
	}
	t.fetch()
	for {
		select {
		case o := <-t.result:
			t.result = nil
			return o, nil
		case <-t.wake():
			t.deliver()
		case <-ctx.Done():
			t.cancel(ctx)
			return taskOutcome{}, ctx.Err()
		}
	}
}

// cancel asks the server to cancel the task, after the caller gave up or
// the call's time ran out. It waits at most taskCancelTimeout, on a
// context of its own.
func (t *taskRun) cancel(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), taskCancelTimeout)
	defer cancel()
	_, err := t.s.Client.CancelTask(ctx, mcp.CancelTaskRequest{Params: mcp.CancelTaskParams{TaskId: t.id}})
	// A task that ended meanwhile cannot be cancelled, and nothing is lost:
	// the span says whether the server took the cancel, not why not.
	trace.SpanFromContext(ctx).AddEvent("mcp.task.cancel", trace.WithAttributes(attribute.Bool("mcp.task.cancelled", err == nil)))
}

// report hands a new status of the task to the caller, as progress, after
// the server's own progress received so far; and to the call's span.
func (t *taskRun) report(ctx context.Context, task mcp.Task) {
	if t.status == task.Status && t.message == task.StatusMessage {
		return
	}
	t.status, t.message = task.Status, task.StatusMessage
	msg := string(task.Status)
	if task.StatusMessage != "" {
		msg += ": " + task.StatusMessage
	}
	trace.SpanFromContext(ctx).AddEvent("mcp.task.status", trace.WithAttributes(attribute.String("mcp.task.status", string(task.Status))))
	if t.progress == nil {
		return
	}
	t.deliver()
	t.emit(progress.Progress{Progress: t.last.Progress, Total: t.last.Total, Message: msg})
}

// deliver hands the server's queued progress notifications to the caller.
func (t *taskRun) deliver() {
	if t.queue != nil {
		t.queue.Deliver(t.emit)
	}
}

func (t *taskRun) emit(p progress.Progress) {
	t.last = p
	t.progress(p)
}

// wake is the channel that says the server's progress waits; nil (never
// ready) without a queue.
func (t *taskRun) wake() <-chan struct{} {
	if t.queue == nil {
		return nil
	}
	return t.queue.Wake()
}

// pollInterval is how long to wait before the next tasks/get: what the
// server asked for (in milliseconds), within bounds.
func pollInterval(ms *int64) time.Duration {
	if ms == nil || *ms <= 0 {
		return taskPollDefault
	}
	if *ms >= taskPollMax.Milliseconds() {
		return taskPollMax
	}
	return max(time.Duration(*ms)*time.Millisecond, taskPollMin)
}

// toolError is a tool error result that says what and, if the server
// said, why.
func toolError(what, why string) *mcp.CallToolResult {
	if why != "" {
		what += ": " + why
	}
	return mcp.NewToolResultError(what)
}
