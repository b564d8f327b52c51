package server

import (
	"context"
	"slices"

	"google.golang.org/protobuf/proto"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/connectors"
	"github.com/connector-svc/connector-svc/internal/store"
)

const (
	defaultConnectorPageSize = 50
	defaultToolPageSize      = 100
	maxPageSize              = 1000
)

// CreateConnector implements connector.v1.ConnectorService.
func (s *Server) CreateConnector(ctx context.Context, req *connectorv1.CreateConnectorRequest) (*connectorv1.CreateConnectorResponse, error) {
	p, err := s.newConnector(req)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	ws := req.GetWorkspaceId()
	vals, err := secretsFromProto(p, nil)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	c, err := s.connectors.Create(ctx, &store.Connector{
		WorkspaceID: ws,
		ExternalID:  p.GetConnectorId(),
		Name:        p.GetName(),
		Description: p.GetDescription(),
		Transport:   transports[p.GetTransport()],
		Config:      configFromProto(p),
		Active:      req.Active == nil || *req.Active,
	}, vals)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &connectorv1.CreateConnectorResponse{Connector: s.render(c)}, nil
}

// newConnector validates a create request and returns its connector with
// output-only fields cleared and defaults filled.
func (s *Server) newConnector(req *connectorv1.CreateConnectorRequest) (*connectorv1.Connector, error) {
	var c checker
	c.id("workspace_id", req.GetWorkspaceId())
	if req.GetConnector() == nil {
		c.add("connector", "required")
		return nil, c.err()
	}
	p := proto.CloneOf(req.GetConnector())
	if p.WorkspaceId != "" && p.WorkspaceId != req.GetWorkspaceId() {
		c.add("connector.workspace_id", "must be empty or equal to workspace_id")
	}
	if p.GetStdio() != nil {
		p.GetStdio().EnvKeys = nil
	}
	if p.GetHttp() != nil {
		p.GetHttp().HeaderNames = nil
	}
	if p.GetAuth() != nil {
		p.GetAuth().HasClientSecret = false // output only
	}
	if p.Name == "" {
		p.Name = p.ConnectorId
	}
	c.connector(p)
	if err := c.err(); err != nil {
		return nil, err
	}
	return p, s.connectors.AllowCommand(transports[p.GetTransport()], p.GetStdio().GetCommand())
}

// GetConnector implements connector.v1.ConnectorService.
func (s *Server) GetConnector(ctx context.Context, req *connectorv1.GetConnectorRequest) (*connectorv1.GetConnectorResponse, error) {
	if err := connectorRef(req.GetWorkspaceId(), req.GetConnectorId()); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	c, err := s.db.GetConnector(ctx, req.GetWorkspaceId(), req.GetConnectorId())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &connectorv1.GetConnectorResponse{Connector: s.render(c)}, nil
}

// ListConnectors implements connector.v1.ConnectorService.
func (s *Server) ListConnectors(ctx context.Context, req *connectorv1.ListConnectorsRequest) (*connectorv1.ListConnectorsResponse, error) {
	var c checker
	c.id("workspace_id", req.GetWorkspaceId())
	size, after := c.page(req.GetPageSize(), req.GetPageToken(), defaultConnectorPageSize)
	if err := c.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	cs, err := s.db.ListConnectors(ctx, req.GetWorkspaceId(), after, size+1)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	resp := &connectorv1.ListConnectorsResponse{}
	cs, resp.NextPageToken = nextPage(cs, size, func(c *store.Connector) string { return c.ExternalID })
	for _, c := range cs {
		resp.Connectors = append(resp.Connectors, s.render(c))
	}
	return resp, nil
}

// updatePaths are the update_mask paths UpdateConnector accepts.
var updatePaths = []string{
	"name", "description", "transport", "stdio", "stdio.command", "stdio.args", "stdio.env",
	"http", "http.url", "http.headers", "connect_timeout", "call_timeout", "session_mode",
	"model", "rate_limit", "disable_new_tools", "narrow_tools_above", "protocol_preference",
	"approval_policy", "auth", "auth.mode", "auth.client_id", "auth.client_secret", "auth.scopes",
	"elicitation", "sampling", "sampling.enabled", "sampling.policy", "sampling.max_tokens_per_request",
	"sampling.max_requests_per_run", "sampling.max_tokens_per_run", "sampling.max_requests_per_minute",
	"sampling.max_tokens_per_minute",
}

// UpdateConnector implements connector.v1.ConnectorService. The stored
// connector and the request are merged along update_mask and the result is
// validated as a whole; nothing is written if it is invalid.
func (s *Server) UpdateConnector(ctx context.Context, req *connectorv1.UpdateConnectorRequest) (*connectorv1.UpdateConnectorResponse, error) {
	var c checker
	c.id("workspace_id", req.GetWorkspaceId())
	c.id("connector.connector_id", req.GetConnector().GetConnectorId())
	paths := req.GetUpdateMask().GetPaths()
	if len(paths) == 0 {
		c.add("update_mask", `required: name the fields to change, e.g. {"paths": ["name"]}`)
	}
	for _, path := range paths {
		if !slices.Contains(updatePaths, path) {
			c.add("update_mask", "unknown or immutable path %q; allowed: %v", path, updatePaths)
		}
	}
	if err := c.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	u := connectors.Update{WorkspaceID: req.GetWorkspaceId(), ConnectorID: req.GetConnector().GetConnectorId(), Paths: paths,
		Change: func(stored *store.Connector) error { return s.applyUpdate(stored, req.GetConnector(), paths) }}
	// A new URL is checked before the transaction: no lookup holds the row.
	if slices.Contains(paths, "http") || slices.Contains(paths, "http.url") {
		u.URL = req.GetConnector().GetHttp().GetUrl()
	}
	updated, err := s.connectors.Update(ctx, u)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &connectorv1.UpdateConnectorResponse{Connector: s.render(updated)}, nil
}

// applyUpdate merges the masked fields of src into stored.
func (s *Server) applyUpdate(stored *store.Connector, src *connectorv1.Connector, paths []string) error {
	merged := connectorToProto(stored)
	secretsReplaced, clientSecret, err := mergeMasked(merged, src, paths)
	if err != nil {
		return err
	}
	var c checker
	c.connector(merged)
	if err := c.err(); err != nil {
		return err
	}
	if err := s.connectors.AllowCommand(transports[merged.GetTransport()], merged.GetStdio().GetCommand()); err != nil {
		return err
	}
	sealed, err := s.resealed(stored, merged, secretsReplaced, clientSecret)
	if err != nil {
		return err
	}
	stored.Name, stored.Description = merged.GetName(), merged.GetDescription()
	stored.Transport = transports[merged.GetTransport()]
	stored.Config = configFromProto(merged)
	stored.SealedSecrets = sealed
	return nil
}

// mergeMasked copies the fields of src named by paths into dst and reports
// whether the header and env values were replaced, and whether the OAuth
// client secret was. Replacing a connection or its headers or env
// replaces all of them; replacing auth replaces the client secret too.
// The URL's query values follow dst's URL (see resealed).
func mergeMasked(dst, src *connectorv1.Connector, paths []string) (secretsReplaced, clientSecret bool, err error) {
	var c checker
	needs := func(path string, has bool, whole string) bool {
		if !has {
			c.add("update_mask", "path %q: the connector has no %s config; use path %q to replace the connection", path, whole, whole)
		}
		return has
	}
	for _, path := range paths {
		switch path {
		case "name":
			dst.Name = src.GetName()
		case "description":
			dst.Description = src.GetDescription()
		case "transport":
			dst.Transport = src.GetTransport()
		case "stdio":
			s := proto.CloneOf(src.GetStdio())
			if s != nil {
				s.EnvKeys = nil
			}
			dst.Connection, secretsReplaced = &connectorv1.Connector_Stdio{Stdio: s}, true
		case "http":
			h := proto.CloneOf(src.GetHttp())
			if h != nil {
				h.HeaderNames = nil
			}
			dst.Connection, secretsReplaced = &connectorv1.Connector_Http{Http: h}, true
		case "stdio.command", "stdio.args", "stdio.env":
			if !needs(path, dst.GetStdio() != nil, "stdio") {
				continue
			}
			switch path {
			case "stdio.command":
				dst.GetStdio().Command = src.GetStdio().GetCommand()
			case "stdio.args":
				dst.GetStdio().Args = src.GetStdio().GetArgs()
			default:
				dst.GetStdio().Env, dst.GetStdio().EnvKeys, secretsReplaced = src.GetStdio().GetEnv(), nil, true
			}
		case "http.url", "http.headers":
			if !needs(path, dst.GetHttp() != nil, "http") {
				continue
			}
			if path == "http.url" {
				dst.GetHttp().Url = src.GetHttp().GetUrl()
			} else {
				dst.GetHttp().Headers, dst.GetHttp().HeaderNames, secretsReplaced = src.GetHttp().GetHeaders(), nil, true
			}
		case "connect_timeout":
			dst.ConnectTimeout = src.GetConnectTimeout()
		case "call_timeout":
			dst.CallTimeout = src.GetCallTimeout()
		case "session_mode":
			dst.SessionMode = src.GetSessionMode()
		case "protocol_preference":
			dst.ProtocolPreference = src.GetProtocolPreference()
		case "approval_policy":
			dst.ApprovalPolicy = src.GetApprovalPolicy()
		case "model":
			dst.Model = src.GetModel()
		case "rate_limit":
			dst.RateLimit = src.GetRateLimit()
		case "disable_new_tools":
			dst.DisableNewTools = src.GetDisableNewTools()
		case "narrow_tools_above":
			dst.NarrowToolsAbove = src.GetNarrowToolsAbove()
		case "auth":
			dst.Auth, clientSecret = proto.CloneOf(src.GetAuth()), true
			if dst.Auth != nil {
				dst.Auth.HasClientSecret = false
			}
		case "elicitation":
			dst.Elicitation = src.GetElicitation()
		case "sampling":
			dst.Sampling = proto.CloneOf(src.GetSampling())
		case "sampling.enabled", "sampling.policy", "sampling.max_tokens_per_request", "sampling.max_requests_per_run",
			"sampling.max_tokens_per_run", "sampling.max_requests_per_minute", "sampling.max_tokens_per_minute":
			if dst.Sampling == nil {
				dst.Sampling = &connectorv1.SamplingConfig{}
			}
			d, v := dst.Sampling, src.GetSampling()
			switch path {
			case "sampling.enabled":
				d.Enabled = v.GetEnabled()
			case "sampling.policy":
				d.Policy = v.GetPolicy()
			case "sampling.max_tokens_per_request":
				d.MaxTokensPerRequest = v.GetMaxTokensPerRequest()
			case "sampling.max_requests_per_run":
				d.MaxRequestsPerRun = v.GetMaxRequestsPerRun()
			case "sampling.max_tokens_per_run":
				d.MaxTokensPerRun = v.GetMaxTokensPerRun()
			case "sampling.max_requests_per_minute":
				d.MaxRequestsPerMinute = v.GetMaxRequestsPerMinute()
			default:
				d.MaxTokensPerMinute = v.GetMaxTokensPerMinute()
			}
		case "auth.mode", "auth.client_id", "auth.client_secret", "auth.scopes":
			if dst.Auth == nil {
				dst.Auth = &connectorv1.AuthConfig{}
			}
			switch path {
			case "auth.mode":
				dst.Auth.Mode = src.GetAuth().GetMode()
			case "auth.client_id":
				dst.Auth.ClientId = src.GetAuth().GetClientId()
			case "auth.client_secret":
				dst.Auth.ClientSecret, dst.Auth.HasClientSecret, clientSecret = src.GetAuth().GetClientSecret(), false, true
			default:
				dst.Auth.Scopes = src.GetAuth().GetScopes()
			}
		}
	}
	return secretsReplaced, clientSecret, c.err()
}

// DeleteConnector implements connector.v1.ConnectorService.
func (s *Server) DeleteConnector(ctx context.Context, req *connectorv1.DeleteConnectorRequest) (*connectorv1.DeleteConnectorResponse, error) {
	if err := connectorRef(req.GetWorkspaceId(), req.GetConnectorId()); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	if err := s.connectors.Delete(ctx, req.GetWorkspaceId(), req.GetConnectorId()); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &connectorv1.DeleteConnectorResponse{}, nil
}

// ActivateConnector implements connector.v1.ConnectorService.
func (s *Server) ActivateConnector(ctx context.Context, req *connectorv1.ActivateConnectorRequest) (*connectorv1.ActivateConnectorResponse, error) {
	c, err := s.setActive(ctx, req.GetWorkspaceId(), req.GetConnectorId(), true)
	if err != nil {
		return nil, err
	}
	return &connectorv1.ActivateConnectorResponse{Connector: c}, nil
}

// DeactivateConnector implements connector.v1.ConnectorService.
func (s *Server) DeactivateConnector(ctx context.Context, req *connectorv1.DeactivateConnectorRequest) (*connectorv1.DeactivateConnectorResponse, error) {
	c, err := s.setActive(ctx, req.GetWorkspaceId(), req.GetConnectorId(), false)
	if err != nil {
		return nil, err
	}
	return &connectorv1.DeactivateConnectorResponse{Connector: c}, nil
}

// setActive sets the desired state; its errors are already statuses.
func (s *Server) setActive(ctx context.Context, workspaceID, connectorID string, active bool) (*connectorv1.Connector, error) {
	if err := connectorRef(workspaceID, connectorID); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	c, err := s.connectors.SetActive(ctx, workspaceID, connectorID, active)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return s.render(c), nil
}

// render is a connector for a response, with the registry's live health
// when this replica owns the connector, and the sessions it has open.
// The counters include the query counts not written to the store yet.
func (s *Server) render(c *store.Connector) *connectorv1.Connector {
	if d := s.counts.Unwritten(c.ID); d != (store.Counters{}) {
		withCounts := *c
		withCounts.Counters = s.counts.With(c.ID, c.Counters)
		c = &withCounts
	}
	p := connectorToProto(c)
	// The owner's health is live; another replica's is what the owner
	// last wrote, in the row.
	if h, err := s.reg.Health(c.ID); err == nil && c.Active && s.reg.Owner(c.ID) {
		p.Health = liveHealthToProto(h)
	}
	if c.Active {
		p.OpenSessions = int32(s.reg.SessionCount(c.ID))
	}
	return p
}
