package orchestrator

import (
	"bytes"
	"context"
	"encoding/json"
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
	Actor             string         `json:",omitempty"`
	At                time.Time
}

// State is a paused run: what Resume needs to go on with it. It is plain
// data: EncodeState and DecodeState keep it between processes.
type State struct {
	// Messages are the transcript up to the paused turn's model message.
	Messages []openai.ChatCompletionMessage
	Turn     int
	Used     int // tool calls of the budget spent or held by pending calls
	// Outputs answer the paused turn's calls that did not wait, by index
	// of the call in the turn.
	Outputs []string
	// Result is the run's result so far; its last step is the paused turn.
	Result Result
}

// EncodeState writes a paused run's state as JSON.
func EncodeState(s *State) ([]byte, error) {
	return json.Marshal(s)
}

// DecodeState reads a state EncodeState wrote. Numbers in arguments stay
// as written (json.Number), as the model's arguments are read.
func DecodeState(b []byte) (*State, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var s State
	if err := d.Decode(&s); err != nil {
		return nil, fmt.Errorf("read the paused run's state: %w", err)
	}
	if len(s.Result.Steps) == 0 {
		return nil, fmt.Errorf("read the paused run's state: no paused step")
	}
	return &s, nil
}

// pause ends a run at turn, before its pending calls: the result says
// what waits, and keeps what Resume needs.
func (r *run) pause(ctx context.Context, msgs []openai.ChatCompletionMessage, turn int, outputs []string) *Result {
	step := r.res.Steps[len(r.res.Steps)-1]
	r.res.Pending = nil
	for _, c := range step.Calls {
		if !c.Pending {
			continue
		}
		t := r.conn.tools[c.Tool]
		r.res.Pending = append(r.res.Pending, PendingCall{Step: step.Index, Call: c, Description: t.Description,
			Annotations: t.Annotations, Reasoning: step.Reasoning})
	}
	r.res.Status, r.res.Answer = StatusAwaitingApproval, ""
	state := &State{Messages: msgs, Turn: turn, Used: r.used, Outputs: outputs}
	r.res.State = state
	r.emit(Event{Kind: EventApprovalRequired, Pending: r.res.Pending})
	// The state holds the result as it is now, without itself.
	state.Result = *r.res
	state.Result.State = nil
	r.agent.logger.InfoContext(ctx, "query run waits for approval", "workspace_id", r.conn.WorkspaceID,
		"connector_id", r.conn.ExternalID, "pending", len(r.res.Pending))
	return r.res
}

// Validate checks arguments for a call of the connector's tool name
// against its schema, as a person's edited arguments must be.
func (c *Connector) Validate(name string, args map[string]any) error {
	t, ok := c.tools[name]
	if !ok {
		return fmt.Errorf("the connector has no enabled tool %q", name)
	}
	return t.validate(args)
}

// Resume goes on with a paused run: decisions holds one decision per
// pending call, by call id (the caller checked them, edited arguments
// included). Approved calls run with their arguments, denied ones answer
// the model with the refusal, and the run goes on as Run does, from the
// next turn; it may pause again. req is the run's request, with the
// connector's live agent now.
func (a *Agent) Resume(ctx context.Context, req Request, st *State, decisions map[string]Decision, emit func(Event)) (*Result, error) {
	res := st.Result
	r := &run{agent: a, req: req, conn: req.Connector, emit: serialize(emit), res: &res, used: st.Used, progress: emit != nil}
	return a.execute(ctx, "connector.query.resume", r, func(ctx context.Context) (*Result, error) {
		r.restoreTools()
		r.res.Pending, r.res.State = nil, nil
		msgs := st.Messages
		outputs, err := r.decide(ctx, decisions, padded(st.Outputs, len(st.Messages[len(st.Messages)-1].ToolCalls)))
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, toolMessages(msgs[len(msgs)-1].ToolCalls, outputs)...)
		return r.loop(ctx, msgs, st.Turn+1)
	})
}

// padded returns outputs with room for n calls.
func padded(outputs []string, n int) []string {
	out := make([]string, n)
	copy(out, outputs)
	return out
}

// decide applies decisions to the paused step's pending calls and runs
// the approved ones; it returns the outputs of all the step's calls.
func (r *run) decide(ctx context.Context, decisions map[string]Decision, outputs []string) ([]string, error) {
	step := &r.res.Steps[len(r.res.Steps)-1]
	var approved []int
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
			if _, ok := r.conn.tools[c.Tool]; !ok {
				// Disabled or gone while the run waited.
				c.IsError, c.RejectedReason = true, r.conn.missing(c.Tool)
				outputs[i] = "Error: " + c.RejectedReason
				r.used--
				break
			}
			approved = append(approved, i)
		default:
			d.Kind = Deny
			c.IsError = true
			c.RejectedReason = "the user declined this call"
			if m := strings.TrimSpace(d.Message); m != "" {
				c.RejectedReason += ": " + m
			}
			outputs[i] = "Error: " + c.RejectedReason + ". Do not call it again for this query unless the user asks; answer with what you have."
			c.ResultExcerpt = Truncate(outputs[i], r.agent.cfg.ExcerptSize)
			r.used--
		}
		d.Arguments = nil // the call's Arguments are what ran
		c.Decision = &d
		r.agent.counters.decisions.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(attribute.String("workspace", r.conn.WorkspaceID),
			attribute.String("connector", r.conn.ExternalID), attribute.String("decision", decisionNames[d.Kind]))))
	}
	if err := r.runCalls(ctx, step, outputs, approved); err != nil {
		return nil, err
	}
	return outputs, nil
}
