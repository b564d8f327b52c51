package queries

import (
	"context"
	"fmt"
	"time"

	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/llm"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/store"
)

// Answer is the answer to one input request a server asked.
type Answer struct {
	InputID string
	// Action is ask.Accept, ask.Decline or ask.Cancel; "" is an action the
	// front door does not know.
	Action string
	// Content is an accepted form's; nil: none given.
	Content map[string]any
}

// CheckAnswer checks a, an answer to in, and returns it as the server
// gets it, with the violations named under field: an action; a form's
// accepted content, with the defaults of the fields it leaves out, valid
// against its requested schema; no content otherwise. A direct call's answers are checked so too.
func CheckAnswer(field string, in ask.Input, a Answer) (ask.Answer, []Violation) {
	var v violations
	ans := ask.Answer{Action: a.Action}
	switch a.Action {
	case ask.Accept, ask.Decline, ask.Cancel:
	default:
		v.add(field+".action", "use INPUT_ACTION_ACCEPT, INPUT_ACTION_DECLINE or INPUT_ACTION_CANCEL")
		return ans, v
	}
	switch {
	case a.Content != nil && (ans.Action != ask.Accept || in.Mode != ask.ModeForm):
		v.add(field+".content", "only with INPUT_ACTION_ACCEPT of a form (INPUT_MODE_FORM)")
	case ans.Action == ask.Accept && in.Mode == ask.ModeForm:
		// Fields left out take their schema's defaults (SEP-1034), here
		// where every path to the server (live, durable retry, direct
		// call) passes, so the record shows what the server got.
		ans.Content = ask.WithDefaults(in.Schema, a.Content)
		if ans.Content == nil {
			ans.Content = map[string]any{}
		}
		if err := orchestrator.ValidateContent(in.Schema, ans.Content); err != nil {
			v.add(field+".content", "does not match the requested schema: %v", err)
		}
	}
	return ans, v
}

// checkAnswers checks a resume's answers against the inputs the run waits
// on: exactly one per input, by its id, each as CheckAnswer says.
func checkAnswers(req Resume, open []orchestrator.Input) (map[string]ask.Answer, error) {
	var v violations
	byID := make(map[string]orchestrator.Input, len(open))
	for _, in := range open {
		byID[in.ID] = in
	}
	now := time.Now()
	out := make(map[string]ask.Answer, len(open))
	answered := make(map[string]bool, len(open))
	for i, a := range req.Inputs {
		field, in, ok := match(&v, "inputs", i, "input_id", a.InputID, byID, out,
			"the run has no open input request %q", "input %q is answered twice")
		if !ok {
			continue
		}
		answered[a.InputID] = true
		ans, bad := CheckAnswer(field, in.Input, a)
		if len(bad) > 0 {
			v = append(v, bad...)
			continue
		}
		ans.Actor, ans.At = req.ActorID, now
		out[a.InputID] = ans
	}
	for _, in := range open {
		// An answer refused above is named there, not again as missing.
		if !answered[in.ID] {
			v.add("inputs", "no answer for input request %q: answer every open input request", in.ID)
		}
	}
	return out, v.err()
}

// resumeInput answers a run's input requests. A run paused live is
// going on here, its tool call open: the answers go to it, and the resume
// waits for its next outcome. A durable one is claimed, and its calls
// that waited run again with the answers, as approved calls do.
func (s *Service) resumeInput(ctx context.Context, req Resume, emit func(orchestrator.Event)) (*Outcome, error) {
	run, err := s.d.Runs.GetRun(ctx, req.WorkspaceID, req.RunID)
	if err != nil {
		return nil, err
	}
	if lr := s.live.get(run.ID); lr != nil {
		return s.answerLive(ctx, lr, req, emit)
	}
	if err := awaitsInput(run, s.d.Log.Replica()); err != nil {
		return nil, err
	}
	if s.d.Agent == nil {
		return nil, llm.ErrNotConfigured
	}
	st, err := orchestrator.DecodeState(run.State)
	if err != nil {
		return nil, err
	}
	answers, err := checkAnswers(req, st.Result.Inputs)
	if err != nil {
		return nil, err
	}
	la, conn, err := s.resumingAgent(ctx, run)
	if err != nil {
		return nil, err
	}
	for _, in := range st.Result.Inputs {
		s.d.Counters.CountInput(la.Row, in.Mode, answers[in.ID].Action)
	}
	// The answers are in the record before anything runs.
	st.Answered(answers)
	return s.claimAndResume(ctx, run, la.Row, conn, st, emit)
}

// answerLive delivers req's answers to lr, a run paused live here, and
// waits for its next outcome.
func (s *Service) answerLive(ctx context.Context, lr *liveRun, req Resume, emit func(orchestrator.Event)) (*Outcome, error) {
	answers, err := checkAnswers(req, lr.reportedInputs())
	if err != nil {
		if len(lr.reportedInputs()) == 0 {
			return nil, notAwaitingInput("the run waits for no input now: its requests were answered, or their deadline passed")
		}
		return nil, err
	}
	// Attached first: the events of the call that goes on are this
	// caller's.
	lr.attach(emit)
	if err := lr.deliver(answers); err != nil {
		lr.attach(nil)
		return nil, err
	}
	lr.saveState(ctx)
	return lr.next(ctx, false)
}

// awaitsInput refuses a run, not going on here, that does not await a
// durable answer now; replica is this one's name.
func awaitsInput(run *store.Run, replica string) error {
	live := run.Status == store.RunAwaitingInput && run.HeldBy != ""
	switch {
	case live && run.HeldBy != replica && run.ExpiresAt != nil && time.Now().Before(*run.ExpiresAt):
		// Resumes go where the run's session (or user) is held, which is
		// where its tool call is open: that moved, or is moving.
		return &RunElsewhereError{}
	case live:
		return notAwaitingInput("the run's input requests are past their deadline, or the replica that held its tool call stopped")
	case run.Status == store.RunAwaitingInput && run.ExpiresAt != nil && !time.Now().Before(*run.ExpiresAt), run.Status == store.RunExpired:
		return &RunExpiredError{Waited: "input"}
	case run.Status != store.RunAwaitingInput:
		return notAwaitingInput(fmt.Sprintf("the run is %s, not awaiting input", run.Status))
	}
	return nil
}
