package live_test

import (
	"bytes"
	"encoding/base64"
	"net/http"
	"slices"
	"testing"

	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/oauth"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/store"
)

// An oauth_user connector's calls run under their user's session key; the
// others' under their session id. Its spec, and the oauth.Connector the
// registry's Authorize hands the manager, carry the auth settings and the
// client secret opened.
func TestOAuthSpecAndSessionKeys(t *testing.T) {
	user := &store.Connector{ID: 7, WorkspaceID: "ws", ExternalID: "p", Transport: store.TransportStreamableHTTP,
		Config: store.Config{URL: "https://mcp.test/mcp", Auth: &store.AuthConfig{Mode: store.AuthUser, ClientID: "cid",
			Scopes: []string{"read"}, HasClientSecret: true}}}
	shared := &store.Connector{ID: 8, Config: store.Config{URL: "https://mcp.test/mcp"}}
	perSession := &store.Connector{ID: 9, Config: store.Config{SessionMode: registry.SessionPerSession}}
	if k := live.SessionKey(user, "s1", "alice"); k != registry.UserSession("alice") {
		t.Errorf("oauth_user key = %q", k)
	}
	if k := live.SessionKey(user, "s1", ""); k != "" {
		t.Errorf("oauth_user key without a user = %q, want none", k)
	}
	if k := live.SessionKey(shared, "s1", "alice"); k != "s1" {
		t.Errorf("shared key = %q", k)
	}
	if !live.OwnConnections(user) || !live.OwnConnections(perSession) || live.OwnConnections(shared) {
		t.Error("OwnConnections: want oauth_user and per_session connectors only")
	}

	box, err := secret.ParseKey(base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{3}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	if user.SealedSecrets, err = box.Seal(secret.Values{ClientSecret: "canary-secret"}, live.SealContext("ws", "p")); err != nil {
		t.Fatal(err)
	}
	oc, err := live.OAuthConnectorOf(box, user)
	if err != nil {
		t.Fatal(err)
	}
	want := oauth.Connector{ID: 7, WorkspaceID: "ws", ExternalID: "p", URL: "https://mcp.test/mcp", Mode: oauth.ModeUser,
		ClientID: "cid", ClientSecret: "canary-secret", Scopes: []string{"read"}}
	if oc.ID != want.ID || oc.URL != want.URL || oc.Mode != want.Mode || oc.ClientID != want.ClientID ||
		oc.ClientSecret != want.ClientSecret || !slices.Equal(oc.Scopes, want.Scopes) || oc.ExternalID != "p" {
		t.Errorf("OAuthConnectorOf = %+v", oc)
	}

	var got []string
	hook := live.Authorize(transporterFunc(func(_ http.RoundTripper, c oauth.Connector, user string) http.RoundTripper {
		got = append(got, c.ExternalID+"/"+c.Mode+"/"+user)
		return nil
	}))
	hook(nil, registry.Spec{ConnectorID: "p", Auth: registry.AuthUser}, "bob")
	if !slices.Equal(got, []string{"p/oauth_user/bob"}) {
		t.Errorf("Authorize handed the manager %v", got)
	}
}

type transporterFunc func(http.RoundTripper, oauth.Connector, string) http.RoundTripper

func (f transporterFunc) Transport(base http.RoundTripper, c oauth.Connector, user string) http.RoundTripper {
	return f(base, c, user)
}
