package server

import (
	"cmp"
	"time"

	"github.com/google/uuid"

	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/egress"
	"github.com/connector-svc/connector-svc/internal/store"
)

// Config is the server's behaviour that operators set.
type Config struct {
	// StdioAllowedCommands are the only commands a stdio connector may run.
	StdioAllowedCommands []string
	// DefaultRPCTimeout is the deadline of an RPC whose caller set none.
	DefaultRPCTimeout time.Duration
	// QueryTimeout is the deadline of a query whose caller set none.
	QueryTimeout time.Duration
	// MaxToolResultBytes caps the content a CallTool response carries, and
	// the contexts a query response carries in total. Keep it below
	// MaxSendBytes.
	MaxToolResultBytes int
	// MaxToolArgumentsBytes caps the encoded arguments of a CallTool
	// request. Keep it below MaxRecvBytes, or gRPC refuses first.
	MaxToolArgumentsBytes int
	// MaxRecvBytes and MaxSendBytes are the gRPC message size limits.
	MaxRecvBytes, MaxSendBytes int
	// Egress refuses HTTP connectors whose host is, or resolves to, an
	// address it denies; nil means the default policy. Give the registry
	// the same policy: it checks every dial.
	Egress *egress.Policy
	// Auth is when callers need API keys (accessRules says which); the
	// empty mode, like auth.ModeNone, asks for none.
	Auth auth.Mode
	// ApprovalTimeout is how long a paused run waits for a decision before
	// it expires; 0 means DefaultApprovalTimeout.
	ApprovalTimeout time.Duration
	// ReplicaID names this replica in the runs it resumes, and in those it
	// holds paused live for input; "" makes one up.
	ReplicaID string
	// RunFlushInterval is how often run records that need not be written
	// at once (failed runs, failed writes) are written; 0 means a second.
	RunFlushInterval time.Duration
	// SamplingBudget is the sampling budget of one query run, or of one
	// direct tool call, of a connector (its per-run limits); nil, or a nil
	// budget, means none.
	SamplingBudget func(*store.Connector) *ask.Budget
	// OAuthWindow is how long an authorization started stays valid
	// (OAUTH_STATE_TTL): within it a user's step-ups (authorizations for
	// more scopes) of one connector are capped; 0 means
	// DefaultOAuthWindow.
	OAuthWindow time.Duration
}

// Size defaults. A default gRPC client receives at most 4 MiB, so that is
// what the server sends at most, and a tool result leaves 1 MiB of room.
const (
	DefaultMaxToolResultBytes    = 3 << 20
	DefaultMaxToolArgumentsBytes = 4 << 20
	DefaultMaxRecvBytes          = 8 << 20
	DefaultMaxSendBytes          = 4 << 20
)

// withDefaults is cfg with a default for each value left unset.
func (cfg Config) withDefaults() Config {
	if cfg.DefaultRPCTimeout <= 0 {
		cfg.DefaultRPCTimeout = 30 * time.Second
	}
	if cfg.QueryTimeout <= 0 {
		cfg.QueryTimeout = 2 * time.Minute
	}
	cfg.MaxToolResultBytes = orDefaultSize(cfg.MaxToolResultBytes, DefaultMaxToolResultBytes)
	cfg.MaxToolArgumentsBytes = orDefaultSize(cfg.MaxToolArgumentsBytes, DefaultMaxToolArgumentsBytes)
	cfg.MaxRecvBytes = orDefaultSize(cfg.MaxRecvBytes, DefaultMaxRecvBytes)
	cfg.MaxSendBytes = orDefaultSize(cfg.MaxSendBytes, DefaultMaxSendBytes)
	if cfg.Egress == nil {
		cfg.Egress = egress.New(egress.Config{})
	}
	cfg.ApprovalTimeout = cmp.Or(max(cfg.ApprovalTimeout, 0), DefaultApprovalTimeout)
	cfg.OAuthWindow = cmp.Or(max(cfg.OAuthWindow, 0), DefaultOAuthWindow)
	// A run paused live for input is held by its replica by name: one
	// made up stands for a replica that was given none.
	cfg.ReplicaID = cmp.Or(cfg.ReplicaID, "replica-"+uuid.NewString()[:8])
	return cfg
}
