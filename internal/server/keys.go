package server

import (
	"context"
	"log/slog"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/auth"
)

const (
	defaultKeyPageSize = 100
	maxKeyNameLen      = 200
)

// scopePair is one of the API's scopes and auth's.
type scopePair struct {
	api  connectorv1.ApiKeyScope
	auth auth.Scope
}

var apiKeyScopes = []scopePair{
	{connectorv1.ApiKeyScope_API_KEY_SCOPE_ADMIN, auth.ScopeAdmin},
	{connectorv1.ApiKeyScope_API_KEY_SCOPE_QUERY, auth.ScopeQuery},
	{connectorv1.ApiKeyScope_API_KEY_SCOPE_CALL, auth.ScopeCall},
	{connectorv1.ApiKeyScope_API_KEY_SCOPE_USERS, auth.ScopeUsers},
}

// CreateApiKey implements connector.v1.ConnectorService. The guard has
// checked that the caller's key (if auth is on) is an admin key of the
// workspace.
func (s *Server) CreateApiKey(ctx context.Context, req *connectorv1.CreateApiKeyRequest) (*connectorv1.CreateApiKeyResponse, error) {
	var c checker
	c.id("workspace_id", req.GetWorkspaceId())
	if len(req.GetScopes()) == 0 {
		c.add("scopes", "at least one: API_KEY_SCOPE_ADMIN, API_KEY_SCOPE_QUERY, API_KEY_SCOPE_CALL or API_KEY_SCOPE_USERS")
	}
	var names []string
	for _, sc := range req.GetScopes() {
		i := slices.IndexFunc(apiKeyScopes, func(p scopePair) bool { return p.api == sc })
		if i < 0 {
			c.add("scopes", "%v is not a scope: want API_KEY_SCOPE_ADMIN, API_KEY_SCOPE_QUERY, API_KEY_SCOPE_CALL or API_KEY_SCOPE_USERS", sc)
			continue
		}
		names = append(names, string(apiKeyScopes[i].auth))
	}
	if len(req.GetName()) > maxKeyNameLen {
		c.add("name", "longer than %d characters", maxKeyNameLen)
	}
	if err := c.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	if s.keys == nil {
		return nil, newStatus(codes.Unimplemented, ReasonInternal, "this server has no API keys")
	}
	scopes, err := auth.ParseScopes(names)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	k, token, err := s.keys.Create(ctx, req.GetWorkspaceId(), scopes, req.GetName())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	s.logger.InfoContext(ctx, "API key created", keyAttrs(k)...)
	return &connectorv1.CreateApiKeyResponse{ApiKey: keyToProto(k), Token: token}, nil
}

// ListApiKeys implements connector.v1.ConnectorService.
func (s *Server) ListApiKeys(ctx context.Context, req *connectorv1.ListApiKeysRequest) (*connectorv1.ListApiKeysResponse, error) {
	var c checker
	c.id("workspace_id", req.GetWorkspaceId())
	size, after := c.page(req.GetPageSize(), req.GetPageToken(), defaultKeyPageSize)
	if err := c.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	if s.keys == nil {
		return &connectorv1.ListApiKeysResponse{}, nil
	}
	keys, err := s.keys.List(ctx, req.GetWorkspaceId(), after, size+1)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	resp := &connectorv1.ListApiKeysResponse{}
	keys, resp.NextPageToken = nextPage(keys, size, func(k auth.Key) string { return k.ID })
	for _, k := range keys {
		resp.ApiKeys = append(resp.ApiKeys, keyToProto(k))
	}
	return resp, nil
}

// RevokeApiKey implements connector.v1.ConnectorService. Calls with the key
// fail in every service from the moment it returns (auth.Keys.Revoke).
func (s *Server) RevokeApiKey(ctx context.Context, req *connectorv1.RevokeApiKeyRequest) (*connectorv1.RevokeApiKeyResponse, error) {
	var c checker
	c.id("workspace_id", req.GetWorkspaceId())
	if req.GetKeyId() == "" {
		c.add("key_id", "required")
	}
	if err := c.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	if s.keys == nil {
		return nil, newStatus(codes.NotFound, ReasonAPIKeyNotFound, "API key not found in this workspace")
	}
	k, err := s.keys.Revoke(ctx, req.GetWorkspaceId(), req.GetKeyId())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	s.logger.InfoContext(ctx, "API key revoked", keyAttrs(k)...)
	return &connectorv1.RevokeApiKeyResponse{ApiKey: keyToProto(k)}, nil
}

func keyToProto(k auth.Key) *connectorv1.ApiKey {
	p := &connectorv1.ApiKey{KeyId: k.ID, WorkspaceId: k.WorkspaceID, Name: k.Name, MaskedToken: k.Masked(),
		CreateTime: timestamppb.New(k.CreatedAt)}
	for _, pair := range apiKeyScopes {
		if slices.Contains(k.Scopes, pair.auth) {
			p.Scopes = append(p.Scopes, pair.api)
		}
	}
	if k.RevokedAt != nil {
		p.RevokeTime = timestamppb.New(*k.RevokedAt)
	}
	return p
}

// keyAttrs are a key's log attributes: its id, never its token.
func keyAttrs(k auth.Key) []any {
	return []any{slog.String("key_id", k.ID), slog.String("workspace_id", k.WorkspaceID), slog.Any("scopes", k.Scopes)}
}
