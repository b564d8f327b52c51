package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/pending"
	"github.com/connector-svc/connector-svc/internal/runs"
	"github.com/connector-svc/connector-svc/internal/store"
)

// A query run goes on detached from its caller (runLive): the caller waits
// for its first outcome, which is its end or a live pause. A live pause is
// a server's input request while its tool call is open: the run's row is
// written awaiting_input, held by this replica, and the caller gets the
// run id and the request at once; the run itself goes on waiting in the
// tool call, kept here (liveRuns) until ResumeQuery brings the answer (or
// the request's deadline passes: cancel), and the resume then waits for
// the next outcome. Other replicas route the resume here: the run's
// session (or user) is held here, as its tool calls were.

// liveRuns are the runs that go on on this replica, by id.
type liveRuns struct {
	mu   sync.Mutex
	runs map[string]*liveRun
}

func (l *liveRuns) get(id string) *liveRun {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.runs[id]
}

func (l *liveRuns) put(lr *liveRun) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.runs == nil {
		l.runs = map[string]*liveRun{}
	}
	l.runs[lr.run.ID] = lr
}

func (l *liveRuns) drop(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.runs, id)
}

// liveRun is one run going on here. It is the run's
// orchestrator.InputBroker.
type liveRun struct {
	s    *Server
	run  *store.Run       // its row as it started
	conn *store.Connector // its connector's row
	// cancel cancels the run; done is closed once it ended and its
	// outcome is set.
	cancel func()
	// stop cancels the run with a cause (StopLiveRuns); ended is closed
	// once its goroutine is done, its record written.
	stop  context.CancelCauseFunc
	ended chan struct{}

	// sinkMu guards sink, the events' current receiver: the caller that
	// waits, if it streams. No event is sent once it stopped waiting.
	sinkMu sync.Mutex
	sink   func(orchestrator.Event)

	saveMu sync.Mutex // one write of the pause's row at a time

	mu       sync.Mutex
	open     []*openInput // by arrival
	reported map[string]bool
	snap     *orchestrator.Result // the run at its last live pause
	paused   bool                 // it paused live: its caller knows its id
	done     bool
	result   *connectorv1.QueryResult
	err      error
	wake     chan struct{}
}

// openInput is an input request that waits for its answer in the
// server's table of pending requests (owned by the run).
type openInput struct {
	in  orchestrator.Input
	req *pending.Request
	// saved says the run's row names it: its caller may hear of it.
	saved bool
}

// owner is the run as the owner of its pending requests.
func (lr *liveRun) owner() pending.Owner { return runOwner(lr.run.ID) }

// runOwner is a query run as the owner of pending requests.
func runOwner(runID string) pending.Owner { return pending.Owner("run\x00" + runID) }

// emit passes a run event on to the caller that waits, if it streams. A
// pause is sent by lastEvents, after the row is written.
func (lr *liveRun) emit(e orchestrator.Event) {
	if e.Kind == orchestrator.EventApprovalRequired || e.Kind == orchestrator.EventInputRequired {
		return
	}
	lr.sinkMu.Lock()
	defer lr.sinkMu.Unlock()
	if lr.sink != nil {
		lr.sink(e)
	}
}

func (lr *liveRun) attach(sink func(orchestrator.Event)) {
	lr.sinkMu.Lock()
	defer lr.sinkMu.Unlock()
	lr.sink = sink
}

func (lr *liveRun) signal() {
	select {
	case lr.wake <- struct{}{}:
	default:
	}
}

// Await implements orchestrator.InputBroker: the run's row says what
// waits before anyone hears of it; then the request waits for
// ResumeQuery's answer, until ctx ends (its deadline).
func (lr *liveRun) Await(ctx context.Context, in orchestrator.Input, snap *orchestrator.Result) (ask.Answer, error) {
	oi := &openInput{in: in, req: lr.s.asks.Open(lr.owner(), in.Input)}
	lr.mu.Lock()
	lr.open = append(lr.open, oi)
	lr.snap, lr.paused = snap, true
	lr.mu.Unlock()
	lr.s.counts.CountInput(lr.conn, in.Mode, "asked")
	if err := lr.savePause(ctx); err != nil {
		lr.s.logger.ErrorContext(ctx, "record a query run paused for input; the input is cancelled", slog.String("run_id", lr.run.ID),
			slog.String("error", err.Error()))
		lr.close(in.ID)
		lr.s.counts.CountInput(lr.conn, in.Mode, "failed")
		return ask.Answer{}, err
	}
	lr.signal()
	// An answer that came as the deadline passed counts.
	if a, ok := oi.req.Wait(ctx); ok {
		lr.s.counts.CountInput(lr.conn, in.Mode, a.Action)
		return a, nil
	}
	lr.close(in.ID)
	lr.s.counts.CountInput(lr.conn, in.Mode, "timeout")
	lr.saveState(ctx)
	return ask.Answer{}, ctx.Err()
}

// close takes input id off the open ones; false if it was not open (an
// answer took it).
func (lr *liveRun) close(id string) bool {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	i := slices.IndexFunc(lr.open, func(o *openInput) bool { return o.in.ID == id })
	if i < 0 {
		return false
	}
	o := lr.open[i]
	lr.open = slices.Delete(lr.open, i, i+1)
	return o.req.Close()
}

func (lr *liveRun) openCount() int {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	return len(lr.open)
}

// openInputsLocked are the requests that wait (only those the row names,
// if saved), and the soonest deadline.
func (lr *liveRun) openInputsLocked(saved bool) ([]orchestrator.Input, time.Time) {
	var ins []orchestrator.Input
	var soonest time.Time
	for _, o := range lr.open {
		if saved && !o.saved {
			continue
		}
		ins = append(ins, o.in)
		if d := o.in.Deadline; !d.IsZero() && (soonest.IsZero() || d.Before(soonest)) {
			soonest = d
		}
	}
	return ins, soonest
}

// savePause writes the run's row awaiting its open inputs, held here,
// expiring with the soonest of their deadlines.
func (lr *liveRun) savePause(ctx context.Context) error {
	lr.saveMu.Lock()
	defer lr.saveMu.Unlock()
	lr.mu.Lock()
	snap := *lr.snap
	ins, soonest := lr.openInputsLocked(false)
	snap.Inputs = ins
	lr.mu.Unlock()
	if len(ins) == 0 {
		return nil
	}
	if soonest.IsZero() {
		soonest = time.Now().Add(lr.s.cfg.ApprovalTimeout)
	}
	rec, err := runs.RecordLive(lr.run, lr.conn.Name, &snap, soonest, lr.s.runs.Replica())
	if err == nil {
		err = lr.s.runs.Save(ctx, rec)
	}
	if err != nil {
		return err
	}
	lr.mu.Lock()
	for _, o := range lr.open {
		if slices.ContainsFunc(ins, func(in orchestrator.Input) bool { return in.ID == o.in.ID }) {
			o.saved = true
		}
	}
	lr.mu.Unlock()
	return nil
}

// saveState writes the run's row as it is once requests were answered or
// passed their deadline: running again when none waits any more, else
// awaiting the others (their deadlines are later).
func (lr *liveRun) saveState(ctx context.Context) {
	if lr.openCount() == 0 {
		lr.saveRunning(ctx)
		return
	}
	if err := lr.savePause(ctx); err != nil {
		lr.s.logger.WarnContext(ctx, "record the input requests a query run still waits on", slog.String("run_id", lr.run.ID),
			slog.String("error", err.Error()))
	}
}

// saveRunning writes the run's row running again, still held here: its
// inputs were answered (or their deadline passed).
func (lr *liveRun) saveRunning(ctx context.Context) {
	lr.saveMu.Lock()
	defer lr.saveMu.Unlock()
	lr.mu.Lock()
	snap := *lr.snap
	lr.mu.Unlock()
	snap.Inputs, snap.Status = nil, 0
	rec, err := runs.RecordLive(lr.run, lr.conn.Name, &snap, time.Now(), lr.s.runs.Replica())
	if err == nil {
		rec.Status, rec.ExpiresAt = store.RunRunning, nil
		err = lr.s.runs.Save(ctx, rec)
	}
	if err != nil {
		lr.s.logger.WarnContext(ctx, "record a query run going on after its input", slog.String("run_id", lr.run.ID),
			slog.String("error", err.Error()))
	}
}

// finish sets the run's outcome.
func (lr *liveRun) finish(res *connectorv1.QueryResult, err error) {
	lr.mu.Lock()
	lr.done, lr.result, lr.err = true, res, err
	lr.mu.Unlock()
	lr.signal()
}

// next waits for the run's next outcome: its end, or a live pause with
// input requests its caller has not heard of yet (it answers them all,
// with the ones heard of before that still wait). If ctx ends first, a
// run that never paused live is cancelled when leaveCancels (its caller
// is gone, and nobody else knows of it) and its end is waited for;
// otherwise the run goes on, and ctx's error is returned.
func (lr *liveRun) next(ctx context.Context, leaveCancels bool) (*connectorv1.QueryResult, error) {
	defer lr.attach(nil)
	for {
		lr.mu.Lock()
		if lr.done {
			res, err := lr.result, lr.err
			lr.mu.Unlock()
			return res, err
		}
		// The caller hears of a request once the row names it.
		fresh := slices.ContainsFunc(lr.open, func(o *openInput) bool { return o.saved && !lr.reported[o.in.ID] })
		if fresh {
			if lr.reported == nil {
				lr.reported = map[string]bool{}
			}
			for _, o := range lr.open {
				if o.saved {
					lr.reported[o.in.ID] = true
				}
			}
			ins, soonest := lr.openInputsLocked(true)
			snap := *lr.snap
			lr.mu.Unlock()
			snap.Inputs = ins
			p := lr.s.resultToProto(lr.conn.ExternalID, lr.conn.Name, &snap)
			p.RunId, p.Status = lr.run.ID, connectorv1.QueryStatus_QUERY_STATUS_AWAITING_INPUT
			if !soonest.IsZero() {
				p.ExpireTime = timestamppb.New(soonest)
			}
			return p, nil
		}
		lr.mu.Unlock()
		select {
		case <-lr.wake:
		case <-ctx.Done():
			lr.mu.Lock()
			paused := lr.paused
			lr.mu.Unlock()
			if !leaveCancels || paused {
				return nil, ctx.Err()
			}
			lr.attach(nil)
			lr.cancel()
			ctx, leaveCancels = context.WithoutCancel(ctx), false
		}
	}
}

// deliver answers the run's open inputs that its caller heard of: all of
// them, one answer each (checked). A request whose deadline passed
// meanwhile is not open any more.
func (lr *liveRun) deliver(answers map[string]ask.Answer) error {
	lr.mu.Lock()
	var targets []*openInput
	for _, o := range lr.open {
		if lr.reported[o.in.ID] {
			targets = append(targets, o)
		}
	}
	for id := range answers {
		if !slices.ContainsFunc(targets, func(o *openInput) bool { return o.in.ID == id }) {
			lr.mu.Unlock()
			return notAwaitingInput(fmt.Sprintf("the run's input request %q is not open: it was answered, or its deadline passed", id))
		}
	}
	if len(targets) != len(answers) {
		lr.mu.Unlock()
		return notAwaitingInput("the run's open input requests changed; GetQueryRun shows them")
	}
	defer lr.mu.Unlock()
	var notOpen *pending.NotOpenError
	if err := lr.s.asks.Answer(lr.owner(), answers); errors.As(err, &notOpen) {
		// Its deadline passed as the answer came.
		return notAwaitingInput(fmt.Sprintf("the run's input request %q is not open: it was answered, or its deadline passed", notOpen.ID))
	}
	lr.open = slices.DeleteFunc(lr.open, func(o *openInput) bool { _, ok := answers[o.in.ID]; return ok })
	return nil
}

// reportedInputs are the open inputs the run's caller heard of.
func (lr *liveRun) reportedInputs() []orchestrator.Input {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	var ins []orchestrator.Input
	for _, o := range lr.open {
		if lr.reported[o.in.ID] {
			ins = append(ins, o.in)
		}
	}
	return ins
}

// errReplicaStopping is why a run going on here when the replica stops
// fails: its tool call's connection (and any input it waits on) ends with
// the replica.
var errReplicaStopping = errors.New("the replica running this query stopped while the run went on without its caller " +
	"(waiting for input, or resumed and left): ask again with QueryConnector")

// StopLiveRuns fails the runs still going on here once the gRPC server has
// drained: those whose callers left (a live pause for input, or a resume
// whose caller went away). They end before the MCP connections close, so
// that no run takes the closing of its call's connection for the call's
// answer and asks the model on. It waits for them within grace.
func (s *Server) StopLiveRuns(grace time.Duration) {
	s.liveRuns.mu.Lock()
	var lrs []*liveRun
	for _, lr := range s.liveRuns.runs {
		lrs = append(lrs, lr)
	}
	s.liveRuns.mu.Unlock()
	if len(lrs) == 0 {
		return
	}
	s.logger.Warn("failing the query runs still going on here without their callers", slog.Int("runs", len(lrs)))
	for _, lr := range lrs {
		lr.stop(errReplicaStopping)
	}
	deadline := time.After(grace)
	for _, lr := range lrs {
		select {
		case <-lr.ended:
		case <-deadline:
			return
		}
	}
}

func notAwaitingInput(msg string) error {
	return newStatus(codes.FailedPrecondition, ReasonRunNotAwaitingInput, msg)
}

// runLive runs body (a run, or a resume, of run on connector c) detached
// from the caller's ctx, within QUERY_TIMEOUT, and waits for its first
// outcome (see liveRun.next): its end, recorded, or a live pause. emit,
// if not nil, receives the run's events while the caller waits (and then
// those who resume it and stream); without, the run streams none.
// newQuery says the run is a new query (it counts as one, and its caller
// leaving before any pause cancels it); before is the usage of a resumed
// run before this part.
func (s *Server) runLive(ctx context.Context, run *store.Run, c *store.Connector, emit func(orchestrator.Event), newQuery bool,
	before orchestrator.Usage, body func(ctx context.Context, emit func(orchestrator.Event), inputs orchestrator.InputBroker) (*orchestrator.Result, error)) (*connectorv1.QueryResult, error) {
	base, stop := context.WithCancelCause(context.WithoutCancel(ctx))
	runCtx, cancelRun := context.WithTimeout(base, s.cfg.QueryTimeout)
	cancel := func() { cancelRun(); stop(nil) }
	lr := &liveRun{s: s, run: run, conn: c, cancel: cancel, stop: stop, ended: make(chan struct{}),
		wake: make(chan struct{}, 1)}
	lr.attach(emit)
	s.liveRuns.put(lr)
	release := s.runs.Hold(run.ID)
	go func() {
		defer close(lr.ended)
		defer cancel()
		defer release()
		defer s.liveRuns.drop(run.ID)
		// A run nobody streams asks its calls for no progress.
		var events func(orchestrator.Event)
		if emit != nil {
			events = lr.emit
		}
		res, err := body(runCtx, events, lr)
		if cause := context.Cause(runCtx); errors.Is(cause, errReplicaStopping) && err != nil {
			// Its tool call's connection closes with this replica: the
			// run fails, rather than go on with that as the call's answer.
			res, err = nil, cause
		}
		s.countQuery(c, res, err, newQuery, before)
		lr.mu.Lock()
		known := lr.paused || !newQuery
		lr.mu.Unlock()
		p, err := s.endRun(runCtx, run, c, res, err, known)
		lr.finish(p, err)
	}()
	return lr.next(ctx, newQuery)
}

// inputsFromProto checks a resume's answers against the inputs the run
// waits on: exactly one per input, by its id; an action; a form's accepted
// content valid against its requested schema; no content otherwise.
func inputsFromProto(req resumeRequest, open []orchestrator.Input) (map[string]ask.Answer, error) {
	var ch checker
	byID := make(map[string]orchestrator.Input, len(open))
	for _, in := range open {
		byID[in.ID] = in
	}
	now := time.Now()
	out := make(map[string]ask.Answer, len(open))
	answered := make(map[string]bool, len(open))
	for i, a := range req.GetInputs() {
		field := fmt.Sprintf("inputs[%d]", i)
		in, ok := byID[a.GetInputId()]
		switch {
		case a.GetInputId() == "":
			ch.add(field+".input_id", "required")
			continue
		case !ok:
			ch.add(field+".input_id", "the run has no open input request %q", a.GetInputId())
			continue
		}
		if _, dup := out[a.GetInputId()]; dup {
			ch.add(field+".input_id", "input %q is answered twice", a.GetInputId())
			continue
		}
		answered[a.GetInputId()] = true
		ans, ok := answerFromProto(&ch, field, in.Input, a)
		if !ok {
			continue
		}
		ans.Actor, ans.At = req.GetActorId(), now
		out[a.GetInputId()] = ans
	}
	for _, in := range open {
		// An answer refused above is named there, not again as missing.
		if !answered[in.ID] {
			ch.add("inputs", "no answer for input request %q: answer every open input request", in.ID)
		}
	}
	return out, ch.err()
}

// answerFromProto checks one answer to in, adding what is wrong to ch
// under field.
func answerFromProto(ch *checker, field string, in ask.Input, a *connectorv1.InputAnswer) (ask.Answer, bool) {
	var ans ask.Answer
	n := len(ch.violations)
	switch a.GetAction() {
	case connectorv1.InputAction_INPUT_ACTION_ACCEPT:
		ans.Action = ask.Accept
	case connectorv1.InputAction_INPUT_ACTION_DECLINE:
		ans.Action = ask.Decline
	case connectorv1.InputAction_INPUT_ACTION_CANCEL:
		ans.Action = ask.Cancel
	default:
		ch.add(field+".action", "use INPUT_ACTION_ACCEPT, INPUT_ACTION_DECLINE or INPUT_ACTION_CANCEL")
		return ans, false
	}
	switch {
	case a.GetContent() != nil && (ans.Action != ask.Accept || in.Mode != ask.ModeForm):
		ch.add(field+".content", "only with INPUT_ACTION_ACCEPT of a form (INPUT_MODE_FORM)")
	case ans.Action == ask.Accept && in.Mode == ask.ModeForm:
		ans.Content = a.GetContent().AsMap()
		if ans.Content == nil {
			ans.Content = map[string]any{}
		}
		if err := orchestrator.ValidateContent(in.Schema, ans.Content); err != nil {
			ch.add(field+".content", "does not match the requested schema: %v", err)
		}
	}
	return ans, len(ch.violations) == n
}

var inputModes = map[string]connectorv1.InputMode{
	ask.ModeForm:     connectorv1.InputMode_INPUT_MODE_FORM,
	ask.ModeURL:      connectorv1.InputMode_INPUT_MODE_URL,
	ask.ModeSampling: connectorv1.InputMode_INPUT_MODE_SAMPLING,
}

var inputActions = map[string]connectorv1.InputAction{
	ask.Accept:  connectorv1.InputAction_INPUT_ACTION_ACCEPT,
	ask.Decline: connectorv1.InputAction_INPUT_ACTION_DECLINE,
	ask.Cancel:  connectorv1.InputAction_INPUT_ACTION_CANCEL,
}

// inputToProto renders an input request of the connector callers know as
// connectorID, named name.
func inputToProto(connectorID, name string, in orchestrator.Input) *connectorv1.InputRequest {
	p := &connectorv1.InputRequest{
		InputId: in.ID, ConnectorId: connectorID, Server: name, CallId: in.CallID, Tool: in.Tool, StepIndex: int32(in.Step),
		Mode: inputModes[in.Mode], Message: in.Message, RequestedSchema: toStruct(in.Schema), Url: in.URL, Durable: in.Durable,
	}
	if u, err := url.Parse(in.URL); err == nil && in.URL != "" {
		p.UrlHost = u.Hostname()
	}
	if sm := in.Sampling; sm != nil {
		p.Sampling = &connectorv1.SamplingRequest{SystemPrompt: sm.SystemPrompt, Messages: sm.Messages, MaxTokens: int32(sm.MaxTokens),
			Tools: sm.Tools}
	}
	if !in.Deadline.IsZero() {
		p.Deadline = timestamppb.New(in.Deadline)
	}
	if a := in.Answer; a != nil {
		p.Answer = &connectorv1.InputAnswer{InputId: in.ID, Action: inputActions[a.Action], Content: toStruct(a.Content), ActorId: a.Actor}
		if !a.At.IsZero() {
			p.Answer.AnswerTime = timestamppb.New(a.At)
		}
	}
	return p
}

func samplingToProto(call orchestrator.Call, rec ask.SamplingRecord) *connectorv1.SamplingCall {
	return &connectorv1.SamplingCall{CallId: call.ID, Tool: call.Tool, Model: rec.Model, Messages: int32(rec.Messages),
		PromptTokens: rec.PromptTokens, CompletionTokens: rec.CompletionTokens, StopReason: rec.StopReason, ToolUses: rec.ToolUses,
		Error: rec.Err, Duration: durationpb.New(rec.Duration), ResultExcerpt: rec.ResultExcerpt}
}
