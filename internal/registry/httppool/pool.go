// Package httppool holds the HTTP side of SSE and streamable-HTTP
// connectors: the transports the connectors of one origin share (every
// connection dialed through the egress policy), each connector's pool over
// them with the limit on what a response may carry (package msglimit), and
// each session's own client, which ends the session (its DELETE) as the
// session's state says. It knows nothing of MCP sessions or connectors
// beyond a URL.
package httppool

import (
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/connector-svc/connector-svc/internal/egress"
	"github.com/connector-svc/connector-svc/internal/registry/msglimit"
	"github.com/connector-svc/connector-svc/internal/telemetry"
)

// transportsPerOrigin is how many HTTP transports the connectors of one
// origin share, so that the callers of a busy server do not all wait on one
// transport's lock over its idle connections. Each connector has a home
// transport among them: its requests go there, one after another, over one
// connection, and spread over the others only while another of its
// requests is under way (those arrive at the server side by side anyway).
// Spread always, a session's sequential requests would arrive on different
// connections, each before the server has finished the last, and mcp-go's
// stateful streamable-HTTP server (v1.2.1) then loses or misroutes the
// session's notifications (progress), which it queues on one channel that
// every request of the session reads (mark3labs/mcp-go#969).
const transportsPerOrigin = 4

// Transports are the HTTP transports of the registry's connectors, shared
// by origin. An idle connector's cost is mostly its idle connection and its
// transport; connectors that reach the same origin (scheme, host and port)
// share a set of transports, and so their idle connections, instead. Every
// connector's connections are checked by the same egress policy and use
// the same TLS settings (the system's roots), so the origin is the whole
// key. Requests are not multiplexed (HTTP/1.1): a connection carries one
// request at a time, so one connector's slow call never holds up another's.
type Transports struct {
	policy  *egress.Policy
	maxIdle int
	own     bool // each connector its own transport, as before sharing (to compare)

	mu   sync.Mutex
	sets map[string]*transportSet
}

// New returns the transports of connectors whose connections policy
// checks, each keeping up to maxIdle idle connections; own gives each
// connector a transport of its own, as before they were shared (to
// compare).
func New(policy *egress.Policy, maxIdle int, own bool) *Transports {
	return &Transports{policy: policy, maxIdle: maxIdle, own: own, sets: map[string]*transportSet{}}
}

// transportSet is the transports of one origin and how many connectors use
// them.
type transportSet struct {
	key   string
	all   []*http.Transport
	next  atomic.Uint32
	users int         // guarded by Transports.mu
	done  atomic.Bool // its last user has gone
}

// acquire returns the transports for rawURL's origin, counting one more
// user; release hands them back.
func (t *Transports) acquire(rawURL string) *transportSet {
	if t.own {
		return &transportSet{all: []*http.Transport{t.newTransport()}, users: 1}
	}
	key := origin(rawURL)
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.sets[key]
	if s == nil {
		s = &transportSet{key: key, all: make([]*http.Transport, transportsPerOrigin)}
		for i := range s.all {
			s.all[i] = t.newTransport()
		}
		t.sets[key] = s
	}
	s.users++
	return s
}

// release counts one user less; the last one closes the idle connections.
func (t *Transports) release(s *transportSet) {
	if !t.own {
		t.mu.Lock()
		s.users--
		last := s.users == 0
		if last {
			delete(t.sets, s.key)
		}
		t.mu.Unlock()
		if !last {
			return
		}
	}
	s.done.Store(true)
	s.closeIdle()
}

// newTransport returns a transport whose every connection goes to an
// address the policy allows, checked on the address dialed after
// resolution: a connector whose DNS answer changes (rebinding) is refused
// at its next dial. It keeps up to maxIdle idle connections per host, so
// that concurrent callers up to somewhat fewer than that reuse theirs
// instead of opening new ones (see Config.MaxIdleConnsPerConnector;
// http.DefaultTransport keeps 2 per host, and 64 callers then open a
// connection for most calls). Idle connections exist only as many as
// calls ran at once, so a set shared by thousands of idle connectors
// holds a few, not one each.
func (t *Transports) newTransport() *http.Transport {
	base := http.DefaultTransport.(*http.Transport).Clone()
	base.DialContext = t.policy.DialContext(&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second})
	// A connector's server is one host (an SSE server's endpoint may name
	// another): the limit is per host, and the total does not cap it.
	base.MaxIdleConnsPerHost, base.MaxIdleConns = t.maxIdle, 0
	return base
}

// origin is the scheme, host and port of rawURL, the port made explicit.
func origin(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return rawURL
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	return u.Scheme + "://" + net.JoinHostPort(u.Hostname(), port)
}

func (s *transportSet) pick() *http.Transport {
	if len(s.all) == 1 {
		return s.all[0]
	}
	return s.all[int(s.next.Add(1))%len(s.all)]
}

func (s *transportSet) closeIdle() {
	for _, tr := range s.all {
		tr.CloseIdleConnections()
	}
}

// Pool is a connector's HTTP client side: its share of its origin's
// transports, and what stays its own: the limit on what a response may
// carry and its closing. Once closed it keeps no idle connection of a set
// nobody uses any more: a request that was still in flight when the
// connector closed (a call racing a shutdown, the session's own DELETE)
// would otherwise return its connection to the pool, where it and the
// server's end of it linger until the idle timeout.
type Pool struct {
	reg    *Transports
	set    *transportSet
	home   *http.Transport // the one of set this connector uses first
	busy   atomic.Int32    // requests under way, but for GET streams
	closed atomic.Bool
	// maxMessage bounds each message a response carries (see package msglimit).
	maxMessage int
}

// NewPool returns the pool of a connector of rawURL. The client over it
// sends each request's trace context (traceparent). A response's messages
// are limited to maxMessage bytes each.
func NewPool(t *Transports, rawURL string, maxMessage int) (*Pool, *http.Client) {
	set := t.acquire(rawURL)
	p := &Pool{reg: t, set: set, home: set.pick(), maxMessage: maxMessage}
	return p, &http.Client{Transport: telemetry.Traceparent(p)}
}

// RoundTrip implements http.RoundTripper.
func (p *Pool) RoundTrip(req *http.Request) (*http.Response, error) {
	tr, counted := p.home, req.Method != http.MethodGet // a GET is a stream that stays open
	if counted && p.busy.Add(1) > 1 {
		tr = p.set.pick()
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		p.done(tr, counted)
		return resp, err
	}
	resp.Body = &pooledBody{ReadCloser: p.limit(resp), p: p, tr: tr, counted: counted}
	return resp, nil
}

// done ends a request of the pool made over tr: it is no longer under way,
// and the last connector of tr's origin keeps no connection idle.
func (p *Pool) done(tr *http.Transport, counted bool) {
	if counted {
		p.busy.Add(-1)
	}
	if p.set.done.Load() {
		tr.CloseIdleConnections()
	}
}

// pooledBody ends its request (Pool.done) when it is first closed.
type pooledBody struct {
	io.ReadCloser
	p       *Pool
	tr      *http.Transport
	counted bool
	closed  atomic.Bool
}

func (b *pooledBody) Close() error {
	err := b.ReadCloser.Close()
	if b.closed.CompareAndSwap(false, true) {
		b.p.done(b.tr, b.counted)
	}
	return err
}

// limit bounds what resp's body may carry: an event stream, each event;
// any other body (one JSON message), the whole.
func (p *Pool) limit(resp *http.Response) io.ReadCloser {
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "text/event-stream" {
		return msglimit.NewMessages(resp.Body, p.maxMessage, true)
	}
	return msglimit.NewBody(resp.Body, p.maxMessage)
}

// Close hands the connector's share of its transports back: the last
// connector of an origin closes the idle connections now and every one
// that becomes idle later. Safe to call more than once.
func (p *Pool) Close() {
	if p.closed.CompareAndSwap(false, true) {
		p.reg.release(p.set)
	}
}
