package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"
)

// AdminConfig is what the admin listener serves.
type AdminConfig struct {
	// Addr is host:port to listen on.
	Addr string
	// Metrics is served at /metrics; nil answers 404.
	Metrics http.Handler
	// Ready answers /readyz; nil means always ready.
	Ready *Readiness
	// Pprof serves net/http/pprof under /debug/pprof/.
	Pprof bool
}

// Admin is the admin HTTP listener: /healthz, /readyz, /metrics and,
// when switched on, /debug/pprof/. It authenticates nobody: keep it on
// loopback or a network only operators reach.
type Admin struct {
	lis    net.Listener
	srv    *http.Server
	logger *slog.Logger
}

// ListenAdmin binds cfg.Addr; Run serves on it.
func ListenAdmin(cfg AdminConfig, logger *slog.Logger) (*Admin, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	lis, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("listen on ADMIN_ADDR %s: %w", cfg.Addr, err)
	}
	srv := &http.Server{Handler: AdminHandler(cfg), ReadHeaderTimeout: 10 * time.Second}
	return &Admin{lis: lis, srv: srv, logger: logger}, nil
}

// Addr is the address the listener is bound to.
func (a *Admin) Addr() string { return a.lis.Addr().String() }

// Run serves until ctx is done, then lets requests in flight finish for up
// to 5s (a CPU profile runs longer: it is cut, with a warning) and returns
// nil.
func (a *Admin) Run(ctx context.Context) error {
	served := make(chan error, 1)
	go func() { served <- a.srv.Serve(a.lis) }()
	select {
	case err := <-served:
		return fmt.Errorf("admin listener: %w", err)
	case <-ctx.Done():
	}
	stop, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := a.srv.Shutdown(stop); err != nil {
		a.logger.Warn("admin listener: requests still in flight were cut at shutdown", slog.String("error", err.Error()))
		_ = a.srv.Close()
	}
	<-served
	return nil
}

// AdminHandler routes the admin endpoints of cfg.
func AdminHandler(cfg AdminConfig) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := cfg.Ready.Check(r.Context()); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	if cfg.Metrics != nil {
		mux.Handle("GET /metrics", cfg.Metrics)
	}
	if cfg.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// Pinger is what readiness pings: the database.
type Pinger interface {
	Ping(ctx context.Context) error
}

// ReadinessConfig tunes Readiness; zero fields take the defaults.
type ReadinessConfig struct {
	Interval time.Duration // between the watcher's pings; 2s
	Timeout  time.Duration // bound on one ping; 1s
	MaxAge   time.Duration // a /readyz reuses a ping this recent; 1s
}

// ErrNotStarted means the service has not loaded its connectors yet, or
// is stopping.
var ErrNotStarted = errors.New("the service is starting or stopping")

// Readiness says whether the service can take traffic: Postgres answers a
// ping, and the service has started (its connectors are loaded) and is
// not stopping. Safe for concurrent use.
type Readiness struct {
	db     Pinger
	cfg    ReadinessConfig
	logger *slog.Logger

	started atomic.Bool
	flight  singleflight.Group

	mu     sync.Mutex // guards the last ping; never held across one
	pinged time.Time
	err    error
}

// NewReadiness returns a Readiness that pings db; not started yet.
func NewReadiness(db Pinger, cfg ReadinessConfig, logger *slog.Logger) *Readiness {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.Interval, 2*time.Second)
	def(&cfg.Timeout, time.Second)
	def(&cfg.MaxAge, time.Second)
	return &Readiness{db: db, cfg: cfg, logger: logger}
}

// SetStarted says the service has loaded its connectors and serves
// (true), or has begun to stop (false).
func (r *Readiness) SetStarted(v bool) { r.started.Store(v) }

// Check returns nil when the service is ready, else why not: ErrNotStarted,
// or the ping's error. A ping younger than MaxAge is reused; concurrent
// checks share one ping. A nil Readiness is always ready.
func (r *Readiness) Check(ctx context.Context) error {
	if r == nil {
		return nil
	}
	if !r.started.Load() {
		return ErrNotStarted
	}
	return r.ping(ctx, r.cfg.MaxAge)
}

// ping returns the result of a ping younger than maxAge, or pings now.
func (r *Readiness) ping(ctx context.Context, maxAge time.Duration) error {
	r.mu.Lock()
	fresh, err := time.Since(r.pinged) < maxAge, r.err
	r.mu.Unlock()
	if fresh {
		return err
	}
	ch := r.flight.DoChan("ping", func() (any, error) {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.Timeout)
		defer cancel()
		err := r.db.Ping(pctx)
		if err != nil {
			err = fmt.Errorf("postgres: %w", err)
		}
		r.mu.Lock()
		r.pinged, r.err = time.Now(), err
		r.mu.Unlock()
		return nil, err
	})
	select {
	case res := <-ch:
		return res.Err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Watch pings Postgres every Interval until ctx is done, and calls
// onChange(false) when it stops answering and onChange(true) when it
// answers again. It assumes Postgres answers at first (start-up has just
// used it). It returns nil when ctx is done.
func (r *Readiness) Watch(ctx context.Context, onChange func(reachable bool)) error {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	up := true
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		err := r.ping(ctx, 0)
		if ctx.Err() != nil {
			return nil
		}
		if (err == nil) == up {
			continue
		}
		up = err == nil
		if up {
			r.logger.InfoContext(ctx, "postgres answers again: serving")
		} else {
			r.logger.WarnContext(ctx, "postgres does not answer: gRPC health NOT_SERVING, /readyz 503", slog.String("error", err.Error()))
		}
		onChange(up)
	}
}
