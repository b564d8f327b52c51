package server

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/llm"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/runs"
	"github.com/connector-svc/connector-svc/internal/store"
)

const (
	maxQueryLen   = 32 << 10
	maxContextLen = 64 << 10
)

// queryRequest is what QueryConnector and StreamQueryConnector requests
// share.
type queryRequest interface {
	GetWorkspaceId() string
	GetConnectorId() string
	GetQuery() string
	GetContext() string
	GetMaxTools() int32
	GetPlanOnly() bool
	GetSessionId() string
	GetUserId() string
}

// QueryConnector implements connector.v1.ConnectorService.
func (s *Server) QueryConnector(ctx context.Context, req *connectorv1.QueryConnectorRequest) (*connectorv1.QueryConnectorResponse, error) {
	if resp, done, err := forwardUnary(ctx, s, s.toCaller(req), req, connectorv1.ConnectorServiceClient.QueryConnector); done {
		return resp, err
	}
	res, err := s.query(ctx, req, nil)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &connectorv1.QueryConnectorResponse{Result: res}, nil
}

// StreamQueryConnector implements connector.v1.ConnectorService: the same
// run as QueryConnector, streamed. The caller cancelling the stream
// cancels the run and its tool calls.
func (s *Server) StreamQueryConnector(req *connectorv1.StreamQueryConnectorRequest, stream connectorv1.ConnectorService_StreamQueryConnectorServer) error {
	if done, err := forwardStream(stream.Context(), s, s.toCaller(req), req, connectorv1.ConnectorServiceClient.StreamQueryConnector,
		stream.Send); done {
		return err
	}
	return serveStream(s, stream, s.cfg.QueryTimeout,
		func(ctx context.Context, send func(*connectorv1.StreamQueryConnectorResponse)) (*connectorv1.StreamQueryConnectorResponse, error) {
			res, err := s.query(ctx, req, streamEvents(send))
			return lastEvents(res, err, send)
		})
}

// streamEvents sends a run's events as a stream's messages. A pause is
// sent by lastEvents instead: after the run's record is written, so a
// caller who resumes at once finds it.
func streamEvents(send func(*connectorv1.StreamQueryConnectorResponse)) func(orchestrator.Event) {
	return func(e orchestrator.Event) {
		if e.Kind != orchestrator.EventApprovalRequired && e.Kind != orchestrator.EventInputRequired {
			send(eventToProto(e))
		}
	}
}

// lastEvents ends a query stream: approval_required or
// authorization_required if the run paused, then the result.
func lastEvents(res *connectorv1.QueryResult, err error, send func(*connectorv1.StreamQueryConnectorResponse)) (*connectorv1.StreamQueryConnectorResponse, error) {
	if err != nil {
		return nil, err
	}
	if res.Status == connectorv1.QueryStatus_QUERY_STATUS_AWAITING_APPROVAL {
		send(&connectorv1.StreamQueryConnectorResponse{Event: &connectorv1.StreamQueryConnectorResponse_ApprovalRequired{
			ApprovalRequired: &connectorv1.ApprovalRequired{RunId: res.RunId, PendingCalls: res.PendingCalls, ExpireTime: res.ExpireTime}}})
	}
	if res.Status == connectorv1.QueryStatus_QUERY_STATUS_AWAITING_AUTHORIZATION {
		send(&connectorv1.StreamQueryConnectorResponse{Event: &connectorv1.StreamQueryConnectorResponse_AuthorizationRequired{
			AuthorizationRequired: res.Authorization}})
	}
	if res.Status == connectorv1.QueryStatus_QUERY_STATUS_AWAITING_INPUT {
		send(&connectorv1.StreamQueryConnectorResponse{Event: &connectorv1.StreamQueryConnectorResponse_InputRequired{
			InputRequired: &connectorv1.InputRequired{RunId: res.RunId, InputRequests: res.InputRequests, ExpireTime: res.ExpireTime}}})
	}
	return &connectorv1.StreamQueryConnectorResponse{Event: &connectorv1.StreamQueryConnectorResponse_Result{Result: res}}, nil
}

// query validates, checks the connector can be used now, runs its live
// agent and counts the run. Nothing is read from the store on the way,
// once the connector's settings are known (agents).
func (s *Server) query(ctx context.Context, req queryRequest, emit func(orchestrator.Event)) (*connectorv1.QueryResult, error) {
	defer s.settleSession(req.GetWorkspaceId(), req.GetConnectorId(), req.GetSessionId(), req.GetUserId())
	maxTools, err := validateQuery(req)
	if err != nil {
		return nil, err
	}
	if s.agent == nil {
		return nil, llm.ErrNotConfigured
	}
	id, err := s.calls.Callable(ctx, req.GetWorkspaceId(), req.GetConnectorId())
	if err != nil {
		return nil, err
	}
	la, err := s.live.Settings(id, func() (*store.Connector, error) {
		return s.calls.ActiveConnector(ctx, req.GetWorkspaceId(), req.GetConnectorId())
	})
	if err != nil {
		return nil, err
	}
	c := la.Row
	// Checked before the model runs: its tool calls would each fail. A
	// plan runs no tool, so it needs no session.
	if c.Config.SessionMode == registry.SessionPerSession && req.GetSessionId() == "" && !req.GetPlanOnly() {
		return nil, sessionRequired()
	}
	user, err := userFor(c, req.GetUserId())
	if err != nil {
		return nil, err
	}
	if !s.limits.allow(ctx, c.ID, c.Config.RateLimit) {
		return nil, rateLimited(c.Config.RateLimit)
	}
	run := &store.Run{ID: runs.NewID(), WorkspaceID: c.WorkspaceID, ConnectorID: c.ID, ConnectorExternalID: c.ExternalID,
		SessionID: req.GetSessionId(), UserID: user, Query: req.GetQuery(), Context: req.GetContext(), MaxTools: maxTools,
		CreatedAt: time.Now()}
	// A plan runs no tool, so it needs no token; a run does: without one
	// it waits for the user to authorize.
	if user != "" && !req.GetPlanOnly() {
		if required, err := s.usable(ctx, c, user); err != nil || required != nil {
			if err != nil {
				return nil, err
			}
			s.countQuery(c, nil, nil, true, orchestrator.Usage{})
			return s.pauseForAuthorization(ctx, run, c, required)
		}
	}
	var cat registry.Catalog
	if req.GetPlanOnly() {
		cat, err = s.reg.Catalog(ctx, id)
	} else {
		cat, err = s.reg.CatalogFor(ctx, id, user)
	}
	if required, ok := asRequired(err); ok && user != "" {
		s.countQuery(c, nil, nil, true, orchestrator.Usage{})
		return s.pauseForAuthorization(ctx, run, c, required)
	}
	if err != nil {
		return nil, err
	}
	// The agent's tool calls run on the session's connection, for a
	// per_session connector, on the user's for an oauth_user one. The run
	// goes on detached from the caller, who waits for its end or its
	// first live pause for input.
	areq := orchestrator.Request{
		Connector: la.Connector(cat), Query: req.GetQuery(), Context: req.GetContext(), MaxTools: maxTools, PlanOnly: req.GetPlanOnly(),
		Session: req.GetSessionId(), UserID: user,
		Throttle:       s.limits.throttle(c.ID, c.Config.RateLimit),
		SamplingBudget: s.samplingBudget(c),
	}
	return s.runLive(ctx, run, c, emit, true, orchestrator.Usage{},
		func(ctx context.Context, emit func(orchestrator.Event), inputs orchestrator.InputBroker) (*orchestrator.Result, error) {
			areq.Inputs = inputs
			return s.agent.Run(ctx, areq, emit)
		})
}

// samplingBudget is a new sampling budget of connector c's, for one run
// or one direct call; nil for none.
func (s *Server) samplingBudget(c *store.Connector) *ask.Budget {
	if s.cfg.SamplingBudget == nil {
		return nil
	}
	return s.cfg.SamplingBudget(c)
}

// endRun records a run that ended with res and err, and renders its
// result for the caller.
func (s *Server) endRun(ctx context.Context, run *store.Run, c *store.Connector, res *orchestrator.Result, runErr error, resumed bool) (*connectorv1.QueryResult, error) {
	rec, err := runs.Record(run, c.Name, res, runErr, s.runErrorMessage(ctx, runErr), s.cfg.ApprovalTimeout)
	if err == nil {
		err = s.runs.Keep(ctx, rec, resumed)
	}
	if err != nil && rec != nil && (rec.Status == store.RunAwaitingApproval || rec.Status == store.RunAwaitingAuthorization ||
		rec.Status == store.RunAwaitingInput) {
		// Without its record the run could never be resumed.
		return nil, err
	}
	if err != nil {
		s.logger.ErrorContext(ctx, "record query run", slog.String("run_id", run.ID), slog.String("error", err.Error()))
	}
	if runErr != nil {
		return nil, runErr
	}
	p := s.resultToProto(c.ExternalID, c.Name, res)
	p.RunId = run.ID
	if rec != nil && rec.ExpiresAt != nil {
		p.ExpireTime = timestamppb.New(*rec.ExpiresAt)
	}
	if res.Status == orchestrator.StatusAwaitingInput {
		for _, in := range res.Inputs {
			s.counts.CountInput(c, in.Mode, "asked")
		}
	}
	if res.Status == orchestrator.StatusAwaitingAuthorization && res.Authorization != nil {
		// A call met the user's missing (or too narrow) authorization:
		// where to send them.
		ar, err := s.startFor(ctx, c, run.UserID, res.Authorization.Reason, res.Authorization.Scopes)
		if err != nil {
			return nil, err
		}
		// Its expire_time is the URL's; the run's (p.ExpireTime) is later.
		ar.RunId = run.ID
		p.Authorization = ar
	}
	return p, nil
}

func validateQuery(req queryRequest) (int, error) {
	var c checker
	c.ref(req.GetWorkspaceId(), req.GetConnectorId())
	switch q := req.GetQuery(); {
	case q == "":
		c.add("query", "required")
	case len(q) > maxQueryLen:
		c.add("query", "longer than %d bytes", maxQueryLen)
	}
	if len(req.GetContext()) > maxContextLen {
		c.add("context", "longer than %d bytes", maxContextLen)
	}
	c.sessionID(req.GetSessionId())
	n := int(req.GetMaxTools())
	switch {
	case n == 0:
		n = orchestrator.DefaultMaxTools
	case n < 1 || n > orchestrator.MaxMaxTools:
		c.add("max_tools", "must be between 1 and %d (0 means %d)", orchestrator.MaxMaxTools, orchestrator.DefaultMaxTools)
	}
	return n, c.err()
}

// countQuery counts a run in the connector's counters, the tokens of a
// failed run included (those of the sampling requests it answered too);
// they reach the store in the background. A resumed run (newQuery false)
// adds the tokens it spent since before, not another query.
func (s *Server) countQuery(c *store.Connector, res *orchestrator.Result, runErr error, newQuery bool, before orchestrator.Usage) {
	now := time.Now()
	d := store.Counters{LastUsedAt: &now}
	if newQuery {
		d.Queries = 1
	}
	if runErr != nil {
		d.QueryErrors = 1
	}
	if res != nil {
		d.PromptTokens, d.CompletionTokens = res.Usage.PromptTokens-before.PromptTokens, res.Usage.CompletionTokens-before.CompletionTokens
		d.Samplings = res.Usage.SamplingRequests - before.SamplingRequests
	}
	s.counts.Add(c.ID, d)
}

var queryStatuses = map[orchestrator.Status]connectorv1.QueryStatus{
	orchestrator.StatusCompleted:             connectorv1.QueryStatus_QUERY_STATUS_COMPLETED,
	orchestrator.StatusBudgetExhausted:       connectorv1.QueryStatus_QUERY_STATUS_BUDGET_EXHAUSTED,
	orchestrator.StatusPlanned:               connectorv1.QueryStatus_QUERY_STATUS_PLANNED,
	orchestrator.StatusAwaitingApproval:      connectorv1.QueryStatus_QUERY_STATUS_AWAITING_APPROVAL,
	orchestrator.StatusAwaitingAuthorization: connectorv1.QueryStatus_QUERY_STATUS_AWAITING_AUTHORIZATION,
	orchestrator.StatusAwaitingInput:         connectorv1.QueryStatus_QUERY_STATUS_AWAITING_INPUT,
}

// resultToProto converts a run's result, of the connector callers know
// as connectorID. Its contexts are cut to what the response has room for.
func (s *Server) resultToProto(connectorID, name string, r *orchestrator.Result) *connectorv1.QueryResult {
	p := &connectorv1.QueryResult{
		Status:        queryStatuses[r.Status],
		Answer:        r.Answer,
		ConnectorId:   connectorID,
		ConnectorName: name,
		ToolsUsed:     r.ToolsUsed,
		ToolsTotal:    int32(r.ToolsTotal),
		ToolsOffered:  r.ToolsOffered,
		Narrowed:      r.Narrowed,
		Usage: &connectorv1.TokenUsage{PromptTokens: r.Usage.PromptTokens, CompletionTokens: r.Usage.CompletionTokens,
			TotalTokens: r.Usage.TotalTokens},
		Duration: durationpb.New(r.Duration),
	}
	for _, st := range r.Steps {
		p.Steps = append(p.Steps, stepToProto(st))
	}
	for _, pt := range r.Plan {
		p.Plan = append(p.Plan, &connectorv1.PlannedTool{Tool: pt.Tool, Purpose: pt.Purpose})
	}
	for _, pc := range r.Pending {
		p.PendingCalls = append(p.PendingCalls, pendingToProto(pc))
	}
	for _, in := range r.Inputs {
		p.InputRequests = append(p.InputRequests, inputToProto(connectorID, name, in))
	}
	p.Contexts = contextsToProto(r.Contexts, s.contextBudget(proto.Size(p)))
	return p
}

func stepToProto(st orchestrator.Step) *connectorv1.Step {
	p := &connectorv1.Step{Index: int32(st.Index), Reasoning: st.Reasoning}
	for _, c := range st.Calls {
		p.Calls = append(p.Calls, callToProto(c))
	}
	return p
}

func callToProto(c orchestrator.Call) *connectorv1.ToolCall {
	p := &connectorv1.ToolCall{
		Id: c.ID, Tool: c.Tool, Arguments: toStruct(c.Arguments), ResultExcerpt: c.ResultExcerpt,
		IsError: c.IsError, RejectedReason: c.RejectedReason, Duration: durationpb.New(c.Duration),
		Pending: c.Pending, Decision: decisionToProto(c.Decision), TaskId: c.TaskID,
	}
	// The inputs' connector and server are the run's: its caller knows them.
	for _, in := range c.Inputs {
		p.Inputs = append(p.Inputs, inputToProto("", "", in))
	}
	for _, rec := range c.Samplings {
		p.Samplings = append(p.Samplings, samplingToProto(c, rec))
	}
	return p
}

// toStruct converts a JSON object; values structpb cannot hold go through
// JSON first.
func toStruct(m map[string]any) *structpb.Struct {
	if m == nil {
		return nil
	}
	st, err := structpb.NewStruct(m)
	if err == nil {
		return st
	}
	b, _ := json.Marshal(m)
	st = &structpb.Struct{}
	if st.UnmarshalJSON(b) != nil {
		return nil
	}
	return st
}

func eventToProto(e orchestrator.Event) *connectorv1.StreamQueryConnectorResponse {
	switch e.Kind {
	case orchestrator.EventStepPlanned:
		return &connectorv1.StreamQueryConnectorResponse{Event: &connectorv1.StreamQueryConnectorResponse_StepPlanned{
			StepPlanned: &connectorv1.StepPlanned{Step: stepToProto(e.Step)}}}
	case orchestrator.EventToolCallStarted:
		return &connectorv1.StreamQueryConnectorResponse{Event: &connectorv1.StreamQueryConnectorResponse_ToolCallStarted{
			ToolCallStarted: &connectorv1.ToolCallStarted{StepIndex: int32(e.Index), Call: callToProto(e.Call)}}}
	case orchestrator.EventToolCallProgress:
		return &connectorv1.StreamQueryConnectorResponse{Event: &connectorv1.StreamQueryConnectorResponse_ToolCallProgress{
			ToolCallProgress: &connectorv1.ToolCallProgress{StepIndex: int32(e.Index), CallId: e.Call.ID, Tool: e.Call.Tool,
				Progress: progressToProto(registry.Progress(e.Progress))}}}
	case orchestrator.EventToolCallFinished:
		return &connectorv1.StreamQueryConnectorResponse{Event: &connectorv1.StreamQueryConnectorResponse_ToolCallFinished{
			ToolCallFinished: &connectorv1.ToolCallFinished{StepIndex: int32(e.Index), Call: callToProto(e.Call)}}}
	default:
		return &connectorv1.StreamQueryConnectorResponse{Event: &connectorv1.StreamQueryConnectorResponse_Answer{
			Answer: &connectorv1.AnswerReady{Answer: e.Answer}}}
	}
}
