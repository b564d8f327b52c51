package sampling

import (
	"context"
	"fmt"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/store"
)

// Limits are sampling budgets; a 0 is the default's.
type Limits struct {
	MaxTokensPerRequest  int
	MaxRequestsPerRun    int
	MaxTokensPerRun      int
	MaxRequestsPerMinute int
	MaxTokensPerMinute   int
}

// DefaultLimits are the service's defaults, as the API documents them.
var DefaultLimits = Limits{
	MaxTokensPerRequest:  1024,
	MaxRequestsPerRun:    10,
	MaxTokensPerRun:      16384,
	MaxRequestsPerMinute: 60,
	MaxTokensPerMinute:   100000,
}

// or is l with each 0 taken from d.
func (l Limits) or(d Limits) Limits {
	pick := func(v, def int) int {
		if v > 0 {
			return v
		}
		return def
	}
	return Limits{
		MaxTokensPerRequest:  pick(l.MaxTokensPerRequest, d.MaxTokensPerRequest),
		MaxRequestsPerRun:    pick(l.MaxRequestsPerRun, d.MaxRequestsPerRun),
		MaxTokensPerRun:      pick(l.MaxTokensPerRun, d.MaxTokensPerRun),
		MaxRequestsPerMinute: pick(l.MaxRequestsPerMinute, d.MaxRequestsPerMinute),
		MaxTokensPerMinute:   pick(l.MaxTokensPerMinute, d.MaxTokensPerMinute),
	}
}

// MinuteStore counts a connector's sampling per minute over all replicas
// (store.DB implements it).
type MinuteStore interface {
	ReserveSampling(ctx context.Context, id int64, at time.Time, tokens, maxRequests, maxTokens int) (store.SamplingMinute, bool, error)
	SettleSampling(ctx context.Context, id int64, minute time.Time, delta int) error
}

// Limits are the budgets of a connector with sampling settings c (nil:
// the defaults).
func (s *Sampler) Limits(c *store.SamplingConfig) Limits {
	if c == nil {
		return s.defaults
	}
	return Limits{
		MaxTokensPerRequest:  c.MaxTokensPerRequest,
		MaxRequestsPerRun:    c.MaxRequestsPerRun,
		MaxTokensPerRun:      c.MaxTokensPerRun,
		MaxRequestsPerMinute: c.MaxRequestsPerMinute,
		MaxTokensPerMinute:   c.MaxTokensPerMinute,
	}.or(s.defaults)
}

// Budget is a fresh per-run budget (a query run's, or a direct call's) of
// a connector with sampling settings c.
func (s *Sampler) Budget(c *store.SamplingConfig) *ask.Budget {
	l := s.Limits(c)
	return ask.NewBudget(l.MaxRequestsPerRun, l.MaxTokensPerRun)
}

// reservation is what one request holds of its budgets while the model
// answers: tokens of its run's budget and of its connector's minute.
// settle gives back what it did not use.
type reservation struct {
	s           *Sampler
	id          int64
	t           Target
	run         *ask.Budget // nil: the request has no run budget
	runReserved int
	minute      time.Time
	inMinute    bool // the connector's minute holds tokens
	tokens      int  // the most the request may use, as reserved
	used        int  // what it used, once the model answered
}

// reserve takes up to maxTokens from the run's budget (a's), then what
// that left from the connector's minute over all replicas; when either is
// spent nothing stays reserved and the error says which.
func (s *Sampler) reserve(ctx context.Context, id int64, t Target, lim Limits, a ask.Asker, maxTokens int) (*reservation, error) {
	r := &reservation{s: s, id: id, t: t, tokens: maxTokens}
	if a != nil {
		r.run = a.Sampling()
	}
	if r.run != nil {
		reserved, err := r.run.Reserve(maxTokens)
		if err != nil {
			return nil, &Error{Code: mcp.INTERNAL_ERROR, Outcome: OutcomeBudget, Msg: err.Error(), err: err}
		}
		r.runReserved, r.tokens = reserved, reserved
	}
	if s.cfg.Minutes == nil {
		return r, nil
	}
	m, ok, err := s.cfg.Minutes.ReserveSampling(ctx, id, s.cfg.Now(), r.tokens, lim.MaxRequestsPerMinute, lim.MaxTokensPerMinute)
	if err != nil {
		r.settle(ctx)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		s.log.Warn("sampling: the per-minute budget cannot be checked", "connector", t.Name, "err", err)
		return nil, &Error{Code: mcp.INTERNAL_ERROR, Outcome: OutcomeFailed, Msg: "sampling refused: the connector's per-minute budget cannot be checked now"}
	}
	if !ok {
		r.settle(ctx)
		what := fmt.Sprintf("%d sampling tokens per minute", lim.MaxTokensPerMinute)
		if m.Requests >= lim.MaxRequestsPerMinute {
			what = fmt.Sprintf("%d sampling requests per minute", lim.MaxRequestsPerMinute)
		}
		return nil, &Error{Code: mcp.INTERNAL_ERROR, Outcome: OutcomeBudget, err: ask.ErrBudget,
			Msg: fmt.Sprintf("%v: %s for connector %q", ask.ErrBudget, what, t.Name)}
	}
	r.minute, r.inMinute = m.Minute, true
	return r, nil
}

// settle gives back what the request reserved and did not use: the
// connector's minute first, then the run's budget. The minute is settled
// even when the call's context has ended: its count must not keep the
// reservation.
func (r *reservation) settle(ctx context.Context) {
	if r.inMinute {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := r.s.cfg.Minutes.SettleSampling(sctx, r.id, r.minute, r.used-r.tokens); err != nil {
			r.s.log.Warn("sampling: settle the per-minute budget", "connector", r.t.Name, "err", err)
		}
	}
	if r.run != nil {
		r.run.Settle(r.runReserved, r.used)
	}
}
