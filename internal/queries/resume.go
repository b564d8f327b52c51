package queries

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/llm"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/runs"
	"github.com/connector-svc/connector-svc/internal/store"
)

// Bounds of a resume's request.
const (
	MaxActorLen   = 200
	MaxMessageLen = 2000
)

// Resume goes on with a paused run: decisions about its pending calls
// (awaiting approval), answers to its open input requests (awaiting
// input), or neither (awaiting its user's authorization, now given).
type Resume struct {
	WorkspaceID, RunID string
	// Decisions, one per pending call, in the request's order (their
	// index names them in violations).
	Decisions []Decision
	// Inputs, one answer per open input request, in the request's order.
	Inputs []Answer
	// ActorID is who decided or answered (the caller's to fill); KeyID is
	// the API key the decisions came with, if any.
	ActorID, KeyID string
}

// Decision is a person's decision about one pending call.
type Decision struct {
	CallID string
	// Kind is orchestrator.Approve, ApproveEdited or Deny; 0 is a kind
	// the front door does not know.
	Kind orchestrator.DecisionKind
	// EditedArguments are ApproveEdited's; nil: none given.
	EditedArguments map[string]any
	// Message is kept with any decision; a denial's reaches the model.
	Message string
}

// Resume checks req against the paused run, claims the run (one resume
// wins) and goes on with it on its connector's live agent; a run paused
// live for input here gets the answers on its open tool call instead. It
// returns the run's next outcome as Start does; emit is Start's. Claimed,
// the run goes on to its end within QueryTimeout even if the caller goes
// away. Errors: *InvalidError (decisions or answers that do not fit the
// run), store.ErrRunNotFound, *RunNotAwaitingError,
// *RunNotAwaitingInputError, *RunExpiredError, ErrRunTaken,
// *RunElsewhereError, *AuthorizationRequiredError, llm.ErrNotConfigured,
// Limits.Admit's refusal, and the run's own.
func (s *Service) Resume(ctx context.Context, req Resume, emit func(orchestrator.Event)) (*Outcome, error) {
	var v violations
	if len(req.Inputs) > 0 {
		if len(req.Decisions) > 0 {
			v.add("decisions", "not with inputs: a run awaits either decisions or input")
			return nil, v.err()
		}
		return s.resumeInput(ctx, req, emit)
	}
	var run *store.Run
	if len(req.Decisions) == 0 {
		// Only a run awaiting its user's authorization goes on without.
		r, err := s.d.Runs.GetRun(ctx, req.WorkspaceID, req.RunID)
		if err == nil && r.Status == store.RunAwaitingInput {
			v.add("inputs", "required: one answer per open input request of the run")
			return nil, v.err()
		}
		if err != nil || r.Status != store.RunAwaitingAuthorization {
			v.add("decisions", "required: one per pending call of the run")
			return nil, v.err()
		}
		run = r
	}
	if s.d.Agent == nil {
		return nil, llm.ErrNotConfigured
	}
	if run == nil {
		r, err := s.d.Runs.GetRun(ctx, req.WorkspaceID, req.RunID)
		if err != nil {
			return nil, err
		}
		run = r
	}
	if run.Status == store.RunAwaitingAuthorization {
		return s.resumeAuthorized(ctx, req, run, emit)
	}
	return s.resumeDecided(ctx, req, run, emit)
}

// resumeDecided goes on with run, paused for approval, with req's
// decisions.
func (s *Service) resumeDecided(ctx context.Context, req Resume, run *store.Run, emit func(orchestrator.Event)) (*Outcome, error) {
	if err := resumable(run); err != nil {
		return nil, err
	}
	st, err := orchestrator.DecodeState(run.State)
	if err != nil {
		return nil, err
	}
	la, conn, err := s.resumingAgent(ctx, run)
	if err != nil {
		return nil, err
	}
	decisions, err := checkDecisions(req, st, conn)
	if err != nil {
		return nil, err
	}
	// The decisions are in the record before anything runs.
	st.Decide(decisions)
	return s.claimAndResume(ctx, run, la.Row, conn, st, emit)
}

// resumingAgent is the live agent of a paused run's connector and its
// tools, for a resume. A resume asks the model again: it takes a token of
// the connector's rate limit to start, as a query does.
func (s *Service) resumingAgent(ctx context.Context, run *store.Run) (*live.Agent, *orchestrator.Connector, error) {
	la, err := s.pausedRunAgent(ctx, run)
	if err != nil {
		return nil, nil, err
	}
	if err := s.d.Limits.Admit(ctx, la.Row); err != nil {
		return nil, nil, err
	}
	cat, err := s.d.Registry.CatalogFor(ctx, run.ConnectorID, run.UserID)
	if err != nil {
		return nil, nil, err
	}
	return la, la.Connector(cat), nil
}

// pausedRunAgent is the live agent of a paused run's connector, which must
// still be the one the run paused on and callable.
func (s *Service) pausedRunAgent(ctx context.Context, run *store.Run) (*live.Agent, error) {
	id, err := s.d.Connectors.Callable(ctx, run.WorkspaceID, run.ConnectorExternalID)
	if err != nil {
		return nil, err
	}
	if id != run.ConnectorID {
		return nil, &RunNotAwaitingError{Msg: "the run's connector was deleted since it paused; the run cannot go on"}
	}
	return s.d.Live.Settings(id, func() (*store.Connector, error) {
		return s.d.Connectors.ActiveConnector(ctx, run.WorkspaceID, run.ConnectorExternalID)
	})
}

// claimAndResume claims a paused run whose state has its decisions or
// answers (they go in its record) and goes on with it on conn, the
// connector's live agent. Claimed, the run goes on to its end, within
// QueryTimeout, even if the caller goes away meanwhile: its record shows
// how it ended. Its heartbeat tells the leader this replica still runs it.
func (s *Service) claimAndResume(ctx context.Context, run *store.Run, row *store.Connector, conn *orchestrator.Connector,
	st *orchestrator.State, emit func(orchestrator.Event)) (*Outcome, error) {
	trace, err := runs.TraceJSON(row.Name, &st.Result)
	if err != nil {
		return nil, err
	}
	if err := s.claim(ctx, run, trace); err != nil {
		return nil, err
	}
	areq := s.agentRequest(run, row, conn)
	return s.runLive(ctx, run, row, emit, false, st.Result.Usage,
		func(ctx context.Context, emit func(orchestrator.Event), inputs orchestrator.InputBroker) (*orchestrator.Result, error) {
			areq.Inputs = inputs
			return s.d.Agent.Resume(ctx, areq, st, emit)
		})
}

// claim marks a paused run running here, with trace: one resume wins.
func (s *Service) claim(ctx context.Context, run *store.Run, trace []byte) error {
	if _, err := s.d.Runs.ClaimRun(ctx, run.WorkspaceID, run.ID, run.Version, trace, s.d.Log.Replica()); err != nil {
		if errors.Is(err, store.ErrRunNotPending) {
			return ErrRunTaken
		}
		return err
	}
	return nil
}

// resumable refuses a run that is not awaiting approval (or its user's
// authorization) now.
func resumable(run *store.Run) error {
	switch {
	case run.Status == store.RunAwaitingAuthorization && run.ExpiresAt != nil && !time.Now().Before(*run.ExpiresAt):
		return &RunExpiredError{Waited: "its user's authorization"}
	case run.Status == store.RunAwaitingApproval && run.ExpiresAt != nil && !time.Now().Before(*run.ExpiresAt),
		run.Status == store.RunExpired:
		return &RunExpiredError{Waited: "approval"}
	case run.Status != store.RunAwaitingApproval && run.Status != store.RunAwaitingAuthorization:
		return &RunNotAwaitingError{Msg: fmt.Sprintf(
			"the run is %s, not awaiting approval: each pending call is decided once", run.Status)}
	}
	return nil
}

// checkDecisions checks a request's decisions against the run's pending
// calls: exactly one per pending call, by its id, and edited arguments
// that the tool's schema accepts.
func checkDecisions(req Resume, st *orchestrator.State, conn *orchestrator.Connector) (map[string]orchestrator.Decision, error) {
	pending := map[string]orchestrator.Call{}
	for _, c := range st.Result.Steps[len(st.Result.Steps)-1].Calls {
		if c.Pending {
			pending[c.ID] = c
		}
	}
	var v violations
	now := time.Now()
	out := make(map[string]orchestrator.Decision, len(pending))
	for i, d := range req.Decisions {
		field, call, ok := match(&v, "decisions", i, "call_id", d.CallID, pending, out,
			"the run has no pending call %q", "call %q is decided twice")
		if !ok {
			continue
		}
		// A message is kept with any decision; a denial's also goes to
		// the model.
		dec := orchestrator.Decision{Kind: d.Kind, Actor: req.ActorID, KeyID: req.KeyID, At: now, Message: d.Message}
		checkDecision(&v, field, d, call, conn, &dec)
		out[d.CallID] = dec
	}
	for id := range pending {
		if _, ok := out[id]; !ok {
			v.add("decisions", "no decision for pending call %q: decide every pending call", id)
		}
	}
	return out, v.err()
}

// checkDecision checks d, of call, adding what is wrong to v under field;
// an approval with edited arguments gets them in dec.
func checkDecision(v *violations, field string, d Decision, call orchestrator.Call, conn *orchestrator.Connector, dec *orchestrator.Decision) {
	switch d.Kind {
	case orchestrator.Approve, orchestrator.Deny:
	case orchestrator.ApproveEdited:
		if d.EditedArguments == nil {
			v.add(field+".edited_arguments", "required with DECISION_KIND_APPROVE_EDITED")
			break
		}
		dec.Arguments = d.EditedArguments
		if err := conn.Validate(call.Tool, dec.Arguments); err != nil {
			v.add(field+".edited_arguments", "invalid for %q: %v", call.Tool, err)
		}
	default:
		v.add(field+".kind", "use DECISION_KIND_APPROVE, DECISION_KIND_APPROVE_EDITED or DECISION_KIND_DENY")
	}
	if d.EditedArguments != nil && d.Kind != orchestrator.ApproveEdited {
		v.add(field+".edited_arguments", "only with DECISION_KIND_APPROVE_EDITED")
	}
	if len(d.Message) > MaxMessageLen {
		v.add(field+".message", "longer than %d characters", MaxMessageLen)
	}
}

// match finds id, which the i-th item of list names (a pending call, an
// open input request), among known; the item's field in the request is
// the first result. An empty id, an unknown one (unknown, a format of the
// id) or one already in given (twice) is a violation of its idField.
func match[T, U any](v *violations, list string, i int, idField, id string, known map[string]T, given map[string]U,
	unknown, twice string) (string, T, bool) {
	field := fmt.Sprintf("%s[%d]", list, i)
	t, ok := known[id]
	_, dup := given[id]
	switch {
	case id == "":
		v.add(field+"."+idField, "required")
	case !ok:
		v.add(field+"."+idField, unknown, id)
	case dup:
		v.add(field+"."+idField, twice, id)
	default:
		return field, t, true
	}
	return field, t, false
}
