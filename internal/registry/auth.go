package registry

// OAuth connectors. The registry knows no OAuth: Config.Authorize wraps
// the HTTP transport of a connection with whatever puts a token on its
// requests. A client credentials connector's own connection (and its
// per-session ones) goes through it with no user. An oauth_user
// connector's calls run on a connection per end user, kept by the
// per-session machinery under the session id UserSession(user), each with
// an HTTP client of its own over the connector's pooled transport, so a
// user's token only ever goes with that user's requests. Its connector
// level connection has no user: it opens no MCP session, its health is an
// unauthenticated probe, and its catalog is what the users' connections
// list.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/registry/oauthtransport"
)

// Auth modes a Spec may name.
const (
	// AuthNone connectors send their static headers only.
	AuthNone = "none"
	// AuthClientCredentials connectors have one machine identity: every
	// request of theirs goes through Config.Authorize with no user.
	AuthClientCredentials = "oauth_client_credentials"
	// AuthUser connectors run each end user's calls on a connection of
	// that user's own (see UserSession), through Config.Authorize with
	// that user.
	AuthUser = "oauth_user"
)

// userPrefix starts the session id of an end user's connection.
const userPrefix = "user:"

// UserSession is the session id under which user's own connection to an
// AuthUser connector is kept, listed (ListSessions), routed among
// replicas and closed (CloseSession).
func UserSession(user string) string { return userPrefix + user }

// SessionUser is the user whose connection sessionID is, if it is one
// (UserSession).
func SessionUser(sessionID string) (string, bool) {
	user, ok := strings.CutPrefix(sessionID, userPrefix)
	return user, ok && user != ""
}

// ErrUserRequired means an oauth_user connector was called without a user.
var ErrUserRequired = errors.New("the connector is oauth_user: a user_id is required")

// ErrNoUserConnection means an oauth_user connector's tools cannot be
// listed now: no user's connection is open to list them over.
var ErrNoUserConnection = errors.New("the connector is oauth_user and no user's connection is open to list its tools " +
	"over; its catalog is refreshed when a user's connection opens (a call or query with a user_id)")

// AuthError is an error of the authorizing transport itself (no token
// for the user, a refresh refused, the authorization server down), not of
// the connection under it (see oauthtransport.AuthError).
type AuthError = oauthtransport.AuthError

// IsAuthError reports whether err is, or wraps, an AuthError.
func IsAuthError(err error) bool { return oauthtransport.IsAuthError(err) }

// authorizedClient is an HTTP client over c's pool whose requests go
// through Config.Authorize as user ("" for the connector's own identity).
func (c *conn) authorizedClient(user string) *http.Client {
	var authorize func(http.RoundTripper) http.RoundTripper
	if fn := c.reg.cfg.Authorize; fn != nil {
		authorize = func(base http.RoundTripper) http.RoundTripper { return fn(base, c.spec, user) }
	}
	return oauthtransport.Client(c.pool, authorize)
}

// user is the end user a session connection of an oauth_user connector
// serves.
func (sc *sessConn) user() string {
	u, _ := strings.CutPrefix(sc.id, userPrefix)
	return u
}

// client is the HTTP client of the session's connection: the connector's,
// or for an oauth_user connector one of the user's own, made once.
func (sc *sessConn) client() *http.Client {
	c := sc.parent
	if !c.spec.perUser() {
		return c.hc
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.hc == nil {
		sc.hc = c.authorizedClient(sc.user())
	}
	return sc.hc
}

// probe asks an oauth_user connector's server, without a token, whether
// it is there (see oauthtransport.Probe), and ends the MCP session a
// server that wants no token opened for it.
func (c *conn) probe(ctx context.Context) error {
	init := initializeRequest()
	id, err := oauthtransport.Probe(ctx, c.hc, oauthtransport.Target{URL: c.spec.URL, Headers: c.spec.Headers,
		SSE: c.spec.Transport == TransportSSE, Client: init.Params.ClientInfo})
	if id != "" {
		c.endProbeSession(id)
	}
	return err
}

// endProbeSession ends the MCP session a server that wants no token
// opened for a probe, in the background.
func (c *conn) endProbeSession(id string) {
	if !c.reg.enter() {
		return
	}
	go func() {
		defer c.reg.bg.Done()
		ctx, cancel := context.WithTimeout(c.reg.life, 5*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodDelete, c.spec.URL, nil)
		if err != nil {
			return
		}
		req.Header.Set("Mcp-Session-Id", id)
		if resp, err := c.hc.Do(req); err == nil {
			_ = resp.Body.Close()
		}
	}()
}

// connectProbe is connect for an oauth_user connector: it probes the
// server, and a server that answers as one wanting OAuth (or wanting
// nothing) is READY. Its catalog stays what the users' connections
// listed.
func (c *conn) connectProbe(ctx context.Context, replacing *session) error {
	start := time.Now()
	if err := c.probe(ctx); err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("%w within the connect timeout (%s): %w", errNoAnswer, c.spec.ConnectTimeout, err)
		}
		err = c.redact.err(err)
		c.fail(err, replacing)
		return err
	}
	c.mu.Lock()
	if c.closed {
		closedErr := c.closedErr
		c.mu.Unlock()
		return closedErr
	}
	reconnect := c.gen > 0
	c.gen, c.failures, c.silent, c.lostAt = c.gen+1, 0, false, time.Time{}
	c.health = Health{State: StateReady, Latency: time.Since(start), CheckedAt: time.Now(), ProtocolVersion: c.health.ProtocolVersion}
	c.scheduleCheck()
	h := c.health
	c.mu.Unlock()
	if reconnect {
		c.usage.reconnects.Add(1)
		c.reg.metrics.count(c.reg.metrics.reconnects, c)
	}
	c.reg.logger.Info("connector reachable; its users' connections open on their calls", append(c.logAttrs(),
		slog.String("latency", h.Latency.String()))...)
	c.saveHealth(h)
	return nil
}

// checkProbe is check for an oauth_user connector: the probe again, or a
// connect while it is down.
func (c *conn) checkProbe() Health {
	c.mu.Lock()
	down, gen := c.down(), c.gen
	c.mu.Unlock()
	if down {
		_ = c.connectShared(c.reg.life)
		return c.snapshot()
	}
	ctx, cancel := context.WithTimeout(c.reg.life, c.reg.cfg.HealthTimeout)
	defer cancel()
	start := time.Now()
	err := c.probe(ctx)
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		err = fmt.Errorf("%w within %s: %w", errNoAnswer, c.reg.cfg.HealthTimeout, err)
	}
	c.mu.Lock()
	if c.gen != gen || c.closed {
		h := c.health
		c.mu.Unlock()
		return h
	}
	if err != nil {
		c.failures++
		c.setDown(c.redact.err(err))
		c.nextTry = time.Now().Add(c.reg.backoff(c.failures))
		c.arm()
	} else {
		c.failures = 0
		c.health = Health{State: StateReady, Latency: time.Since(start), CheckedAt: time.Now(), ProtocolVersion: c.health.ProtocolVersion}
		c.scheduleCheck()
	}
	h := c.health
	c.mu.Unlock()
	if err != nil {
		c.reg.logger.Warn("connector probe failed", append(c.logAttrs(), slog.String("state", string(h.State)),
			slog.String("error", h.LastError))...)
	}
	c.saveHealth(h)
	return h
}

// takeListed gives an oauth_user connector the catalog a user's
// connection just listed: synced to the source as the owner's checks
// sync (written only if it changed), read with the source's flags on a
// follower.
func (c *conn) takeListed(ctx context.Context, tools []mcp.Tool) {
	seq := c.syncSeq.Add(1)
	cat, _, err := c.syncCatalog(ctx, tools, false)
	if err != nil {
		c.reg.logger.Error("sync tools listed by a user's connection", append(c.logAttrs(), slog.String("error", err.Error()))...)
	}
	c.mu.Lock()
	c.publishCatalog(cat, seq)
	c.mu.Unlock()
}

// catalogNow is the connector's current catalog; nil before any listing.
func (c *conn) catalogNow() *catalog {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.cat
}

// anyUserSession returns a live user connection of the connector, counted
// as a call (release it), or nil if none is open.
func (c *conn) anyUserSession() *session {
	c.mu.Lock()
	scs := make([]*sessConn, 0, len(c.sessions))
	for _, sc := range c.sessions {
		scs = append(scs, sc)
	}
	c.mu.Unlock()
	for _, sc := range scs {
		sc.mu.Lock()
		s := sc.sess
		sc.mu.Unlock()
		if s != nil && s.acquire() {
			return s
		}
	}
	return nil
}

// forgetUnopened removes sc, which never got a connection (its user has
// no usable token), when no other call uses it: a user who cannot
// authorize holds no place under MaxSessions. Config.OnSessionClosed
// hears of it, as of any session that ends.
func (c *conn) forgetUnopened(sc *sessConn) {
	c.mu.Lock()
	sc.mu.Lock()
	gone := c.sessions[sc.id] == sc && sc.sess == nil && sc.adopt == nil && !sc.had && sc.inUse.Load() == 0
	if gone {
		delete(c.sessions, sc.id)
		sc.closed = true
	}
	sc.mu.Unlock()
	c.mu.Unlock()
	if gone {
		if fn := c.reg.cfg.OnSessionClosed; fn != nil {
			fn(c.spec.ID, sc.id)
		}
	}
}

// CatalogFor is Catalog for a call as user: an oauth_user connector whose
// users' connections have listed no tools yet opens user's connection
// first, which lists them (an *AuthError if user has no usable token).
// Other connectors ignore user.
func (r *Registry) CatalogFor(ctx context.Context, id int64, user string) (Catalog, error) {
	c, err := r.get(id)
	if err != nil {
		return Catalog{}, err
	}
	if !c.spec.perUser() {
		return r.Catalog(ctx, id)
	}
	if user == "" {
		return Catalog{}, ErrUserRequired
	}
	if _, _, _, err := c.ready(ctx); err != nil {
		return Catalog{}, err
	}
	if c.catalogNow() == nil {
		if _, err := c.openUserFirst(ctx, UserSession(user)); err != nil {
			return Catalog{}, c.redact.err(err)
		}
	}
	return r.Catalog(ctx, id)
}

// openUserFirst opens the connection of caller session key (a user's) of
// an oauth_user connector whose catalog is empty, which lists the tools,
// and returns the catalog.
func (c *conn) openUserFirst(ctx context.Context, key string) (*catalog, error) {
	sc, err := c.sessionFor(key)
	if err != nil {
		return nil, err
	}
	_, err = sc.current(ctx)
	sc.done()
	if err != nil {
		if IsAuthError(err) {
			c.forgetUnopened(sc)
		}
		return nil, err
	}
	cat := c.catalogNow()
	if cat == nil {
		return nil, retryNext(errors.New("the user's connection listed no tools"))
	}
	return cat, nil
}

// listForCatalog lists the tools over s, a user's connection just opened
// or adopted, and gives them to the connector's catalog (takeListed). A
// tools/list_changed on it re-lists.
func (c *conn) listForCatalog(ctx context.Context, s *session) error {
	list, err := s.client.ListTools(ctx, mcp.ListToolsRequest{})
	if err != nil {
		return fmt.Errorf("tools/list: %w", err)
	}
	s.client.OnNotification(func(n mcp.JSONRPCNotification) {
		if n.Method == string(mcp.MethodNotificationToolsListChanged) {
			c.reg.refreshLater(c)
		}
	})
	c.takeListed(ctx, list.Tools)
	return nil
}
