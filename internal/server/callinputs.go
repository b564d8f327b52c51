package server

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/mark3labs/mcp-go/mcp"
	"google.golang.org/grpc/codes"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/pending"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/store"
)

// A direct tool call's server may ask too. StreamCallTool sends each
// request on the stream (input_required) and waits for AnswerInput, routed
// to this replica as the call was, until the request's deadline (then
// cancel). A unary CallTool cannot carry a request: each is answered
// cancel at once and listed in the response (cancelled_inputs). On the
// sessionless protocol the call ends needing input instead: the stream
// asks, and the call is sent again with the answers, for a few rounds at
// most; a unary call is sent again once with cancel answers.

// maxInputRounds bounds how many times a direct call is sent again with
// answers.
const maxInputRounds = 5

// callOwner is a direct call, by the connector, session and user that
// AnswerInput must name, as the owner of pending requests.
func callOwner(workspaceID, connectorID, sessionID, userID string) pending.Owner {
	return pending.Owner("call\x00" + workspaceID + "\x00" + connectorID + "\x00" + sessionID + "\x00" + userID)
}

// callAsker is the ask.Asker of one direct tool call.
type callAsker struct {
	s    *Server
	row  *store.Connector
	req  callRequest
	user string
	// send sends on the call's stream; nil for a unary call.
	send   func(*connectorv1.StreamCallToolResponse)
	budget *ask.Budget

	mu        sync.Mutex
	cancelled []*connectorv1.InputRequest
}

func (s *Server) newCallAsker(row *store.Connector, req callRequest, user string, send func(*connectorv1.StreamCallToolResponse)) *callAsker {
	return &callAsker{s: s, row: row, req: req, user: user, send: send, budget: s.samplingBudget(row)}
}

// Elicit implements ask.Asker.
func (a *callAsker) Elicit(ctx context.Context, call ask.Call, in ask.Input) (ask.Answer, error) {
	in.ID = "in_" + uuid.NewString()
	a.s.countInput(a.row, in.Mode, "asked")
	render := inputToProto(a.req.GetConnectorId(), a.row.Name, orchestrator.Input{Input: in, Tool: call.Tool})
	if a.send == nil && in.Mode == ask.ModeSampling {
		// Nobody can approve a sampling request here: it is refused.
		a.s.countInput(a.row, in.Mode, "unanswerable")
		return ask.Answer{}, ask.ErrNobodyToAsk
	}
	if a.send == nil {
		// A unary call carries no request: cancel, and say so.
		a.mu.Lock()
		a.cancelled = append(a.cancelled, render)
		a.mu.Unlock()
		a.s.countInput(a.row, in.Mode, "unanswerable")
		return ask.Answer{Action: ask.Cancel, At: time.Now()}, nil
	}
	req := a.s.asks.Open(callOwner(a.req.GetWorkspaceId(), a.req.GetConnectorId(), a.req.GetSessionId(), a.req.GetUserId()), in)
	wait, cancel := ctx, context.CancelFunc(func() {})
	if !in.Deadline.IsZero() {
		wait, cancel = context.WithDeadline(ctx, in.Deadline)
	}
	defer cancel()
	a.send(&connectorv1.StreamCallToolResponse{Event: &connectorv1.StreamCallToolResponse_InputRequired{InputRequired: render}})
	// An answer that came as the deadline passed counts.
	if ans, ok := req.Wait(wait); ok {
		a.s.countInput(a.row, in.Mode, ans.Action)
		return ans, nil
	}
	a.s.countInput(a.row, in.Mode, "timeout")
	return ask.Answer{Action: ask.Cancel, At: time.Now()}, nil
}

// Sampling implements ask.Asker: a budget per direct call.
func (a *callAsker) Sampling() *ask.Budget { return a.budget }

// Sampled implements ask.Asker: the request counts in the connector's
// counters, its tokens with the model's.
func (a *callAsker) Sampled(_ ask.Call, rec ask.SamplingRecord) {
	now := time.Now()
	d := store.Counters{PromptTokens: rec.PromptTokens, CompletionTokens: rec.CompletionTokens, LastUsedAt: &now}
	if rec.Err == "" {
		d.Samplings = 1
	}
	a.s.counts.add(a.row.ID, d)
}

// callWithInputs runs a direct call with a asking for it: a call that
// ends needing input is sent again once answered.
func (s *Server) callWithInputs(ctx context.Context, a *callAsker, id int64, tool string, args map[string]any, opts registry.CallOptions) (*mcp.CallToolResult, error) {
	ctx = ask.With(ctx, a, ask.Call{Tool: tool})
	res, err := s.reg.CallTool(ctx, id, tool, args, opts)
	for round := 0; err != nil; round++ {
		var ire *ask.InputRequiredError
		var ure *ask.URLRequiredError
		switch {
		case errors.As(err, &ire):
			if round >= maxInputRounds || (a.send == nil && round > 0) {
				return nil, newStatus(codes.FailedPrecondition, ReasonInputRequired, fmt.Sprintf(
					"the server still needs the user's input after %d answered round(s); call the tool with StreamCallTool and answer its input requests", round))
			}
			retry := &ask.Retry{RequestState: ire.RequestState, Served: ire.Served, Answers: map[string]ask.Answer{}}
			for _, in := range ire.Inputs {
				key := in.ID
				ans, _ := a.Elicit(ctx, ask.Call{Tool: tool}, in)
				retry.Answers[key] = ans
			}
			opts.Retry = retry
		case errors.As(err, &ure):
			if a.send == nil {
				return nil, newStatus(codes.FailedPrecondition, ReasonInputRequired, fmt.Sprintf(
					"the server needs the user to open a URL (%s) before the call can run, which a unary CallTool cannot ask; use StreamCallTool",
					urlHosts(ure.Inputs)))
			}
			if round >= maxInputRounds {
				return nil, newStatus(codes.FailedPrecondition, ReasonInputRequired, "the server still needs the user to open a URL after they said they had")
			}
			for _, in := range ure.Inputs {
				in.Mode = ask.ModeURL
				if ans, _ := a.Elicit(ctx, ask.Call{Tool: tool}, in); ans.Action != ask.Accept {
					return nil, newStatus(codes.FailedPrecondition, ReasonInputRequired, fmt.Sprintf(
						"the user answered %s to the server's request to open a URL; the call was not tried again", ans.Action))
				}
			}
			opts.Retry = nil
		default:
			return res, err
		}
		res, err = s.reg.CallTool(ctx, id, tool, args, opts)
	}
	return res, err
}

// urlHosts names the hosts of URL inputs.
func urlHosts(ins []ask.Input) string {
	var hosts []string
	for _, in := range ins {
		if u, err := url.Parse(in.URL); err == nil && u.Hostname() != "" {
			hosts = append(hosts, u.Hostname())
		}
	}
	if len(hosts) == 0 {
		return "no host given"
	}
	return strings.Join(hosts, ", ")
}

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
	owner := callOwner(req.GetWorkspaceId(), req.GetConnectorId(), req.GetSessionId(), req.GetUserId())
	in, ok := s.asks.Lookup(owner, req.GetAnswer().GetInputId())
	if !ok {
		return nil, s.toStatus(ctx, newStatus(codes.NotFound, ReasonInputNotFound, fmt.Sprintf(
			"no input request %q waits for an answer on this connector, session and user: it was answered, its deadline passed, or its call ended",
			req.GetAnswer().GetInputId())))
	}
	ans, _ := answerFromProto(&ch, "answer", in, req.GetAnswer())
	if err := ch.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	ans.At = time.Now()
	if err := s.asks.Answer(owner, map[string]ask.Answer{in.ID: ans}); err != nil {
		return nil, s.toStatus(ctx, newStatus(codes.NotFound, ReasonInputNotFound, fmt.Sprintf(
			"input request %q was answered, or its deadline passed, meanwhile", req.GetAnswer().GetInputId())))
	}
	return &connectorv1.AnswerInputResponse{}, nil
}
