// Package calls is the use case of calling a connector's tool directly,
// whatever the front door (the gRPC API today): which connector and
// connection the call runs on (the caller's session's, the end user's),
// whether it may run now (the approval policy, the rate limit), the
// server's questions in the middle of it, and the answers to them. It
// knows nothing of gRPC or proto: a front door validates and converts its
// request into a Request, and maps the typed errors of errors.go to its
// own. Where the call runs (here, or on the replica a front door forwards
// it to) is live.Placer's to say, before Call; the Placer checks the
// caller's session and user ids against the connector then, and Call takes
// them as checked. The limits of a call (its arguments' and its result's
// sizes, its connector's rate limit) are this package's: limits.go.
package calls

import (
	"context"
	"errors"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/oauth"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/pending"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/runs"
	"github.com/connector-svc/connector-svc/internal/store"
)

// ConnectorStore reads a connector's row when the live state does not
// hold it, for the precise error (not found, inactive).
type ConnectorStore interface {
	GetConnector(ctx context.Context, workspaceID, connectorID string) (*store.Connector, error)
}

// Deps are a Service's collaborators.
type Deps struct {
	Registry *registry.Registry
	Live     *live.Connectors
	Store    ConnectorStore
	Limits   Limits
	Counters *runs.Counters
	// Asks holds the servers' questions that wait here for an answer; the
	// query runs' too.
	Asks *pending.Table
	// Placer settles the claim of a session a refused call left unopened;
	// nil: a single replica.
	Placer *live.Placer
	// MaxArgumentsBytes caps a call's arguments (Request.ArgumentsBytes),
	// MaxResultBytes its result; 0 or less is no cap.
	MaxArgumentsBytes, MaxResultBytes int
	// SamplingBudget is a direct call's sampling budget of a connector;
	// nil, or a nil budget, means none.
	SamplingBudget func(*store.Connector) *ask.Budget
}

// Service calls connectors' tools. Safe for concurrent use.
type Service struct{ d Deps }

// New returns a Service over d.
func New(d Deps) *Service { return &Service{d: d} }

// Request is one direct call of a tool.
type Request struct {
	WorkspaceID, ConnectorID, Tool string
	Args                           map[string]any
	// ArgumentsBytes is the size of Args as the front door received them
	// (its encoding), which MaxArgumentsBytes caps.
	ArgumentsBytes int
	// SessionID and UserID are the caller's session (per_session
	// connectors) and end user (oauth_user connectors).
	SessionID, UserID string
	// UserApproved says the caller has a person's approval for a tool
	// that needs one.
	UserApproved bool
	// Progress, if not nil, receives the server's progress updates.
	Progress func(registry.Progress)
	// Ask, if not nil, hands each question of the server to the caller
	// (once it waits in the table: Answer reaches it), from any goroutine,
	// with the name of the connector that asks.
	// Nil means the caller cannot carry one (a unary call): each is
	// answered cancel at once and listed in Result.Cancelled, and a
	// sampling request to approve is refused.
	Ask func(connectorName string, in orchestrator.Input)
}

// Result is a call's outcome.
type Result struct {
	*mcp.CallToolResult
	Duration time.Duration
	// Restarted: the call ran on a new MCP session in place of one the
	// caller's session had (here, or on a replica that stopped).
	Restarted bool
	// TaskID is the MCP task the call ran as, if it did.
	TaskID string
	// Cancelled are the questions a unary call answered cancel.
	Cancelled []orchestrator.Input
	// ConnectorName is the name of the connector the call ran on.
	ConnectorName string
}

// Call runs req's tool on its connector's live connection: the caller's
// session's for a per_session connector, the end user's for an oauth_user
// one. It refuses arguments over MaxArgumentsBytes
// (*ArgumentsTooLargeError), a tool that needs approval without
// UserApproved (*ApprovalRequiredError) and a call over the rate limit
// (*RateLimitedError); a user who must authorize first is an
// *AuthorizationRequiredError; a result over MaxResultBytes, or over the
// registry's limit, is a *ResultTooLargeError.
func (s *Service) Call(ctx context.Context, req Request) (_ *Result, err error) {
	defer s.d.Placer.Settle(live.Target{WorkspaceID: req.WorkspaceID, ConnectorID: req.ConnectorID,
		SessionID: req.SessionID, UserID: req.UserID})
	if err := s.checkArguments(req.ArgumentsBytes); err != nil {
		return nil, err
	}
	id, err := s.Callable(ctx, req.WorkspaceID, req.ConnectorID)
	if err != nil {
		return nil, err
	}
	row, err := s.LiveRow(ctx, id, req.WorkspaceID, req.ConnectorID)
	if err != nil {
		return nil, err
	}
	// An oauth_user connector runs the call on the user's own connection,
	// with that user's token.
	user := ""
	if row.Config.AuthMode() == store.AuthUser {
		user = req.UserID
	}
	defer func() {
		var required *oauth.RequiredError
		if errors.As(err, &required) {
			err = &AuthorizationRequiredError{Row: row, UserID: user, Required: required}
		}
	}()
	settings, err := s.d.Live.Settings(id, func() (*store.Connector, error) {
		return s.ActiveConnector(ctx, req.WorkspaceID, req.ConnectorID)
	})
	if err != nil {
		return nil, err
	}
	if err := s.checkApproval(ctx, id, settings.Row, req, user); err != nil {
		return nil, err
	}
	if err := s.d.Limits.Admit(ctx, settings.Row); err != nil {
		return nil, err
	}
	start := time.Now()
	var restarted bool
	var taskID string
	opts := registry.CallOptions{Session: req.SessionID, UserID: user, Progress: req.Progress, Restarted: &restarted, TaskID: &taskID}
	a := s.newAsker(row, req)
	res, err := s.callWithInputs(ctx, a, id, req.Tool, req.Args, opts)
	if errors.Is(err, registry.ErrResultTooLarge) {
		return nil, &ResultTooLargeError{Limit: s.d.MaxResultBytes}
	}
	if err != nil {
		return nil, err
	}
	if err := s.CheckResultBytes(ResultSize(res)); err != nil {
		return nil, err
	}
	return &Result{CallToolResult: res, Duration: time.Since(start), Restarted: restarted, TaskID: taskID,
		Cancelled: a.cancelledInputs(), ConnectorName: row.Name}, nil
}

// Callable returns the registry id of an active connector. The registry
// holds exactly the active connectors, with their live catalogs: it is the
// one that knows which tools exist, and a call to a connector it holds
// goes to it (waiting for a connect under way) even if the tool turns out
// not to exist. Only a connector it does not hold goes to the store, for
// the precise error.
func (s *Service) Callable(ctx context.Context, workspaceID, connectorID string) (int64, error) {
	if id, ok := s.d.Registry.Lookup(workspaceID, connectorID); ok {
		return id, nil
	}
	c, err := s.ActiveConnector(ctx, workspaceID, connectorID)
	if err != nil {
		return 0, err
	}
	// Active in the store but not held: activated a moment ago by another
	// request (through another replica: learn of it now, and wait for its
	// connect), or its secrets did not open.
	if s.d.Live != nil {
		s.d.Live.Learn(ctx, c)
	}
	if id, ok := s.d.Registry.Lookup(workspaceID, connectorID); ok {
		return id, nil
	}
	return 0, &UnavailableError{LastError: c.Health.LastError}
}

// ActiveConnector loads a workspace's connector and refuses an inactive
// one (ErrInactive).
func (s *Service) ActiveConnector(ctx context.Context, workspaceID, connectorID string) (*store.Connector, error) {
	c, err := s.d.Store.GetConnector(ctx, workspaceID, connectorID)
	if err != nil {
		return nil, err
	}
	if !c.Active {
		return nil, ErrInactive
	}
	return c, nil
}

// LiveRow is the row connector id's live copy was built from.
func (s *Service) LiveRow(ctx context.Context, id int64, workspaceID, connectorID string) (*store.Connector, error) {
	if row, ok := s.d.Live.Row(id); ok {
		return row, nil
	}
	return s.d.Store.GetConnector(ctx, workspaceID, connectorID)
}

// checkApproval refuses a direct call of a tool that needs approval,
// unless the caller says it has the user's. A tool that may not be called
// (not listed, disabled) is left to the call, which says why.
func (s *Service) checkApproval(ctx context.Context, id int64, row *store.Connector, req Request, user string) error {
	if req.UserApproved {
		return nil
	}
	cat, err := s.d.Registry.CatalogFor(ctx, id, user)
	if err != nil {
		return err
	}
	t, override, ok := cat.Tool(req.Tool)
	if ok && live.NeedsApproval(row.Config.ApprovalPolicy, t, override) {
		return &ApprovalRequiredError{Tool: req.Tool}
	}
	return nil
}
