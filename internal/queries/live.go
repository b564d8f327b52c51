package queries

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

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
// tool call, kept here (liveRuns) until Resume brings the answer (or
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
	s    *Service
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
	result   *Outcome
	err      error
	wake     chan struct{}
}

// openInput is an input request that waits for its answer in Deps.Asks,
// owned by the run.
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
// pause is not an event: the caller hears of it in the Outcome, once
// the row is written.
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
// Resume's answer, until ctx ends (its deadline).
func (lr *liveRun) Await(ctx context.Context, in orchestrator.Input, snap *orchestrator.Result) (ask.Answer, error) {
	oi := &openInput{in: in, req: lr.s.d.Asks.Open(lr.owner(), in.Input)}
	lr.mu.Lock()
	lr.open = append(lr.open, oi)
	lr.snap, lr.paused = snap, true
	lr.mu.Unlock()
	lr.s.d.Counters.CountInput(lr.conn, in.Mode, "asked")
	if err := lr.savePause(ctx); err != nil {
		lr.s.d.Logger.ErrorContext(ctx, "record a query run paused for input; the input is cancelled", slog.String("run_id", lr.run.ID),
			slog.String("error", err.Error()))
		lr.close(in.ID)
		lr.s.d.Counters.CountInput(lr.conn, in.Mode, "failed")
		return ask.Answer{}, err
	}
	lr.signal()
	// An answer that came as the deadline passed counts.
	if a, ok := oi.req.Wait(ctx); ok {
		lr.s.d.Counters.CountInput(lr.conn, in.Mode, a.Action)
		return a, nil
	}
	lr.close(in.ID)
	lr.s.d.Counters.CountInput(lr.conn, in.Mode, "timeout")
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
		soonest = time.Now().Add(lr.s.d.ApprovalTimeout)
	}
	rec, err := runs.RecordLive(lr.run, lr.conn.Name, &snap, soonest, lr.s.d.Log.Replica())
	if err == nil {
		err = lr.s.d.Log.Save(ctx, rec)
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
		lr.s.d.Logger.WarnContext(ctx, "record the input requests a query run still waits on", slog.String("run_id", lr.run.ID),
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
	rec, err := runs.RecordLive(lr.run, lr.conn.Name, &snap, time.Now(), lr.s.d.Log.Replica())
	if err == nil {
		rec.Status, rec.ExpiresAt = store.RunRunning, nil
		err = lr.s.d.Log.Save(ctx, rec)
	}
	if err != nil {
		lr.s.d.Logger.WarnContext(ctx, "record a query run going on after its input", slog.String("run_id", lr.run.ID),
			slog.String("error", err.Error()))
	}
}

// finish sets the run's outcome.
func (lr *liveRun) finish(res *Outcome, err error) {
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
func (lr *liveRun) next(ctx context.Context, leaveCancels bool) (*Outcome, error) {
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
			snap.Status = orchestrator.StatusAwaitingInput
			out := &Outcome{RunID: lr.run.ID, Connector: lr.conn, Result: &snap}
			if !soonest.IsZero() {
				out.ExpiresAt = &soonest
			}
			return out, nil
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
	if err := lr.s.d.Asks.Answer(lr.owner(), answers); errors.As(err, &notOpen) {
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

// StopLiveRuns fails the runs still going on here once the front doors
// have drained: those whose callers left (a live pause for input, or a resume
// whose caller went away). They end before the MCP connections close, so
// that no run takes the closing of its call's connection for the call's
// answer and asks the model on. It waits for them within grace.
func (s *Service) StopLiveRuns(grace time.Duration) {
	s.live.mu.Lock()
	var lrs []*liveRun
	for _, lr := range s.live.runs {
		lrs = append(lrs, lr)
	}
	s.live.mu.Unlock()
	if len(lrs) == 0 {
		return
	}
	s.d.Logger.Warn("failing the query runs still going on here without their callers", slog.Int("runs", len(lrs)))
	for _, lr := range lrs {
		lr.stop(ErrReplicaStopping)
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

// runLive runs body (a run, or a resume, of run on connector c) detached
// from the caller's ctx, within QUERY_TIMEOUT, and waits for its first
// outcome (see liveRun.next): its end, recorded, or a live pause. emit,
// if not nil, receives the run's events while the caller waits (and then
// those who resume it and stream); without, the run streams none.
// newQuery says the run is a new query (it counts as one, and its caller
// leaving before any pause cancels it); before is the usage of a resumed
// run before this part.
func (s *Service) runLive(ctx context.Context, run *store.Run, c *store.Connector, emit func(orchestrator.Event), newQuery bool,
	before orchestrator.Usage, body func(ctx context.Context, emit func(orchestrator.Event), inputs orchestrator.InputBroker) (*orchestrator.Result, error)) (*Outcome, error) {
	base, stop := context.WithCancelCause(context.WithoutCancel(ctx))
	runCtx, cancelRun := context.WithTimeout(base, s.d.QueryTimeout)
	cancel := func() { cancelRun(); stop(nil) }
	lr := &liveRun{s: s, run: run, conn: c, cancel: cancel, stop: stop, ended: make(chan struct{}),
		wake: make(chan struct{}, 1)}
	lr.attach(emit)
	s.live.put(lr)
	release := s.d.Log.Hold(run.ID)
	go func() {
		defer close(lr.ended)
		defer cancel()
		defer release()
		defer s.live.drop(run.ID)
		// A run nobody streams asks its calls for no progress.
		var events func(orchestrator.Event)
		if emit != nil {
			events = lr.emit
		}
		res, err := body(runCtx, events, lr)
		if cause := context.Cause(runCtx); errors.Is(cause, ErrReplicaStopping) && err != nil {
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
