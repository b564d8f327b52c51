package server

import (
	"context"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/calls"
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
	if err := s.calls.AnswerInput(calls.AnswerRequest{WorkspaceID: req.GetWorkspaceId(), ConnectorID: req.GetConnectorId(),
		SessionID: req.GetSessionId(), UserID: req.GetUserId(), Answer: answerFromProto(req.GetAnswer())}); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &connectorv1.AnswerInputResponse{}, nil
}
