// Package oauth is the client side of MCP authorization (OAuth 2.1) for
// connectors whose servers need it: it finds a server's authorization
// server (its 401 challenge, RFC 9728 protected resource metadata, RFC 8414
// and OpenID discovery), registers the service as a client once per
// issuer (pre-registered, client ID metadata document, or RFC 7591
// dynamic registration), runs the authorization code flow with PKCE for a
// chat product's end users, and keeps each user's tokens sealed in
// Postgres, refreshing them before they expire or when the server refuses
// one. Transport puts a user's token on the requests of that user's own
// connection and nowhere else.
//
// Everything that must survive a restart or be seen by another replica
// (registrations, authorizations in progress, tokens) lives in Postgres:
// a flow started on one replica completes on any other.
package oauth

import (
	"fmt"
	"strings"
	"time"
)

// Modes a connector's auth may name.
const (
	ModeNone              = "none"
	ModeClientCredentials = "oauth_client_credentials"
	ModeUser              = "oauth_user"
)

// Connector is what the package needs to know of a connector.
type Connector struct {
	ID          int64 // the store's key
	WorkspaceID string
	ExternalID  string // the id callers name it by
	// URL is the MCP endpoint; its canonical form is the resource tokens
	// are asked for (RFC 8707) and the only place they are sent.
	URL  string
	Mode string // ModeNone, ModeClientCredentials or ModeUser
	// A pre-registered client; empty ClientID means register (ModeUser).
	ClientID, ClientSecret string
	// Scopes to ask for; empty means those of the challenge or metadata.
	Scopes []string
}

// Reasons a user must authorize (RequiredError.Reason).
const (
	// ReasonNoToken: never authorized, or the authorization was revoked.
	ReasonNoToken = "NO_TOKEN"
	// ReasonReauthorize: the authorization server refused the refresh
	// token, or the server refuses the token and none can be refreshed.
	ReasonReauthorize = "REAUTHORIZE"
	// ReasonInsufficientScope: the server asked for more scopes (a 403
	// insufficient_scope challenge).
	ReasonInsufficientScope = "INSUFFICIENT_SCOPE"
)

// RequiredError means a call cannot go on until the user (UserID; empty
// for a client credentials connector's machine identity) authorizes the
// service: Scopes are what to ask for. Transport returns it from
// RoundTrip, so it comes back wrapped from whatever made the request.
type RequiredError struct {
	ConnectorID int64
	UserID      string
	Reason      string
	Scopes      []string
}

func (e *RequiredError) Error() string {
	switch e.Reason {
	case ReasonInsufficientScope:
		return fmt.Sprintf("the server needs more scopes (%s): the user must authorize again", strings.Join(e.Scopes, " "))
	case ReasonReauthorize:
		return "the authorization is no longer valid: the user must authorize again"
	default:
		return "the user has not authorized this connector"
	}
}

// Started is an authorization the user's browser is sent to.
type Started struct {
	URL       string
	Scopes    []string
	ExpiresAt time.Time
}

// Grant is one standing authorization; it never holds a token.
type Grant struct {
	ConnectorID         int64
	WorkspaceID         string
	ConnectorExternalID string
	UserID              string
	Scopes              []string
	ExpiresAt           time.Time // zero if the server did not say
	Refreshable         bool
	Issuer              string
	CreatedAt           time.Time
	UpdatedAt           time.Time
}

// Completed is a finished authorization.
type Completed struct {
	Grant    Grant
	ReturnTo string // as given to Start; may be empty
}
