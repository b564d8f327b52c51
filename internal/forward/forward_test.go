package forward

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/tlsfiles"
	"github.com/connector-svc/connector-svc/internal/tlsfiles/tlsfilestest"
)

const (
	getMethod  = "/connector.v1.ConnectorService/GetConnector"
	listMethod = "/connector.v1.ConnectorService/ListConnectors"
)

// fake is a ConnectorService that records, for each call it serves, who
// From says sent it, and answers GetConnector with that sender as the
// connector id.
type fake struct {
	connectorv1.UnimplementedConnectorServiceServer
	mu    sync.Mutex
	calls []string // the sender of each call served, "" when From says none
}

func (f *fake) record(ctx context.Context) string {
	from, ok := From(ctx)
	if ok != Forwarded(ctx) || ok == (from == "") {
		panic("From and Forwarded disagree")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, from)
	return from
}

func (f *fake) served() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func (f *fake) GetConnector(ctx context.Context, _ *connectorv1.GetConnectorRequest) (*connectorv1.GetConnectorResponse, error) {
	return &connectorv1.GetConnectorResponse{Connector: &connectorv1.Connector{ConnectorId: f.record(ctx)}}, nil
}

func (f *fake) StreamCallTool(_ *connectorv1.StreamCallToolRequest, ss grpc.ServerStreamingServer[connectorv1.StreamCallToolResponse]) error {
	f.record(ss.Context())
	return ss.Send(&connectorv1.StreamCallToolResponse{})
}

// serve starts a gRPC server on loopback with opts serving a fake, and
// returns its address and the fake.
func serve(t *testing.T, opts ...grpc.ServerOption) (string, *fake) {
	t.Helper()
	return serveOn(t, listen(t), opts...)
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis
}

// serveOn is serve on lis.
func serveOn(t *testing.T, lis net.Listener, opts ...grpc.ServerOption) (string, *fake) {
	t.Helper()
	s := grpc.NewServer(opts...)
	f := &fake{}
	connectorv1.RegisterConnectorServiceServer(s, f)
	done := make(chan error, 1)
	go func() { done <- s.Serve(lis) }()
	t.Cleanup(func() {
		s.Stop()
		if err := <-done; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("serve: %v", err)
		}
	})
	return lis.Addr().String(), f
}

// plain is a client with no forwarding interceptors: what a caller has.
func plain(t *testing.T, addr string) connectorv1.ConnectorServiceClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return connectorv1.NewConnectorServiceClient(cc)
}

func testKey(b byte) []byte { return Key(bytes.Repeat([]byte{b}, 32)) }

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// sign is the Header value of a call to method with an empty request,
// from replica from to the replica at to, at t, with a fresh nonce.
func sign(key []byte, method, from, to string, t time.Time) string {
	empty := sha256.Sum256(nil)
	nonce := make([]byte, nonceSize)
	_, _ = rand.Read(nonce)
	return signed{method: method, from: from, to: to, millis: t.UnixMilli(), nonce: nonce, digest: empty[:]}.header(key)
}

func withHeader(t *testing.T, vals ...string) context.Context {
	md := metadata.MD{}
	for _, v := range vals {
		md.Append(Header, v)
	}
	return metadata.NewOutgoingContext(ctx(t), md)
}

func TestKeyIsDerived(t *testing.T) {
	raw := bytes.Repeat([]byte{7}, 32)
	k := Key(raw)
	if len(k) != 32 || bytes.Equal(k, raw) || bytes.Contains(k, raw[:8]) {
		t.Fatalf("Key = %x; want 32 bytes unlike the raw key", k)
	}
	if !bytes.Equal(k, Key(raw)) {
		t.Error("Key is not deterministic")
	}
	if bytes.Equal(k, Key(bytes.Repeat([]byte{8}, 32))) {
		t.Error("two SECRET_KEYs derive the same key")
	}
}

// TestForwardedCallPasses: a unary and a streaming call through Dial reach
// the handler with From naming the sender, also for an id with dots.
func TestForwardedCallPasses(t *testing.T) {
	key := testKey(1)
	addr, f := serve(t, ServerOptions(key, 30*time.Second)...)
	for _, from := range []string{"replica-a", "pod.ns.svc:7"} {
		cc, err := Dial(addr, key, from)
		if err != nil {
			t.Fatal(err)
		}
		client := connectorv1.NewConnectorServiceClient(cc)
		res, err := client.GetConnector(ctx(t), &connectorv1.GetConnectorRequest{})
		if err != nil {
			t.Fatalf("GetConnector from %s: %v", from, err)
		}
		if got := res.GetConnector().GetConnectorId(); got != from {
			t.Errorf("From = %q in the handler, want %q", got, from)
		}
		stream, err := client.StreamCallTool(ctx(t), &connectorv1.StreamCallToolRequest{})
		if err == nil {
			_, err = stream.Recv()
		}
		if err != nil {
			t.Fatalf("StreamCallTool from %s: %v", from, err)
		}
		cc.Close()
	}
	want := []string{"replica-a", "replica-a", "pod.ns.svc:7", "pod.ns.svc:7"}
	if got := f.served(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("served %q, want %q", got, want)
	}
}

// TestRefused: calls without a valid header are refused UNAUTHENTICATED,
// unary and streaming, before the handler runs, with a message that names
// the problem and carries neither key nor header.
func TestRefused(t *testing.T) {
	key, other := testKey(1), testKey(2)
	lis := listen(t)
	addr := lis.Addr().String()
	_, f := serveOn(t, lis, ServerConfig{Self: addr, Key: key, Skew: 30 * time.Second}.Options()...)
	now := time.Now()
	// Each case's header is made for the method it is sent with.
	cases := []struct {
		name   string
		header func(method string) string
		want   string
		repeat bool
	}{
		{"missing", nil, "missing", false},
		{"wrong key", func(m string) string { return sign(other, m, "a", addr, now) }, "does not verify", false},
		{"stale", func(m string) string { return sign(key, m, "a", addr, now.Add(-time.Minute)) }, "timestamp", false},
		{"from the future", func(m string) string { return sign(key, m, "a", addr, now.Add(time.Minute)) }, "timestamp", false},
		{"tampered method", func(string) string { return sign(key, listMethod, "a", addr, now) }, "does not verify", false},
		{"tampered sender", func(m string) string { return strings.Replace(sign(key, m, "a", addr, now), "v2.a.", "v2.b.", 1) }, "does not verify", false},
		{"other receiver", func(m string) string { return sign(key, m, "a", "10.0.0.9:7000", now) }, "signed for the replica at", false},
		{"garbage", func(string) string { return "v2.a.b.c" }, "malformed", false},
		{"no version", func(m string) string { return strings.TrimPrefix(sign(key, m, "a", addr, now), "v2.") }, "malformed", false},
		{"v1 header", func(m string) string { return legacyHeader(key, m, "a", now) }, "malformed", false},
		{"repeated", func(m string) string { return sign(key, m, "a", addr, now) }, "repeated", true},
	}
	client := plain(t, addr)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			headers := func(method string) []string {
				if c.header == nil {
					return nil
				}
				if c.repeat {
					return []string{c.header(method), c.header(method)}
				}
				return []string{c.header(method)}
			}
			_, err := client.GetConnector(withHeader(t, headers(getMethod)...), &connectorv1.GetConnectorRequest{})
			wantRefused(t, err, c.want, key, headers(getMethod))
			streamMethod := "/connector.v1.ConnectorService/StreamCallTool"
			stream, err := client.StreamCallTool(withHeader(t, headers(streamMethod)...), &connectorv1.StreamCallToolRequest{})
			if err == nil {
				_, err = stream.Recv()
			}
			wantRefused(t, err, c.want, key, headers(streamMethod))
		})
	}
	if got := f.served(); len(got) != 0 {
		t.Errorf("the handler ran %d times for refused calls", len(got))
	}
}

// wantRefused checks that err is UNAUTHENTICATED naming want, and that
// its message carries neither the key nor the headers sent, nor their
// signatures.
func wantRefused(t *testing.T, err error, want string, key []byte, headers []string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.Unauthenticated || !strings.Contains(st.Message(), want) {
		t.Errorf("got %v, want UNAUTHENTICATED naming %q", err, want)
	}
	leaks := []string{string(key), base64.RawURLEncoding.EncodeToString(key), base64.StdEncoding.EncodeToString(key)}
	for _, h := range headers {
		leaks = append(leaks, h)
		if sig := h[strings.LastIndexByte(h, '.')+1:]; len(sig) > 8 {
			leaks = append(leaks, sig)
		}
	}
	for _, s := range leaks {
		if strings.Contains(st.Message(), s) {
			t.Errorf("message %q carries key or header material", st.Message())
		}
	}
}

// TestOlderKeyPasses: during a SECRET_KEY rotation, a sender still on the
// old key is accepted by a server that lists it as older; one on neither
// is not.
func TestOlderKeyPasses(t *testing.T) {
	newKey, oldKey := testKey(1), testKey(2)
	addr, f := serve(t, ServerOptions(newKey, 0, oldKey)...)
	for _, c := range []struct {
		key  []byte
		pass bool
	}{{oldKey, true}, {newKey, true}, {testKey(3), false}} {
		cc, err := Dial(addr, c.key, "r")
		if err != nil {
			t.Fatal(err)
		}
		_, err = connectorv1.NewConnectorServiceClient(cc).GetConnector(ctx(t), &connectorv1.GetConnectorRequest{})
		cc.Close()
		if (err == nil) != c.pass {
			t.Errorf("key %x: err = %v, want pass %v", c.key[:4], err, c.pass)
		}
	}
	if n := len(f.served()); n != 2 {
		t.Errorf("served %d calls, want 2", n)
	}
}

// TestPublicServerIgnoresHeader: a server without ServerOptions (the
// public listener) never reports a call as forwarded, even one with a
// valid header.
func TestPublicServerIgnoresHeader(t *testing.T) {
	key := testKey(1)
	addr, f := serve(t)
	cc, err := Dial(addr, key, "intruder")
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	res, err := connectorv1.NewConnectorServiceClient(cc).GetConnector(ctx(t), &connectorv1.GetConnectorRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if id := res.GetConnector().GetConnectorId(); id != "" {
		t.Errorf("From = %q on the public server", id)
	}
	_, err = plain(t, addr).GetConnector(withHeader(t, sign(key, getMethod, "intruder", addr, time.Now())), &connectorv1.GetConnectorRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := f.served(); len(got) != 2 || got[0] != "" || got[1] != "" {
		t.Errorf("served %q, want two calls with no sender", got)
	}
	if Forwarded(context.Background()) {
		t.Error("Forwarded(background) = true")
	}
}

// TestCallerHeaderReplaced: a header a caller put on the context is
// replaced by the signer's own, so a forwarded call carries one header.
func TestCallerHeaderReplaced(t *testing.T) {
	key := testKey(1)
	addr, f := serve(t, ServerOptions(key, 0)...)
	cc, err := Dial(addr, key, "b")
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c := metadata.AppendToOutgoingContext(ctx(t), Header, "v2.evil.1.xx", LegacyHeader, "v1.evil.1.xx")
	if _, err := connectorv1.NewConnectorServiceClient(cc).GetConnector(c, &connectorv1.GetConnectorRequest{}); err != nil {
		t.Fatal(err)
	}
	if got := f.served(); len(got) != 1 || got[0] != "b" {
		t.Errorf("served %q, want one call from b", got)
	}
}

// TestPool: one connection per address, concurrently; Forget makes a new
// one; Close closes them all and later Conns fail.
func TestPool(t *testing.T) {
	key := testKey(1)
	addrA, fa := serve(t, ServerOptions(key, 0)...)
	addrB, fb := serve(t, ServerOptions(key, 0)...)
	if _, err := NewPool(key, "bad|id"); err == nil {
		t.Error("NewPool accepted a replica id with |")
	}
	p, err := NewPool(key, "me")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	conns := make([]*grpc.ClientConn, 16)
	for i := range conns {
		wg.Go(func() {
			addr := addrA
			if i%2 == 1 {
				addr = addrB
			}
			cc, err := p.Conn(addr)
			if err != nil {
				t.Error(err)
				return
			}
			conns[i] = cc
			if _, err := connectorv1.NewConnectorServiceClient(cc).GetConnector(ctx(t), &connectorv1.GetConnectorRequest{}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for i := 2; i < len(conns); i++ {
		if conns[i] != conns[i%2] {
			t.Fatalf("call %d got a second connection to its address", i)
		}
	}
	if len(fa.served()) != 8 || len(fb.served()) != 8 {
		t.Errorf("served %d and %d, want 8 each", len(fa.served()), len(fb.served()))
	}
	p.Forget(addrA)
	if cc, _ := p.Conn(addrA); cc == conns[0] {
		t.Error("Conn after Forget returned the closed connection")
	}
	if err := p.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := p.Conn(addrB); !errors.Is(err, ErrClosed) {
		t.Errorf("Conn after Close: %v, want ErrClosed", err)
	}
}

// capture is a server interceptor, after the forwarding ones, that keeps
// the forwarding headers of each call that passed: what someone reading
// the hop sees.
type capture struct {
	mu   sync.Mutex
	seen []metadata.MD
}

func (c *capture) keep(ctx context.Context) {
	md, _ := metadata.FromIncomingContext(ctx)
	kept := metadata.MD{}
	for k, v := range md {
		if strings.HasPrefix(k, "x-connector-svc-forward") {
			kept[k] = v
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen = append(c.seen, kept)
}

func (c *capture) last() metadata.MD {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen[len(c.seen)-1]
}

func (c *capture) options() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			c.keep(ctx)
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			c.keep(ss.Context())
			return h(srv, ss)
		}),
	}
}

// replay sends req to addr with the captured headers md, unary and
// streaming, as someone who captured them would, and returns the errors.
func replay(t *testing.T, addr string, md metadata.MD, req *connectorv1.GetConnectorRequest) error {
	t.Helper()
	_, err := plain(t, addr).GetConnector(metadata.NewOutgoingContext(ctx(t), md), req)
	return err
}

func replayStream(t *testing.T, addr string, md metadata.MD, req *connectorv1.StreamCallToolRequest) error {
	t.Helper()
	stream, err := plain(t, addr).StreamCallTool(metadata.NewOutgoingContext(ctx(t), md), req)
	if err == nil {
		_, err = stream.Recv()
	}
	return err
}

// TestReplayRefused: a forwarded call captured on the hop and sent again,
// the same bytes, is refused UNAUTHENTICATED, unary and streaming, by the
// replica it was sent to and by another replica with the same key.
func TestReplayRefused(t *testing.T) {
	key := testKey(1)
	lisA, lisB := listen(t), listen(t)
	addrA, addrB := lisA.Addr().String(), lisB.Addr().String()
	var c capture
	_, fa := serveOn(t, lisA, append(ServerConfig{Self: addrA, Key: key}.Options(), c.options()...)...)
	_, fb := serveOn(t, lisB, ServerConfig{Self: addrB, Key: key}.Options()...)
	cc, err := Dial(addrA, key, "sender")
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := connectorv1.NewConnectorServiceClient(cc)

	req := &connectorv1.GetConnectorRequest{ConnectorId: "c1", WorkspaceId: "w"}
	if _, err := client.GetConnector(ctx(t), req); err != nil {
		t.Fatal(err)
	}
	md := c.last()
	for _, to := range []string{addrA, addrB} {
		if err := replay(t, to, md, req); status.Code(err) != codes.Unauthenticated {
			t.Errorf("unary replay to %s: %v, want UNAUTHENTICATED", to, err)
		}
	}

	sreq := &connectorv1.StreamCallToolRequest{ConnectorId: "c1", ToolName: "t"}
	stream, err := client.StreamCallTool(ctx(t), sreq)
	if err == nil {
		_, err = stream.Recv()
	}
	if err != nil {
		t.Fatal(err)
	}
	md = c.last()
	for _, to := range []string{addrA, addrB} {
		if err := replayStream(t, to, md, sreq); status.Code(err) != codes.Unauthenticated {
			t.Errorf("streaming replay to %s: %v, want UNAUTHENTICATED", to, err)
		}
	}
	if got, want := len(fa.served()), 2; got != want {
		t.Errorf("replica A served %d calls, want %d (the two signed ones)", got, want)
	}
	if got := len(fb.served()); got != 0 {
		t.Errorf("replica B served %d replayed calls", got)
	}
}

// TestChangedPayloadRefused: a request changed after it was signed (by an
// interceptor after the signer, as someone on the hop would) is refused
// UNAUTHENTICATED naming the digest, unary and streaming.
func TestChangedPayloadRefused(t *testing.T) {
	key := testKey(1)
	lis := listen(t)
	addr := lis.Addr().String()
	_, f := serveOn(t, lis, ServerConfig{Self: addr, Key: key}.Options()...)
	tamperUnary := func(ctx context.Context, method string, _, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(ctx, method, &connectorv1.GetConnectorRequest{ConnectorId: "someone-elses"}, reply, cc, opts...)
	}
	tamperStream := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		return tampered{cs}, err
	}
	cc, err := Dial(addr, key, "sender", grpc.WithChainUnaryInterceptor(tamperUnary), grpc.WithChainStreamInterceptor(tamperStream))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := connectorv1.NewConnectorServiceClient(cc)
	_, err = client.GetConnector(ctx(t), &connectorv1.GetConnectorRequest{ConnectorId: "mine"})
	if st := status.Convert(err); st.Code() != codes.Unauthenticated || !strings.Contains(st.Message(), "digest") {
		t.Errorf("unary: %v, want UNAUTHENTICATED naming the digest", err)
	}
	stream, err := client.StreamCallTool(ctx(t), &connectorv1.StreamCallToolRequest{ConnectorId: "mine"})
	if err == nil {
		_, err = stream.Recv()
	}
	if st := status.Convert(err); st.Code() != codes.Unauthenticated || !strings.Contains(st.Message(), "digest") {
		t.Errorf("streaming: %v, want UNAUTHENTICATED naming the digest", err)
	}
	if got := f.served(); len(got) != 0 {
		t.Errorf("served %q changed calls", got)
	}
}

// tampered replaces the message a stream sends.
type tampered struct{ grpc.ClientStream }

func (s tampered) SendMsg(any) error {
	return s.ClientStream.SendMsg(&connectorv1.StreamCallToolRequest{ConnectorId: "someone-elses"})
}

// TestOldCallRefused: a call signed more than the skew ago is refused,
// and so is one signed before the receiving process started (a replay to
// a process restarted at the same address, whose nonces are new).
func TestOldCallRefused(t *testing.T) {
	key := testKey(1)
	lis := listen(t)
	addr := lis.Addr().String()
	_, f := serveOn(t, lis, ServerConfig{Self: addr, Key: key, Skew: time.Minute}.Options()...)
	for _, c := range []struct {
		age  time.Duration
		want string
	}{{2 * time.Minute, "timestamp"}, {10 * time.Second, "before this replica started"}} {
		_, err := plain(t, addr).GetConnector(withHeader(t, sign(key, getMethod, "a", addr, time.Now().Add(-c.age))), &connectorv1.GetConnectorRequest{})
		wantRefused(t, err, c.want, key, nil)
	}
	if got := f.served(); len(got) != 0 {
		t.Errorf("served %q", got)
	}
}

// TestNonceCacheBounded: a nonce is kept until its signature's window
// ends, and then forgotten; a full cache refuses rather than forgets.
func TestNonceCacheBounded(t *testing.T) {
	n := newNonces(2)
	t0 := time.Unix(1_000_000, 0)
	a, b, c := []byte("aaaaaaaaaaaaaaaa"), []byte("bbbbbbbbbbbbbbbb"), []byte("cccccccccccccccc")
	if err := n.use(a, t0.Add(30*time.Second), t0); err != nil {
		t.Fatal(err)
	}
	if err := n.use(a, t0.Add(30*time.Second), t0.Add(29*time.Second)); err != errReplayed {
		t.Errorf("second use within the window: %v, want errReplayed", err)
	}
	if err := n.use(b, t0.Add(40*time.Second), t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := n.use(c, t0.Add(40*time.Second), t0.Add(2*time.Second)); err != errTooMany {
		t.Errorf("third nonce in a cache of 2: %v, want errTooMany", err)
	}
	if err := n.use(c, t0.Add(70*time.Second), t0.Add(31*time.Second)); err != nil {
		t.Errorf("after a's window: %v, want room", err)
	}
	if got := n.len(); got != 2 {
		t.Errorf("kept %d nonces, want 2 (a forgotten)", got)
	}
}

// tlsFiles writes a certificate named cn issued by ca, its key and ca's
// certificate into dir, and returns the files (the CA as ClientCAFile).
func tlsFiles(t *testing.T, dir string, ca *tlsfilestest.CA, cn string) tlsfiles.Files {
	t.Helper()
	files := tlsfiles.Files{CertFile: filepath.Join(dir, cn+".pem"), KeyFile: filepath.Join(dir, cn+"-key.pem"),
		ClientCAFile: filepath.Join(dir, cn+"-ca.pem")}
	cert, key := ca.Issue(t, cn)
	tlsfilestest.WriteFile(t, files.KeyFile, key)
	tlsfilestest.WriteFile(t, files.CertFile, cert)
	tlsfilestest.WriteFile(t, files.ClientCAFile, ca.PEM)
	return files
}

func reloader(t *testing.T, files tlsfiles.Files) *tlsfiles.Reloader {
	t.Helper()
	r, err := tlsfiles.New(files, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestMutualTLS: over mutual TLS a pool whose certificate chains to the
// configured CA forwards; a client without a certificate, with another
// CA's, or in plaintext is refused; certificates and CAs renewed on disk
// are used by new connections on both sides without a restart.
func TestMutualTLS(t *testing.T) {
	key := testKey(1)
	dir := t.TempDir()
	ca := tlsfilestest.NewCA(t, "internal ca")
	serverFiles, clientFiles := tlsFiles(t, dir, ca, "server"), tlsFiles(t, dir, ca, "client")
	server := reloader(t, serverFiles)
	lis := listen(t)
	addr := lis.Addr().String()
	_, f := serveOn(t, lis, append(ServerConfig{Self: addr, Key: key}.Options(), grpc.Creds(credentials.NewTLS(server.ServerConfig())))...)

	call := func(p *Pool) error {
		t.Helper()
		p.Forget(addr) // a new connection: a new handshake
		cc, err := p.Conn(addr)
		if err != nil {
			t.Fatal(err)
		}
		_, err = connectorv1.NewConnectorServiceClient(cc).GetConnector(ctx(t), &connectorv1.GetConnectorRequest{})
		return err
	}
	pool := func(files tlsfiles.Files) *Pool {
		p, err := NewPool(key, "a")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		p.UseTLS(reloader(t, files).ClientConfig, "")
		return p
	}
	client := pool(clientFiles)
	if err := call(client); err != nil {
		t.Fatalf("a client with a certificate of the CA: %v", err)
	}

	other := tlsFiles(t, dir, tlsfilestest.NewCA(t, "other ca"), "stranger")
	tlsfilestest.WriteFile(t, other.ClientCAFile, ca.PEM) // it trusts the server, the server does not trust it
	refusedClients := map[string]grpc.DialOption{
		"plaintext":         grpc.WithTransportCredentials(insecure.NewCredentials()),
		"no certificate":    grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"})),
		"another CA's cert": grpc.WithTransportCredentials(credentials.NewTLS(reloader(t, other).ClientConfig("127.0.0.1"))),
	}
	for name, creds := range refusedClients {
		cc, err := Dial(addr, key, "a", creds)
		if err != nil {
			t.Fatal(err)
		}
		_, err = connectorv1.NewConnectorServiceClient(cc).GetConnector(ctx(t), &connectorv1.GetConnectorRequest{})
		cc.Close()
		if status.Code(err) != codes.Unavailable {
			t.Errorf("%s: %v, want UNAVAILABLE (no handshake)", name, err)
		}
	}

	// Renewal: a new CA, and certificates of it on both sides, written
	// over the files the running server and pool read.
	newCA := tlsfilestest.NewCA(t, "renewed ca")
	for _, files := range []tlsfiles.Files{serverFiles, clientFiles} {
		cert, k := newCA.Issue(t, "renewed")
		tlsfilestest.WriteFile(t, files.KeyFile, k)
		tlsfilestest.WriteFile(t, files.CertFile, cert)
		tlsfilestest.WriteFile(t, files.ClientCAFile, newCA.PEM)
	}
	if err := call(client); err != nil {
		t.Errorf("after renewal on disk: %v", err)
	}
	old := tlsFiles(t, t.TempDir(), ca, "old")
	if err := call(pool(old)); status.Code(err) != codes.Unavailable {
		t.Errorf("a client of the replaced CA after renewal: %v, want UNAVAILABLE", err)
	}
	if got := len(f.served()); got != 2 {
		t.Errorf("served %d calls, want 2", got)
	}
}

// BenchmarkSignAndCheck is the hop's added work per call, no network:
// the sender marshals and signs a request, the receiver digests its
// bytes, verifies the header and records the nonce.
func BenchmarkSignAndCheck(b *testing.B) {
	key := testKey(1)
	s := signer{key: key, from: "replica-a", to: "10.0.0.7:50052", now: time.Now}
	c := &checker{self: "10.0.0.7:50052", keys: [][]byte{key}, skew: DefaultSkew, now: time.Now,
		nonces: newNonces(0), codec: serverCodec{digests: &sync.Map{}}}
	req := &connectorv1.GetConnectorRequest{WorkspaceId: "workspace", ConnectorId: "connector-with-a-name"}
	b.ReportAllocs()
	for b.Loop() {
		ctx, body, err := s.outgoing(context.Background(), getMethod, req)
		if err != nil {
			b.Fatal(err)
		}
		md, _ := metadata.FromOutgoingContext(ctx)
		in := new(connectorv1.GetConnectorRequest)
		if err := c.codec.Unmarshal(body, in); err != nil {
			b.Fatal(err)
		}
		d, _ := c.codec.digestOf(in)
		if _, _, err := c.check(metadata.NewIncomingContext(context.Background(), md), getMethod, d[:]); err != nil {
			b.Fatal(err)
		}
	}
}
