package connectors

import (
	"maps"
	"slices"
	"time"

	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/store"
)

// Spec is a connector as a front door creates or changes it: the settings
// a caller writes, with the write-only secret values (header, env and URL
// query values, the OAuth client secret) in the clear. Check validates
// it; the stored row is made of it (config), its secrets sealed apart.
// Every front door converts its own request to a Spec, so that all of them
// refuse the same connectors with the same messages.
type Spec struct {
	ConnectorID, Name, Description string
	// Transport is store.TransportStdio, TransportSSE or
	// TransportStreamableHTTP; "" is required.
	Transport Choice
	// Stdio is the connection of a stdio connector, HTTP that of an HTTP
	// one; at most one is set.
	Stdio *Stdio
	HTTP  *HTTP
	// Timeouts of 0 get the service's defaults.
	ConnectTimeout, CallTimeout Timeout
	// SessionMode is registry.SessionShared ("" too) or
	// registry.SessionPerSession.
	SessionMode Choice
	// ProtocolPreference is registry.ProtocolAuto ("" too),
	// ProtocolClassic or ProtocolSessionless.
	ProtocolPreference Choice
	// ApprovalPolicy is live.PolicyNone, PolicyDestructive ("" too) or
	// PolicyAll.
	ApprovalPolicy   Choice
	Model            string
	DisableNewTools  bool
	NarrowToolsAbove int
	// RateLimit is as the caller gave it: a rate of 0 is none.
	RateLimit   *store.RateLimit
	Auth        *Auth
	Elicitation bool
	Sampling    *Sampling
}

// Choice is a setting with a fixed set of values, as a front door read it:
// Value is the stored value the caller chose ("" when it chose none, which
// gets the setting's default), and Unknown, when not 0, the number of a
// choice the front door does not know, which Check refuses.
type Choice struct {
	Value   string
	Unknown int32
}

// Timeout is a duration as the caller gave it; Malformed: what the caller
// sent is not a duration.
type Timeout struct {
	D         time.Duration
	Malformed bool
}

// Stdio is a stdio connection. Env holds the values the request sets
// (write-only); EnvKeys the names of those already stored.
type Stdio struct {
	Command string
	Args    []string
	Env     map[string]string
	EnvKeys []string
}

// HTTP is an HTTP connection. Headers holds the values the request sets
// (write-only); HeaderNames the names of those already stored. URL's query
// values are secrets: a value REDACTED keeps the stored one.
type HTTP struct {
	URL         string
	Headers     map[string]string
	HeaderNames []string
}

// Auth is how a connector authorizes to its server. Mode is
// store.AuthNone ("" too), AuthClientCredentials or AuthUser.
// ClientSecret is write-only; HasClientSecret says one is stored.
type Auth struct {
	Mode            Choice
	ClientID        string
	ClientSecret    string
	HasClientSecret bool
	Scopes          []string
}

// Sampling is what a connector's servers may ask its model. Policy is
// store.SamplingAuto ("" too) or SamplingApprove; limits of 0 use the
// service's defaults.
type Sampling struct {
	Enabled                                                 bool
	Policy                                                  Choice
	MaxTokensPerRequest, MaxRequestsPerRun, MaxTokensPerRun int
	MaxRequestsPerMinute, MaxTokensPerMinute                int
}

// authMode is the stored auth mode a's mode names.
func (a *Auth) authMode() string {
	if a == nil || a.Mode.Value == "" {
		return store.AuthNone
	}
	return a.Mode.Value
}

// The API's names of stored values, as messages name them.
var (
	transportNames = map[string]string{store.TransportStdio: "TRANSPORT_STDIO", store.TransportSSE: "TRANSPORT_SSE",
		store.TransportStreamableHTTP: "TRANSPORT_STREAMABLE_HTTP"}
	authModeNames = map[string]string{store.AuthNone: "AUTH_MODE_NONE",
		store.AuthClientCredentials: "AUTH_MODE_OAUTH_CLIENT_CREDENTIALS", store.AuthUser: "AUTH_MODE_OAUTH_USER"}
)

// specOf is the stored connector c as a Spec, its settings normalized as
// the API shows them and without its secret values: the connector an
// update changes.
func specOf(c *store.Connector) *Spec {
	cfg := c.Config
	sp := &Spec{
		ConnectorID: c.ExternalID, Name: c.Name, Description: c.Description,
		Transport:      Choice{Value: known(c.Transport, "", store.TransportStdio, store.TransportSSE, store.TransportStreamableHTTP)},
		ConnectTimeout: Timeout{D: time.Duration(cfg.ConnectTimeout)},
		CallTimeout:    Timeout{D: time.Duration(cfg.CallTimeout)},
		SessionMode:    Choice{Value: known(cfg.SessionMode, registry.SessionShared, registry.SessionPerSession)},
		ProtocolPreference: Choice{Value: known(cfg.ProtocolPreference, registry.ProtocolAuto, registry.ProtocolClassic,
			registry.ProtocolSessionless)},
		ApprovalPolicy:   Choice{Value: known(cfg.ApprovalPolicy, live.PolicyNone, live.PolicyDestructive, live.PolicyAll)},
		Model:            cfg.Model,
		DisableNewTools:  cfg.DisableNewTools,
		NarrowToolsAbove: cfg.NarrowToolsAbove,
		Elicitation:      cfg.Elicitation,
	}
	if c.Transport == store.TransportStdio {
		sp.Stdio = &Stdio{Command: cfg.Command, Args: cfg.Args, EnvKeys: cfg.EnvKeys}
	} else {
		shown, _ := secret.SplitURL(cfg.URL)
		sp.HTTP = &HTTP{URL: shown, HeaderNames: cfg.HeaderNames}
	}
	if rl := cfg.RateLimit; rl != nil {
		sp.RateLimit = &store.RateLimit{RequestsPerSecond: rl.RequestsPerSecond, Burst: rl.Burst}
	}
	if a := cfg.Auth; a != nil && cfg.AuthMode() != store.AuthNone {
		sp.Auth = &Auth{Mode: Choice{Value: a.Mode}, ClientID: a.ClientID, Scopes: a.Scopes, HasClientSecret: a.HasClientSecret}
	}
	if sc := cfg.Sampling; sc != nil {
		sp.Sampling = &Sampling{Enabled: sc.Enabled, Policy: Choice{Value: known(sc.Policy, store.SamplingAuto, store.SamplingApprove)},
			MaxTokensPerRequest: sc.MaxTokensPerRequest, MaxRequestsPerRun: sc.MaxRequestsPerRun, MaxTokensPerRun: sc.MaxTokensPerRun,
			MaxRequestsPerMinute: sc.MaxRequestsPerMinute, MaxTokensPerMinute: sc.MaxTokensPerMinute}
	}
	return sp
}

// known is v if it is one of values, else def, as the API shows a stored
// value it has no name for.
func known(v, def string, values ...string) string {
	if v == def || slices.Contains(values, v) {
		return v
	}
	return def
}

// orDefault is v, or def if v is "".
func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// config is the stored config of a valid spec. Key names are those of the
// write-only maps plus those already stored; the URL keeps its query
// parameters' names, their values redacted.
func config(sp *Spec) store.Config {
	cfg := store.Config{
		ConnectTimeout:     store.Duration(orDefault(sp.ConnectTimeout.D, live.DefaultConnectTimeout)),
		CallTimeout:        store.Duration(orDefault(sp.CallTimeout.D, live.DefaultCallTimeout)),
		SessionMode:        orDefault(sp.SessionMode.Value, registry.SessionShared),
		ProtocolPreference: orDefault(sp.ProtocolPreference.Value, registry.ProtocolAuto),
		Model:              sp.Model,
		DisableNewTools:    sp.DisableNewTools,
		NarrowToolsAbove:   sp.NarrowToolsAbove,
		ApprovalPolicy:     orDefault(sp.ApprovalPolicy.Value, live.PolicyDestructive),
		Elicitation:        sp.Elicitation,
	}
	if s := sp.Stdio; s != nil {
		cfg.Command, cfg.Args = s.Command, s.Args
		cfg.EnvKeys = names(s.Env, s.EnvKeys)
	}
	if h := sp.HTTP; h != nil {
		cfg.URL, _ = secret.SplitURL(h.URL)
		cfg.HeaderNames = names(h.Headers, h.HeaderNames)
	}
	if rl := sp.RateLimit; rl != nil && rl.RequestsPerSecond > 0 {
		cfg.RateLimit = &store.RateLimit{RequestsPerSecond: rl.RequestsPerSecond, Burst: max(rl.Burst, 1)}
	}
	if a := sp.Auth; a.authMode() != store.AuthNone {
		cfg.Auth = &store.AuthConfig{Mode: a.authMode(), ClientID: a.ClientID, Scopes: a.Scopes,
			HasClientSecret: a.ClientSecret != "" || a.HasClientSecret}
	}
	if sc := sp.Sampling; sc != nil {
		cfg.Sampling = &store.SamplingConfig{Enabled: sc.Enabled, Policy: orDefault(sc.Policy.Value, store.SamplingAuto),
			MaxTokensPerRequest: sc.MaxTokensPerRequest, MaxRequestsPerRun: sc.MaxRequestsPerRun, MaxTokensPerRun: sc.MaxTokensPerRun,
			MaxRequestsPerMinute: sc.MaxRequestsPerMinute, MaxTokensPerMinute: sc.MaxTokensPerMinute}
	}
	return cfg
}

// names is the sorted union of m's keys and stored.
func names(m map[string]string, stored []string) []string {
	out := slices.AppendSeq(slices.Clone(stored), maps.Keys(m))
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) == 0 {
		return nil
	}
	return out
}
