package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"golang.org/x/sync/errgroup"
)

// job is one background part of the service: it runs until its context
// is done and returns nil then, or fails.
type job struct {
	name string
	run  func(ctx context.Context) error
}

// runJobs is where the service's background work starts and stops. The
// serving jobs (the gRPC server, the listener, the reconcile loop, the
// cluster's membership, ...) run until ctx is done or one of them fails;
// then they all stop, the gRPC server draining its calls. The drained jobs
// run meanwhile on a context of their own and stop only after that: what
// the last calls still use (the MCP connections) and what must be written
// after them (counters, run records).
func runJobs(ctx context.Context, serving, drained []job, logger *slog.Logger) error {
	after, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	var wg sync.WaitGroup
	errs := make([]error, len(drained))
	for i, j := range drained {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := j.run(after); err != nil {
				errs[i] = fmt.Errorf("%s: %w", j.name, err)
			}
		}()
	}
	eg, ctx := errgroup.WithContext(ctx)
	for _, j := range serving {
		eg.Go(func() error {
			if err := j.run(ctx); err != nil && !(ctx.Err() != nil && errors.Is(err, context.Canceled)) {
				return fmt.Errorf("%s: %w", j.name, err)
			}
			return nil
		})
	}
	err := eg.Wait()
	stop()
	wg.Wait()
	for _, e := range errs {
		if e != nil {
			logger.Error("stopping", slog.String("error", e.Error()))
		}
	}
	return errors.Join(append([]error{err}, errs...)...)
}
