package server

import (
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/connectors"
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
		InputCount: c.Inputs, SamplingCount: c.Samplings,
	}
	if c.LastUsedAt != nil {
		p.LastUsedTime = timestamppb.New(*c.LastUsedAt)
	}
	return p
}

// specFromProto is the connector p of a request as the connectors use
// case's Spec: its output-only fields (env_keys, header_names,
// has_client_secret) left out, and an enum value the API does not define
// kept as the number it is, for the use case to refuse.
func specFromProto(p *connectorv1.Connector) *connectors.Spec {
	sp := &connectors.Spec{
		ConnectorID: p.GetConnectorId(), Name: p.GetName(), Description: p.GetDescription(),
		Transport:          choice(transports, p.GetTransport()),
		ConnectTimeout:     timeoutFromProto(p.GetConnectTimeout()),
		CallTimeout:        timeoutFromProto(p.GetCallTimeout()),
		SessionMode:        choice(sessionModes, p.GetSessionMode()),
		ProtocolPreference: choice(protocolPreferences, p.GetProtocolPreference()),
		ApprovalPolicy:     choice(approvalPolicies, p.GetApprovalPolicy()),
		Model:              p.GetModel(),
		DisableNewTools:    p.GetDisableNewTools(),
		NarrowToolsAbove:   int(p.GetNarrowToolsAbove()),
		Elicitation:        p.GetElicitation(),
	}
	if s := p.GetStdio(); s != nil {
		sp.Stdio = &connectors.Stdio{Command: s.GetCommand(), Args: s.GetArgs(), Env: s.GetEnv()}
	}
	if h := p.GetHttp(); h != nil {
		sp.HTTP = &connectors.HTTP{URL: h.GetUrl(), Headers: h.GetHeaders()}
	}
	if rl := p.GetRateLimit(); rl != nil {
		sp.RateLimit = &store.RateLimit{RequestsPerSecond: rl.GetRequestsPerSecond(), Burst: int(rl.GetBurst())}
	}
	if a := p.GetAuth(); a != nil {
		sp.Auth = &connectors.Auth{Mode: choice(authModes, a.GetMode()), ClientID: a.GetClientId(),
			ClientSecret: a.GetClientSecret(), Scopes: a.GetScopes()}
	}
	if sc := p.GetSampling(); sc != nil {
		sp.Sampling = &connectors.Sampling{Enabled: sc.GetEnabled(), Policy: choice(samplingPolicies, sc.GetPolicy()),
			MaxTokensPerRequest: int(sc.GetMaxTokensPerRequest()), MaxRequestsPerRun: int(sc.GetMaxRequestsPerRun()),
			MaxTokensPerRun: int(sc.GetMaxTokensPerRun()), MaxRequestsPerMinute: int(sc.GetMaxRequestsPerMinute()),
			MaxTokensPerMinute: int(sc.GetMaxTokensPerMinute())}
	}
	return sp
}

// choice is the stored value m gives v, or v's number if m has none.
func choice[E ~int32](m map[E]string, v E) connectors.Choice {
	if s, ok := m[v]; ok {
		return connectors.Choice{Value: s}
	}
	return connectors.Choice{Unknown: int32(v)}
}

// timeoutFromProto is d as a Timeout; nil is 0, the default.
func timeoutFromProto(d *durationpb.Duration) connectors.Timeout {
	if d == nil {
		return connectors.Timeout{}
	}
	if d.CheckValid() != nil {
		return connectors.Timeout{Malformed: true}
	}
	return connectors.Timeout{D: d.AsDuration()}
}

func orDefault(d *durationpb.Duration, def time.Duration) time.Duration {
	if d == nil || d.AsDuration() == 0 {
		return def
	}
	return d.AsDuration()
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
