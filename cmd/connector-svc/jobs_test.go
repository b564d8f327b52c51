package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// A leader job's error (the run sweeper's, say) is logged, naming the
// job, and does not stop the others.
func TestWhileLeadingLogsAJobsError(t *testing.T) {
	var out bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&syncWriter{w: &out}, nil))
	ctx, cancel := context.WithCancel(context.Background())
	failed := make(chan struct{})
	hook := whileLeading("r1", []job{
		{"run sweeper", func(context.Context) error { defer close(failed); return errors.New("sweep went wrong") }},
		{"dead replicas", func(ctx context.Context) error { <-ctx.Done(); return nil }},
	}, logger)
	done := make(chan struct{})
	go func() { hook(ctx); close(done) }()
	<-failed
	select {
	case <-done:
		t.Fatal("the hook returned when one job failed; want the others to go on while leading")
	case <-time.After(50 * time.Millisecond):
	}
	cancel()
	<-done
	if s := out.String(); !strings.Contains(s, "leader job failed") || !strings.Contains(s, "run sweeper") || !strings.Contains(s, "sweep went wrong") {
		t.Errorf("log %q; want the sweeper's error logged with its name", s)
	}
}

// runJobs stops its stages in order, and a failing job of a later stage
// stops the service and has its error returned.
func TestRunJobsStopOrderAndErrors(t *testing.T) {
	var mu sync.Mutex
	var stopped []string
	wait := func(name string) job {
		return job{name, func(ctx context.Context) error {
			<-ctx.Done()
			time.Sleep(10 * time.Millisecond)
			mu.Lock()
			stopped = append(stopped, name)
			mu.Unlock()
			return nil
		}}
	}
	fail := job{"admin listener", func(context.Context) error { return errors.New("port gone") }}
	err := runJobs(context.Background(), [][]job{{wait("grpc"), wait("listener")}, {wait("registry")}, {wait("last"), fail}},
		slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "admin listener: port gone") {
		t.Errorf("runJobs = %v; want the admin listener's error", err)
	}
	if !slices.Equal(stopped[2:], []string{"registry", "last"}) || len(stopped) != 4 {
		t.Errorf("stopped %v; want grpc and listener, then registry, then last", stopped)
	}
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
