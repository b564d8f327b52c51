package registry

// What the registry is told of each connector, and what it reports back.

import (
	"context"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
)

// Spec is what the registry needs to connect one connector. Secret values
// (Headers, Env) are held in memory only.
type Spec struct {
	ID          int64 // the source's key
	WorkspaceID string
	ConnectorID string
	Transport   string // TransportStdio, TransportSSE or TransportStreamableHTTP
	URL         string
	Headers     map[string]string
	Command     string
	Args        []string
	Env         map[string]string
	SessionMode string // SessionShared (or empty) or SessionPerSession
	Protocol    string // ProtocolAuto (or empty), ProtocolClassic or ProtocolSessionless
	// Auth is how HTTP requests are authorized: AuthNone (or empty),
	// AuthClientCredentials or AuthUser (see Config.Authorize). The
	// other auth fields are for Config.Authorize; ClientSecret is held in
	// memory only.
	Auth                   string
	ClientID, ClientSecret string
	Scopes                 []string

	ConnectTimeout time.Duration
	CallTimeout    time.Duration

	// Elicitation declares elicitation (form and URL modes) on the
	// connector's connections that belong to one user — per-session and
	// per-user ones — and never on a shared one. Sampling declares
	// sampling (with tools) on all its connections, answered through
	// Config.Sample.
	Elicitation bool
	Sampling    bool
}

// State is a connector's connection health.
type State string

// States, as the source persists them.
const (
	StateConnecting State = "connecting"
	StateReady      State = "ready"
	StateDegraded   State = "degraded"
	StateError      State = "error"
)

// Health is a connector's last known connection health.
type Health struct {
	State           State
	LastError       string
	Latency         time.Duration
	CheckedAt       time.Time
	ProtocolVersion string
	// NextAttemptAt is when the next connect attempt is due, while the
	// connector is down and none is under way; zero otherwise. A call
	// after the last attempt + ProbeAfter starts one sooner.
	NextAttemptAt time.Time
}

// Usage are counter increments since the last report.
type Usage struct {
	Calls, Errors, Reconnects, Reinitializations int64
	LastUsed                                     time.Time // zero if unused
}

// ToolChanges says what a catalog sync changed, and which tools operators
// have disabled after it.
type ToolChanges struct {
	Added, Removed, Changed []string
	Disabled                []string
	// Approval holds the tools whose approval an operator overrode: true
	// always asks, false never; a tool not in it follows its connector's
	// policy.
	Approval map[string]bool
}

// Empty reports whether nothing changed.
func (t ToolChanges) Empty() bool { return len(t.Added)+len(t.Removed)+len(t.Changed) == 0 }

// ToolFlags are the operators' flags of a connector's tools as the source
// holds them: what a follower, which syncs no catalog, reads (see
// SetOwner).
type ToolFlags struct {
	// Enabled holds every listed tool the source knows, and whether it may
	// be called. A tool the source does not know yet (the owner has not
	// synced it) is callable on a follower, as the owner's sync will make
	// it, unless DisableNew says new tools start disabled.
	Enabled    map[string]bool
	DisableNew bool
	// Approval holds the tools whose approval an operator overrode (see
	// ToolChanges.Approval).
	Approval map[string]bool
}

// ConnectorSource is where the registry reads connectors and reports what it
// learns. It is an interface here so that the registry needs no SQL.
type ConnectorSource interface {
	// ActiveConnectors returns every connector to connect at start-up.
	ActiveConnectors(ctx context.Context) ([]Spec, error)
	// SyncTools makes the stored catalog of connector id match tools.
	SyncTools(ctx context.Context, id int64, tools []mcp.Tool) (ToolChanges, error)
	// ToolFlags reads the flags of connector id's tools, writing nothing.
	ToolFlags(ctx context.Context, id int64) (ToolFlags, error)
	// SaveHealth persists a connector's health.
	SaveHealth(ctx context.Context, id int64, h Health) error
	// AddUsage adds counter increments.
	AddUsage(ctx context.Context, id int64, u Usage) error
}

// perSession reports whether the connector opens a connection per caller
// session; its own connection then only lists the tools.
func (s *Spec) perSession() bool { return s.SessionMode == SessionPerSession }

// perUser reports whether the connector runs each end user's calls on
// that user's own connection (AuthUser).
func (s *Spec) perUser() bool { return s.Auth == AuthUser }

// ownConnections reports whether the connector's calls run on
// connections of their own (per caller session or per user), its own
// connection only listing tools or probing.
func (s *Spec) ownConnections() bool { return s.perSession() || s.perUser() }
