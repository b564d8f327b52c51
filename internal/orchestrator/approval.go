package orchestrator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	openai "github.com/sashabaranov/go-openai"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// A tool whose Tool.RequiresApproval is set does not run when the model
// asks for it: the run pauses after the turn's other calls, and returns
// StatusAwaitingApproval with the calls that wait (Result.Pending) and the
// run's State. A person decides about each; Agent.Resume runs the
// approved ones, tells the model about the denied ones, and goes on. The
// run may pause again; its budget spans all of it.

// PendingCall is a call that waits for a person's decision.
type PendingCall struct {
	Step int
	Call Call // its ID, Tool and Arguments as the model asked
	// Description and Annotations are the tool's, to show the person.
	Description string
	Annotations mcp.ToolAnnotation
	// Reasoning is what the model said with its calls.
	Reasoning string
}

// DecisionKind is what a person decided about a pending call.
type DecisionKind int

// Decision kinds.
const (
	Approve       DecisionKind = iota + 1 // run it as asked
	ApproveEdited                         // run it with Decision.Arguments
	Deny                                  // do not run it
)

var decisionNames = map[DecisionKind]string{Approve: "approve", ApproveEdited: "approve_edited", Deny: "deny"}

// Decision is a person's decision about one pending call.
type Decision struct {
	Kind DecisionKind
	// Arguments are the edited arguments of ApproveEdited; the call runs
	// with exactly these. OriginalArguments are the model's, kept for
	// the record.
	Arguments         map[string]any `json:",omitempty"`
	OriginalArguments map[string]any `json:",omitempty"`
	Message           string         `json:",omitempty"` // Deny: told to the model
	Actor             string         `json:",omitempty"` // who decided, as the caller names them
	KeyID             string         `json:",omitempty"` // the API key the decision came with, if any
	At                time.Time
}

// pause ends a run at turn, before its pending calls: the result says
// what waits, and keeps what Resume needs.
func (r *run) pause(ctx context.Context, msgs []openai.ChatCompletionMessage, turn int, outputs []string) *Result {
	step := r.res.Steps[len(r.res.Steps)-1]
	r.res.Pending = nil
	for _, c := range step.Calls {
		if !c.Pending || c.AwaitsAuthorization || c.AwaitsInput {
			continue
		}
		t := r.conn.tools[c.Tool]
		r.res.Pending = append(r.res.Pending, PendingCall{Step: step.Index, Call: c, Description: t.Description,
			Annotations: t.Annotations, Reasoning: step.Reasoning})
	}
	r.res.Status, r.res.Answer = StatusAwaitingApproval, ""
	switch {
	case r.res.Authorization != nil:
		// The caller says where the user authorizes (it starts that).
		r.res.Status = StatusAwaitingAuthorization
	case len(r.res.Pending) == 0 && len(r.res.Inputs) > 0:
		r.res.Status = StatusAwaitingInput
	}
	state := &State{Messages: msgs, Turn: turn, Used: r.used, Outputs: outputs}
	if r.res.Status == StatusAwaitingInput {
		state.Durable = r.durable
	} else {
		r.res.Inputs = nil
	}
	r.res.State = state
	switch r.res.Status {
	case StatusAwaitingApproval:
		r.emit(Event{Kind: EventApprovalRequired, Pending: r.res.Pending})
	case StatusAwaitingInput:
		r.emit(Event{Kind: EventInputRequired, Index: step.Index, Inputs: r.res.Inputs})
	}
	// The state holds the result as it is now, without itself.
	state.Result = *r.res
	state.Result.State = nil
	r.agent.logger.InfoContext(ctx, "query run waits for approval or authorization", "workspace_id", r.conn.WorkspaceID,
		"connector_id", r.conn.ExternalID, "pending", len(step.Calls), "authorization", r.res.Authorization != nil)
	return r.res
}

// Authorized readies a run paused for its user's authorization
// (StatusAwaitingAuthorization) to go on once they have authorized: its
// calls that met the AuthorizationError run again on Resume, with their
// share of the budget.
func (st *State) Authorized() {
	step := &st.Result.Steps[len(st.Result.Steps)-1]
	st.Outputs = padded(st.Outputs, len(step.Calls))
	st.Approved = nil
	for i := range step.Calls {
		c := &step.Calls[i]
		if c.Pending && c.AwaitsAuthorization {
			c.Pending, c.AwaitsAuthorization = false, false
			st.Approved = append(st.Approved, i)
		}
	}
	st.Result.Authorization = nil
	st.Decided = true
}

// Validate checks arguments for a call of the connector's tool name
// against its schema, as a person's edited arguments must be.
func (c *Connector) Validate(name string, args map[string]any) error {
	t, ok := c.tools[name]
	if !ok {
		return fmt.Errorf("the connector has no enabled tool %q", name)
	}
	if err := t.validate(args); err != nil {
		return errors.New(schemaError(err))
	}
	return nil
}

// Decide applies decisions, one per pending call by call id (the caller
// checked them, edited arguments included), to a paused run's state: each
// pending call gets its decision; an approved one, the arguments it will
// run with; a denied one, the refusal the model will read. So the record
// says who decided what before anything runs (the caller may store it
// now), and Resume runs the approved calls.
func (st *State) Decide(decisions map[string]Decision) {
	step := &st.Result.Steps[len(st.Result.Steps)-1]
	st.Outputs = padded(st.Outputs, len(step.Calls))
	st.Approved = nil
	for i := range step.Calls {
		c := &step.Calls[i]
		if !c.Pending {
			continue
		}
		d := decisions[c.ID]
		c.Pending = false
		switch d.Kind {
		case Approve, ApproveEdited:
			if d.Kind == ApproveEdited {
				d.OriginalArguments, c.Arguments = c.Arguments, d.Arguments
			}
			st.Approved = append(st.Approved, i)
		default:
			d.Kind = Deny
			c.IsError = true
			c.RejectedReason = "the user declined this call"
			if m := strings.TrimSpace(d.Message); m != "" {
				c.RejectedReason += ": " + m
			}
			st.Outputs[i] = "Error: " + c.RejectedReason + ". Do not call it again for this query unless the user asks; answer with what you have."
			c.ResultExcerpt = st.Outputs[i]
			st.Used-- // its share of the budget goes back
		}
		d.Arguments = nil // the call's Arguments are what runs
		c.Decision = &d
	}
	st.Decided = true
}

// padded returns outputs with room for n calls.
func padded(outputs []string, n int) []string {
	out := make([]string, n)
	copy(out, outputs)
	return out
}

// Resume goes on with a paused run whose state has its decisions
// (State.Decide): the approved calls run, the model reads their results
// and the refusals, and the run goes on as Run does, from the next turn;
// it may pause again. req is the run's request, with the connector's live
// agent now.
func (a *Agent) Resume(ctx context.Context, req Request, st *State, emit func(Event)) (*Result, error) {
	if !st.Decided {
		return nil, errors.New("resume: the paused run has no decisions")
	}
	res := st.Result
	r := &run{agent: a, req: req, conn: req.Connector, emit: serialize(emit), res: &res, used: st.Used, progress: emit != nil,
		retries: st.Retries}
	return a.execute(ctx, "connector.query.resume", r, func(ctx context.Context) (*Result, error) {
		r.restoreTools()
		r.offerRead(ctx)
		r.res.Pending, r.res.State = nil, nil
		msgs := st.Messages
		outputs := padded(st.Outputs, len(msgs[len(msgs)-1].ToolCalls))
		if err := r.runApproved(ctx, st.Approved, outputs); err != nil {
			return nil, err
		}
		// A call sent again may need the user's input again (its server's
		// next round): the run pauses on the same turn.
		if pending := r.awaitInput(&r.res.Steps[len(r.res.Steps)-1], outputs, nil); len(pending) > 0 {
			r.res.Authorization = nil
			return r.pause(ctx, msgs, st.Turn, outputs), nil
		}
		msgs = append(msgs, toolMessages(msgs[len(msgs)-1].ToolCalls, outputs)...)
		return r.loop(ctx, msgs, st.Turn+1)
	})
}

// runApproved runs the paused step's approved calls (indexes) and counts
// the step's decisions. A call whose tool was disabled or removed while
// the run waited does not run.
func (r *run) runApproved(ctx context.Context, indexes []int, outputs []string) error {
	step := &r.res.Steps[len(r.res.Steps)-1]
	var runnable []int
	for _, i := range indexes {
		c := &step.Calls[i]
		if _, ok := r.conn.tools[c.Tool]; !ok {
			c.IsError = true
			c.RejectedReason = fmt.Sprintf("the tool %q was disabled or removed while the call waited for approval", c.Tool)
			outputs[i], c.ResultExcerpt = "Error: "+c.RejectedReason, "Error: "+c.RejectedReason
			r.used--
			continue
		}
		runnable = append(runnable, i)
	}
	for _, c := range step.Calls {
		if c.Decision != nil {
			r.agent.counters.decisions.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(attribute.String("workspace", r.conn.WorkspaceID),
				attribute.String("connector", r.conn.ExternalID), attribute.String("decision", decisionNames[c.Decision.Kind]))))
		}
	}
	return r.runCalls(ctx, step, outputs, runnable)
}

// declined reports whether the user declined a call of tool with args
// earlier in the run: a model that asks again is refused without asking
// the person again.
func (r *run) declined(tool string, args map[string]any) bool {
	var key []byte
	for _, st := range r.res.Steps {
		for _, c := range st.Calls {
			if c.Tool != tool || c.Decision == nil || c.Decision.Kind != Deny {
				continue
			}
			if key == nil {
				key, _ = json.Marshal(args)
			}
			if prev, _ := json.Marshal(c.Arguments); bytes.Equal(prev, key) {
				return true
			}
		}
	}
	return false
}

// schemaError is a schema validation error without the schema's internal
// location: what is wrong, and where in the arguments.
func schemaError(err error) string {
	lines := strings.Split(err.Error(), "\n")
	if len(lines) > 1 && strings.HasPrefix(lines[0], "jsonschema validation failed") {
		lines = lines[1:]
	}
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(strings.TrimSpace(l), "- ")
	}
	return strings.Join(lines, "; ")
}
