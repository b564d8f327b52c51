package orchestrator

import (
	"context"
	"errors"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/ask"
)

// ErrPanic means a run panicked; the service keeps serving.
var ErrPanic = errors.New("the query run panicked")

// Request is one query.
type Request struct {
	Connector *Connector // the connector's live agent (NewConnector)
	Query     string
	Context   string
	MaxTools  int // 1..MaxMaxTools
	PlanOnly  bool
	// Session is the caller's session id, passed with every tool call of
	// the run (CallOptions.Session); empty for none.
	Session string
	// UserID is the end user the run is for, passed with every tool call
	// of the run (CallOptions.UserID); empty for none.
	UserID string
	// Throttle, when set, is called before each tool call of the run
	// reaches the ToolCaller, and may wait (the connector's rate limit);
	// an error fails that call as the ToolCaller's would.
	Throttle func(ctx context.Context) error
	// Inputs answers what a server asks the user while a tool call is
	// open (see inputs.go); nil: nobody can be asked, and the server gets
	// an error.
	Inputs InputBroker
	// SamplingBudget is the run's sampling budget (ask.Asker.Sampling);
	// nil for none.
	SamplingBudget *ask.Budget
}

// Status is how a run ended.
type Status int

// Statuses.
const (
	StatusCompleted        Status = iota + 1 // the model answered on its own
	StatusBudgetExhausted                    // the answer was forced after the budget or turn limit
	StatusPlanned                            // plan_only
	StatusAwaitingApproval                   // paused before calls that need approval (Result.Pending)
	// StatusAwaitingAuthorization: paused because calls of the last step
	// met an AuthorizationError (Result.Authorization says why); they run
	// again when the run is resumed (State.Authorized).
	StatusAwaitingAuthorization
	// StatusAwaitingInput: paused because a server asked the user for
	// input (Result.Inputs). A durable pause (the calls ended, State says
	// how to retry them) goes on with State.Answered and Resume; a live
	// one is still running, its tool call open, until the InputBroker
	// answers.
	StatusAwaitingInput
)

// AuthorizationError is what a ToolCaller returns for a call that cannot
// run until the run's user authorizes the connector (again, or for more
// scopes): the run pauses with StatusAwaitingAuthorization instead of
// telling the model the call failed.
type AuthorizationError struct {
	Err    error
	Reason string   // why, as the authorization layer says it
	Scopes []string // what to ask for
}

func (e *AuthorizationError) Error() string { return e.Err.Error() }
func (e *AuthorizationError) Unwrap() error { return e.Err }

// AuthorizationNeed is why a run awaits its user's authorization.
type AuthorizationNeed struct {
	Reason string
	Scopes []string `json:",omitempty"`
}

// Call is one tool call of a run.
type Call struct {
	ID             string
	Tool           string
	Arguments      map[string]any
	ResultExcerpt  string
	IsError        bool
	RejectedReason string // set when the call never ran
	Duration       time.Duration
	// Pending marks a call that waits for a person's decision.
	Pending bool
	// Decision is the decision a call that needed approval got.
	Decision *Decision
	// AwaitsAuthorization marks a pending call that met an
	// AuthorizationError: it runs again when the run is resumed.
	AwaitsAuthorization bool `json:",omitempty"`
	// AwaitsInput marks a pending call that ended needing the user's
	// input: it runs again, with the answers, when the run is resumed.
	AwaitsInput bool `json:",omitempty"`
	// Inputs are what its server asked the user during the call, with
	// the answers; Samplings, the sampling requests it made.
	Inputs    []Input              `json:",omitempty"`
	Samplings []ask.SamplingRecord `json:",omitempty"`
	// TaskID is the server's id of the task the call ran as, if it did.
	TaskID string `json:",omitempty"`
	// Resource is what a read_resource call read: its uri and size.
	Resource *ResourceRead `json:",omitempty"`
}

// Step is one model turn with tool calls.
type Step struct {
	Index int
	Calls []Call
	// Reasoning is what the model said with its calls, if anything.
	Reasoning string
}

// PlannedTool is one entry of a plan.
type PlannedTool struct {
	Tool, Purpose string
}

// Context is structured material from a tool result.
type Context struct {
	Tool              string
	StructuredContent map[string]any
	ResourceLinks     []mcp.ResourceLink
}

// Usage counts tokens: the model's own and those of the sampling
// requests it answered for the run's servers (SamplingRequests of them).
type Usage struct {
	PromptTokens, CompletionTokens, TotalTokens int64
	SamplingRequests                            int64 `json:",omitempty"`
}

// Result is the outcome of a run.
type Result struct {
	Status    Status
	Answer    string
	ToolsUsed []string
	// ResourceBytes is how many bytes of resources the run has read
	// (read_resource), against Config.ResourceBudget.
	ResourceBytes int `json:",omitempty"`
	// ToolsTotal is how many enabled tools the connector has; ToolsOffered
	// are the ones the model was offered (those search_tools found
	// included), all of them unless Narrowed.
	ToolsTotal   int
	ToolsOffered []string
	Narrowed     bool
	// SessionRestarted: a tool call of the run ran on a new MCP session in
	// place of the one the caller's session had (a per_session connector
	// whose server forgot it, say), and what the server kept for it is
	// gone.
	SessionRestarted bool `json:",omitempty"`
	Steps            []Step
	Plan             []PlannedTool
	Contexts         []Context
	Usage            Usage
	Duration         time.Duration
	// Pending are the calls a paused run (StatusAwaitingApproval) waits
	// on, and State what Resume needs to go on with it.
	Pending []PendingCall
	State   *State
	// Authorization says why a run awaits authorization
	// (StatusAwaitingAuthorization).
	Authorization *AuthorizationNeed `json:",omitempty"`
	// Inputs are the requests a run awaiting input waits on
	// (StatusAwaitingInput).
	Inputs []Input `json:",omitempty"`
}

// EventKind says what an Event reports.
type EventKind int

// Event kinds, in the order a run emits them.
const (
	EventStepPlanned EventKind = iota + 1
	EventToolCallStarted
	EventToolCallProgress // per progress notification of a running call, in order
	EventToolCallFinished
	EventAnswer
	EventApprovalRequired // the run paused; Event.Pending says for what
	EventInputRequired    // a server asks the user; Event.Inputs says what
)

// Event is progress of a run, for streaming.
type Event struct {
	Kind   EventKind
	Step   Step // EventStepPlanned
	Index  int  // the step of a tool call event
	Call   Call // tool call events
	Answer string

	// Progress is the update of an EventToolCallProgress.
	Progress Progress

	// Pending are the calls of an EventApprovalRequired.
	Pending []PendingCall

	// Inputs are the requests of an EventInputRequired.
	Inputs []Input
}
