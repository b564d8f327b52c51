package live

import (
	"net/http"

	"github.com/connector-svc/connector-svc/internal/oauth"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/store"
)

// An oauth_user connector runs each end user's calls on a connection of
// that user's own, kept by the registry's per-session machinery under the
// session id registry.UserSession(user): routed to one replica through
// the sessions table, adopted, expired when idle and closed like any
// caller session of a per_session connector.

// OwnConnections reports whether row's connector runs calls on
// connections of their own, one per caller session (per_session) or per
// end user (oauth_user), which Sessions routes among replicas.
func OwnConnections(row *store.Connector) bool {
	return row.Config.SessionMode == registry.SessionPerSession || row.Config.AuthMode() == store.AuthUser
}

// SessionKey is the session id under which a call of row's connector
// for sessionID and userID runs: the user's for an oauth_user connector,
// sessionID otherwise (empty for shared connectors' calls, which have
// none).
func SessionKey(row *store.Connector, sessionID, userID string) string {
	switch {
	case row.Config.AuthMode() == store.AuthUser && userID != "":
		return registry.UserSession(userID)
	case row.Config.AuthMode() == store.AuthUser:
		return ""
	}
	return sessionID
}

// Transporter puts the tokens of a connector's identity or of one of its
// users on requests (oauth.Manager.Transport).
type Transporter interface {
	Transport(base http.RoundTripper, c oauth.Connector, userID string) http.RoundTripper
}

// Authorize is the registry's Config.Authorize over t: each connection's
// transport gets the tokens of its connector's identity ("" user) or of
// its user.
func Authorize(t Transporter) func(base http.RoundTripper, spec registry.Spec, user string) http.RoundTripper {
	return func(base http.RoundTripper, spec registry.Spec, user string) http.RoundTripper {
		return t.Transport(base, OAuthConnector(spec), user)
	}
}

// OAuthConnector is what the oauth package needs to know of the
// connector of spec.
func OAuthConnector(spec registry.Spec) oauth.Connector {
	return oauth.Connector{ID: spec.ID, WorkspaceID: spec.WorkspaceID, ExternalID: spec.ConnectorID, URL: spec.URL,
		Mode: spec.Auth, ClientID: spec.ClientID, ClientSecret: spec.ClientSecret, Scopes: spec.Scopes}
}

// OAuthConnectorOf is OAuthConnector for row's connector, its secrets
// opened with box.
func OAuthConnectorOf(box *secret.Box, row *store.Connector) (oauth.Connector, error) {
	spec, err := (&Source{box: box}).Spec(row)
	if err != nil {
		return oauth.Connector{}, err
	}
	return OAuthConnector(spec), nil
}
