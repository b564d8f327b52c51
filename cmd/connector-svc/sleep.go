package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"time"
)

// sleepUsage is the sleep command's.
const sleepUsage = `Usage: connector-svc sleep SECONDS

Waits SECONDS (0 to 3600), then exits 0. It is the chart's preStop hook on
clusters before Kubernetes 1.30, which lack the native sleep action: the
image ko builds the service into has no shell and no sleep binary.
`

// runSleep is the sleep command: it waits, or returns early when ctx ends.
// -h prints its usage and returns flag.ErrHelp; anything but one number
// of seconds is a *usageError.
func runSleep(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 1 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		fmt.Fprint(stdout, sleepUsage)
		return flag.ErrHelp
	}
	if len(args) != 1 {
		return &usageError{err: fmt.Errorf("sleep %q: want one argument, the seconds to wait", args), usage: sleepUsage}
	}
	n, err := strconv.Atoi(args[0])
	if err != nil || n < 0 || n > 3600 {
		return &usageError{err: fmt.Errorf("sleep %q: want a whole number of seconds from 0 to 3600", args[0]), usage: sleepUsage}
	}
	t := time.NewTimer(time.Duration(n) * time.Second)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	return nil
}
