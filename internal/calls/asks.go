package calls

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/pending"
	"github.com/connector-svc/connector-svc/internal/queries"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/store"
)

// A direct tool call's server may ask too. A caller that carries
// questions (Request.Ask: a stream) is handed each request once it waits
// in the table, and the answer (Answer, routed to this replica as the call
// was) reaches it until the request's deadline (then cancel). A unary call
// cannot carry a request: each is answered cancel at once and listed in
// the result. On the sessionless protocol the call ends needing input
// instead: the caller is asked, and the call is sent again with the
// answers, for a few rounds at most; a unary call is sent again once with
// cancel answers.

// maxInputRounds bounds how many times a direct call is sent again with
// answers.
const maxInputRounds = 5

// Owner is a direct call, by the connector, session and user that an
// answer must name, as the owner of its pending requests.
func Owner(workspaceID, connectorID, sessionID, userID string) pending.Owner {
	return pending.Owner("call\x00" + workspaceID + "\x00" + connectorID + "\x00" + sessionID + "\x00" + userID)
}

// Pending returns the request id that waits for an answer from this
// connector, session and user, so that a front door can check an answer
// against it; false if none waits.
func (s *Service) Pending(workspaceID, connectorID, sessionID, userID, id string) (ask.Input, bool) {
	return s.d.Asks.Lookup(Owner(workspaceID, connectorID, sessionID, userID), id)
}

// Answer delivers a to request id of a direct call of this connector,
// session and user. Returns an error that Is pending.ErrNotOpen if it does
// not wait (answered, past its deadline, its call ended).
func (s *Service) Answer(workspaceID, connectorID, sessionID, userID, id string, a ask.Answer) error {
	return s.d.Asks.Answer(Owner(workspaceID, connectorID, sessionID, userID), map[string]ask.Answer{id: a})
}

// AnswerRequest is a caller's answer to a question of a direct call of
// its connector, session and user.
type AnswerRequest struct {
	WorkspaceID, ConnectorID, SessionID, UserID string
	Answer                                      queries.Answer
}

// AnswerInput delivers req's answer to the question, of a direct call of
// the same connector, session and user, that waits for it here. The
// answer is checked against the question (queries.CheckAnswer: a
// *queries.InvalidError naming "answer"); a question that does not wait,
// or no longer, is an *InputNotFoundError.
func (s *Service) AnswerInput(req AnswerRequest) error {
	id := req.Answer.InputID
	in, ok := s.Pending(req.WorkspaceID, req.ConnectorID, req.SessionID, req.UserID, id)
	if !ok {
		return &InputNotFoundError{ID: id}
	}
	ans, bad := queries.CheckAnswer("answer", in, req.Answer)
	if len(bad) > 0 {
		return &queries.InvalidError{Violations: bad}
	}
	ans.At = time.Now()
	if err := s.Answer(req.WorkspaceID, req.ConnectorID, req.SessionID, req.UserID, id, ans); err != nil {
		return &InputNotFoundError{ID: id, Meanwhile: true}
	}
	return nil
}

// asker is the ask.Asker of one direct call.
type asker struct {
	s      *Service
	row    *store.Connector
	req    Request
	budget *ask.Budget

	mu        sync.Mutex
	cancelled []orchestrator.Input
}

func (s *Service) newAsker(row *store.Connector, req Request) *asker {
	a := &asker{s: s, row: row, req: req}
	if s.d.SamplingBudget != nil {
		a.budget = s.d.SamplingBudget(row)
	}
	return a
}

func (a *asker) cancelledInputs() []orchestrator.Input {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cancelled
}

// Elicit implements ask.Asker.
func (a *asker) Elicit(ctx context.Context, call ask.Call, in ask.Input) (ask.Answer, error) {
	in.ID = "in_" + uuid.NewString()
	count := a.s.d.Counters.CountInput
	count(a.row, in.Mode, "asked")
	if a.req.Ask == nil && in.Mode == ask.ModeSampling {
		// Nobody can approve a sampling request here: it is refused.
		count(a.row, in.Mode, "unanswerable")
		return ask.Answer{}, ask.ErrNobodyToAsk
	}
	if a.req.Ask == nil {
		// A unary call carries no request: cancel, and say so.
		a.mu.Lock()
		a.cancelled = append(a.cancelled, orchestrator.Input{Input: in, Tool: call.Tool})
		a.mu.Unlock()
		count(a.row, in.Mode, "unanswerable")
		return ask.Answer{Action: ask.Cancel, At: time.Now()}, nil
	}
	r := a.s.d.Asks.Open(Owner(a.req.WorkspaceID, a.req.ConnectorID, a.req.SessionID, a.req.UserID), in)
	wait, cancel := ctx, context.CancelFunc(func() {})
	if !in.Deadline.IsZero() {
		wait, cancel = context.WithDeadline(ctx, in.Deadline)
	}
	defer cancel()
	a.req.Ask(a.row.Name, orchestrator.Input{Input: in, Tool: call.Tool})
	// An answer that came as the deadline passed counts.
	if ans, ok := r.Wait(wait); ok {
		count(a.row, in.Mode, ans.Action)
		return ans, nil
	}
	count(a.row, in.Mode, "timeout")
	return ask.Answer{Action: ask.Cancel, At: time.Now()}, nil
}

// Sampling implements ask.Asker: a budget per direct call.
func (a *asker) Sampling() *ask.Budget { return a.budget }

// Sampled implements ask.Asker: the request counts in the connector's
// counters, its tokens with the model's.
func (a *asker) Sampled(_ ask.Call, rec ask.SamplingRecord) {
	now := time.Now()
	d := store.Counters{PromptTokens: rec.PromptTokens, CompletionTokens: rec.CompletionTokens, LastUsedAt: &now}
	if rec.Err == "" {
		d.Samplings = 1
	}
	a.s.d.Counters.Add(a.row.ID, d)
}

// callWithInputs runs a direct call with a asking for it: a call that
// ends needing input is sent again once answered.
func (s *Service) callWithInputs(ctx context.Context, a *asker, id int64, tool string, args map[string]any, opts registry.CallOptions) (*mcp.CallToolResult, error) {
	ctx = ask.With(ctx, a, ask.Call{Tool: tool})
	res, err := s.d.Registry.CallTool(ctx, id, tool, args, opts)
	for round := 0; err != nil; round++ {
		var ire *ask.InputRequiredError
		var ure *ask.URLRequiredError
		switch {
		case errors.As(err, &ire):
			if round >= maxInputRounds || (a.req.Ask == nil && round > 0) {
				return nil, &InputRequiredError{Rounds: round}
			}
			retry := &ask.Retry{RequestState: ire.RequestState, Served: ire.Served, Answers: map[string]ask.Answer{}}
			for _, in := range ire.Inputs {
				key := in.ID
				ans, _ := a.Elicit(ctx, ask.Call{Tool: tool}, in)
				retry.Answers[key] = ans
			}
			opts.Retry = retry
		case errors.As(err, &ure):
			if a.req.Ask == nil {
				return nil, &InputRequiredError{URLHosts: urlHosts(ure.Inputs), Unary: true}
			}
			if round >= maxInputRounds {
				return nil, &InputRequiredError{URLHosts: urlHosts(ure.Inputs), Rounds: round}
			}
			for _, in := range ure.Inputs {
				in.Mode = ask.ModeURL
				if ans, _ := a.Elicit(ctx, ask.Call{Tool: tool}, in); ans.Action != ask.Accept {
					return nil, &InputRequiredError{URLHosts: urlHosts(ure.Inputs), Refused: ans.Action}
				}
			}
			opts.Retry = nil
		default:
			return res, err
		}
		res, err = s.d.Registry.CallTool(ctx, id, tool, args, opts)
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
