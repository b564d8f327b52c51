package server

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/queries"
)

// AnswerInput implements connector.v1.ConnectorService: the answer to an
// input request a StreamCallTool carries, routed as that call was.
func (s *Server) AnswerInput(ctx context.Context, req *connectorv1.AnswerInputRequest) (*connectorv1.AnswerInputResponse, error) {
	var ch checker
	ch.ref(req.GetWorkspaceId(), req.GetConnectorId())
	ch.sessionID(req.GetSessionId())
	if req.GetAnswer() == nil {
		ch.add("answer", "required")
	} else if req.GetAnswer().GetInputId() == "" {
		ch.add("answer.input_id", "required")
	}
	if err := ch.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	if resp, done, err := forwardUnary(ctx, s, s.toCaller(req), req, connectorv1.ConnectorServiceClient.AnswerInput); done {
		return resp, err
	}
	id := req.GetAnswer().GetInputId()
	in, ok := s.calls.Pending(req.GetWorkspaceId(), req.GetConnectorId(), req.GetSessionId(), req.GetUserId(), id)
	if !ok {
		return nil, s.toStatus(ctx, newStatus(codes.NotFound, ReasonInputNotFound, fmt.Sprintf(
			"no input request %q waits for an answer on this connector, session and user: it was answered, its deadline passed, or its call ended", id)))
	}
	ans, bad := queries.CheckAnswer("answer", in, answerFromProto(req.GetAnswer()))
	if len(bad) > 0 {
		return nil, s.toStatus(ctx, &queries.InvalidError{Violations: bad})
	}
	ans.At = time.Now()
	if err := s.calls.Answer(req.GetWorkspaceId(), req.GetConnectorId(), req.GetSessionId(), req.GetUserId(), id, ans); err != nil {
		return nil, s.toStatus(ctx, newStatus(codes.NotFound, ReasonInputNotFound, fmt.Sprintf(
			"input request %q was answered, or its deadline passed, meanwhile", id)))
	}
	return &connectorv1.AnswerInputResponse{}, nil
}
