package queries

import (
	"context"

	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/runs"
	"github.com/connector-svc/connector-svc/internal/store"
)

// resumeAuthorized goes on with run, which paused because its user had
// not authorized the connector: once they have, it claims the run (one
// resume wins) and runs the query from the start, under the same run id,
// as that user (a run that paused at a call runs that call again and goes
// on). Until then it returns an *AuthorizationRequiredError. It takes no
// decisions.
func (s *Service) resumeAuthorized(ctx context.Context, req Resume, run *store.Run, emit func(orchestrator.Event)) (*Outcome, error) {
	if len(req.Decisions) > 0 {
		var v violations
		v.add("decisions", "run %s awaits its user's authorization, not decisions: resume it without decisions once "+
			"user %q has authorized the connector", run.ID, run.UserID)
		return nil, v.err()
	}
	if err := resumable(run); err != nil {
		return nil, err
	}
	la, err := s.pausedRunAgent(ctx, run)
	if err != nil {
		return nil, err
	}
	row := la.Row
	required, err := s.d.Authorizations.Required(ctx, row, run.UserID)
	if err != nil {
		return nil, err
	}
	if required != nil {
		return nil, &AuthorizationRequiredError{Row: row, UserID: run.UserID, RunID: run.ID, Required: required}
	}
	if err := s.d.Limits.Admit(ctx, row); err != nil {
		return nil, err
	}
	cat, err := s.d.Registry.CatalogFor(ctx, run.ConnectorID, run.UserID)
	if required, ok := asRequired(err); ok {
		return nil, &AuthorizationRequiredError{Row: row, UserID: run.UserID, RunID: run.ID, Required: required}
	}
	if err != nil {
		return nil, err
	}
	var st *orchestrator.State
	traced := &orchestrator.Result{}
	if len(run.State) > 0 {
		if st, err = orchestrator.DecodeState(run.State); err != nil {
			return nil, err
		}
		st.Authorized()
		traced = &st.Result
	}
	trace, err := runs.TraceJSON(row.Name, traced)
	if err != nil {
		return nil, err
	}
	if err := s.claim(ctx, run, trace); err != nil {
		return nil, err
	}
	// Claimed, the run goes on to its end, as a resumed approval does.
	areq := s.agentRequest(run, row, la.Connector(cat))
	return s.runLive(ctx, run, row, emit, false, traced.Usage,
		func(ctx context.Context, emit func(orchestrator.Event), inputs orchestrator.InputBroker) (*orchestrator.Result, error) {
			areq.Inputs = inputs
			if st != nil {
				return s.d.Agent.Resume(ctx, areq, st, emit)
			}
			return s.d.Agent.Run(ctx, areq, emit)
		})
}
