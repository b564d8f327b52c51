package forward

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// Dial returns a client connection to the internal listener at addr whose
// every RPC carries the Header, signed with key as replica from. opts come
// after Dial's own (a larger receive limit, keepalive).
//
// The connection is plaintext: payloads are not encrypted on this hop,
// which must stay on the cluster network. The HMAC authenticates the
// sender and binds the header to the method and a time within the
// server's skew; it does not cover the payload, so someone who can read
// the hop could replay a header within that window. Like grpc.NewClient,
// Dial does no I/O; it fails only on a bad from or bad options.
func Dial(addr string, key []byte, from string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	if err := checkReplicaID(from); err != nil {
		return nil, fmt.Errorf("forward: dial %s: %w", addr, err)
	}
	if len(key) == 0 {
		return nil, fmt.Errorf("forward: dial %s: no forwarding key", addr)
	}
	s := signer{key: key, from: from, now: time.Now}
	all := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
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
	key  []byte
	from string
	now  func() time.Time
}

// outgoing is ctx with the Header for method set (replacing any a caller
// put there).
func (s signer) outgoing(ctx context.Context, method string) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	md.Set(Header, sign(s.key, method, s.from, s.now()))
	return metadata.NewOutgoingContext(ctx, md)
}

func (s signer) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return invoker(s.outgoing(ctx, method), method, req, reply, cc, opts...)
}

func (s signer) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return streamer(s.outgoing(ctx, method), desc, cc, method, opts...)
}

// ErrClosed is returned by Pool.Conn after Pool.Close.
var ErrClosed = errors.New("forward: the connection pool is closed")

// Pool keeps one client connection per internal address, made by Dial on
// first use. Safe for concurrent use.
type Pool struct {
	key  []byte
	from string
	opts []grpc.DialOption

	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
	closed bool
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
	cc, err := Dial(addr, p.key, p.from, p.opts...)
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
