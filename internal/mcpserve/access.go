package mcpserve

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/connector-svc/connector-svc/internal/auth"
)

// Who may call an endpoint: with keys on (AUTH auto once a key exists,
// or keys), a key of the path's workspace as "Authorization: Bearer",
// with scope call for the tools and query for the agent tools; its user
// header only with scope users. Without keys (AUTH none, or auto before
// any key: loopback only, as the gRPC port), anyone, with every scope.

// caller is who a request comes from.
type caller struct {
	key    *auth.Key // nil: auth is off
	userID string    // the user header, when the key may name users
}

// allows reports whether the caller has scope s.
func (c caller) allows(s auth.Scope) bool { return c.key == nil || c.key.Allows(s) }

type callerKey struct{}

func withCaller(ctx context.Context, c caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

func callerFrom(ctx context.Context) caller {
	c, _ := ctx.Value(callerKey{}).(caller)
	return c
}

type access struct {
	keys    *auth.Keys
	mode    auth.Mode
	origins []string
	limit   rate.Limit
	burst   int

	mu       sync.Mutex
	limiters map[string]*keyLimiter // by key id
}

type keyLimiter struct {
	*rate.Limiter
	used time.Time
}

func newAccess(keys *auth.Keys, cfg Config) *access {
	a := &access{keys: keys, mode: cfg.Auth, origins: cfg.AllowedOrigins, limiters: map[string]*keyLimiter{}}
	if cfg.RateLimit > 0 {
		a.limit, a.burst = rate.Limit(cfg.RateLimit), max(cfg.Burst, 1)
	}
	return a
}

// denial is a refused request's HTTP answer.
type denial struct {
	status int
	// challenge is the WWW-Authenticate header of a 401.
	challenge  string
	msg        string
	retryAfter time.Duration
}

func (d *denial) write(w http.ResponseWriter) {
	if d.challenge != "" {
		w.Header().Set("WWW-Authenticate", d.challenge)
	}
	if d.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(d.retryAfter.Seconds()+0.999)))
	}
	code := -32600 // a request the endpoint will not serve as it is
	if d.status == http.StatusTooManyRequests || d.status == http.StatusServiceUnavailable {
		code = -32000 // the server's: try again after Retry-After
	}
	writeJSONRPCError(w, d.status, code, d.msg)
}

// enforcing reports whether requests need keys now.
func (a *access) enforcing() bool {
	switch a.mode {
	case auth.ModeKeys:
		return true
	case auth.ModeAuto:
		return a.keys != nil && a.keys.Exist()
	}
	return false
}

// check authenticates r for workspace ws.
func (a *access) check(r *http.Request, ws string) (caller, *denial) {
	user := strings.TrimSpace(r.Header.Get(UserHeader))
	if !a.enforcing() {
		return caller{userID: user}, nil
	}
	token, err := bearer(r)
	if err != nil {
		return caller{}, &denial{status: http.StatusUnauthorized, challenge: `Bearer realm="connector-svc"`, msg: err.Error()}
	}
	key, err := a.keys.Verify(r.Context(), token)
	switch {
	case errors.Is(err, auth.ErrUnknownKey):
		return caller{}, invalidToken("unknown API key")
	case errors.Is(err, auth.ErrRevoked):
		return caller{}, invalidToken(fmt.Sprintf("API key %s is revoked", key.ID))
	case err != nil:
		return caller{}, &denial{status: http.StatusServiceUnavailable, msg: "cannot check the API key now; retry", retryAfter: time.Second}
	}
	if key.WorkspaceID != ws {
		return caller{}, &denial{status: http.StatusForbidden,
			msg: fmt.Sprintf("API key %s is for workspace %q, not %q", key.ID, key.WorkspaceID, ws)}
	}
	if !key.Allows(auth.ScopeCall) {
		return caller{}, &denial{status: http.StatusForbidden, challenge: `Bearer realm="connector-svc", error="insufficient_scope", scope="call"`,
			msg: fmt.Sprintf("the MCP endpoint needs scope call (or query); API key %s has %s", key.ID, scopeList(key.Scopes))}
	}
	if user != "" && !key.Allows(auth.ScopeUsers) {
		return caller{}, &denial{status: http.StatusForbidden,
			msg: fmt.Sprintf("API key %s may not name users (%s needs scope users)", key.ID, UserHeader)}
	}
	if d := a.admit(key.ID); d != nil {
		return caller{}, d
	}
	return caller{key: &key, userID: user}, nil
}

func invalidToken(msg string) *denial {
	return &denial{status: http.StatusUnauthorized, msg: msg,
		challenge: `Bearer realm="connector-svc", error="invalid_token", error_description="` + msg + `"`}
}

// bearer returns the request's "Authorization: Bearer …" token.
func bearer(r *http.Request) (string, error) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return "", errors.New(`the MCP endpoint needs an API key: send "Authorization: Bearer <key>" ` +
			"(an operator creates keys with: connector-svc keys create --workspace <workspace> --scope call)")
	}
	scheme, token, _ := strings.Cut(h, " ")
	if !strings.EqualFold(scheme, "bearer") || strings.TrimSpace(token) == "" {
		return "", errors.New(`the Authorization header must be "Bearer <key>"`)
	}
	return strings.TrimSpace(token), nil
}

func scopeList(ss []auth.Scope) string {
	names := make([]string, len(ss))
	for i, s := range ss {
		names[i] = string(s)
	}
	return strings.Join(names, ", ")
}

// admit takes a token of key id's rate limit on this replica.
func (a *access) admit(id string) *denial {
	if a.limit == 0 {
		return nil
	}
	now := time.Now()
	a.mu.Lock()
	l, ok := a.limiters[id]
	if !ok {
		if len(a.limiters) > 10000 {
			a.sweepLocked(now)
		}
		l = &keyLimiter{Limiter: rate.NewLimiter(a.limit, a.burst)}
		a.limiters[id] = l
	}
	l.used = now
	a.mu.Unlock()
	r := l.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return &denial{status: http.StatusTooManyRequests, retryAfter: d,
			msg: fmt.Sprintf("API key %s is over the MCP endpoint's rate limit (%g requests per second, burst %d); retry after %s",
				id, float64(a.limit), a.burst, d.Round(time.Millisecond))}
	}
	return nil
}

// sweepLocked forgets limiters idle for a minute.
func (a *access) sweepLocked(now time.Time) {
	for id, l := range a.limiters {
		if now.Sub(l.used) > time.Minute {
			delete(a.limiters, id)
		}
	}
}

// originAllowed is the DNS-rebinding protection the spec asks of servers:
// a request a browser sends carries Origin, which must be the endpoint's
// own host (a local page of the same origin) or a configured one. A
// request without Origin comes from a program, not a page.
func (a *access) originAllowed(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	if slices.Contains(a.origins, "*") || slices.Contains(a.origins, origin) {
		return true
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false
	}
	return sameHost(u.Host, r.Host)
}

func sameHost(a, b string) bool {
	ha, pa, errA := net.SplitHostPort(a)
	hb, pb, errB := net.SplitHostPort(b)
	if errA != nil || errB != nil {
		return strings.EqualFold(a, b)
	}
	return strings.EqualFold(ha, hb) && pa == pb
}
