// Package queries is the use case of running a query on a connector's
// agent, whatever the front door (the gRPC API today): starting a run (its
// connector, session and user, the rate limit, a user who must authorize
// first), the run going on detached from its caller on this replica until
// it ends or pauses (for a person's approval, for a user's input, for a
// user's authorization), its record, and resuming a paused run with
// decisions, answers, or once its user has authorized. It knows nothing of
// gRPC or proto: a front door validates and converts its request into a
// Start or a Resume, converts the Outcome, and maps the typed errors of
// errors.go to its own. Where a run starts or resumes (here, or on the
// replica that holds its session or its open tool call) is live.Placer's
// to say, before; the Placer checks the caller's session and user ids
// against the connector then, and Start takes them as checked.
package queries

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"time"

	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/authorizations"
	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/llm"
	"github.com/connector-svc/connector-svc/internal/oauth"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/pending"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/runs"
	"github.com/connector-svc/connector-svc/internal/store"
)

// Bounds of a query's request.
const (
	MaxQueryBytes   = 32 << 10
	MaxContextBytes = 64 << 10
)

// Connectors finds the connector a run is for (calls.Service does).
type Connectors interface {
	// Callable is the registry id of a workspace's active connector.
	Callable(ctx context.Context, workspaceID, connectorID string) (int64, error)
	// ActiveConnector reads a workspace's connector, refusing an inactive
	// one.
	ActiveConnector(ctx context.Context, workspaceID, connectorID string) (*store.Connector, error)
}

// RunStore reads paused runs and claims them for a resume (*store.DB).
type RunStore interface {
	GetRun(ctx context.Context, workspaceID, id string) (*store.Run, error)
	ClaimRun(ctx context.Context, workspaceID, id string, version int, trace json.RawMessage, replica string) (*store.Run, error)
}

// Limits hold runs to their connectors' rate limits (calls.Limits does).
type Limits interface {
	// Admit takes a token of row's rate limit for a run to start or go on;
	// without one it returns the refusal, as the front door maps it.
	Admit(ctx context.Context, row *store.Connector) error
	// Throttle is the gate of a run's tool calls on row's connector; nil
	// without a limit.
	Throttle(row *store.Connector) func(context.Context) error
}

// Authorizations are what a run needs of its users' OAuth authorizations
// (authorizations.Service, whose step-up limits direct calls share).
type Authorizations interface {
	// Required is nil when userID holds a usable token of row's
	// connector, and says why not (an *oauth.RequiredError, NO_TOKEN) when
	// they must authorize first.
	Required(ctx context.Context, row *store.Connector, userID string) (*oauth.RequiredError, error)
	// Start starts an authorization of row's connector for userID, for
	// reason (a step-up asks for scopes on top of those held), and says
	// where to send the user.
	Start(ctx context.Context, row *store.Connector, userID, reason string, scopes []string) (*Authorization, error)
}

// Deps are a Service's collaborators.
type Deps struct {
	// Agent runs the queries; nil means no LLM is configured, and runs are
	// refused with llm.ErrNotConfigured.
	Agent      *orchestrator.Agent
	Registry   *registry.Registry
	Live       *live.Connectors
	Connectors Connectors
	Runs       RunStore
	// Log writes the run records off the request path; its Replica names
	// this replica in the runs it holds.
	Log      *runs.Log
	Counters *runs.Counters
	Limits   Limits
	// Asks holds the servers' questions that wait here for an answer; the
	// direct calls' too.
	Asks *pending.Table
	// Placer settles the claim of a session a refused query left
	// unopened; nil: a single replica.
	Placer *live.Placer
	// Authorizations start users' authorizations; needed by oauth_user
	// connectors only.
	Authorizations Authorizations
	// SamplingBudget is a run's sampling budget of a connector; nil, or a
	// nil budget, means none.
	SamplingBudget func(*store.Connector) *ask.Budget
	// ErrorMessage is what a failed run's record says of err: the message
	// its caller got. Nil: err's own text.
	ErrorMessage func(ctx context.Context, err error) string
	// QueryTimeout bounds a run detached from its caller; ApprovalTimeout
	// is how long a paused run waits. Both must be set.
	QueryTimeout, ApprovalTimeout time.Duration
	Logger                        *slog.Logger
}

// Service runs queries and resumes them. Safe for concurrent use.
type Service struct {
	d Deps
	// live are the runs going on here.
	live liveRuns
}

// New returns a Service over d.
func New(d Deps) *Service {
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	return &Service{d: d}
}

// Start is one query of a connector.
type Start struct {
	WorkspaceID, ConnectorID string
	Query, Context           string
	// MaxTools bounds the run's tool calls; 0 means
	// orchestrator.DefaultMaxTools.
	MaxTools int
	// PlanOnly plans the calls without running any.
	PlanOnly bool
	// SessionID and UserID are the caller's session (per_session
	// connectors) and end user (oauth_user connectors).
	SessionID, UserID string
}

// Outcome is where a run is when its caller hears of it: ended, or
// paused (Result.Status says which).
type Outcome struct {
	RunID string
	// Connector is the row of the run's connector.
	Connector *store.Connector
	// Result is the run so far; a live pause's lists only the input
	// requests its caller hears of.
	Result *orchestrator.Result
	// ExpiresAt is when a paused run expires; nil otherwise.
	ExpiresAt *time.Time
	// Authorization, when the run awaits its user's authorization, says
	// where to send them.
	Authorization *Authorization
}

// Authorization is where to send a user who must authorize a connector.
type Authorization = authorizations.Authorization

// Start runs a query on its connector's live agent, detached from ctx
// within QueryTimeout, and returns its first outcome: its end, or a pause.
// emit, if not nil, receives the run's events while the caller waits (a
// pause is not one: the Outcome says it, once recorded). A caller that
// leaves before any pause cancels the run. Errors: llm.ErrNotConfigured,
// registry.ErrSessionRequired (a per_session connector's run without a
// session), Limits.Admit's refusal, the connector's lookup
// errors, and the run's own.
func (s *Service) Start(ctx context.Context, req Start, emit func(orchestrator.Event)) (*Outcome, error) {
	defer s.d.Placer.Settle(live.Target{WorkspaceID: req.WorkspaceID, ConnectorID: req.ConnectorID,
		SessionID: req.SessionID, UserID: req.UserID})
	if s.d.Agent == nil {
		return nil, llm.ErrNotConfigured
	}
	la, user, err := s.admit(ctx, req)
	if err != nil {
		return nil, err
	}
	c := la.Row
	run := &store.Run{ID: runs.NewID(), WorkspaceID: c.WorkspaceID, ConnectorID: c.ID, ConnectorExternalID: c.ExternalID,
		SessionID: req.SessionID, UserID: user, Query: req.Query, Context: req.Context, MaxTools: maxTools(req.MaxTools),
		CreatedAt: time.Now()}
	// A plan runs no tool, so it needs no token; a run does: without one
	// it waits for the user to authorize.
	if user != "" && !req.PlanOnly {
		if required, err := s.d.Authorizations.Required(ctx, c, user); err != nil || required != nil {
			if err != nil {
				return nil, err
			}
			s.countQuery(c, nil, nil, true, orchestrator.Usage{})
			return s.pauseForAuthorization(ctx, run, c, required)
		}
	}
	var cat registry.Catalog
	if req.PlanOnly {
		cat, err = s.d.Registry.Catalog(ctx, c.ID)
	} else {
		cat, err = s.d.Registry.CatalogFor(ctx, c.ID, user)
	}
	if required, ok := asRequired(err); ok && user != "" {
		s.countQuery(c, nil, nil, true, orchestrator.Usage{})
		return s.pauseForAuthorization(ctx, run, c, required)
	}
	if err != nil {
		return nil, err
	}
	// The agent's tool calls run on the session's connection, for a
	// per_session connector, on the user's for an oauth_user one. The run
	// goes on detached from the caller, who waits for its end or its
	// first live pause for input.
	areq := s.agentRequest(run, c, la.Connector(cat))
	areq.PlanOnly = req.PlanOnly
	return s.runLive(ctx, run, c, emit, true, orchestrator.Usage{},
		func(ctx context.Context, emit func(orchestrator.Event), inputs orchestrator.InputBroker) (*orchestrator.Result, error) {
			areq.Inputs = inputs
			return s.d.Agent.Run(ctx, areq, emit)
		})
}

// admit checks that req's connector can be used now: active, its live
// agent, the caller's session, a token of its rate limit. It
// returns the agent and the user the run runs as ("" but for an
// oauth_user connector). Nothing is read from the store on the way, once
// the connector's settings are known.
func (s *Service) admit(ctx context.Context, req Start) (*live.Agent, string, error) {
	id, err := s.d.Connectors.Callable(ctx, req.WorkspaceID, req.ConnectorID)
	if err != nil {
		return nil, "", err
	}
	la, err := s.d.Live.Settings(id, func() (*store.Connector, error) {
		return s.d.Connectors.ActiveConnector(ctx, req.WorkspaceID, req.ConnectorID)
	})
	if err != nil {
		return nil, "", err
	}
	c := la.Row
	// Checked before the model runs: its tool calls would each fail. A
	// plan runs no tool, so it needs no session.
	if c.Config.SessionMode == registry.SessionPerSession && req.SessionID == "" && !req.PlanOnly {
		return nil, "", registry.ErrSessionRequired
	}
	user := ""
	if c.Config.AuthMode() == store.AuthUser {
		user = req.UserID
	}
	if err := s.d.Limits.Admit(ctx, c); err != nil {
		return nil, "", err
	}
	return la, user, nil
}

// maxTools is n, or the default for 0.
func maxTools(n int) int {
	if n == 0 {
		return orchestrator.DefaultMaxTools
	}
	return n
}

// agentRequest is the agent's request of run on connector c, whose tools
// are conn.
func (s *Service) agentRequest(run *store.Run, c *store.Connector, conn *orchestrator.Connector) orchestrator.Request {
	r := orchestrator.Request{Connector: conn, Query: run.Query, Context: run.Context, MaxTools: run.MaxTools,
		Session: run.SessionID, UserID: run.UserID, Throttle: s.d.Limits.Throttle(c)}
	if s.d.SamplingBudget != nil {
		r.SamplingBudget = s.d.SamplingBudget(c)
	}
	return r
}

// asRequired returns the *oauth.RequiredError err wraps, if any.
func asRequired(err error) (*oauth.RequiredError, bool) {
	var re *oauth.RequiredError
	ok := errors.As(err, &re)
	return re, ok
}

// errorMessage is what a failed run's record says.
func (s *Service) errorMessage(ctx context.Context, err error) string {
	switch {
	case err == nil:
		return ""
	case s.d.ErrorMessage == nil:
		return err.Error()
	}
	return s.d.ErrorMessage(ctx, err)
}

// endRun records a run that ended with res and err, and says its outcome.
func (s *Service) endRun(ctx context.Context, run *store.Run, c *store.Connector, res *orchestrator.Result, runErr error, resumed bool) (*Outcome, error) {
	rec, err := runs.Record(run, c.Name, res, runErr, s.errorMessage(ctx, runErr), s.d.ApprovalTimeout)
	if err == nil {
		err = s.d.Log.Keep(ctx, rec, resumed)
	}
	if err != nil && rec != nil && (rec.Status == store.RunAwaitingApproval || rec.Status == store.RunAwaitingAuthorization ||
		rec.Status == store.RunAwaitingInput) {
		// Without its record the run could never be resumed.
		return nil, err
	}
	if err != nil {
		s.d.Logger.ErrorContext(ctx, "record query run", slog.String("run_id", run.ID), slog.String("error", err.Error()))
	}
	if runErr != nil {
		return nil, runErr
	}
	out := &Outcome{RunID: run.ID, Connector: c, Result: res}
	if rec != nil && rec.ExpiresAt != nil {
		exp := *rec.ExpiresAt
		out.ExpiresAt = &exp
	}
	if res.Status == orchestrator.StatusAwaitingInput {
		for _, in := range res.Inputs {
			s.d.Counters.CountInput(c, in.Mode, "asked")
		}
	}
	if res.Status == orchestrator.StatusAwaitingAuthorization && res.Authorization != nil {
		// A call met the user's missing (or too narrow) authorization:
		// where to send them. Its ExpiresAt is the URL's; the run's is
		// later.
		a, err := s.d.Authorizations.Start(ctx, c, run.UserID, res.Authorization.Reason, res.Authorization.Scopes)
		if err != nil {
			return nil, err
		}
		a.RunID = run.ID
		out.Authorization = a
	}
	return out, nil
}

// countQuery counts a run in the connector's counters, the tokens of a
// failed run included (those of the sampling requests it answered too);
// they reach the store in the background. A resumed run (newQuery false)
// adds the tokens it spent since before, not another query.
func (s *Service) countQuery(c *store.Connector, res *orchestrator.Result, runErr error, newQuery bool, before orchestrator.Usage) {
	now := time.Now()
	d := store.Counters{LastUsedAt: &now}
	if newQuery {
		d.Queries = 1
	}
	if runErr != nil {
		d.QueryErrors = 1
	}
	if res != nil {
		d.PromptTokens, d.CompletionTokens = res.Usage.PromptTokens-before.PromptTokens, res.Usage.CompletionTokens-before.CompletionTokens
		d.Samplings = res.Usage.SamplingRequests - before.SamplingRequests
	}
	s.d.Counters.Add(c.ID, d)
}

// pauseForAuthorization records run, which has not started, as awaiting
// its user's authorization of row's connector (required says why): the
// Outcome's Authorization has the URL to send the user to until its
// ExpiresAt (the authorization's window) and, like a run awaiting
// approval, the run expires after ApprovalTimeout. Resume runs it from
// the start once authorized.
func (s *Service) pauseForAuthorization(ctx context.Context, run *store.Run, row *store.Connector, required *oauth.RequiredError) (*Outcome, error) {
	a, err := s.d.Authorizations.Start(ctx, row, run.UserID, required.Reason, required.Scopes)
	if err != nil {
		return nil, err
	}
	rec, err := runs.Record(run, row.Name, &orchestrator.Result{}, nil, "", s.d.ApprovalTimeout)
	if err != nil {
		return nil, err
	}
	exp := time.Now().Add(s.d.ApprovalTimeout)
	rec.Status, rec.ExpiresAt, rec.FinishedAt, rec.State = store.RunAwaitingAuthorization, &exp, nil, nil
	if err := s.d.Log.Keep(ctx, rec, false); err != nil {
		return nil, err // without its record the run could never be resumed
	}
	// The run waits until exp; the URL works for less long, and a resume
	// after it answers a new one.
	a.RunID = run.ID
	return &Outcome{RunID: run.ID, Connector: row, Result: &orchestrator.Result{Status: orchestrator.StatusAwaitingAuthorization},
		ExpiresAt: &exp, Authorization: a}, nil
}
