// Package auth decides who may call the service. It owns API keys: random
// tokens shown once, stored only as their SHA-256, each bound to one
// workspace and a set of scopes. It creates, lists and revokes them
// (through the store), verifies them with a cache that is trusted only
// while this process is confirmed to have heard of every revocation, and
// provides the gRPC interceptors that
// authenticate every call (Guard).
package auth

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Scope is a set of RPCs a key may call.
type Scope string

// The scopes. Admin implies query, and query implies call: an admin key
// can create a stdio connector, which runs a command on the host, so
// withholding the query RPCs from it would protect nothing. Users implies
// nothing and nothing implies it.
const (
	// ScopeAdmin is connector, tool and API key lifecycle.
	ScopeAdmin Scope = "admin"
	// ScopeQuery is queries (the connectors' agents), and what call allows.
	ScopeQuery Scope = "query"
	// ScopeCall is listing and calling tools, answering their servers'
	// questions, and sessions.
	ScopeCall Scope = "call"
	// ScopeUsers lets a key name the end user behind a request on the MCP
	// endpoint (its user header), for oauth_user connectors and the audit
	// trail. The gRPC API takes user_id from any key that may call.
	ScopeUsers Scope = "users"
)

// scopes are the valid scopes, in order.
var scopes = []Scope{ScopeAdmin, ScopeQuery, ScopeCall, ScopeUsers}

// ParseScopes checks scope names ("admin", "query", "call", "users"), each
// may appear once and at least one must, and returns them in a canonical
// order.
func ParseScopes(names []string) ([]Scope, error) {
	if len(names) == 0 {
		return nil, errors.New("name at least one scope: admin, query, call or users")
	}
	var out []Scope
	for _, n := range names {
		s := Scope(strings.TrimSpace(n))
		if !slices.Contains(scopes, s) {
			return nil, fmt.Errorf("unknown scope %q: want admin, query, call or users", n)
		}
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b Scope) int { return slices.Index(scopes, a) - slices.Index(scopes, b) })
	return out, nil
}

// Key is an API key as the service shows it: everything but the token.
type Key struct {
	ID          string
	WorkspaceID string
	Scopes      []Scope
	Name        string
	// Hint is the token's last 4 characters.
	Hint      string
	CreatedAt time.Time
	// RevokedAt is nil while the key is valid.
	RevokedAt *time.Time
}

// Allows reports whether k grants scope s. Admin implies query, and
// query call.
func (k Key) Allows(s Scope) bool {
	switch {
	case slices.Contains(k.Scopes, s):
		return true
	case s == ScopeQuery:
		return slices.Contains(k.Scopes, ScopeAdmin)
	case s == ScopeCall:
		return slices.Contains(k.Scopes, ScopeAdmin) || slices.Contains(k.Scopes, ScopeQuery)
	}
	return false
}

// Masked is how listings show the token: its prefix and id, then its hint.
func (k Key) Masked() string { return tokenPrefix + k.ID + "_…" + k.Hint }

// Errors of Verify.
var (
	// ErrNoKey means the call carries no API key.
	ErrNoKey = errors.New("no API key")
	// ErrUnknownKey means no key has that token.
	ErrUnknownKey = errors.New("unknown API key")
	// ErrRevoked means the key was revoked.
	ErrRevoked = errors.New("API key revoked")
)

type keyContext struct{}

// WithKey returns ctx carrying the caller's key.
func WithKey(ctx context.Context, k Key) context.Context {
	return context.WithValue(ctx, keyContext{}, k)
}

// KeyFrom returns the key the call was authenticated with; false when the
// call carried none that was checked (auth off, or a method that needs no
// key).
func KeyFrom(ctx context.Context) (Key, bool) {
	k, ok := ctx.Value(keyContext{}).(Key)
	return k, ok
}
