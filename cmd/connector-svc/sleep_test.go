package main

import (
	"context"
	"errors"
	"flag"
	"strings"
	"testing"
	"time"
)

// TestSleepCommand: the chart's preStop hook before Kubernetes 1.30 runs
// `connector-svc sleep N`, in images with no sleep binary.
func TestSleepCommand(t *testing.T) {
	var out strings.Builder
	start := time.Now()
	if err := run(context.Background(), []string{"sleep", "1"}, func(string) string { return "" }, &out); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < time.Second {
		t.Errorf("sleep 1 returned after %v", took)
	}
	for _, args := range [][]string{{"sleep"}, {"sleep", "x"}, {"sleep", "-1"}, {"sleep", "1", "2"}} {
		var usage *usageError
		if err := run(context.Background(), args, func(string) string { return "" }, &out); !errors.As(err, &usage) {
			t.Errorf("%v = %v, want a usage error", args, err)
		}
	}
	out.Reset()
	if err := run(context.Background(), []string{"sleep", "-h"}, func(string) string { return "" }, &out); !errors.Is(err, flag.ErrHelp) ||
		!strings.Contains(out.String(), "Usage: connector-svc sleep SECONDS") {
		t.Errorf("sleep -h = %v, printed %q", err, out.String())
	}
}
