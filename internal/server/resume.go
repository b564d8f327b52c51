package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/oauth"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/queries"
	"github.com/connector-svc/connector-svc/internal/runs"
	"github.com/connector-svc/connector-svc/internal/store"
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

// resume validates a resume's request, goes on with the run, and converts
// its outcome.
func (s *Server) resume(ctx context.Context, req resumeRequest, emit func(orchestrator.Event)) (*connectorv1.QueryResult, error) {
	var ch checker
	ch.id("workspace_id", req.GetWorkspaceId())
	if req.GetRunId() == "" {
		ch.add("run_id", "required")
	}
	if len(req.GetActorId()) > queries.MaxActorLen {
		ch.add("actor_id", "longer than %d characters", queries.MaxActorLen)
	}
	if err := ch.err(); err != nil {
		return nil, err
	}
	r := queries.Resume{WorkspaceID: req.GetWorkspaceId(), RunID: req.GetRunId(), ActorID: req.GetActorId()}
	if k, ok := auth.KeyFrom(ctx); ok {
		r.KeyID = k.ID
	}
	for _, d := range req.GetDecisions() {
		r.Decisions = append(r.Decisions, decisionFromProto(d))
	}
	for _, a := range req.GetInputs() {
		r.Inputs = append(r.Inputs, answerFromProto(a))
	}
	out, err := s.queries.Resume(ctx, r, emit)
	var needed *queries.AuthorizationRequiredError
	if errors.As(err, &needed) {
		// The user must authorize first: say where.
		return nil, s.authorizationNeeded(ctx, needed.Row, needed.UserID, needed.Required, needed.RunID)
	}
	if err != nil {
		return nil, err
	}
	return s.outcomeToProto(out), nil
}

// decisionKindsFromProto are the API's decision kinds; any other is 0.
var decisionKindsFromProto = map[connectorv1.DecisionKind]orchestrator.DecisionKind{
	connectorv1.DecisionKind_DECISION_KIND_APPROVE:        orchestrator.Approve,
	connectorv1.DecisionKind_DECISION_KIND_APPROVE_EDITED: orchestrator.ApproveEdited,
	connectorv1.DecisionKind_DECISION_KIND_DENY:           orchestrator.Deny,
}

func decisionFromProto(d *connectorv1.Decision) queries.Decision {
	out := queries.Decision{CallID: d.GetCallId(), Kind: decisionKindsFromProto[d.GetKind()], Message: d.GetMessage()}
	if d.GetEditedArguments() != nil {
		out.EditedArguments = d.GetEditedArguments().AsMap()
	}
	return out
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
	run, err := s.runs.GetRun(ctx, req.GetWorkspaceId(), req.GetRunId())
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
		summarize(res)
	}
	return p, nil
}

// summarize leaves out of a listed run's result the steps' arguments and
// result excerpts, the users' answers and the pending calls' arguments:
// the run's full record (GetQueryRun) has them.
func summarize(res *connectorv1.QueryResult) {
	for _, st := range res.Steps {
		for _, c := range st.Calls {
			c.Arguments, c.ResultExcerpt = nil, ""
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
