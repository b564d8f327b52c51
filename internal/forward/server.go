package forward

import (
	"context"
	"crypto/hmac"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// DefaultSkew is how far a forwarded call's timestamp may be from the
// receiving replica's clock.
const DefaultSkew = 30 * time.Second

// startSlack is how long before this replica's start a call may have been
// signed: clocks of two replicas differ a little. A call signed earlier
// was meant for a process gone from this address, whose nonces this one
// does not know.
const startSlack = time.Second

// ServerConfig is how the internal listener checks forwarded calls.
type ServerConfig struct {
	// Self is this replica's advertised internal address: a call signed
	// for another is refused. Empty accepts any receiver (tests only).
	Self string
	// Key signs; Older are keys still accepted during a SECRET_KEY
	// rotation.
	Key   []byte
	Older [][]byte
	// Skew is how far a call's timestamp may be from this replica's clock
	// (0 means DefaultSkew); MaxNonces how many nonces are kept at most
	// (0 means DefaultMaxNonces).
	Skew      time.Duration
	MaxNonces int
}

// Options are the internal listener's server options: a codec that keeps
// the digest of each request's bytes, and interceptors under which each
// RPC, unary or server-streaming, must carry a Header signed with Key (or
// one of Older) for its method, for Self, within ±Skew of this replica's
// clock and not before it started, with a nonce not seen before and the
// digest of its request. Others are refused UNAUTHENTICATED, with a
// message naming the problem and never the header or the key. A call that
// passes has its sender in its context (From). Give these options before
// any other interceptors, so nothing runs for a refused call.
func (cfg ServerConfig) Options() []grpc.ServerOption {
	skew := cfg.Skew
	if skew <= 0 {
		skew = DefaultSkew
	}
	now := time.Now()
	c := &checker{self: cfg.Self, keys: append([][]byte{cfg.Key}, cfg.Older...), skew: skew, now: time.Now,
		notBefore: now.Add(-startSlack), nonces: newNonces(cfg.MaxNonces), codec: serverCodec{digests: &sync.Map{}}}
	return []grpc.ServerOption{grpc.ForceServerCodec(c.codec), grpc.ChainUnaryInterceptor(c.unary), grpc.ChainStreamInterceptor(c.stream)}
}

// ServerOptions is ServerConfig{Key: key, Older: older, Skew: skew}'s
// Options: any receiver is accepted.
func ServerOptions(key []byte, skew time.Duration, older ...[]byte) []grpc.ServerOption {
	return ServerConfig{Key: key, Older: older, Skew: skew}.Options()
}

// checker verifies incoming Headers.
type checker struct {
	self      string
	keys      [][]byte
	skew      time.Duration
	now       func() time.Time
	notBefore time.Time
	nonces    *nonces
	codec     serverCodec
}

func refused(err error) error {
	return status.Error(codes.Unauthenticated, "forwarded call refused: "+err.Error())
}

// check verifies the header of a call to method and uses its nonce. It
// returns ctx carrying the sender and the digest the header signs, or the
// status refusing the call. digest, if not nil, is the request's, checked
// before the nonce is used.
func (c *checker) check(ctx context.Context, method string, digest []byte) (context.Context, []byte, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get(Header)
	switch {
	case len(vals) == 0 && len(md.Get(LegacyHeader)) > 0:
		return nil, nil, status.Error(codes.Unauthenticated, "forwarded call refused: it carries only the "+LegacyHeader+
			" header of earlier versions, which does not sign the payload: the sending replica runs an earlier version; finish upgrading every replica")
	case len(vals) == 0:
		return nil, nil, status.Error(codes.Unauthenticated, "forwarded call refused: the "+Header+" header is missing (the internal listener serves other replicas only)")
	case len(vals) > 1:
		return nil, nil, status.Error(codes.Unauthenticated, "forwarded call refused: the "+Header+" header is repeated")
	}
	now := c.now()
	sg, err := verify(c.keys, vals[0], method, c.self, now, c.skew)
	if err != nil {
		return nil, nil, refused(err)
	}
	if time.UnixMilli(sg.millis).Before(c.notBefore) {
		return nil, nil, refused(errNotBefore)
	}
	if digest != nil && !hmac.Equal(digest, sg.digest) {
		return nil, nil, refused(errPayload)
	}
	if err := c.nonces.use(sg.nonce, time.UnixMilli(sg.millis).Add(c.skew), now); errors.Is(err, errTooMany) {
		return nil, nil, status.Error(codes.Unavailable, "forwarded call refused: "+err.Error())
	} else if err != nil {
		return nil, nil, refused(err)
	}
	return context.WithValue(ctx, senderKey{}, sg.from), sg.digest, nil
}

func (c *checker) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	d, ok := c.codec.digestOf(req)
	if !ok {
		return nil, refused(errors.New("the request's digest is unknown (the listener does not use the forwarding codec)"))
	}
	ctx, _, err := c.check(ctx, info.FullMethod, d[:])
	if err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (c *checker) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if info.IsClientStream {
		return refused(errors.New("a client-streaming method cannot be forwarded (the signature covers one request message)"))
	}
	ctx, digest, err := c.check(ss.Context(), info.FullMethod, nil)
	if err != nil {
		return err
	}
	return handler(srv, &stream{ServerStream: ss, ctx: ctx, codec: c.codec, digest: digest})
}

// stream is a ServerStream whose context carries the sender, and whose
// one request message must have the digest the header signs.
type stream struct {
	grpc.ServerStream
	ctx      context.Context
	codec    serverCodec
	digest   []byte
	received bool
}

func (s *stream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	d, ok := s.codec.digestOf(m)
	if err != nil {
		return err
	}
	if s.received {
		return refused(errors.New("a second request message on a forwarded stream (the signature covers one)"))
	}
	s.received = true
	if !ok || !hmac.Equal(d[:], s.digest) {
		return refused(errPayload)
	}
	return nil
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
