// Command stdioserver is an MCP server over stdio for the registry's tests.
// It can misbehave the ways real servers do: ignore SIGTERM and closed
// stdin, leave a child process behind, and crash.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/connector-svc/connector-svc/internal/mcptest"
	"github.com/connector-svc/connector-svc/internal/registry/testdata/asktools"
)

func main() {
	stubborn := flag.Bool("stubborn", false, "ignore SIGTERM and keep running after stdin closes")
	child := flag.Bool("child", false, "start a child process (sleep) in the same process group")
	pidfile := flag.String("pidfile", "", "append this process's pid, and the child's, to this file")
	httpAddr := flag.String("http", "", "serve streamable HTTP (classic sessions) on this address instead of stdio")
	sseAddr := flag.String("sse", "", "serve SSE on this address instead of stdio")
	profile := flag.String("profile", "", "hold an exclusive lock on this directory (its $CONNECTOR_SESSION_ID subdirectory if set) while running, as a browser holds its profile")
	asks := flag.Bool("asks", false, "serve the tools that ask back (see asktools)")
	exitAfter := flag.Duration("exit-after", 0, "exit with status 7 this long after starting, saying so (and $TOKEN) on stderr")
	flag.Parse()

	if *profile != "" {
		lockProfile(filepath.Join(*profile, os.Getenv("CONNECTOR_SESSION_ID")))
	}
	if *exitAfter > 0 {
		time.AfterFunc(*exitAfter, func() {
			fmt.Fprintln(os.Stderr, "leaving on purpose; token was", os.Getenv("TOKEN"))
			os.Exit(7)
		})
	}

	if *stubborn {
		signal.Ignore(syscall.SIGTERM)
	}
	pids := fmt.Sprintln(os.Getpid())
	if *child {
		cmd := exec.Command("sleep", "600")
		if err := cmd.Start(); err != nil {
			log.Fatal(err)
		}
		pids += fmt.Sprintln(cmd.Process.Pid)
	}
	if *pidfile != "" {
		f, err := os.OpenFile(*pidfile, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Fprint(f, pids)
		f.Close()
	}

	s := server.NewMCPServer("stdioserver", "1.0")
	if *asks {
		asktools.Add(s)
	}
	readOnly := true
	echo := mcp.NewTool("echo", mcp.WithString("text", mcp.Required()))
	echo.Annotations.ReadOnlyHint = &readOnly
	s.AddTool(echo, func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText(req.GetString("text", "")), nil
	})
	s.AddTool(mcp.NewTool("env", mcp.WithString("name", mcp.Required())),
		func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText(os.Getenv(req.GetString("name", ""))), nil
		})
	s.AddTool(mcp.NewTool("pid"), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText(fmt.Sprint(os.Getpid())), nil
	})
	// remember and recall keep one value per server process, that is per
	// connection: what a browser page or a shell's directory is.
	var mu sync.Mutex
	var remembered string
	s.AddTool(mcp.NewTool("remember", mcp.WithString("value", mcp.Required())),
		func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			mu.Lock()
			remembered = req.GetString("value", "")
			mu.Unlock()
			return mcp.NewToolResultText("ok"), nil
		})
	s.AddTool(mcp.NewTool("recall"), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		mu.Lock()
		defer mu.Unlock()
		return mcp.NewToolResultText(remembered), nil
	})
	s.AddTool(mcp.NewTool("crash"), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		fmt.Fprintln(os.Stderr, "panic: the test asked me to crash")
		os.Exit(3)
		return nil, nil
	})

	// big answers with a text of the given size; with stream set, it sends
	// a notification first, so a streamable-HTTP answer is an SSE stream.
	s.AddTool(mcp.NewTool("big", mcp.WithNumber("bytes", mcp.Required()), mcp.WithBoolean("stream")),
		func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			if req.GetBool("stream", false) {
				_ = server.ServerFromContext(ctx).SendNotificationToClient(ctx, "notifications/message",
					map[string]any{"level": "info", "data": "a big one is coming"})
			}
			return mcp.NewToolResultText(strings.Repeat("x", req.GetInt("bytes", 0))), nil
		})

	written := mcptest.NewWritten()
	mcptest.AddProgressTool(s, written)

	if *sseAddr != "" {
		log.Fatal(serveHTTP(*sseAddr, server.NewSSEServer(s, server.WithBaseURL("http://"+*sseAddr))))
	}
	if *httpAddr != "" {
		log.Fatal(serveHTTP(*httpAddr, legacyOnly(written.Handler(server.NewStreamableHTTPServer(s)))))
	}
	err := server.NewStdioServer(s).Listen(context.Background(), os.Stdin, written.Writer(os.Stdout))
	if *stubborn {
		select {} // a server that does not exit when its client goes
	}
	if err != nil {
		log.Fatal(err)
	}
}

// lockProfile takes an exclusive lock on dir/lock, held until the process
// ends, or exits the way Playwright does when another instance has it.
func lockProfile(dir string) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		log.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		log.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		fmt.Fprintln(os.Stderr, "Error: profile already in use:", dir)
		os.Exit(1)
	}
	profileLock = f // kept open, and so locked, for the life of the process
}

// profileLock holds the profile's lock; a file nobody refers to would be
// closed by its finalizer.
var profileLock *os.File

// serveHTTP serves mcp on addr, and GET /accepted: how many TCP
// connections the server has accepted so far, that request's own included,
// so that a benchmark can count the connections its clients open.
func serveHTTP(addr string, mcp http.Handler) error {
	var accepted atomic.Int64
	mux := http.NewServeMux()
	mux.Handle("/", mcp)
	mux.HandleFunc("GET /accepted", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, accepted.Load()) })
	hs := &http.Server{Addr: addr, Handler: mux, ConnState: func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			accepted.Add(1)
		}
	}}
	return hs.ListenAndServe()
}

// legacyOnly answers the 2026-07 server/discover probe with "method not
// found", so clients use classic sessions, as most deployed servers do.
func legacyOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			var msg struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
			}
			if json.Unmarshal(body, &msg) == nil && msg.Method == "server/discover" {
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"error":{"code":-32601,"message":"Method not found"}}`, msg.ID)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}
