package registry

import (
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/connector-svc/connector-svc/internal/egress"
	"github.com/connector-svc/connector-svc/internal/telemetry"
)

// pool is a connector's HTTP connection pool. Once closed it keeps no idle
// connection: a request that was still in flight when the connector closed
// (a call racing a shutdown, the session's own DELETE) would otherwise
// return its connection to the pool, where it and the server's end of it
// linger until the idle timeout.
type pool struct {
	base   *http.Transport
	closed atomic.Bool
}

// newPool returns a pool whose every connection goes to an address policy
// allows, checked on the address dialed after resolution: a connector whose
// DNS answer changes (rebinding) is refused at its next dial. It keeps up
// to maxIdle idle connections, so that concurrent callers up to somewhat
// fewer than that reuse theirs instead of opening new ones (see
// Config.MaxIdleConnsPerConnector; http.DefaultTransport keeps 2 per host,
// and 64 callers then open a connection for most calls). The client over
// it sends each request's trace context (traceparent).
func newPool(policy *egress.Policy, maxIdle int) (*pool, *http.Client) {
	base := http.DefaultTransport.(*http.Transport).Clone()
	base.DialContext = policy.DialContext(&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second})
	// A connector's server is one host (an SSE server's endpoint may name
	// another): the limit is per host, and the total does not cap it.
	base.MaxIdleConnsPerHost, base.MaxIdleConns = maxIdle, 0
	p := &pool{base: base}
	return p, &http.Client{Transport: telemetry.Traceparent(p)}
}

// RoundTrip implements http.RoundTripper.
func (p *pool) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := p.base.RoundTrip(req)
	if !p.closed.Load() {
		return resp, err
	}
	if err != nil {
		p.base.CloseIdleConnections()
		return resp, err
	}
	resp.Body = &closeThen{ReadCloser: resp.Body, then: p.base.CloseIdleConnections}
	return resp, nil
}

// close closes the idle connections now and every one that becomes idle
// later.
func (p *pool) close() {
	p.closed.Store(true)
	p.base.CloseIdleConnections()
}

// closeThen runs then after closing its body.
type closeThen struct {
	io.ReadCloser
	then func()
}

func (c *closeThen) Close() error {
	err := c.ReadCloser.Close()
	c.then()
	return err
}
