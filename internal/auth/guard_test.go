package auth

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// The rules of a small service: one admin, one query, one public service
// and one needing any key.
var testRules = Rules{
	"/svc.S/Admin":  {Scope: ScopeAdmin},
	"/svc.S/Query":  {Scope: ScopeQuery},
	"/svc.S/Stream": {Scope: ScopeQuery},
	"health.H":      {NoKey: true},
	"refl.R":        {},
}

type request struct{ ws string }

func (r *request) GetWorkspaceId() string { return r.ws }

type noWorkspace struct{}

// transportStream carries the method name, as a gRPC server puts it in
// the context.
type transportStream struct{ method string }

func (s transportStream) Method() string               { return s.method }
func (s transportStream) SetHeader(metadata.MD) error  { return nil }
func (s transportStream) SendHeader(metadata.MD) error { return nil }
func (s transportStream) SetTrailer(metadata.MD) error { return nil }

func callCtx(method, authorization string) context.Context {
	ctx := grpc.NewContextWithServerTransportStream(context.Background(), transportStream{method})
	if authorization != "" {
		ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", authorization))
	}
	return ctx
}

// unary calls the guard's unary interceptor with a handler that records
// the key it saw.
func unary(g *Guard, method, authorization string, req any) (Key, error) {
	var seen Key
	_, err := g.Unary()(callCtx(method, authorization), req, &grpc.UnaryServerInfo{FullMethod: method},
		func(ctx context.Context, _ any) (any, error) {
			seen, _ = KeyFrom(ctx)
			return "ok", nil
		})
	return seen, err
}

func reason(err error) (string, map[string]string) {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason(), info.GetMetadata()
		}
	}
	return "", nil
}

func TestGuard(t *testing.T) {
	keys, _ := newKeys(t, Config{})
	ctx := context.Background()
	admin, adminToken, err := keys.Create(ctx, "acme", []Scope{ScopeAdmin}, "")
	if err != nil {
		t.Fatal(err)
	}
	_, queryToken, err := keys.Create(ctx, "acme", []Scope{ScopeQuery}, "")
	if err != nil {
		t.Fatal(err)
	}
	revoked, revokedToken, err := keys.Create(ctx, "acme", []Scope{ScopeAdmin}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := keys.Revoke(ctx, "", revoked.ID); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	g := NewGuard(keys, ModeKeys, testRules, slog.New(slog.NewJSONHandler(&logs, nil)))

	for _, tt := range []struct {
		name, method, auth string
		req                any
		code               codes.Code
		reason             string
		msg                string // the message contains it
	}{
		{"admin key, admin RPC", "/svc.S/Admin", "Bearer " + adminToken, &request{"acme"}, codes.OK, "", ""},
		{"admin key, query RPC", "/svc.S/Query", "Bearer " + adminToken, &request{"acme"}, codes.OK, "", ""},
		{"scheme in any case", "/svc.S/Query", "bearer " + queryToken, &request{"acme"}, codes.OK, "", ""},
		{"query key, query RPC", "/svc.S/Query", "Bearer " + queryToken, &request{"acme"}, codes.OK, "", ""},
		{"health without a key", "/health.H/Check", "", &noWorkspace{}, codes.OK, "", ""},
		{"health with a bad key", "/health.H/Check", "Bearer nope", &noWorkspace{}, codes.OK, "", ""},
		{"reflection with a key", "/refl.R/Info", "Bearer " + queryToken, &noWorkspace{}, codes.OK, "", ""},
		{"reflection without a key", "/refl.R/Info", "", &noWorkspace{}, codes.Unauthenticated, ReasonKeyMissing, "authorization: Bearer"},
		{"no key", "/svc.S/Query", "", &request{"acme"}, codes.Unauthenticated, ReasonKeyMissing, "connector-svc keys create"},
		{"not bearer", "/svc.S/Query", "Basic " + queryToken, &request{"acme"}, codes.Unauthenticated, ReasonKeyMissing, "Bearer <key>"},
		{"unknown key", "/svc.S/Query", "Bearer " + queryToken[:len(queryToken)-1] + "_", &request{"acme"}, codes.Unauthenticated, ReasonKeyInvalid, "unknown"},
		{"revoked key", "/svc.S/Admin", "Bearer " + revokedToken, &request{"acme"}, codes.Unauthenticated, ReasonKeyRevoked, revoked.ID},
		{"query key, admin RPC", "/svc.S/Admin", "Bearer " + queryToken, &request{"acme"}, codes.PermissionDenied, ReasonScopeMissing, "needs scope admin"},
		{"other workspace", "/svc.S/Admin", "Bearer " + adminToken, &request{"globex"}, codes.PermissionDenied, ReasonWrongWorkspace, `for workspace "acme", not "globex"`},
		{"empty workspace: the handler refuses it", "/svc.S/Admin", "Bearer " + adminToken, &request{""}, codes.OK, "", ""},
		{"scoped RPC, request without workspace", "/svc.S/Admin", "Bearer " + adminToken, &noWorkspace{}, codes.PermissionDenied, ReasonWrongWorkspace, "names no workspace"},
		{"method without a rule", "/svc.S/New", "Bearer " + adminToken, &request{"acme"}, codes.PermissionDenied, ReasonNoRule, "no access rule"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			seen, err := unary(g, tt.method, tt.auth, tt.req)
			st := status.Convert(err)
			if st.Code() != tt.code || !strings.Contains(st.Message(), tt.msg) {
				t.Fatalf("code %v %q; want %v containing %q", st.Code(), st.Message(), tt.code, tt.msg)
			}
			if r, _ := reason(err); r != tt.reason {
				t.Errorf("reason %q, want %q", r, tt.reason)
			}
			if tt.code == codes.OK && strings.HasPrefix(tt.method, "/svc.S/") && seen.ID == "" {
				t.Error("the handler did not get the key in its context")
			}
		})
	}
	if _, meta := reason(func() error { _, err := unary(g, "/svc.S/Admin", "Bearer "+adminToken, &request{"x"}); return err }()); meta["workspace_id"] != "acme" {
		t.Errorf("WRONG_WORKSPACE metadata = %v, want the key's workspace", meta)
	}
	for _, token := range []string{adminToken, queryToken, revokedToken} {
		if strings.Contains(logs.String(), token) {
			t.Fatalf("a token reached the log:\n%s", logs.String())
		}
	}
	if !strings.Contains(logs.String(), `"key_id":"`+admin.ID+`"`) {
		t.Errorf("denials are not logged with the key id:\n%s", logs.String())
	}
}

func TestGuardAutoTurnsOnWithTheFirstKey(t *testing.T) {
	keys, _ := newKeys(t, Config{})
	g := NewGuard(keys, ModeAuto, testRules, nil)
	if _, err := unary(g, "/svc.S/Admin", "", &request{"acme"}); err != nil {
		t.Fatalf("auto mode without keys refused a call: %v", err)
	}
	if _, _, err := keys.Create(context.Background(), "acme", []Scope{ScopeAdmin}, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := unary(g, "/svc.S/Admin", "", &request{"acme"}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("auto mode with a key, call without = %v; want UNAUTHENTICATED", err)
	}
}

// serverStream is a client stream that sends msgs, one per RecvMsg.
type serverStream struct {
	grpc.ServerStream
	ctx  context.Context
	msgs []*request
}

func (s *serverStream) Context() context.Context { return s.ctx }

func (s *serverStream) RecvMsg(m any) error {
	*m.(*request) = *s.msgs[0]
	s.msgs = s.msgs[1:]
	return nil
}

func TestGuardStream(t *testing.T) {
	keys, _ := newKeys(t, Config{})
	_, token, err := keys.Create(context.Background(), "acme", []Scope{ScopeQuery}, "")
	if err != nil {
		t.Fatal(err)
	}
	g := NewGuard(keys, ModeKeys, testRules, nil)
	stream := func(auth string, msgs ...*request) error {
		ss := &serverStream{ctx: callCtx("/svc.S/Stream", auth), msgs: msgs}
		return g.Stream()(nil, ss, &grpc.StreamServerInfo{FullMethod: "/svc.S/Stream", IsServerStream: true},
			func(_ any, ss grpc.ServerStream) error {
				if _, ok := KeyFrom(ss.Context()); !ok {
					t.Error("the handler's stream context has no key")
				}
				for range msgs {
					if err := ss.RecvMsg(&request{}); err != nil {
						return err
					}
				}
				return nil
			})
	}
	if err := stream("Bearer "+token, &request{"acme"}, &request{"acme"}); err != nil {
		t.Errorf("stream in the key's workspace: %v", err)
	}
	if err := stream("", &request{"acme"}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("stream without a key: %v; want UNAUTHENTICATED", err)
	}
	if err := stream("Bearer "+token, &request{"acme"}, &request{"globex"}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("stream whose second message names another workspace: %v; want PERMISSION_DENIED", err)
	}
}
