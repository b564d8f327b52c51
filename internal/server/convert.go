package server

import (
	"maps"
	"slices"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/store"
)

// Defaults for a connector's timeouts, stored with the connector on create.
const (
	DefaultConnectTimeout = live.DefaultConnectTimeout
	DefaultCallTimeout    = live.DefaultCallTimeout
)

var transports = map[connectorv1.Transport]string{
	connectorv1.Transport_TRANSPORT_STDIO:           store.TransportStdio,
	connectorv1.Transport_TRANSPORT_SSE:             store.TransportSSE,
	connectorv1.Transport_TRANSPORT_STREAMABLE_HTTP: store.TransportStreamableHTTP,
}

var sessionModes = map[connectorv1.SessionMode]string{
	connectorv1.SessionMode_SESSION_MODE_UNSPECIFIED: registry.SessionShared,
	connectorv1.SessionMode_SESSION_MODE_SHARED:      registry.SessionShared,
	connectorv1.SessionMode_SESSION_MODE_PER_SESSION: registry.SessionPerSession,
}

var protocolPreferences = map[connectorv1.ProtocolPreference]string{
	connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_UNSPECIFIED: registry.ProtocolAuto,
	connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_AUTO:        registry.ProtocolAuto,
	connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_CLASSIC:     registry.ProtocolClassic,
	connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_SESSIONLESS: registry.ProtocolSessionless,
}

var authModes = map[connectorv1.AuthMode]string{
	connectorv1.AuthMode_AUTH_MODE_UNSPECIFIED:              store.AuthNone,
	connectorv1.AuthMode_AUTH_MODE_NONE:                     store.AuthNone,
	connectorv1.AuthMode_AUTH_MODE_OAUTH_CLIENT_CREDENTIALS: store.AuthClientCredentials,
	connectorv1.AuthMode_AUTH_MODE_OAUTH_USER:               store.AuthUser,
}

// authModeName is the API's name of a stored auth mode.
func authModeName(mode string) string {
	switch mode {
	case store.AuthClientCredentials:
		return connectorv1.AuthMode_AUTH_MODE_OAUTH_CLIENT_CREDENTIALS.String()
	case store.AuthUser:
		return connectorv1.AuthMode_AUTH_MODE_OAUTH_USER.String()
	}
	return connectorv1.AuthMode_AUTH_MODE_NONE.String()
}

var healthStates = map[string]connectorv1.ConnectorState{
	"connecting": connectorv1.ConnectorState_CONNECTOR_STATE_CONNECTING,
	"ready":      connectorv1.ConnectorState_CONNECTOR_STATE_READY,
	"degraded":   connectorv1.ConnectorState_CONNECTOR_STATE_DEGRADED,
	"error":      connectorv1.ConnectorState_CONNECTOR_STATE_ERROR,
}

// key returns the key of m whose value is v.
func key[K comparable, V comparable](m map[K]V, v V) K {
	for k, mv := range m {
		if mv == v {
			return k
		}
	}
	var zero K
	return zero
}

// connectorToProto renders a stored connector. Secret values are never in
// it: only the names of headers, env keys and URL query parameters. (The
// stored URL is already redacted; redacting it again covers rows stored
// before query values were sealed.)
func connectorToProto(c *store.Connector) *connectorv1.Connector {
	p := &connectorv1.Connector{
		WorkspaceId:      c.WorkspaceID,
		ConnectorId:      c.ExternalID,
		Name:             c.Name,
		Description:      c.Description,
		Transport:        key(transports, c.Transport),
		ConnectTimeout:   durationpb.New(time.Duration(c.Config.ConnectTimeout)),
		CallTimeout:      durationpb.New(time.Duration(c.Config.CallTimeout)),
		SessionMode:      key(sessionModes, c.Config.SessionMode),
		Model:            c.Config.Model,
		DisableNewTools:  c.Config.DisableNewTools,
		NarrowToolsAbove: int32(c.Config.NarrowToolsAbove),
		Active:           c.Active,
		Health:           healthToProto(c),
		ToolCount:        int32(c.ToolCount),
		Counters:         countersToProto(c.Counters),
		CreateTime:       timestamppb.New(c.CreatedAt),
		UpdateTime:       timestamppb.New(c.UpdatedAt),
	}
	if p.SessionMode == connectorv1.SessionMode_SESSION_MODE_UNSPECIFIED {
		p.SessionMode = connectorv1.SessionMode_SESSION_MODE_SHARED
	}
	p.ProtocolPreference = key(protocolPreferences, c.Config.ProtocolPreference)
	if p.ProtocolPreference == connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_UNSPECIFIED {
		p.ProtocolPreference = connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_AUTO
	}
	p.ApprovalPolicy = approvalPolicyToProto(c.Config.ApprovalPolicy)
	if c.Transport == store.TransportStdio {
		p.Connection = &connectorv1.Connector_Stdio{Stdio: &connectorv1.StdioConfig{
			Command: c.Config.Command, Args: c.Config.Args, EnvKeys: c.Config.EnvKeys,
		}}
	} else {
		shown, _ := secret.SplitURL(c.Config.URL)
		p.Connection = &connectorv1.Connector_Http{Http: &connectorv1.HttpConfig{
			Url: shown, HeaderNames: c.Config.HeaderNames,
		}}
	}
	if rl := c.Config.RateLimit; rl != nil {
		p.RateLimit = &connectorv1.RateLimit{RequestsPerSecond: rl.RequestsPerSecond, Burst: int32(rl.Burst)}
	}
	if a := c.Config.Auth; a != nil && c.Config.AuthMode() != store.AuthNone {
		// The client secret is write-only: has_client_secret says it is set.
		p.Auth = &connectorv1.AuthConfig{Mode: key(authModes, a.Mode), ClientId: a.ClientID, Scopes: a.Scopes,
			HasClientSecret: a.HasClientSecret}
	}
	p.Elicitation = c.Config.Elicitation
	if sc := c.Config.Sampling; sc != nil {
		p.Sampling = &connectorv1.SamplingConfig{Enabled: sc.Enabled, Policy: key(samplingPolicies, sc.Policy),
			MaxTokensPerRequest: int32(sc.MaxTokensPerRequest), MaxRequestsPerRun: int32(sc.MaxRequestsPerRun),
			MaxTokensPerRun: int32(sc.MaxTokensPerRun), MaxRequestsPerMinute: int32(sc.MaxRequestsPerMinute),
			MaxTokensPerMinute: int32(sc.MaxTokensPerMinute)}
		if p.Sampling.Policy == connectorv1.SamplingPolicy_SAMPLING_POLICY_UNSPECIFIED {
			p.Sampling.Policy = connectorv1.SamplingPolicy_SAMPLING_POLICY_AUTO
		}
	}
	return p
}

var samplingPolicies = map[connectorv1.SamplingPolicy]string{
	connectorv1.SamplingPolicy_SAMPLING_POLICY_UNSPECIFIED: store.SamplingAuto,
	connectorv1.SamplingPolicy_SAMPLING_POLICY_AUTO:        store.SamplingAuto,
	connectorv1.SamplingPolicy_SAMPLING_POLICY_APPROVE:     store.SamplingApprove,
}

func healthToProto(c *store.Connector) *connectorv1.ConnectorHealth {
	h := &connectorv1.ConnectorHealth{
		State:           healthStates[c.Health.State],
		LastError:       c.Health.LastError,
		ProtocolVersion: c.Health.ProtocolVersion,
	}
	if !c.Active {
		h.State = connectorv1.ConnectorState_CONNECTOR_STATE_INACTIVE
	}
	if c.Health.CheckedAt != nil {
		h.CheckTime = timestamppb.New(*c.Health.CheckedAt)
		h.Latency = durationpb.New(c.Health.Latency)
	}
	return h
}

func countersToProto(c store.Counters) *connectorv1.ConnectorCounters {
	p := &connectorv1.ConnectorCounters{
		CallCount: c.Calls, ErrorCount: c.Errors, ReconnectCount: c.Reconnects, ReinitializeCount: c.Reinitializations,
		QueryCount: c.Queries, QueryErrorCount: c.QueryErrors,
		PromptTokens: c.PromptTokens, CompletionTokens: c.CompletionTokens,
	}
	if c.LastUsedAt != nil {
		p.LastUsedTime = timestamppb.New(*c.LastUsedAt)
	}
	return p
}

// configFromProto is the stored config of a validated connector. Key names
// are those of the write-only maps plus those already stored; the URL keeps
// its query parameters' names, their values redacted.
func configFromProto(p *connectorv1.Connector) store.Config {
	cfg := store.Config{
		ConnectTimeout:     store.Duration(orDefault(p.GetConnectTimeout(), DefaultConnectTimeout)),
		CallTimeout:        store.Duration(orDefault(p.GetCallTimeout(), DefaultCallTimeout)),
		SessionMode:        sessionModes[p.GetSessionMode()],
		ProtocolPreference: protocolPreferences[p.GetProtocolPreference()],
		Model:              p.GetModel(),
		DisableNewTools:    p.GetDisableNewTools(),
		NarrowToolsAbove:   int(p.GetNarrowToolsAbove()),
		ApprovalPolicy:     approvalPolicies[p.GetApprovalPolicy()],
	}
	if s := p.GetStdio(); s != nil {
		cfg.Command, cfg.Args = s.GetCommand(), s.GetArgs()
		cfg.EnvKeys = names(s.GetEnv(), s.GetEnvKeys())
	}
	if h := p.GetHttp(); h != nil {
		cfg.URL, _ = secret.SplitURL(h.GetUrl())
		cfg.HeaderNames = names(h.GetHeaders(), h.GetHeaderNames())
	}
	if rl := p.GetRateLimit(); rl != nil && rl.GetRequestsPerSecond() > 0 {
		cfg.RateLimit = &store.RateLimit{RequestsPerSecond: rl.GetRequestsPerSecond(), Burst: max(int(rl.GetBurst()), 1)}
	}
	if a := p.GetAuth(); authModes[a.GetMode()] != store.AuthNone && authModes[a.GetMode()] != "" {
		cfg.Auth = &store.AuthConfig{Mode: authModes[a.GetMode()], ClientID: a.GetClientId(), Scopes: a.GetScopes(),
			HasClientSecret: a.GetClientSecret() != "" || a.GetHasClientSecret()}
	}
	cfg.Elicitation = p.GetElicitation()
	if sc := p.GetSampling(); sc != nil {
		cfg.Sampling = &store.SamplingConfig{Enabled: sc.GetEnabled(), Policy: samplingPolicies[sc.GetPolicy()],
			MaxTokensPerRequest: int(sc.GetMaxTokensPerRequest()), MaxRequestsPerRun: int(sc.GetMaxRequestsPerRun()),
			MaxTokensPerRun: int(sc.GetMaxTokensPerRun()), MaxRequestsPerMinute: int(sc.GetMaxRequestsPerMinute()),
			MaxTokensPerMinute: int(sc.GetMaxTokensPerMinute())}
	}
	return cfg
}

func orDefault(d *durationpb.Duration, def time.Duration) time.Duration {
	if d == nil || d.AsDuration() == 0 {
		return def
	}
	return d.AsDuration()
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

// toolToProto renders a tool of a connector whose approval policy is
// policy.
func toolToProto(t *store.Tool, policy string) *connectorv1.Tool {
	p := &connectorv1.Tool{
		Name:             t.Name,
		Description:      t.Description,
		Enabled:          t.Enabled,
		RequiresApproval: storedNeedsApproval(policy, t),
		ApprovalOverride: approvalOverrideToProto(t.RequiresApproval),
		SyncTime:         timestamppb.New(t.SyncedAt),
		Annotations: &connectorv1.ToolAnnotations{
			Title:           t.Annotations.Title,
			ReadOnlyHint:    t.Annotations.ReadOnlyHint,
			DestructiveHint: t.Annotations.DestructiveHint,
			IdempotentHint:  t.Annotations.IdempotentHint,
			OpenWorldHint:   t.Annotations.OpenWorldHint,
		},
	}
	schema := &structpb.Struct{}
	if err := schema.UnmarshalJSON(t.InputSchema); err == nil {
		p.InputSchema = schema
	}
	return p
}
