package registry

import (
	"context"
	"net/http"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/egress"
)

// Config tunes the registry; zero fields take the defaults in New.
type Config struct {
	HealthInterval  time.Duration // between tools/list checks of a ready connector; 30s
	HealthTimeout   time.Duration // bound on one check; 10s
	Concurrency     int           // connects and checks running at once; 16
	BackoffBase     time.Duration // first reconnect delay (full jitter); 1s
	BackoffMax      time.Duration // reconnect delay cap; 30s, so a connector nobody calls is back within 30 s of its server
	ErrorAfter      int           // consecutive failures before StateError; 3
	ProbeAfter      time.Duration // a call to a down connector reconnects now if the last try is older (the fail-fast window); 3s
	ProbeTimeout    time.Duration // bound on the probe after a call timed out; 3s
	SessionIdleTTL  time.Duration // a per-session connection unused this long closes; 15m
	MaxSessions     int           // open sessions per per_session connector; 64
	DiscoverTimeout time.Duration // bound on the 2026-07 server/discover probe; 1s
	CloseGrace      time.Duration // before a stdio server's process group is killed; 2s
	UsageInterval   time.Duration // between counter reports; 5s
	// HealthSaveInterval is how often a connector's health is written
	// to the source when only its check time and latency changed; a
	// change of state, error or protocol version is written at once; 10m.
	HealthSaveInterval time.Duration
	// MaxIdleConnsPerConnector is how many idle HTTP connections an SSE
	// or streamable-HTTP connector keeps open to its server for reuse:
	// more than the calls it runs at once, or calls beyond it open new
	// connections. A connection goes back to the pool a moment after its
	// response is read, so callers at full speed open a few more than
	// their number, which a pool of exactly their number closes again at
	// each lull. 128: for 64 callers.
	MaxIdleConnsPerConnector int
	// MaxResultBytes is the most content a tool result may carry (the
	// server's MAX_TOOL_RESULT_BYTES): a message from a server is read
	// up to about twice that and refused past it, with
	// ErrResultTooLarge; 3 MiB.
	MaxResultBytes int
	// Egress checks every address an HTTP connector connects to (stdio
	// servers make their own connections, unchecked); nil means the
	// default policy, egress.New(egress.Config{}).
	Egress *egress.Policy
	// MeterProvider records the registry's metrics (see metrics.go); nil
	// records none.
	MeterProvider metric.MeterProvider
	// TracerProvider makes the spans of connects, re-initializes and tool
	// calls; nil means otel's global one.
	TracerProvider trace.TracerProvider

	// DetachSessions leaves the per-session MCP sessions of classic
	// streamable HTTP open at the server when the registry shuts down (no
	// DELETE), so that another replica can adopt them (see Adopt); stdio
	// processes still stop, and other sessions still end.
	DetachSessions bool
	// OnSessionOpened, if set, hears of every MCP session a caller session
	// of a per_session connector opens or adopts here, with its handle
	// (the zero handle when it cannot be adopted: see SessionHandle), after
	// it opened and before a call runs on it: a session renewed after a
	// loss is told again, with its new handle. It runs on the path of the
	// call that opened the session: keep it short.
	OnSessionOpened func(id int64, sessionID string, h SessionHandle)
	// OnSessionClosed, if set, hears of every caller session of a
	// per_session connector that ends here (CloseSession, idle expiry, the
	// connector's removal, update or deletion, shutdown), except one
	// detached at shutdown (see DetachSessions), whose MCP session lives on
	// for another replica.
	OnSessionClosed func(id int64, sessionID string)
	// OnResourceEvent, if set, hears of a server's notifications about
	// its resources and prompts on a connector's shared connection: a
	// subscribed resource updated, a list changed (see Subscribe). It
	// runs on the connection's reader: keep it short.
	OnResourceEvent func(id int64, ev ResourceEvent)

	// Authorize, if set, wraps base, a connector's pooled HTTP transport,
	// with one that authorizes its requests: as the connector's own
	// identity (user "") for an AuthClientCredentials connector, as user
	// for the connection of one end user of an AuthUser connector. Errors
	// its RoundTrip makes itself (not base's) reach callers as *AuthError,
	// wrapping them, and never count as the connection failing. Without
	// it, OAuth connectors' requests fail.
	Authorize func(base http.RoundTripper, spec Spec, user string) http.RoundTripper

	// ElicitationTimeout bounds how long an elicitation a server sends
	// while its call is open (the classic protocol) waits for the user's
	// answer before it is answered "cancel"; the transport may allow less
	// (see asks.go), and the call's own deadline still holds. 10m.
	ElicitationTimeout time.Duration
	// Sample, if set, answers a server's sampling/createMessage on a
	// connector with sampling on, for the call it belongs to: a, the
	// call's Asker (nil when the call has none), and call name it. Without
	// it, sampling requests get an error.
	Sample func(ctx context.Context, id int64, a ask.Asker, call ask.Call, req mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error)

	// ownTransports gives each connector an HTTP transport of its own,
	// as before connectors shared them; for benchmarks that compare.
	ownTransports bool
}

func (c *Config) setDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.HealthInterval, 30*time.Second)
	def(&c.HealthTimeout, 10*time.Second)
	def(&c.BackoffBase, time.Second)
	def(&c.BackoffMax, 30*time.Second)
	def(&c.DiscoverTimeout, time.Second)
	def(&c.CloseGrace, 2*time.Second)
	def(&c.UsageInterval, 5*time.Second)
	def(&c.HealthSaveInterval, 10*time.Minute)
	def(&c.ProbeAfter, 3*time.Second)
	def(&c.ProbeTimeout, 3*time.Second)
	def(&c.SessionIdleTTL, 15*time.Minute)
	def(&c.ElicitationTimeout, 10*time.Minute)
	if c.MaxSessions <= 0 {
		c.MaxSessions = 64
	}
	if c.MaxIdleConnsPerConnector <= 0 {
		c.MaxIdleConnsPerConnector = 128
	}
	if c.MaxResultBytes <= 0 {
		c.MaxResultBytes = 3 << 20
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 16
	}
	if c.ErrorAfter <= 0 {
		c.ErrorAfter = 3
	}
	if c.Egress == nil {
		c.Egress = egress.New(egress.Config{})
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
}
