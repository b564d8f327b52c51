package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/llm"
	"github.com/connector-svc/connector-svc/internal/oauth"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/runs"
	"github.com/connector-svc/connector-svc/internal/store"
)

// Bounds of a ResumeQuery request.
const (
	maxActorLen       = 200
	maxDenyMessageLen = 2000
)

// resumeRequest is what ResumeQuery and StreamResumeQuery requests share.
type resumeRequest interface {
	GetWorkspaceId() string
	GetRunId() string
	GetDecisions() []*connectorv1.Decision
	GetActorId() string
	GetInputs() []*connectorv1.InputAnswer
}

// ResumeQuery implements connector.v1.ConnectorService.
func (s *Server) ResumeQuery(ctx context.Context, req *connectorv1.ResumeQueryRequest) (*connectorv1.ResumeQueryResponse, error) {
	if resp, done, err := forwardUnary(ctx, s, s.toRun(req.GetWorkspaceId(), req.GetRunId()), req,
		connectorv1.ConnectorServiceClient.ResumeQuery); done {
		return resp, err
	}
	res, err := s.resume(ctx, req, nil)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &connectorv1.ResumeQueryResponse{Result: res}, nil
}

// StreamResumeQuery implements connector.v1.ConnectorService: ResumeQuery,
// with the run's events streamed as StreamQueryConnector streams them.
func (s *Server) StreamResumeQuery(req *connectorv1.StreamResumeQueryRequest, stream connectorv1.ConnectorService_StreamResumeQueryServer) error {
	if done, err := forwardStream(stream.Context(), s, s.toRun(req.GetWorkspaceId(), req.GetRunId()), req,
		connectorv1.ConnectorServiceClient.StreamResumeQuery, stream.Send); done {
		return err
	}
	return serveStream(s, stream, s.cfg.QueryTimeout,
		func(ctx context.Context, send func(*connectorv1.StreamResumeQueryResponse)) (*connectorv1.StreamResumeQueryResponse, error) {
			wrap := func(e *connectorv1.StreamQueryConnectorResponse) {
				send(&connectorv1.StreamResumeQueryResponse{Event: e})
			}
			res, err := s.resume(ctx, req, streamEvents(wrap))
			last, err := lastEvents(res, err, wrap)
			if err != nil {
				return nil, err
			}
			return &connectorv1.StreamResumeQueryResponse{Event: last}, nil
		})
}

// resume checks the decisions against the paused run, claims the run (one
// resume wins) and goes on with it on the connector's live agent.
func (s *Server) resume(ctx context.Context, req resumeRequest, emit func(orchestrator.Event)) (*connectorv1.QueryResult, error) {
	var ch checker
	ch.id("workspace_id", req.GetWorkspaceId())
	if req.GetRunId() == "" {
		ch.add("run_id", "required")
	}
	if len(req.GetActorId()) > maxActorLen {
		ch.add("actor_id", "longer than %d characters", maxActorLen)
	}
	if err := ch.err(); err != nil {
		return nil, err
	}
	if len(req.GetInputs()) > 0 {
		if len(req.GetDecisions()) > 0 {
			ch.add("decisions", "not with inputs: a run awaits either decisions or input")
			return nil, ch.err()
		}
		return s.resumeInput(ctx, req, emit)
	}
	var run *store.Run
	if len(req.GetDecisions()) == 0 {
		// Only a run awaiting its user's authorization goes on without.
		r, err := s.db.GetRun(ctx, req.GetWorkspaceId(), req.GetRunId())
		if err == nil && r.Status == store.RunAwaitingInput {
			ch.add("inputs", "required: one answer per open input request of the run")
			return nil, ch.err()
		}
		if err != nil || r.Status != store.RunAwaitingAuthorization {
			ch.add("decisions", "required: one per pending call of the run")
			return nil, ch.err()
		}
		run = r
	}
	if s.agent == nil {
		return nil, llm.ErrNotConfigured
	}
	if run == nil {
		r, err := s.db.GetRun(ctx, req.GetWorkspaceId(), req.GetRunId())
		if err != nil {
			return nil, err
		}
		run = r
	}
	if run.Status == store.RunAwaitingAuthorization {
		return s.resumeAuthorized(ctx, req, run, emit)
	}
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
	decisions, err := decisionsFromProto(ctx, req, st, conn)
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
func (s *Server) resumingAgent(ctx context.Context, run *store.Run) (*live.Agent, *orchestrator.Connector, error) {
	la, err := s.pausedRunAgent(ctx, run)
	if err != nil {
		return nil, nil, err
	}
	if !s.limits.allow(ctx, la.Row.ID, la.Row.Config.RateLimit) {
		return nil, nil, rateLimited(la.Row.Config.RateLimit)
	}
	cat, err := s.reg.CatalogFor(ctx, run.ConnectorID, run.UserID)
	if err != nil {
		return nil, nil, err
	}
	return la, la.Connector(cat), nil
}

// claimAndResume claims a paused run whose state has its decisions or
// answers (they go in its record) and goes on with it on conn, the
// connector's live agent. Claimed, the run goes on to its end, within
// QUERY_TIMEOUT, even if the caller goes away meanwhile: GetQueryRun shows
// how it ended. Its heartbeat tells the leader this replica still runs it.
func (s *Server) claimAndResume(ctx context.Context, run *store.Run, row *store.Connector, conn *orchestrator.Connector,
	st *orchestrator.State, emit func(orchestrator.Event)) (*connectorv1.QueryResult, error) {
	trace, err := runs.TraceJSON(row.Name, &st.Result)
	if err != nil {
		return nil, err
	}
	if err := s.claim(ctx, run, trace); err != nil {
		return nil, err
	}
	areq := orchestrator.Request{
		Connector: conn, Query: run.Query, Context: run.Context, MaxTools: run.MaxTools, Session: run.SessionID,
		UserID: run.UserID, Throttle: s.limits.throttle(row.ID, row.Config.RateLimit), SamplingBudget: s.samplingBudget(row),
	}
	return s.runLive(ctx, run, row, emit, false, st.Result.Usage,
		func(ctx context.Context, emit func(orchestrator.Event), inputs orchestrator.InputBroker) (*orchestrator.Result, error) {
			areq.Inputs = inputs
			return s.agent.Resume(ctx, areq, st, emit)
		})
}

// claim marks a paused run running here, with trace: one resume wins.
func (s *Server) claim(ctx context.Context, run *store.Run, trace []byte) error {
	if _, err := s.db.ClaimRun(ctx, run.WorkspaceID, run.ID, run.Version, trace, s.runs.Replica()); err != nil {
		if errors.Is(err, store.ErrRunNotPending) {
			return newStatus(codes.Aborted, ReasonRunTaken,
				"the run was resumed by another request meanwhile, or expired; GetQueryRun shows where it is")
		}
		return err
	}
	return nil
}

// resumeInput answers a run's input requests. A run paused live is
// going on here, its tool call open: the answers go to it, and the resume
// waits for its next outcome. A durable one is claimed, and its calls
// that waited run again with the answers, as approved calls do.
func (s *Server) resumeInput(ctx context.Context, req resumeRequest, emit func(orchestrator.Event)) (*connectorv1.QueryResult, error) {
	run, err := s.db.GetRun(ctx, req.GetWorkspaceId(), req.GetRunId())
	if err != nil {
		return nil, err
	}
	if lr := s.liveRuns.get(run.ID); lr != nil {
		answers, err := inputsFromProto(req, lr.reportedInputs())
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
	live := run.Status == store.RunAwaitingInput && run.HeldBy != ""
	switch {
	case live && run.HeldBy != s.runs.Replica() && run.ExpiresAt != nil && time.Now().Before(*run.ExpiresAt):
		// Resumes go where the run's session (or user) is held, which is
		// where its tool call is open: that moved, or is moving.
		return nil, newStatus(codes.Unavailable, ReasonConnectorUnavailable,
			"the run's tool call waits on another replica, which this request did not reach; retry. If that replica "+
				"stopped, the run fails once its heartbeat is missed (GetQueryRun shows it), or expires at its input's deadline")
	case live:
		return nil, notAwaitingInput("the run's input requests are past their deadline, or the replica that held its tool call stopped")
	case run.Status == store.RunAwaitingInput && run.ExpiresAt != nil && !time.Now().Before(*run.ExpiresAt), run.Status == store.RunExpired:
		return nil, newStatus(codes.FailedPrecondition, ReasonRunExpired,
			"the run waited for input longer than APPROVAL_TIMEOUT allows and expired; ask again with QueryConnector")
	case run.Status != store.RunAwaitingInput:
		return nil, notAwaitingInput(fmt.Sprintf("the run is %s, not awaiting input", run.Status))
	}
	if s.agent == nil {
		return nil, llm.ErrNotConfigured
	}
	st, err := orchestrator.DecodeState(run.State)
	if err != nil {
		return nil, err
	}
	answers, err := inputsFromProto(req, st.Result.Inputs)
	if err != nil {
		return nil, err
	}
	la, conn, err := s.resumingAgent(ctx, run)
	if err != nil {
		return nil, err
	}
	for _, in := range st.Result.Inputs {
		s.counts.CountInput(la.Row, in.Mode, answers[in.ID].Action)
	}
	// The answers are in the record before anything runs.
	st.Answered(answers)
	return s.claimAndResume(ctx, run, la.Row, conn, st, emit)
}

// resumable refuses a run that is not awaiting approval now.
func resumable(run *store.Run) error {
	switch {
	case run.Status == store.RunAwaitingAuthorization && run.ExpiresAt != nil && !time.Now().Before(*run.ExpiresAt):
		return newStatus(codes.FailedPrecondition, ReasonRunExpired,
			"the run waited for its user's authorization longer than APPROVAL_TIMEOUT allows and expired; ask again with QueryConnector")
	case run.Status == store.RunAwaitingApproval && run.ExpiresAt != nil && !time.Now().Before(*run.ExpiresAt),
		run.Status == store.RunExpired:
		return newStatus(codes.FailedPrecondition, ReasonRunExpired,
			"the run waited for approval longer than APPROVAL_TIMEOUT allows and expired; ask again with QueryConnector")
	case run.Status != store.RunAwaitingApproval && run.Status != store.RunAwaitingAuthorization:
		return newStatus(codes.FailedPrecondition, ReasonRunNotAwaiting, fmt.Sprintf(
			"the run is %s, not awaiting approval: each pending call is decided once", run.Status))
	}
	return nil
}

// decisionsFromProto checks a request's decisions against the run's
// pending calls: exactly one per pending call, by its id, and edited
// arguments that the tool's schema accepts.
func decisionsFromProto(ctx context.Context, req resumeRequest, st *orchestrator.State, conn *orchestrator.Connector) (map[string]orchestrator.Decision, error) {
	pending := map[string]orchestrator.Call{}
	for _, c := range st.Result.Steps[len(st.Result.Steps)-1].Calls {
		if c.Pending {
			pending[c.ID] = c
		}
	}
	var ch checker
	now := time.Now()
	var keyID string
	if k, ok := auth.KeyFrom(ctx); ok {
		keyID = k.ID
	}
	out := make(map[string]orchestrator.Decision, len(pending))
	for i, d := range req.GetDecisions() {
		field := fmt.Sprintf("decisions[%d]", i)
		call, ok := pending[d.GetCallId()]
		switch {
		case d.GetCallId() == "":
			ch.add(field+".call_id", "required")
			continue
		case !ok:
			ch.add(field+".call_id", "the run has no pending call %q", d.GetCallId())
			continue
		}
		if _, dup := out[d.GetCallId()]; dup {
			ch.add(field+".call_id", "call %q is decided twice", d.GetCallId())
			continue
		}
		// A message is kept with any decision; a denial's also goes to
		// the model.
		dec := orchestrator.Decision{Actor: req.GetActorId(), KeyID: keyID, At: now, Message: d.GetMessage()}
		switch d.GetKind() {
		case connectorv1.DecisionKind_DECISION_KIND_APPROVE:
			dec.Kind = orchestrator.Approve
		case connectorv1.DecisionKind_DECISION_KIND_APPROVE_EDITED:
			dec.Kind = orchestrator.ApproveEdited
			if d.GetEditedArguments() == nil {
				ch.add(field+".edited_arguments", "required with DECISION_KIND_APPROVE_EDITED")
				break
			}
			dec.Arguments = d.GetEditedArguments().AsMap()
			if err := conn.Validate(call.Tool, dec.Arguments); err != nil {
				ch.add(field+".edited_arguments", "invalid for %q: %v", call.Tool, err)
			}
		case connectorv1.DecisionKind_DECISION_KIND_DENY:
			dec.Kind = orchestrator.Deny
		default:
			ch.add(field+".kind", "use DECISION_KIND_APPROVE, DECISION_KIND_APPROVE_EDITED or DECISION_KIND_DENY")
		}
		if d.GetEditedArguments() != nil && dec.Kind != orchestrator.ApproveEdited {
			ch.add(field+".edited_arguments", "only with DECISION_KIND_APPROVE_EDITED")
		}
		if len(d.GetMessage()) > maxDenyMessageLen {
			ch.add(field+".message", "longer than %d characters", maxDenyMessageLen)
		}
		out[d.GetCallId()] = dec
	}
	for id := range pending {
		if _, ok := out[id]; !ok {
			ch.add("decisions", "no decision for pending call %q: decide every pending call", id)
		}
	}
	return out, ch.err()
}

// GetQueryRun implements connector.v1.ConnectorService.
func (s *Server) GetQueryRun(ctx context.Context, req *connectorv1.GetQueryRunRequest) (*connectorv1.GetQueryRunResponse, error) {
	var ch checker
	ch.id("workspace_id", req.GetWorkspaceId())
	if req.GetRunId() == "" {
		ch.add("run_id", "required")
	}
	if err := ch.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	run, err := s.db.GetRun(ctx, req.GetWorkspaceId(), req.GetRunId())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	p, err := s.runToProto(run, true)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &connectorv1.GetQueryRunResponse{Run: p}, nil
}

// ListQueryRuns implements connector.v1.ConnectorService.
func (s *Server) ListQueryRuns(ctx context.Context, req *connectorv1.ListQueryRunsRequest) (*connectorv1.ListQueryRunsResponse, error) {
	var ch checker
	ch.id("workspace_id", req.GetWorkspaceId())
	if req.GetConnectorId() != "" {
		ch.id("connector_id", req.GetConnectorId())
	}
	size, after := ch.page(req.GetPageSize(), req.GetPageToken(), defaultRunPageSize)
	f := store.RunFilter{WorkspaceID: req.GetWorkspaceId(), ConnectorExternalID: req.GetConnectorId(), Before: after, Limit: size + 1}
	if st := req.GetStatus(); st != connectorv1.QueryStatus_QUERY_STATUS_UNSPECIFIED {
		if f.Status = storedStatus(st); f.Status == "" {
			ch.add("status", "unknown value %d", st)
		}
	}
	if t := req.GetStartTime(); t != nil {
		f.Since = t.AsTime()
	}
	if t := req.GetEndTime(); t != nil {
		f.Until = t.AsTime()
	}
	if err := ch.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	runs, err := s.db.ListRuns(ctx, f)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	resp := &connectorv1.ListQueryRunsResponse{}
	runs, resp.NextPageToken = nextPage(runs, size, func(r *store.Run) string { return r.ID })
	for _, r := range runs {
		p, err := s.runToProto(r, false)
		if err != nil {
			return nil, s.toStatus(ctx, err)
		}
		resp.Runs = append(resp.Runs, p)
	}
	return resp, nil
}

const defaultRunPageSize = 50

// runStatusesToProto maps stored run statuses to the API's.
var runStatusesToProto = map[string]connectorv1.QueryStatus{
	store.RunCompleted:             connectorv1.QueryStatus_QUERY_STATUS_COMPLETED,
	store.RunBudgetExhausted:       connectorv1.QueryStatus_QUERY_STATUS_BUDGET_EXHAUSTED,
	store.RunPlanned:               connectorv1.QueryStatus_QUERY_STATUS_PLANNED,
	store.RunAwaitingApproval:      connectorv1.QueryStatus_QUERY_STATUS_AWAITING_APPROVAL,
	store.RunAwaitingAuthorization: connectorv1.QueryStatus_QUERY_STATUS_AWAITING_AUTHORIZATION,
	store.RunAwaitingInput:         connectorv1.QueryStatus_QUERY_STATUS_AWAITING_INPUT,
	store.RunRunning:               connectorv1.QueryStatus_QUERY_STATUS_RUNNING,
	store.RunExpired:               connectorv1.QueryStatus_QUERY_STATUS_EXPIRED,
	store.RunFailed:                connectorv1.QueryStatus_QUERY_STATUS_FAILED,
}

func storedStatus(st connectorv1.QueryStatus) string { return key(runStatusesToProto, st) }

// runToProto renders a run record; full includes the steps' arguments and
// result excerpts. A paused run past its expiry shows as expired, before
// the sweep marks it so.
func (s *Server) runToProto(r *store.Run, full bool) (*connectorv1.QueryRun, error) {
	tr, err := runs.ReadTrace(r.Trace)
	if err != nil {
		return nil, fmt.Errorf("read the trace of run %s: %w", r.ID, err)
	}
	res := s.resultToProto(r.ConnectorExternalID, tr.ConnectorName, &tr.Result)
	res.RunId = r.ID
	res.Duration = durationpb.New(r.Duration)
	p := &connectorv1.QueryRun{
		RunId: r.ID, ConnectorId: r.ConnectorExternalID, SessionId: r.SessionID, Query: r.Query, Context: r.Context,
		MaxTools: int32(r.MaxTools), Status: runStatusesToProto[r.Status], Result: res, Error: r.Error,
		CreateTime: timestamppb.New(r.CreatedAt), UpdateTime: timestamppb.New(r.UpdatedAt),
	}
	if r.FinishedAt != nil {
		p.FinishTime = timestamppb.New(*r.FinishedAt)
	}
	if r.Status == store.RunAwaitingAuthorization {
		// The URL it paused with is single use: ResumeQuery says the
		// current one.
		res.Authorization = &connectorv1.AuthorizationRequired{RunId: r.ID, ConnectorId: r.ConnectorExternalID, UserId: r.UserID,
			Reason: oauth.ReasonNoToken}
		if need := tr.Result.Authorization; need != nil {
			res.Authorization.Reason, res.Authorization.Scopes = need.Reason, need.Scopes
		}
	}
	if r.ExpiresAt != nil && (r.Status == store.RunAwaitingApproval || r.Status == store.RunAwaitingAuthorization ||
		r.Status == store.RunAwaitingInput) {
		res.ExpireTime = timestamppb.New(*r.ExpiresAt)
		if res.Authorization != nil {
			res.Authorization.ExpireTime = res.ExpireTime
		}
		if !time.Now().Before(*r.ExpiresAt) {
			p.Status, res.PendingCalls, res.Authorization, res.InputRequests = connectorv1.QueryStatus_QUERY_STATUS_EXPIRED, nil, nil, nil
		}
	}
	res.Status = p.Status
	if !full {
		for _, st := range res.Steps {
			for _, c := range st.Calls {
				c.Arguments, c.ResultExcerpt = nil, ""
				// What the user filled in is the run's full record's.
				for _, in := range c.Inputs {
					if in.Answer != nil {
						in.Answer.Content = nil
					}
				}
			}
		}
		for _, pc := range res.PendingCalls {
			pc.Arguments = nil
		}
	}
	return p, nil
}

func pendingToProto(pc orchestrator.PendingCall) *connectorv1.PendingCall {
	a := pc.Annotations
	return &connectorv1.PendingCall{
		CallId: pc.Call.ID, Tool: pc.Call.Tool, Arguments: toStruct(pc.Call.Arguments), ToolDescription: pc.Description,
		Annotations: &connectorv1.ToolAnnotations{Title: a.Title, ReadOnlyHint: a.ReadOnlyHint, DestructiveHint: a.DestructiveHint,
			IdempotentHint: a.IdempotentHint, OpenWorldHint: a.OpenWorldHint},
		Reasoning: pc.Reasoning, StepIndex: int32(pc.Step),
	}
}

var decisionKinds = map[orchestrator.DecisionKind]connectorv1.DecisionKind{
	orchestrator.Approve:       connectorv1.DecisionKind_DECISION_KIND_APPROVE,
	orchestrator.ApproveEdited: connectorv1.DecisionKind_DECISION_KIND_APPROVE_EDITED,
	orchestrator.Deny:          connectorv1.DecisionKind_DECISION_KIND_DENY,
}

func decisionToProto(d *orchestrator.Decision) *connectorv1.CallDecision {
	if d == nil {
		return nil
	}
	return &connectorv1.CallDecision{Kind: decisionKinds[d.Kind], OriginalArguments: toStruct(d.OriginalArguments),
		Message: d.Message, ActorId: d.Actor, ApiKeyId: d.KeyID, DecideTime: timestamppb.New(d.At)}
}

// pausedRunAgent is the live agent of a paused run's connector, which must
// still be the one the run paused on and callable.
func (s *Server) pausedRunAgent(ctx context.Context, run *store.Run) (*live.Agent, error) {
	id, err := s.calls.Callable(ctx, run.WorkspaceID, run.ConnectorExternalID)
	if err != nil {
		return nil, err
	}
	if id != run.ConnectorID {
		return nil, newStatus(codes.FailedPrecondition, ReasonRunNotAwaiting,
			"the run's connector was deleted since it paused; the run cannot go on")
	}
	return s.live.Settings(id, func() (*store.Connector, error) {
		return s.calls.ActiveConnector(ctx, run.WorkspaceID, run.ConnectorExternalID)
	})
}
