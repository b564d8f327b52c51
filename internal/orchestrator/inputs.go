package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/connector-svc/connector-svc/internal/ask"
)

// A server may ask the user something in the middle of a tool call
// (elicitation) or ask the connector's model for a completion (sampling).
// Every tool call of a run carries an ask.Asker (callAsker) in its context
// for the connection to find.
//
// On the classic protocol the request arrives while the call is open: the
// Asker records it on the call, emits EventInputRequired and hands it to
// the run's InputBroker, which waits for the user's answer until the
// request's deadline; a request nobody answered in time is answered
// cancel, and the model reads so in the call's output. The run itself
// goes on meanwhile (its call waits): such a pause is live.
//
// On the sessionless protocol the call ends instead, with an
// ask.InputRequiredError (or, classic, a -32042, ask.URLRequiredError): the
// call becomes pending, and the run pauses with StatusAwaitingInput after
// its step, as for an approval. State.Answered and Resume retry the call
// with the answers. Such a pause is durable.

// Input is one request for the user's input, in a run: ask.Input with the
// call that asked, and the answer once there is one. Its ID is unique in
// the run: "<call id>.<n>" for a live one, "<call id>/<server's key>" for
// a durable one.
type Input struct {
	ask.Input
	CallID string
	Tool   string
	Step   int
	Answer *ask.Answer `json:",omitempty"`
}

// InputBroker answers a run's live input requests: the caller of the run
// implements it.
type InputBroker interface {
	// Await hands in to the user and waits for the answer until ctx ends
	// (the request's deadline is ctx's). snapshot is the run's result so
	// far, its running step included, for the record of the pause. An
	// error means nobody answered: the server is answered cancel.
	Await(ctx context.Context, in Input, snapshot *Result) (ask.Answer, error)
}

// DurableCall is how a call that ended needing the user's input is sent
// again: with its server's RequestState and Served answers, and the
// answers to its inputs (by the server's key, Keys maps the run's input
// ids to them); a URL one (a -32042) plainly, once the user accepted.
type DurableCall struct {
	RequestState string                     `json:",omitempty"`
	Served       map[string]json.RawMessage `json:",omitempty"`
	Keys         map[string]string          `json:",omitempty"`
	URL          bool                       `json:",omitempty"`
}

// timedOutNote is what the model reads after the output of a call whose
// server asked the user something nobody answered in time.
const timedOutNote = "Note: the user did not answer the server's request in time: it was cancelled."

// callAsker is the ask.Asker of one tool call of a run.
type callAsker struct {
	r    *run
	step int
	call ask.Call
}

func (r *run) asker(step int, c Call) *callAsker {
	return &callAsker{r: r, step: step, call: ask.Call{ID: c.ID, Tool: c.Tool}}
}

// Elicit implements ask.Asker.
func (a *callAsker) Elicit(ctx context.Context, _ ask.Call, in ask.Input) (ask.Answer, error) {
	r := a.r
	if r.req.Inputs == nil {
		return ask.Answer{}, ask.ErrNobodyToAsk
	}
	r.mu.Lock()
	if r.inputs == nil {
		r.inputs = map[string][]Input{}
	}
	in.ID = fmt.Sprintf("%s.%d", a.call.ID, len(r.inputs[a.call.ID])+1)
	in.Durable = false
	input := Input{Input: in, CallID: a.call.ID, Tool: a.call.Tool, Step: a.step}
	r.inputs[a.call.ID] = append(r.inputs[a.call.ID], input)
	r.mu.Unlock()

	r.emit(Event{Kind: EventInputRequired, Index: a.step, Inputs: []Input{input}})
	wait, cancel := ctx, context.CancelFunc(func() {})
	if !in.Deadline.IsZero() {
		wait, cancel = context.WithDeadline(ctx, in.Deadline)
	}
	defer cancel()
	snap := r.snapshot()
	ans, err := r.req.Inputs.Await(wait, input, snap)
	late := err != nil && errors.Is(wait.Err(), context.DeadlineExceeded)
	if err != nil {
		ans = ask.Answer{Action: ask.Cancel}
	}
	if ans.At.IsZero() {
		ans.At = time.Now()
	}
	r.mu.Lock()
	for i := range r.inputs[a.call.ID] {
		if r.inputs[a.call.ID][i].ID == input.ID {
			r.inputs[a.call.ID][i].Answer = &ans
		}
	}
	if late {
		if r.timedOut == nil {
			r.timedOut = map[string]bool{}
		}
		r.timedOut[a.call.ID] = true
	}
	r.mu.Unlock()
	return ans, nil
}

// Sampling implements ask.Asker: the run's budget.
func (a *callAsker) Sampling() *ask.Budget { return a.r.req.SamplingBudget }

// Sampled implements ask.Asker: the request is recorded on the call, and
// its tokens count in the run's usage as the model's own do.
func (a *callAsker) Sampled(_ ask.Call, rec ask.SamplingRecord) {
	r := a.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.samplings == nil {
		r.samplings = map[string][]ask.SamplingRecord{}
	}
	r.samplings[a.call.ID] = append(r.samplings[a.call.ID], rec)
	r.res.Usage.PromptTokens += rec.PromptTokens
	r.res.Usage.CompletionTokens += rec.CompletionTokens
	r.res.Usage.TotalTokens += rec.PromptTokens + rec.CompletionTokens
	if rec.Err == "" {
		r.res.Usage.SamplingRequests++
	}
}

// recorded moves what the call's server asked during it onto the call.
func (r *run) recorded(c *Call) (timedOut bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c.Inputs = append(c.Inputs, r.inputs[c.ID]...)
	c.Samplings = append(c.Samplings, r.samplings[c.ID]...)
	delete(r.inputs, c.ID)
	delete(r.samplings, c.ID)
	timedOut = r.timedOut[c.ID]
	delete(r.timedOut, c.ID)
	return timedOut
}

// snapshot is the run's result as it is now, with the step that runs and
// what its calls' servers asked so far.
func (r *run) snapshot() *Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	res := *r.res
	res.State, res.Pending = nil, nil
	res.Steps = slices.Clone(res.Steps)
	if r.current != nil {
		st := cloneStep(*r.current)
		for i := range st.Calls {
			c := &st.Calls[i]
			c.Inputs = append(slices.Clone(c.Inputs), r.inputs[c.ID]...)
			c.Samplings = append(slices.Clone(c.Samplings), r.samplings[c.ID]...)
		}
		// A resumed step is in the result already: it is replaced.
		if n := len(res.Steps); n > 0 && res.Steps[n-1].Index == st.Index {
			res.Steps[n-1] = st
		} else {
			res.Steps = append(res.Steps, st)
		}
	}
	res.Status, res.Answer = StatusAwaitingInput, ""
	return &res
}

// needInput records a call that ended needing the user's input (err is
// an ask.InputRequiredError or ask.URLRequiredError): its inputs, with
// ids unique in the run, and how to send it again.
func (r *run) needInput(step int, c *Call, err error) {
	var ire *ask.InputRequiredError
	var ure *ask.URLRequiredError
	d := DurableCall{Keys: map[string]string{}}
	var ins []ask.Input
	switch {
	case errors.As(err, &ire):
		d.RequestState = ire.RequestState
		if len(ire.Served) > 0 {
			d.Served = maps.Clone(ire.Served)
		}
		ins = ire.Inputs
	case errors.As(err, &ure):
		d.URL = true
		ins = ure.Inputs
	default:
		return
	}
	for n, in := range ins {
		key := in.ID
		if key == "" {
			key = in.ElicitationID
		}
		if key == "" {
			key = fmt.Sprint(n + 1)
		}
		in.ID = c.ID + "/" + key
		// A server may ask under the same key in a later round of the
		// call: the run's id stays unique.
		for round := 2; slices.ContainsFunc(c.Inputs, func(prev Input) bool { return prev.ID == in.ID }); round++ {
			in.ID = fmt.Sprintf("%s/%s#%d", c.ID, key, round)
		}
		in.Durable, in.Deadline = true, time.Time{}
		if d.URL {
			in.Mode = ask.ModeURL
		}
		d.Keys[in.ID] = key
		c.Inputs = append(c.Inputs, Input{Input: in, CallID: c.ID, Tool: c.Tool, Step: step})
	}
	c.AwaitsInput = true
	r.mu.Lock()
	if r.durable == nil {
		r.durable = map[string]DurableCall{}
	}
	r.durable[c.ID] = d
	r.mu.Unlock()
}

// awaitInput makes the calls of step that ended needing the user's input
// pending, so that the run pauses for it and they run again on resume,
// and returns the step's pending calls. A step that pauses for approval
// or authorization already tells the model those calls could not go on.
func (r *run) awaitInput(step *Step, outputs []string, pending []int) []int {
	if len(pending) > 0 {
		for i := range step.Calls {
			c := &step.Calls[i]
			if c.AwaitsInput {
				c.AwaitsInput, c.IsError = false, true
				outputs[i] = "Error: the server needs the user's input before this call can go on, and the user cannot be asked now; try again later"
				c.ResultExcerpt = outputs[i]
				delete(r.durable, c.ID)
			}
		}
		return pending
	}
	r.res.Inputs = nil
	for i := range step.Calls {
		c := &step.Calls[i]
		if !c.AwaitsInput {
			continue
		}
		c.Pending, c.IsError, c.ResultExcerpt, outputs[i] = true, false, "", ""
		pending = append(pending, i)
		for _, in := range c.Inputs {
			if in.Durable && in.Answer == nil {
				r.res.Inputs = append(r.res.Inputs, in)
			}
		}
		// It did not finish: it counts as used when it runs on resume.
		r.unused(c.Tool)
	}
	return pending
}

// Answered readies a run paused for its user's input (StatusAwaitingInput)
// to go on with answers, one per input by id (the caller checked them
// against the inputs: Result.Inputs). Each call that waited runs again on
// Resume: with the answers, or for a URL one plainly once every URL was
// accepted; a URL one declined or cancelled does not run again, and the
// model reads why.
func (st *State) Answered(answers map[string]ask.Answer) {
	step := &st.Result.Steps[len(st.Result.Steps)-1]
	st.Outputs = padded(st.Outputs, len(step.Calls))
	st.Approved = nil
	if st.Retries == nil {
		st.Retries = map[string]*ask.Retry{}
	}
	for i := range step.Calls {
		c := &step.Calls[i]
		if !c.Pending || !c.AwaitsInput {
			continue
		}
		c.Pending, c.AwaitsInput = false, false
		d := st.Durable[c.ID]
		retry := &ask.Retry{RequestState: d.RequestState, Answers: map[string]ask.Answer{}}
		if len(d.Served) > 0 {
			retry.Served = maps.Clone(d.Served)
		}
		refused := ""
		for j := range c.Inputs {
			in := &c.Inputs[j]
			a, ok := answers[in.ID]
			if !ok || in.Answer != nil {
				continue
			}
			in.Answer = &a
			retry.Answers[d.Keys[in.ID]] = a
			if a.Action != ask.Accept && refused == "" {
				refused = a.Action
			}
		}
		if d.URL && refused != "" {
			c.IsError = true
			verb := "declined"
			if refused == ask.Cancel {
				verb = "cancelled"
			}
			c.RejectedReason = fmt.Sprintf("the user %s the server's request to open a URL, so the call was not tried again", verb)
			st.Outputs[i] = "Error: " + c.RejectedReason + ". Answer with what you have."
			c.ResultExcerpt = st.Outputs[i]
			st.Used--
			continue
		}
		if !d.URL {
			st.Retries[c.ID] = retry
		}
		st.Approved = append(st.Approved, i)
	}
	st.Result.Inputs = nil
	st.Durable = nil
	st.Decided = true
}

// withNote adds the timed-out note to a call's output.
func withNote(text string) string {
	if strings.TrimSpace(text) == "" {
		return timedOutNote
	}
	return text + "\n" + timedOutNote
}

// ValidateContent checks a form's accepted content against the schema its
// server requested, as the server would: what is wrong, and where in the
// content.
func ValidateContent(schema, content map[string]any) error {
	if schema == nil {
		return nil
	}
	raw, err := json.Marshal(schema)
	if err != nil {
		return fmt.Errorf("the requested schema cannot be read: %v", err)
	}
	// A form's formats are part of what the user must fill in right.
	sch := compile("input", raw, true)
	if sch == nil {
		return errors.New("the requested schema is not a valid JSON schema")
	}
	// Numbers are checked as JSON has them.
	b, err := json.Marshal(content)
	if err != nil {
		return err
	}
	doc, err := jsonschemaDoc(b)
	if err != nil {
		return err
	}
	if err := sch.Validate(doc); err != nil {
		return errors.New(schemaError(err))
	}
	return nil
}
