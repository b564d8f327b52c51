package forward

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Dial returns a client connection to the internal listener at addr whose
// every RPC carries the Header, signed with key as replica from for the
// replica at addr (its advertised internal address, which the receiver
// compares with its own). opts come after Dial's own, so a
// grpc.WithTransportCredentials there replaces the plaintext default
// (Pool.UseTLS).
//
// Each request message is marshaled deterministically once, its digest
// signed and the same bytes sent. Only unary and server-streaming methods
// can be signed (one request message); a client-streaming one fails.
// Like grpc.NewClient, Dial does no I/O; it fails only on a bad from or
// bad options.
func Dial(addr string, key []byte, from string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	if err := checkReplicaID(from); err != nil {
		return nil, fmt.Errorf("forward: dial %s: %w", addr, err)
	}
	if len(key) == 0 {
		return nil, fmt.Errorf("forward: dial %s: no forwarding key", addr)
	}
	if addr == "" || len(addr) > maxReceiver {
		return nil, fmt.Errorf("forward: dial: want an address of 1 to %d bytes", maxReceiver)
	}
	s := signer{key: key, from: from, to: addr, now: time.Now}
	all := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(clientCodec{})),
		grpc.WithChainUnaryInterceptor(s.unary),
		grpc.WithChainStreamInterceptor(s.stream),
	}, opts...)
	cc, err := grpc.NewClient(addr, all...)
	if err != nil {
		return nil, fmt.Errorf("forward: dial %s: %w", addr, err)
	}
	return cc, nil
}

// signer puts the Header on outgoing RPCs.
type signer struct {
	key      []byte
	from, to string
	now      func() time.Time
}

// outgoing marshals req and returns ctx with the Header for method and
// req set (replacing any a caller put there), and req's bytes to send.
func (s signer) outgoing(ctx context.Context, method string, req any) (context.Context, encoded, error) {
	b, err := marshal(req)
	if err != nil {
		return nil, nil, status.Error(codes.Internal, err.Error())
	}
	digest := sha256.Sum256(b)
	nonce := make([]byte, nonceSize)
	_, _ = rand.Read(nonce) // never fails (crypto/rand)
	now := s.now()
	sg := signed{method: method, from: s.from, to: s.to, millis: now.UnixMilli(), nonce: nonce, digest: digest[:]}
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	md.Set(Header, sg.header(s.key))
	md.Set(LegacyHeader, legacyHeader(s.key, method, s.from, now))
	return metadata.NewOutgoingContext(ctx, md), encoded(b), nil
}

func (s signer) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	ctx, b, err := s.outgoing(ctx, method, req)
	if err != nil {
		return err
	}
	return invoker(ctx, method, b, reply, cc, opts...)
}

// errClientStreams refuses a method whose client sends several messages:
// the header is sent before the first and signs one.
var errClientStreams = status.Error(codes.Unimplemented, "forward: a client-streaming method cannot be forwarded (the signature covers one request message)")

func (s signer) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if desc.ClientStreams {
		return nil, errClientStreams
	}
	return &lazyStream{ctx: ctx, open: func(m any) (grpc.ClientStream, encoded, error) {
		ctx, b, err := s.outgoing(ctx, method, m)
		if err != nil {
			return nil, nil, err
		}
		cs, err := streamer(ctx, desc, cc, method, opts...)
		return cs, b, err
	}}, nil
}

// lazyStream opens a server-streaming call when its one request message
// is sent, so that the header can sign it. The generated client sends it
// right after opening the stream, before anything else.
type lazyStream struct {
	ctx  context.Context
	open func(m any) (grpc.ClientStream, encoded, error)
	cs   grpc.ClientStream
}

var errNotSent = status.Error(codes.Internal, "forward: the stream's request message was not sent yet")

func (l *lazyStream) SendMsg(m any) error {
	if l.cs != nil {
		return errClientStreams
	}
	cs, b, err := l.open(m)
	if err != nil {
		return err
	}
	l.cs = cs
	return cs.SendMsg(b)
}

func (l *lazyStream) RecvMsg(m any) error {
	if l.cs == nil {
		return errNotSent
	}
	return l.cs.RecvMsg(m)
}

func (l *lazyStream) Header() (metadata.MD, error) {
	if l.cs == nil {
		return nil, errNotSent
	}
	return l.cs.Header()
}

func (l *lazyStream) Trailer() metadata.MD {
	if l.cs == nil {
		return nil
	}
	return l.cs.Trailer()
}

func (l *lazyStream) CloseSend() error {
	if l.cs == nil {
		return errNotSent
	}
	return l.cs.CloseSend()
}

func (l *lazyStream) Context() context.Context {
	if l.cs == nil {
		return l.ctx
	}
	return l.cs.Context()
}

// ErrClosed is returned by Pool.Conn after Pool.Close.
var ErrClosed = errors.New("forward: the connection pool is closed")

// Pool keeps one client connection per internal address, made by Dial on
// first use. Safe for concurrent use.
type Pool struct {
	key  []byte
	from string
	opts []grpc.DialOption

	// tls, if set, makes the client TLS configuration for a peer whose
	// certificate must carry serverName ("" means the host of its address).
	tls        func(serverName string) *tls.Config
	serverName string

	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
	closed bool
}

// UseTLS makes the pool's connections TLS, each with clientConfig(name),
// where name is serverName or, if that is empty, the host of the peer's
// address: the name the peer's certificate must carry. Call it before the
// first Conn.
func (p *Pool) UseTLS(clientConfig func(serverName string) *tls.Config, serverName string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tls, p.serverName = clientConfig, serverName
}

// NewPool returns a Pool whose connections sign as replica from with key;
// opts are passed to Dial. Fails on a from the header cannot carry.
func NewPool(key []byte, from string, opts ...grpc.DialOption) (*Pool, error) {
	if err := checkReplicaID(from); err != nil {
		return nil, fmt.Errorf("forward: pool: %w", err)
	}
	if len(key) == 0 {
		return nil, errors.New("forward: pool: no forwarding key")
	}
	return &Pool{key: key, from: from, opts: opts, conns: map[string]*grpc.ClientConn{}}, nil
}

// Conn returns the connection to addr, making it on first use (no I/O:
// it connects on its first RPC). Returns ErrClosed after Close.
func (p *Pool) Conn(addr string) (*grpc.ClientConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	if cc := p.conns[addr]; cc != nil {
		return cc, nil
	}
	opts := p.opts
	if p.tls != nil {
		name := p.serverName
		if name == "" {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, fmt.Errorf("forward: dial %s: %w", addr, err)
			}
			name = host
		}
		opts = append(slices.Clip(opts), grpc.WithTransportCredentials(credentials.NewTLS(p.tls(name))))
	}
	cc, err := Dial(addr, p.key, p.from, opts...)
	if err != nil {
		return nil, err
	}
	p.conns[addr] = cc
	return cc, nil
}

// Forget closes and drops the connection to addr, if any: for a replica
// that left. A later Conn makes a new one.
func (p *Pool) Forget(addr string) {
	p.mu.Lock()
	cc := p.conns[addr]
	delete(p.conns, addr)
	p.mu.Unlock()
	if cc != nil {
		_ = cc.Close()
	}
}

// Close closes every connection; RPCs in flight on them fail with
// CANCELED. Safe to call twice.
func (p *Pool) Close() error {
	p.mu.Lock()
	conns := p.conns
	p.conns, p.closed = nil, true
	p.mu.Unlock()
	var errs []error
	for _, cc := range conns {
		errs = append(errs, cc.Close())
	}
	return errors.Join(errs...)
}
