package main

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/connector-svc/connector-svc/internal/runs"
	"github.com/connector-svc/connector-svc/internal/store"
)

// leaderWork is the leader's jobs (leaderJobs) as one job of runJobs: the
// elector's OnLead hook (onLead) hands Run each term this replica leads,
// and Run runs the term's jobs (whileLeading) until the term ends or the
// service stops, whichever comes first. The elector waits for the hook,
// and so for the jobs, before it resigns.
type leaderWork struct {
	lead  func(ctx context.Context) // one term's jobs: whileLeading
	terms chan leaderTerm
}

// leaderTerm is one term: ctx ends when this replica stops leading; done
// is closed once the term's jobs have returned.
type leaderTerm struct {
	ctx  context.Context
	done chan struct{}
}

func newLeaderWork(lead func(ctx context.Context)) *leaderWork {
	return &leaderWork{lead: lead, terms: make(chan leaderTerm)}
}

// onLead is the elector's hook: it hands the term to Run and returns once
// the term's jobs have returned, or as soon as the term ends if Run does
// not take it (the service is stopping).
func (w *leaderWork) onLead(ctx context.Context) {
	t := leaderTerm{ctx: ctx, done: make(chan struct{})}
	select {
	case w.terms <- t:
		<-t.done
	case <-ctx.Done():
	}
}

// Run runs the jobs of each term the elector hands over until ctx is
// done; a term's jobs stop when it ends or ctx does. It returns nil.
func (w *leaderWork) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case t := <-w.terms:
			term, cancel := context.WithCancel(t.ctx)
			stop := context.AfterFunc(ctx, cancel)
			w.lead(term)
			stop()
			cancel()
			close(t.done)
		}
	}
}

// leaderJobs are what the leader alone runs, while it leads: the run
// sweep, deleting the rows of replicas dead for longer than a TTL, and
// forgetting the sessions of stopped replicas nobody took over within
// sessionIdle.
func (r *replica) leaderJobs(db *store.DB, sweeper *runs.Sweeper, sessionIdle time.Duration, logger *slog.Logger) []job {
	return []job{
		{"run sweeper", sweeper.Run},
		{"dead replicas and their sessions", func(ctx context.Context) error {
			tick := time.NewTicker(r.members.Config().TTL)
			defer tick.Stop()
			for {
				r.expire(ctx, db, sessionIdle, logger)
				select {
				case <-ctx.Done():
					return nil
				case <-tick.C:
				}
			}
		}},
	}
}

func (r *replica) expire(ctx context.Context, db *store.DB, sessionIdle time.Duration, logger *slog.Logger) {
	if n, err := r.members.ExpireDead(ctx); err != nil && ctx.Err() == nil {
		logger.WarnContext(ctx, "delete dead replicas", slog.String("error", err.Error()))
	} else if n > 0 {
		logger.InfoContext(ctx, "dead replicas deleted", slog.Int64("replicas", n))
	}
	if n, err := db.ExpireFreeSessions(ctx, sessionIdle); err != nil && ctx.Err() == nil {
		logger.WarnContext(ctx, "forget the sessions of stopped replicas", slog.String("error", err.Error()))
	} else if n > 0 {
		logger.InfoContext(ctx, "sessions of stopped replicas forgotten", slog.Int64("sessions", n))
	}
}

// whileLeading runs jobs for one term this replica leads (leaderWork.Run
// calls it with the term's context): they start when it gains the lease
// and stop when it loses it or the service stops (the elector waits for
// them before it resigns). A job that fails is logged and the others go
// on: the next term runs it again.
func whileLeading(self string, jobs []job, logger *slog.Logger) func(ctx context.Context) {
	return func(ctx context.Context) {
		logger.InfoContext(ctx, "leading: sweeping runs and dead replicas", slog.String("replica_id", self))
		var wg sync.WaitGroup
		for _, j := range jobs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := j.run(ctx); err != nil && !(ctx.Err() != nil && errors.Is(err, context.Canceled)) {
					logger.ErrorContext(ctx, "leader job failed until the next term", slog.String("job", j.name),
						slog.String("error", err.Error()))
				}
			}()
		}
		wg.Wait()
	}
}
