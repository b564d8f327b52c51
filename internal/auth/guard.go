package auth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	grpcauth "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Mode is when the service asks callers for a key.
type Mode string

// The modes (the AUTH setting).
const (
	// ModeAuto asks for keys once any key exists, and serves without auth
	// (on a loopback address only) before.
	ModeAuto Mode = "auto"
	// ModeKeys always asks for keys; with none created, every call fails.
	ModeKeys Mode = "keys"
	// ModeNone never asks, and may serve on a loopback address only.
	ModeNone Mode = "none"
	// ModeNoneAnyAddress never asks, on any address: only behind something
	// else that authenticates callers.
	ModeNoneAnyAddress Mode = "none-any-address"
)

// ParseMode checks a mode name.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeAuto, ModeKeys, ModeNone, ModeNoneAnyAddress:
		return m, nil
	}
	return "", fmt.Errorf("AUTH %q: want auto, keys, none or none-any-address", s)
}

// Guarded reports whether the mode needs a Guard: auto and keys.
func (m Mode) Guarded() bool { return m == ModeAuto || m == ModeKeys }

// Rule is what calling a method takes.
type Rule struct {
	// NoKey serves the method to anyone: health checks.
	NoKey bool
	// Scope is the scope the key needs; empty means any valid key. A method
	// with a scope takes requests that name a workspace (GetWorkspaceId),
	// which must be the key's.
	Scope Scope
}

// Rules maps full method names ("/pkg.Service/Method") and whole services
// ("pkg.Service") to their rules; a method's own rule wins. A method with
// no rule is refused to every caller.
type Rules map[string]Rule

func (r Rules) lookup(method string) (Rule, bool) {
	if rule, ok := r[method]; ok {
		return rule, true
	}
	service, _, _ := strings.Cut(strings.TrimPrefix(method, "/"), "/")
	rule, ok := r[service]
	return rule, ok
}

// Reasons of the errors the Guard returns, sent as google.rpc.ErrorInfo.
const (
	ReasonKeyMissing      = "API_KEY_MISSING"
	ReasonKeyInvalid      = "API_KEY_INVALID"
	ReasonKeyRevoked      = "API_KEY_REVOKED"
	ReasonScopeMissing    = "SCOPE_MISSING"
	ReasonWrongWorkspace  = "WRONG_WORKSPACE"
	ReasonNoRule          = "NO_ACCESS_RULE"
	ReasonAuthUnavailable = "AUTH_UNAVAILABLE"
)

// errorDomain is the ErrorInfo domain of the service's errors.
const errorDomain = "connector-svc"

// Guard is the gRPC interceptors that check every call against the rules:
// UNAUTHENTICATED without a valid key, PERMISSION_DENIED for a key of
// another workspace or without the method's scope. Safe for concurrent use.
type Guard struct {
	keys   *Keys
	mode   Mode
	rules  Rules
	logger *slog.Logger
}

// NewGuard returns a Guard enforcing rules in mode (ModeAuto: once
// keys.Exist()). Denied calls are logged with the key's id, never its token.
func NewGuard(keys *Keys, mode Mode, rules Rules, logger *slog.Logger) *Guard {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Guard{keys: keys, mode: mode, rules: rules, logger: logger}
}

// enforcing reports whether calls need keys now.
func (g *Guard) enforcing() bool {
	switch g.mode {
	case ModeKeys:
		return true
	case ModeAuto:
		return g.keys.Exist()
	}
	return false
}

// Unary returns the unary interceptor.
func (g *Guard) Unary() grpc.UnaryServerInterceptor {
	authenticate := grpcauth.UnaryServerInterceptor(g.authenticate)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
		return authenticate(ctx, req, info, func(ctx context.Context, req any) (any, error) {
			if err := g.checkWorkspace(ctx, info.FullMethod, req); err != nil {
				return nil, err
			}
			return next(ctx, req)
		})
	}
}

// Stream returns the stream interceptor. It checks the workspace of every
// message the client sends, before the handler sees it.
func (g *Guard) Stream() grpc.StreamServerInterceptor {
	authenticate := grpcauth.StreamServerInterceptor(g.authenticate)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, next grpc.StreamHandler) error {
		return authenticate(srv, ss, info, func(srv any, ss grpc.ServerStream) error {
			return next(srv, &checkedStream{ServerStream: ss, guard: g, method: info.FullMethod})
		})
	}
}

type checkedStream struct {
	grpc.ServerStream
	guard  *Guard
	method string
}

func (s *checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return s.guard.checkWorkspace(s.Context(), s.method, m)
}

// authenticate is the go-grpc-middleware AuthFunc: it finds the method's
// rule, verifies the key and its scope, and puts the key in the context.
func (g *Guard) authenticate(ctx context.Context) (context.Context, error) {
	method, _ := grpc.Method(ctx)
	rule, ok := g.rules.lookup(method)
	if !ok {
		g.logger.ErrorContext(ctx, "no access rule for a method: refused", slog.String("method", method))
		return nil, g.deny(ctx, method, nil, codes.PermissionDenied, ReasonNoRule, "this RPC has no access rule")
	}
	if rule.NoKey || !g.enforcing() {
		return ctx, nil
	}
	token, err := bearer(ctx)
	if err != nil {
		return nil, g.deny(ctx, method, nil, codes.Unauthenticated, ReasonKeyMissing, err.Error())
	}
	key, err := g.keys.Verify(ctx, token)
	switch {
	case errors.Is(err, ErrUnknownKey):
		return nil, g.deny(ctx, method, nil, codes.Unauthenticated, ReasonKeyInvalid, "unknown API key")
	case errors.Is(err, ErrRevoked):
		return nil, g.deny(ctx, method, &key, codes.Unauthenticated, ReasonKeyRevoked, fmt.Sprintf("API key %s is revoked", key.ID))
	case err != nil:
		g.logger.ErrorContext(ctx, "cannot verify an API key", slog.String("method", method), slog.String("error", err.Error()))
		return nil, g.deny(ctx, method, nil, codes.Unavailable, ReasonAuthUnavailable, "cannot check the API key now; retry")
	}
	if rule.Scope != "" && !key.Allows(rule.Scope) {
		return nil, g.deny(ctx, method, &key, codes.PermissionDenied, ReasonScopeMissing,
			fmt.Sprintf("this RPC needs scope %s; API key %s has %s", rule.Scope, key.ID, scopeList(key.Scopes)), "scope", string(rule.Scope))
	}
	return WithKey(ctx, key), nil
}

// bearer returns the token of the call's "authorization: Bearer …"
// metadata.
func bearer(ctx context.Context) (string, error) {
	vals := metadata.ValueFromIncomingContext(ctx, "authorization")
	if len(vals) == 0 {
		return "", errors.New(`this RPC needs an API key: send the metadata "authorization: Bearer <key>" ` +
			"(an operator creates keys with: connector-svc keys create --workspace <workspace> --scope admin|query|call)")
	}
	scheme, token, _ := strings.Cut(vals[0], " ")
	if !strings.EqualFold(scheme, "bearer") || strings.TrimSpace(token) == "" {
		return "", errors.New(`the authorization metadata must be "Bearer <key>"`)
	}
	return strings.TrimSpace(token), nil
}

// workspaced is every request of a method with a scope.
type workspaced interface{ GetWorkspaceId() string }

// checkWorkspace refuses a request for another workspace than the key's.
// A request naming none goes on to its handler, which refuses it as
// invalid: every RPC with a scope requires workspace_id.
func (g *Guard) checkWorkspace(ctx context.Context, method string, req any) error {
	key, ok := KeyFrom(ctx)
	if !ok {
		return nil // no key needed, or auth off
	}
	r, ok := req.(workspaced)
	if !ok {
		if rule, _ := g.rules.lookup(method); rule.Scope != "" {
			return g.deny(ctx, method, &key, codes.PermissionDenied, ReasonWrongWorkspace, "this request names no workspace")
		}
		return nil
	}
	ws := r.GetWorkspaceId()
	if ws == "" {
		// A missing workspace is a bad request, not another workspace: the
		// handler refuses it (INVALID_ARGUMENT "workspace_id: required")
		// with the request's other problems, before it reads anything.
		return nil
	}
	if ws != key.WorkspaceID {
		return g.deny(ctx, method, &key, codes.PermissionDenied, ReasonWrongWorkspace,
			fmt.Sprintf("API key %s is for workspace %q, not %q", key.ID, key.WorkspaceID, ws), "workspace_id", key.WorkspaceID)
	}
	return nil
}

// deny logs a refused call (the key's id, never its token) and returns its
// status, with an ErrorInfo carrying reason and metadata pairs.
func (g *Guard) deny(ctx context.Context, method string, key *Key, code codes.Code, reason, msg string, meta ...string) error {
	attrs := []any{slog.String("method", method), slog.String("code", code.String()), slog.String("reason", reason)}
	if key != nil {
		attrs = append(attrs, slog.String("key_id", key.ID), slog.String("key_workspace", key.WorkspaceID))
	}
	if p, ok := peer.FromContext(ctx); ok {
		attrs = append(attrs, slog.String("peer", p.Addr.String()))
	}
	g.logger.WarnContext(ctx, "rpc denied", attrs...)

	info := &errdetails.ErrorInfo{Reason: reason, Domain: errorDomain}
	for i := 0; i+1 < len(meta); i += 2 {
		if info.Metadata == nil {
			info.Metadata = map[string]string{}
		}
		info.Metadata[meta[i]] = meta[i+1]
	}
	st, err := status.New(code, msg).WithDetails(info)
	if err != nil {
		return status.Error(code, msg)
	}
	return st.Err()
}

func scopeList(ss []Scope) string {
	names := make([]string, len(ss))
	for i, s := range ss {
		names[i] = string(s)
	}
	return "scope " + strings.Join(names, ",")
}
