package server

import (
	"net/url"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/queries"
)

// A server's input requests, of query runs (internal/queries holds the
// runs paused live for input) and of direct calls alike, and their
// answers, as the API shows them.

// inputActionsFromProto are the API's input actions; any other is "".
var inputActionsFromProto = map[connectorv1.InputAction]string{
	connectorv1.InputAction_INPUT_ACTION_ACCEPT:  ask.Accept,
	connectorv1.InputAction_INPUT_ACTION_DECLINE: ask.Decline,
	connectorv1.InputAction_INPUT_ACTION_CANCEL:  ask.Cancel,
}

// answerFromProto converts an answer to an input request; queries checks
// it (CheckAnswer).
func answerFromProto(a *connectorv1.InputAnswer) queries.Answer {
	out := queries.Answer{InputID: a.GetInputId(), Action: inputActionsFromProto[a.GetAction()]}
	if a.GetContent() != nil {
		out.Content = a.GetContent().AsMap()
	}
	return out
}

var inputModes = map[string]connectorv1.InputMode{
	ask.ModeForm:     connectorv1.InputMode_INPUT_MODE_FORM,
	ask.ModeURL:      connectorv1.InputMode_INPUT_MODE_URL,
	ask.ModeSampling: connectorv1.InputMode_INPUT_MODE_SAMPLING,
}

var inputActions = map[string]connectorv1.InputAction{
	ask.Accept:  connectorv1.InputAction_INPUT_ACTION_ACCEPT,
	ask.Decline: connectorv1.InputAction_INPUT_ACTION_DECLINE,
	ask.Cancel:  connectorv1.InputAction_INPUT_ACTION_CANCEL,
}

// inputToProto renders an input request of the connector callers know as
// connectorID, named name.
func inputToProto(connectorID, name string, in orchestrator.Input) *connectorv1.InputRequest {
	p := &connectorv1.InputRequest{
		InputId: in.ID, ConnectorId: connectorID, Server: name, CallId: in.CallID, Tool: in.Tool, StepIndex: int32(in.Step),
		Mode: inputModes[in.Mode], Message: in.Message, RequestedSchema: toStruct(in.Schema), DefaultedFields: in.Defaulted, Url: in.URL, Durable: in.Durable,
	}
	if u, err := url.Parse(in.URL); err == nil && in.URL != "" {
		p.UrlHost = u.Hostname()
	}
	if sm := in.Sampling; sm != nil {
		p.Sampling = &connectorv1.SamplingRequest{SystemPrompt: sm.SystemPrompt, Messages: sm.Messages, MaxTokens: int32(sm.MaxTokens),
			Tools: sm.Tools}
	}
	if !in.Deadline.IsZero() {
		p.Deadline = timestamppb.New(in.Deadline)
	}
	if a := in.Answer; a != nil {
		p.Answer = &connectorv1.InputAnswer{InputId: in.ID, Action: inputActions[a.Action], Content: toStruct(a.Content), ActorId: a.Actor}
		if !a.At.IsZero() {
			p.Answer.AnswerTime = timestamppb.New(a.At)
		}
	}
	return p
}

func samplingToProto(call orchestrator.Call, rec ask.SamplingRecord) *connectorv1.SamplingCall {
	return &connectorv1.SamplingCall{CallId: call.ID, Tool: call.Tool, Model: rec.Model, Messages: int32(rec.Messages),
		PromptTokens: rec.PromptTokens, CompletionTokens: rec.CompletionTokens, StopReason: rec.StopReason, ToolUses: rec.ToolUses,
		Error: rec.Err, Duration: durationpb.New(rec.Duration), ResultExcerpt: rec.ResultExcerpt}
}
