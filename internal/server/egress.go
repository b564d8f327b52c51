package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"github.com/connector-svc/connector-svc/internal/egress"
)

// egressLookupTimeout bounds the name lookup of a create or update.
const egressLookupTimeout = 5 * time.Second

// egressDeniedError is a connector URL the egress policy refuses.
type egressDeniedError struct{ err error }

func (e *egressDeniedError) Error() string { return e.err.Error() }
func (e *egressDeniedError) Unwrap() error { return e.err }

// checkEgress refuses an HTTP connector URL whose host is, or resolves to,
// an address the egress policy denies. A host that does not resolve now
// passes (its server may not exist yet): every dial is checked again, and
// a refused one shows in the connector's health. A URL that does not parse
// passes too, for validation to report.
func (s *Server) checkEgress(ctx context.Context, rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil || u.Hostname() == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, egressLookupTimeout)
	defer cancel()
	err = s.cfg.Egress.CheckHost(ctx, u.Hostname())
	var denied *egress.DeniedError
	switch {
	case errors.As(err, &denied):
		hint := ""
		if denied.Rule.Default {
			hint = "; an operator can open the range with EGRESS_ALLOW_CIDRS"
		}
		return &egressDeniedError{fmt.Errorf("connector.http.url: %w%s", err, hint)}
	case err != nil:
		s.logger.DebugContext(ctx, "egress check: the host does not resolve now; its dials will be checked",
			slog.String("host", u.Hostname()), slog.String("error", err.Error()))
	}
	return nil
}
