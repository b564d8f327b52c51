package server

import (
	"context"
	"encoding/json"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/queries"
	"github.com/connector-svc/connector-svc/internal/registry"
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
// not one of them (the queries use case says it in the outcome): it is
// sent by lastEvents, after the run's record is written, so a caller who
// resumes at once finds it.
func streamEvents(send func(*connectorv1.StreamQueryConnectorResponse)) func(orchestrator.Event) {
	return func(e orchestrator.Event) { send(eventToProto(e)) }
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

// query validates and runs a query, and converts its outcome.
func (s *Server) query(ctx context.Context, req queryRequest, emit func(orchestrator.Event)) (*connectorv1.QueryResult, error) {
	start, err := validateQuery(req)
	if err != nil {
		s.settleSession(req.GetWorkspaceId(), req.GetConnectorId(), req.GetSessionId(), req.GetUserId())
		return nil, err
	}
	out, err := s.queries.Start(ctx, start, emit)
	if err != nil {
		return nil, err
	}
	return s.outcomeToProto(out), nil
}

// outcomeToProto renders a run's outcome for its caller.
func (s *Server) outcomeToProto(o *queries.Outcome) *connectorv1.QueryResult {
	p := s.resultToProto(o.Connector.ExternalID, o.Connector.Name, o.Result)
	p.RunId = o.RunID
	if o.ExpiresAt != nil {
		p.ExpireTime = timestamppb.New(*o.ExpiresAt)
	}
	if o.Authorization != nil {
		p.Authorization = authorizationToProto(o.Authorization)
	}
	return p
}

// validateQuery checks a query's request and converts it.
func validateQuery(req queryRequest) (queries.Start, error) {
	var c checker
	c.ref(req.GetWorkspaceId(), req.GetConnectorId())
	switch q := req.GetQuery(); {
	case q == "":
		c.add("query", "required")
	case len(q) > queries.MaxQueryBytes:
		c.add("query", "longer than %d bytes", queries.MaxQueryBytes)
	}
	if len(req.GetContext()) > queries.MaxContextBytes {
		c.add("context", "longer than %d bytes", queries.MaxContextBytes)
	}
	c.sessionID(req.GetSessionId())
	if n := int(req.GetMaxTools()); n != 0 && (n < 1 || n > orchestrator.MaxMaxTools) {
		c.add("max_tools", "must be between 1 and %d (0 means %d)", orchestrator.MaxMaxTools, orchestrator.DefaultMaxTools)
	}
	return queries.Start{WorkspaceID: req.GetWorkspaceId(), ConnectorID: req.GetConnectorId(), Query: req.GetQuery(),
		Context: req.GetContext(), MaxTools: int(req.GetMaxTools()), PlanOnly: req.GetPlanOnly(), SessionID: req.GetSessionId(),
		UserID: req.GetUserId()}, c.err()
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
		Status:           queryStatuses[r.Status],
		Answer:           r.Answer,
		ConnectorId:      connectorID,
		ConnectorName:    name,
		ToolsUsed:        r.ToolsUsed,
		ToolsTotal:       int32(r.ToolsTotal),
		ToolsOffered:     r.ToolsOffered,
		Narrowed:         r.Narrowed,
		SessionRestarted: r.SessionRestarted,
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
	if c.Resource != nil {
		p.ResourceUri, p.ResourceBytes = c.Resource.URI, int64(c.Resource.Bytes)
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
