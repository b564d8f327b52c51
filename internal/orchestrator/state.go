package orchestrator

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	openai "github.com/sashabaranov/go-openai"

	"github.com/connector-svc/connector-svc/internal/ask"
)

// A paused run's State outlives the process that paused it: the service
// keeps it in Postgres (query_runs.state) and any replica may resume it,
// a newer build included. So it is stored in a format of its own, with a
// version number, and not as the Go types happen to marshal: the
// transcript's messages, the pending calls, and the durable calls and
// their retries have stored types here (stored*), with explicit JSON
// names, converted from and to go-openai's, mcp-go's and the ask
// package's types at this edge. The run's result so far is stored in the
// format of the run's trace (query_runs.trace, the Go names of Result),
// so both change together, and only on purpose.
//
// Versions:
//   - 1: json.Marshal of State as it was until version 2, with no
//     version field: go-openai's ChatCompletionMessage for the messages,
//     the pending calls inside the result.
//   - 2: storedState.
//
// A change of the stored format is a new version: EncodeState writes it,
// and DecodeState keeps reading every earlier one (a replica of the
// earlier build may have paused the run). testdata/state-v*.json are
// states each version wrote; the tests decode them.

// StateVersion is the version of the format EncodeState writes.
const StateVersion = 2

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
	// Decided says Decide applied the decisions; Approved are the paused
	// turn's calls to run then, by index.
	Decided  bool
	Approved []int
	// Durable are the paused turn's calls that ended needing the user's
	// input (StatusAwaitingInput), by call id; Retries, once answered
	// (Answered), what each is sent again with.
	Durable map[string]DurableCall `json:",omitempty"`
	Retries map[string]*ask.Retry  `json:",omitempty"`
}

// NewerStateError is DecodeState's error for a state written in a
// version this build does not know: a newer replica paused the run.
type NewerStateError struct {
	Version int
}

func (e *NewerStateError) Error() string {
	return fmt.Sprintf("run state version %d is newer than this build understands (%d): upgrade the replica", e.Version, StateVersion)
}

// storedState is a State as version 2 stores it.
type storedState struct {
	Version  int             `json:"version"`
	Messages []storedMessage `json:"messages"`
	Turn     int             `json:"turn"`
	Used     int             `json:"used"`
	Outputs  []string        `json:"outputs"`
	// Run is the run's result so far in the trace's format, without its
	// pending calls (Pending) and state. Its name matches no field of
	// version 1: a replica that knows only version 1 finds no paused step
	// in a version 2 state, and refuses it rather than misreading it.
	Run      Result                   `json:"run"`
	Pending  []storedPending          `json:"pending,omitempty"`
	Decided  bool                     `json:"decided,omitempty"`
	Approved []int                    `json:"approved,omitempty"`
	Durable  map[string]storedDurable `json:"durable,omitempty"`
	Retries  map[string]storedRetry   `json:"retries,omitempty"`
}

// storedMessage is a message of the transcript: what the agent sends the
// model and what the model answered with.
type storedMessage struct {
	Role    string `json:"role"`
	Content string `json:"content,omitempty"`
	// Parts are a content the model gave as parts rather than as text.
	Parts   []storedPart `json:"parts,omitempty"`
	Refusal string       `json:"refusal,omitempty"`
	Name    string       `json:"name,omitempty"` // a tool message's tool
	// Reasoning is the model's reasoning beside its content
	// (reasoning_content), sent back as it came.
	Reasoning  string           `json:"reasoning,omitempty"`
	ToolCalls  []storedToolCall `json:"tool_calls,omitempty"`
	ToolCallID string           `json:"tool_call_id,omitempty"` // a tool message's call
}

// storedPart is a part of a message's content.
type storedPart struct {
	Type        string `json:"type,omitempty"`
	Text        string `json:"text,omitempty"`
	ImageURL    string `json:"image_url,omitempty"`
	ImageDetail string `json:"image_detail,omitempty"`
}

// storedToolCall is a tool call the model asked for, its arguments as
// the model wrote them.
type storedToolCall struct {
	ID        string `json:"id"`
	Type      string `json:"type,omitempty"` // "function"
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// storedPending is a PendingCall; Title and Hints are its tool's
// annotations (MCP's), a hint the server left unset absent.
type storedPending struct {
	Step        int             `json:"step"`
	Call        Call            `json:"call"` // in the trace's format
	Description string          `json:"description,omitempty"`
	Title       string          `json:"title,omitempty"`
	Hints       map[string]bool `json:"hints,omitempty"`
	Reasoning   string          `json:"reasoning,omitempty"`
}

// hints are the stored names of a tool's hints, and where mcp-go keeps
// each.
var hints = []struct {
	name  string
	field func(*mcp.ToolAnnotation) **bool
}{
	{"read_only", func(a *mcp.ToolAnnotation) **bool { return &a.ReadOnlyHint }},
	{"destructive", func(a *mcp.ToolAnnotation) **bool { return &a.DestructiveHint }},
	{"idempotent", func(a *mcp.ToolAnnotation) **bool { return &a.IdempotentHint }},
	{"open_world", func(a *mcp.ToolAnnotation) **bool { return &a.OpenWorldHint }},
}

// storedDurable is a DurableCall. It converts to and from one (the same
// fields in the same order): a field added there does not compile until
// it is added here, in a new version.
type storedDurable struct {
	RequestState string                     `json:"request_state,omitempty"`
	Served       map[string]json.RawMessage `json:"served,omitempty"`
	Keys         map[string]string          `json:"keys"`
	URL          bool                       `json:"url,omitempty"`
}

// storedRetry is an ask.Retry.
type storedRetry struct {
	RequestState string                     `json:"request_state,omitempty"`
	Answers      map[string]storedAnswer    `json:"answers"`
	Served       map[string]json.RawMessage `json:"served,omitempty"`
}

// storedAnswer is an ask.Answer, converted as storedDurable is.
type storedAnswer struct {
	Action  string         `json:"action"`
	Content map[string]any `json:"content,omitempty"`
	Actor   string         `json:"actor,omitempty"`
	At      time.Time      `json:"at,omitzero"`
}

// EncodeState writes a paused run's state as JSON, in the format of
// StateVersion.
func EncodeState(s *State) ([]byte, error) {
	out := storedState{Version: StateVersion, Turn: s.Turn, Used: s.Used, Outputs: s.Outputs, Run: s.Result,
		Decided: s.Decided, Approved: s.Approved}
	out.Run.Pending, out.Run.State = nil, nil
	for _, m := range s.Messages {
		out.Messages = append(out.Messages, storeMessage(m))
	}
	for _, p := range s.Result.Pending {
		out.Pending = append(out.Pending, storedPending{Step: p.Step, Call: p.Call, Description: p.Description,
			Title: p.Annotations.Title, Hints: storeHints(p.Annotations), Reasoning: p.Reasoning})
	}
	if len(s.Durable) > 0 {
		out.Durable = make(map[string]storedDurable, len(s.Durable))
		for id, d := range s.Durable {
			out.Durable[id] = storedDurable(d)
		}
	}
	for id, r := range s.Retries {
		if r == nil {
			continue // as good as none
		}
		if out.Retries == nil {
			out.Retries = make(map[string]storedRetry, len(s.Retries))
		}
		sr := storedRetry{RequestState: r.RequestState, Served: r.Served}
		if r.Answers != nil {
			sr.Answers = make(map[string]storedAnswer, len(r.Answers))
			for key, a := range r.Answers {
				sr.Answers[key] = storedAnswer(a)
			}
		}
		out.Retries[id] = sr
	}
	return json.Marshal(out)
}

// DecodeState reads a state EncodeState wrote, in this version or an
// earlier one; a later version is a *NewerStateError. Numbers in
// arguments stay as written (json.Number), as the model's arguments are
// read.
func DecodeState(b []byte) (*State, error) {
	var probe struct {
		Version json.RawMessage `json:"version"`
	}
	if err := json.Unmarshal(b, &probe); err != nil {
		return nil, fmt.Errorf("read the paused run's state: %w", err)
	}
	version := 1 // version 1 has no version field
	if probe.Version != nil {
		err := json.Unmarshal(probe.Version, &version)
		if err != nil || version < 1 || string(probe.Version) == "null" {
			return nil, fmt.Errorf("read the paused run's state: the version %s is not a version number", probe.Version)
		}
	}
	var st *State
	var err error
	switch {
	case version > StateVersion:
		return nil, &NewerStateError{Version: version}
	case version == 1:
		st, err = decodeStateV1(b)
	default:
		st, err = decodeStateV2(b)
	}
	if err == nil {
		err = st.check()
	}
	if err != nil {
		return nil, fmt.Errorf("read the paused run's state (version %d): %w", version, err)
	}
	return st, nil
}

// decodeJSON decodes b into v with numbers kept as written.
func decodeJSON(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	return d.Decode(v)
}

// decodeStateV1 reads version 1: State as json.Marshal wrote it, which
// is what State's Go names and types still read.
func decodeStateV1(b []byte) (*State, error) {
	var s State
	if err := decodeJSON(b, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// decodeStateV2 reads version 2 (storedState).
func decodeStateV2(b []byte) (*State, error) {
	var in storedState
	if err := decodeJSON(b, &in); err != nil {
		return nil, err
	}
	s := &State{Turn: in.Turn, Used: in.Used, Outputs: in.Outputs, Result: in.Run, Decided: in.Decided, Approved: in.Approved}
	s.Result.Pending, s.Result.State = nil, nil
	for _, m := range in.Messages {
		s.Messages = append(s.Messages, loadMessage(m))
	}
	for _, p := range in.Pending {
		s.Result.Pending = append(s.Result.Pending, PendingCall{Step: p.Step, Call: p.Call, Description: p.Description,
			Annotations: loadHints(p.Title, p.Hints), Reasoning: p.Reasoning})
	}
	if in.Durable != nil {
		s.Durable = make(map[string]DurableCall, len(in.Durable))
		for id, d := range in.Durable {
			s.Durable[id] = DurableCall(d)
		}
	}
	if in.Retries != nil {
		s.Retries = make(map[string]*ask.Retry, len(in.Retries))
		for id, r := range in.Retries {
			retry := &ask.Retry{RequestState: r.RequestState, Served: r.Served}
			if r.Answers != nil {
				retry.Answers = make(map[string]ask.Answer, len(r.Answers))
				for key, a := range r.Answers {
					retry.Answers[key] = ask.Answer(a)
				}
			}
			s.Retries[id] = retry
		}
	}
	return s, nil
}

// check says whether a decoded state is one Resume can go on with: its
// last message is the paused turn's, with a tool call for each call of
// the result's last step, and what it approved are calls of that step.
func (st *State) check() error {
	if len(st.Result.Steps) == 0 {
		return errors.New("no paused step")
	}
	calls := len(st.Result.Steps[len(st.Result.Steps)-1].Calls)
	if len(st.Messages) == 0 {
		return errors.New("no messages")
	}
	if n := len(st.Messages[len(st.Messages)-1].ToolCalls); n != calls || n == 0 {
		return fmt.Errorf("the paused turn's message has %d tool calls, its step %d calls", n, calls)
	}
	for _, i := range st.Approved {
		if i < 0 || i >= calls {
			return fmt.Errorf("approved call %d of a step of %d calls", i, calls)
		}
	}
	return nil
}

// storeMessage is m as the state stores it. What go-openai has and the
// agent's messages never carry is not kept: a tool call's Index (a
// streamed chunk's) and the legacy FunctionCall (the agent offers tools,
// not functions).
func storeMessage(m openai.ChatCompletionMessage) storedMessage {
	out := storedMessage{Role: m.Role, Content: m.Content, Refusal: m.Refusal, Name: m.Name, Reasoning: m.ReasoningContent,
		ToolCallID: m.ToolCallID}
	for _, p := range m.MultiContent {
		sp := storedPart{Type: string(p.Type), Text: p.Text}
		if p.ImageURL != nil {
			sp.ImageURL, sp.ImageDetail = p.ImageURL.URL, string(p.ImageURL.Detail)
		}
		out.Parts = append(out.Parts, sp)
	}
	for _, tc := range m.ToolCalls {
		out.ToolCalls = append(out.ToolCalls, storedToolCall{ID: tc.ID, Type: string(tc.Type), Name: tc.Function.Name,
			Arguments: tc.Function.Arguments})
	}
	return out
}

// loadMessage is a stored message as go-openai's.
func loadMessage(m storedMessage) openai.ChatCompletionMessage {
	out := openai.ChatCompletionMessage{Role: m.Role, Content: m.Content, Refusal: m.Refusal, Name: m.Name,
		ReasoningContent: m.Reasoning, ToolCallID: m.ToolCallID}
	for _, p := range m.Parts {
		part := openai.ChatMessagePart{Type: openai.ChatMessagePartType(p.Type), Text: p.Text}
		if p.ImageURL != "" || p.ImageDetail != "" {
			part.ImageURL = &openai.ChatMessageImageURL{URL: p.ImageURL, Detail: openai.ImageURLDetail(p.ImageDetail)}
		}
		out.MultiContent = append(out.MultiContent, part)
	}
	for _, tc := range m.ToolCalls {
		out.ToolCalls = append(out.ToolCalls, openai.ToolCall{ID: tc.ID, Type: openai.ToolType(tc.Type),
			Function: openai.FunctionCall{Name: tc.Name, Arguments: tc.Arguments}})
	}
	return out
}

// storeHints are the hints a tool's annotations set, by stored name;
// nil for none.
func storeHints(a mcp.ToolAnnotation) map[string]bool {
	var out map[string]bool
	for _, h := range hints {
		if v := *h.field(&a); v != nil {
			if out == nil {
				out = map[string]bool{}
			}
			out[h.name] = *v
		}
	}
	return out
}

// loadHints are a pending call's tool annotations as mcp-go's.
func loadHints(title string, set map[string]bool) mcp.ToolAnnotation {
	a := mcp.ToolAnnotation{Title: title}
	for _, h := range hints {
		if v, ok := set[h.name]; ok {
			*h.field(&a) = &v
		}
	}
	return a
}
