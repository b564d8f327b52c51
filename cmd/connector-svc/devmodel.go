package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/connector-svc/connector-svc/internal/llm/devmodel"
)

// devCommand returns the development command args names (dev-model,
// dev-certs), nil for any other. They take none of the service's settings
// and touch no database, so they run before the service's configuration is
// read.
func devCommand(args []string) func(ctx context.Context, dev devConfig, stdout io.Writer) error {
	if len(args) == 0 {
		return nil
	}
	rest := args[1:]
	switch args[0] {
	case "dev-model":
		return func(ctx context.Context, dev devConfig, stdout io.Writer) error {
			return runDevModel(ctx, rest, dev, stdout)
		}
	case "dev-certs":
		return func(_ context.Context, dev devConfig, stdout io.Writer) error {
			return runDevCerts(rest, dev, stdout)
		}
	}
	return nil
}

const devModelUsage = `Usage: connector-svc dev-model [-addr host:port]

Serves the development model: a scripted stand-in for an OpenAI-compatible
chat model (POST /v1/chat/completions, POST /v1/embeddings), NOT a language
model. For a query it calls each offered tool whose name the query contains
(else the tool whose name shares most words with it, else the first tool),
with arguments made from the query and the tool's input schema; given tool
results, it answers with them. Every answer starts with
"` + devmodel.Label + `".

Start the service with LLM_BASE_URL=http://<addr>/v1 LLM_MODEL=dev-model.
Ctrl-C stops it.

  -addr host:port   where it listens, a loopback address only
                    (DEV_MODEL_ADDR; default ` + devmodel.DefaultAddr + `)
`

// runDevModel serves the development model until ctx is done.
func runDevModel(ctx context.Context, args []string, dev devConfig, stdout io.Writer) error {
	fs := flag.NewFlagSet("connector-svc dev-model", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	addr := fs.String("addr", cmp.Or(dev.ModelAddr, devmodel.DefaultAddr), "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, devModelUsage)
			return err
		}
		return &usageError{err: fmt.Errorf("dev-model: %w", err), usage: devModelUsage}
	}
	if fs.NArg() > 0 {
		return &usageError{err: fmt.Errorf("dev-model takes flags only, not %q", fs.Args()), usage: devModelUsage}
	}
	host, _, err := net.SplitHostPort(*addr)
	if err != nil {
		return &usageError{err: fmt.Errorf("dev-model: -addr %q: %w", *addr, err), usage: devModelUsage}
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return &usageError{err: fmt.Errorf("dev-model: -addr %q: a loopback address only (127.0.0.1, ::1 or localhost): it is a development stand-in", *addr),
			usage: devModelUsage}
	}
	lis, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("dev-model: %w", err)
	}
	var mu sync.Mutex // the handler's lines, from concurrent requests
	logf := func(format string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(stdout, "%s dev-model: %s\n", time.Now().UTC().Format(time.TimeOnly), fmt.Sprintf(format, a...))
	}
	base := "http://" + lis.Addr().String() + "/v1"
	logf("%s: it follows fixed rules and understands nothing; try a real model for real answers (README: Ask a connector a question)", devmodel.Label)
	logf("listening on %s; start the service with LLM_BASE_URL=%s LLM_MODEL=dev-model", base, base)
	srv := &http.Server{Handler: devmodel.Handler(func(l string) { logf("%s", l) }), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	select {
	case err := <-done:
		return fmt.Errorf("dev-model: %w", err)
	case <-ctx.Done():
	}
	stop, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(stop); err != nil {
		return fmt.Errorf("dev-model: stopping: %w", err)
	}
	logf("stopped")
	return nil
}
