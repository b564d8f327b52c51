package registry

// Server requests on the legacy SSE transport: the session's event stream
// is read by ssereq first, which answers them; here its hooks log, count
// and bound that work by the registry's life.

import (
	"context"
	"log/slog"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/connector-svc/connector-svc/internal/registry/ssereq"
)

// sseRequests returns the answerer of spec's SSE session, whose POSTs go
// through base; nil for other transports.
func (c *conn) sseRequests(spec Spec, base http.RoundTripper) *ssereq.Requests {
	if spec.Transport != TransportSSE {
		return nil
	}
	return ssereq.New(spec.URL, spec.Headers, base, ssereq.Hooks{
		Refused: func(method string) {
			c.reg.logger.Warn("the server asked for "+method+", which the SSE transport cannot carry; answered with an error",
				append(c.logAttrs(), slog.String("method", method))...)
			c.reg.metrics.refused(c, method)
		},
		Go: c.reg.goLive,
		Failed: func(err error) {
			c.reg.logger.Debug("answering the server's request over SSE failed",
				append(c.logAttrs(), slog.String("error", c.redact.err(err).Error()))...)
		},
	})
}

// goLive runs f as background work Run waits for, with the registry's
// life; false, and f not run, once shutdown has begun.
func (r *Registry) goLive(f func(life context.Context)) bool {
	if !r.enter() {
		return false
	}
	go func() {
		defer r.bg.Done()
		f(r.life)
	}()
	return true
}

// refused counts a server request answered with an error because the
// transport cannot carry it.
func (x *metrics) refused(c *conn, method string) {
	x.serverRefused.Add(context.Background(), 1, metric.WithAttributeSet(labels(c.spec, attribute.String("method", method))))
}
