package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"

	"github.com/connector-svc/connector-svc/internal/forward"
	"github.com/connector-svc/connector-svc/internal/server"
	"github.com/connector-svc/connector-svc/internal/telemetry"
)

// job is one background part of the service: it runs until its context
// is done and returns nil then, or fails.
type job struct {
	name string
	run  func(ctx context.Context) error
}

// runJobs is where the service's background work starts and stops. Every
// job of every stage starts at once. The first stage runs until ctx is done
// or any job of any stage fails; each later stage runs on a context of its
// own, ended only once every job of the stage before it has returned: that
// is the stop order. A job's error is logged as it stops the service and
// returned, with the others, joined; none is dropped.
func runJobs(ctx context.Context, stages [][]job, logger *slog.Logger) error {
	first, stopAll := context.WithCancel(ctx)
	defer stopAll()
	ctxs := make([]context.Context, len(stages))
	cancels := make([]context.CancelFunc, len(stages))
	ctxs[0], cancels[0] = first, stopAll
	for i := 1; i < len(stages); i++ {
		ctxs[i], cancels[i] = context.WithCancel(context.WithoutCancel(ctx))
		defer cancels[i]()
	}
	var mu sync.Mutex
	var errs []error
	wgs := make([]sync.WaitGroup, len(stages))
	for i, stage := range stages {
		for _, j := range stage {
			wgs[i].Add(1)
			go func() {
				defer wgs[i].Done()
				err := j.run(ctxs[i])
				if err == nil || ctxs[i].Err() != nil && errors.Is(err, context.Canceled) {
					return
				}
				err = fmt.Errorf("%s: %w", j.name, err)
				logger.Error("stopping", slog.String("error", err.Error()))
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				stopAll()
			}()
		}
	}
	for i := range stages {
		wgs[i].Wait()
		if i+1 < len(stages) {
			cancels[i+1]()
		}
	}
	return errors.Join(errs...)
}

// stages are serve's jobs in their stop order: first what serves (gRPC
// draining its calls, the listeners, the cluster's parts and the leader's
// jobs); then what the last calls still used (the MCP connections) and
// what must be written after them (counters, run records); last the admin
// listener, so that /readyz says 503 and /metrics answers while gRPC
// drains.
func (s *parts) stages(g *grpc.Server, hs *health.Server, admin *adminJob) [][]job {
	cfg := s.cfg
	serving := []job{
		{"grpc", s.grpcJob(g, hs)},
		{"readiness", func(ctx context.Context) error {
			return s.obs.ready.Watch(ctx, func(up bool) { server.SetServing(hs, up) })
		}},
		{"listener", s.listener.Run},
		{"reconcile", s.lv.Run},
		{"membership", s.rep.members.Run},
		{"ownership", s.rep.owners.Run},
		{"leader election", s.rep.elector.Run},
		{"leader jobs", s.leader.Run},
	}
	if s.callbackLis != nil {
		cb := newCallbackServer(cfg.OAuth, s.oauth, s.logger)
		serving = append(serving, job{"oauth callback", func(ctx context.Context) error {
			return serveCallback(ctx, cfg.OAuth, s.callbackLis, cb, s.logger)
		}})
	}
	if s.mcp != nil {
		serving = append(serving, job{"mcp endpoint", s.mcp.run}, job{"mcp endpoint's tool lists", s.mcp.handler.Run})
	}
	if s.console != nil {
		serving = append(serving, job{"console", s.console.run})
	}
	if s.rep.internal != nil {
		internal := server.NewInternalGRPCServer(s.srv, slices.Concat(connOptions(cfg.Conn, false), internalServerCreds(s.rep.tls),
			forward.ServerConfig{Self: s.rep.members.Config().Addr, Key: s.rep.key, Older: s.rep.older}.Options())...)
		serving = append(serving, job{"internal listener", func(ctx context.Context) error {
			return serveGRPC(ctx, internal, s.rep.internal, func() {
				s.srv.StopWatches() // watches relayed to other replicas: their callers watch again elsewhere
				stopGracefully(internal, cfg.ShutdownGrace)
			})
		}})
	}
	liveStopped := make(chan struct{})
	drained := []job{
		// The registry stops once the runs still going on here without
		// their callers have failed: their tool calls' connections close
		// with it.
		{"registry", func(ctx context.Context) error {
			regCtx, stopRegistry := context.WithCancel(context.WithoutCancel(ctx))
			defer stopRegistry()
			go func() {
				<-ctx.Done()
				s.srv.StopLiveRuns(cfg.ShutdownGrace)
				close(liveStopped)
				stopRegistry()
			}()
			return s.reg.Run(regCtx)
		}},
		// The last write of the records waits for those runs: their failure
		// is part of the drain, committed before the process exits.
		{"counters and run records", func(ctx context.Context) error {
			recCtx, stopRecords := context.WithCancel(context.WithoutCancel(ctx))
			defer stopRecords()
			go func() {
				<-ctx.Done()
				<-liveStopped
				stopRecords()
			}()
			return s.srv.Run(recCtx, cfg.ShutdownGrace)
		}},
	}
	var last []job
	if admin != nil {
		last = append(last, job{"admin listener", admin.run})
	}
	return [][]job{serving, drained, last}
}

// grpcJob serves the public gRPC server until ctx is done, then reports
// NOT_SERVING, waits SHUTDOWN_DELAY (balancers that read health or /readyz
// stop sending calls meanwhile; those still sent are served) and drains.
func (s *parts) grpcJob(g *grpc.Server, hs *health.Server) func(context.Context) error {
	cfg := s.cfg
	return func(ctx context.Context) error {
		return serveGRPC(ctx, g, s.lis, func() {
			s.obs.ready.SetStarted(false)
			hs.Shutdown() // NOT_SERVING from now on, whatever the watcher says
			s.logger.Info("shutting down", slog.String("delay", cfg.Conn.ShutdownDelay.String()),
				slog.String("grace", cfg.ShutdownGrace.String()))
			time.Sleep(cfg.Conn.ShutdownDelay)
			s.srv.StopWatches() // open-ended streams: their callers watch again, through another replica
			stopGracefully(g, cfg.ShutdownGrace)
		})
	}
}

// serveGRPC serves g on lis until ctx is done, then runs drain (which
// stops g) and returns once it has.
func serveGRPC(ctx context.Context, g *grpc.Server, lis net.Listener, drain func()) error {
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		<-ctx.Done()
		drain()
	}()
	if err := g.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	<-drained // Serve returns when the drain starts
	return nil
}

// adminJob is the admin listener's job; closeUnlessRun closes its
// listener when serve fails before runJobs.
type adminJob struct {
	admin *telemetry.Admin
	ran   bool
}

func (a *adminJob) run(ctx context.Context) error {
	a.ran = true
	return a.admin.Run(ctx)
}

// closeUnlessRun frees the admin address when the job never ran: Run on
// a done context shuts the server down, closing its listener.
func (a *adminJob) closeUnlessRun() {
	if a == nil || a.ran {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = a.admin.Run(ctx)
}
