package server_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/server"
)

const (
	scopeAdmin = connectorv1.ApiKeyScope_API_KEY_SCOPE_ADMIN
	scopeQuery = connectorv1.ApiKeyScope_API_KEY_SCOPE_QUERY
)

func bearer(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// createKey creates a key over gRPC, sending token if not empty.
func (f *fixture) createKey(t *testing.T, token, ws string, scopes ...connectorv1.ApiKeyScope) *connectorv1.CreateApiKeyResponse {
	t.Helper()
	c := ctx(t)
	if token != "" {
		c = bearer(c, token)
	}
	resp, err := f.client.CreateApiKey(c, &connectorv1.CreateApiKeyRequest{WorkspaceId: ws, Scopes: scopes, Name: "for " + ws})
	if err != nil {
		t.Fatalf("CreateApiKey(%s): %v", ws, err)
	}
	return resp
}

// TestAPIKeysOverGRPC: the first key, created while auth is off (auto, no
// key yet), turns auth on; an admin key manages its workspace's keys; a
// revocation works from the moment RevokeApiKey returns.
func TestAPIKeysOverGRPC(t *testing.T) {
	f := setup(t, options{auth: auth.ModeAuto})
	list := func(c context.Context) error {
		_, err := f.client.ListConnectors(c, &connectorv1.ListConnectorsRequest{WorkspaceId: "acme"})
		return err
	}
	if err := list(ctx(t)); err != nil {
		t.Fatalf("auth auto without keys: %v", err)
	}
	first := f.createKey(t, "", "acme", scopeAdmin)
	if err := list(ctx(t)); err == nil {
		t.Fatal("a call without a key works after the first key was created")
	}
	admin := first.GetToken()
	if got := first.GetApiKey(); got.GetMaskedToken() != "csk_"+got.GetKeyId()+"_…"+admin[len(admin)-4:] ||
		!strings.HasPrefix(admin, "csk_"+got.GetKeyId()+"_") || got.GetRevokeTime() != nil ||
		len(got.GetScopes()) != 1 || got.GetScopes()[0] != scopeAdmin {
		t.Errorf("created %v with token %q", got, admin)
	}

	query := f.createKey(t, admin, "acme", scopeQuery, scopeQuery).GetToken()
	_, globex, err := f.keys.Create(ctx(t), "globex", []auth.Scope{auth.ScopeAdmin}, "") // as the CLI would
	if err != nil {
		t.Fatal(err)
	}
	closeSession := func(token string) error {
		_, err := f.client.CloseSession(bearer(ctx(t), token), &connectorv1.CloseSessionRequest{WorkspaceId: "acme", SessionId: "s"})
		return err
	}
	if err := closeSession(query); err != nil {
		t.Errorf("a query RPC with a query key: %v", err)
	}

	var listed []*connectorv1.ApiKey
	var responses strings.Builder
	for page := ""; ; {
		resp, err := f.client.ListApiKeys(bearer(ctx(t), admin), &connectorv1.ListApiKeysRequest{WorkspaceId: "acme", PageSize: 1, PageToken: page})
		if err != nil {
			t.Fatal(err)
		}
		responses.WriteString(protojson.Format(resp))
		listed = append(listed, resp.GetApiKeys()...)
		if page = resp.GetNextPageToken(); page == "" {
			break
		}
	}
	if len(listed) != 2 || listed[0].GetWorkspaceId() != "acme" || listed[1].GetWorkspaceId() != "acme" {
		t.Errorf("ListApiKeys of acme = %v", listed)
	}
	if strings.Contains(responses.String(), admin) || strings.Contains(responses.String(), query) {
		t.Error("ListApiKeys returned a token")
	}

	_, err = f.client.ListApiKeys(bearer(ctx(t), query), &connectorv1.ListApiKeysRequest{WorkspaceId: "acme"})
	wantStatus(t, err, codes.PermissionDenied, auth.ReasonScopeMissing, "")
	queryID := listed[1].GetKeyId()
	if listed[0].GetKeyId() != first.GetApiKey().GetKeyId() {
		queryID = listed[0].GetKeyId()
	}
	_, err = f.client.RevokeApiKey(bearer(ctx(t), globex), &connectorv1.RevokeApiKeyRequest{WorkspaceId: "acme", KeyId: queryID})
	wantStatus(t, err, codes.PermissionDenied, auth.ReasonWrongWorkspace, "")
	_, err = f.client.RevokeApiKey(bearer(ctx(t), admin), &connectorv1.RevokeApiKeyRequest{WorkspaceId: "acme", KeyId: globex[4:12]})
	wantStatus(t, err, codes.NotFound, server.ReasonAPIKeyNotFound, "")
	for _, req := range []*connectorv1.CreateApiKeyRequest{
		{WorkspaceId: "acme"},
		{WorkspaceId: "acme", Scopes: []connectorv1.ApiKeyScope{connectorv1.ApiKeyScope_API_KEY_SCOPE_UNSPECIFIED}},
	} {
		_, err := f.client.CreateApiKey(bearer(ctx(t), admin), req)
		wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "scopes")
	}

	revoked, err := f.client.RevokeApiKey(bearer(ctx(t), admin), &connectorv1.RevokeApiKeyRequest{WorkspaceId: "acme", KeyId: queryID})
	if err != nil || revoked.GetApiKey().GetRevokeTime() == nil {
		t.Fatalf("RevokeApiKey = %v, %v", revoked, err)
	}
	wantStatus(t, closeSession(query), codes.Unauthenticated, auth.ReasonKeyRevoked, "") // at once: no wait
	again, err := f.client.RevokeApiKey(bearer(ctx(t), admin), &connectorv1.RevokeApiKeyRequest{WorkspaceId: "acme", KeyId: queryID})
	if err != nil || !again.GetApiKey().GetRevokeTime().AsTime().Equal(revoked.GetApiKey().GetRevokeTime().AsTime()) {
		t.Errorf("revoking twice = %v, %v; want the first revocation", again, err)
	}
	for _, token := range []string{admin, query, globex} {
		if strings.Contains(f.logs.String(), token) {
			t.Fatal("a token reached the logs")
		}
	}
}
