package forward

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// DefaultSkew is how far a forwarded call's timestamp may be from the
// receiving replica's clock.
const DefaultSkew = 30 * time.Second

// ServerOptions are the interceptors of the internal listener: each RPC,
// unary or streaming, must carry a Header signed with key (or with one of
// older, during a SECRET_KEY rotation) for its method, with a timestamp
// within ±skew (0 means DefaultSkew) of this replica's clock. Others are
// refused UNAUTHENTICATED, with a message naming the problem and never the
// header or the key. A call that passes has its sender in its context
// (From). Give these options before any other interceptors, so nothing
// runs for a refused call.
func ServerOptions(key []byte, skew time.Duration, older ...[]byte) []grpc.ServerOption {
	if skew <= 0 {
		skew = DefaultSkew
	}
	c := checker{keys: append([][]byte{key}, older...), skew: skew, now: time.Now}
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(c.unary), grpc.ChainStreamInterceptor(c.stream)}
}

// checker verifies incoming Headers.
type checker struct {
	keys [][]byte
	skew time.Duration
	now  func() time.Time
}

// check returns ctx carrying the sender of a call to method, or the
// UNAUTHENTICATED status refusing it.
func (c checker) check(ctx context.Context, method string) (context.Context, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get(Header)
	switch {
	case len(vals) == 0:
		return nil, status.Error(codes.Unauthenticated, "forwarded call refused: the "+Header+" header is missing (the internal listener serves other replicas only)")
	case len(vals) > 1:
		return nil, status.Error(codes.Unauthenticated, "forwarded call refused: the "+Header+" header is repeated")
	}
	from, err := verify(c.keys, vals[0], method, c.now(), c.skew)
	if err != nil {
		return nil, status.Error(codes.Unauthenticated, "forwarded call refused: "+err.Error())
	}
	return context.WithValue(ctx, senderKey{}, from), nil
}

func (c checker) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	ctx, err := c.check(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (c checker) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, err := c.check(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	return handler(srv, &stream{ServerStream: ss, ctx: ctx})
}

// stream is a ServerStream whose context carries the sender.
type stream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *stream) Context() context.Context { return s.ctx }

// senderKey is the context key of a verified sender. Unexported: only
// ServerOptions' interceptors set it.
type senderKey struct{}

// From returns the replica that forwarded the call of ctx. ok is false for
// any context that did not pass ServerOptions' interceptors, whatever
// metadata the call carried.
func From(ctx context.Context) (replica string, ok bool) {
	replica, ok = ctx.Value(senderKey{}).(string)
	return replica, ok
}

// Forwarded reports whether the call of ctx came from another replica
// through the internal listener; such a call is served here, never
// forwarded again.
func Forwarded(ctx context.Context) bool {
	_, ok := From(ctx)
	return ok
}
