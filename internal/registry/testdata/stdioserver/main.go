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
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

func main() {
	stubborn := flag.Bool("stubborn", false, "ignore SIGTERM and keep running after stdin closes")
	child := flag.Bool("child", false, "start a child process (sleep) in the same process group")
	pidfile := flag.String("pidfile", "", "append this process's pid, and the child's, to this file")
	httpAddr := flag.String("http", "", "serve streamable HTTP (classic sessions) on this address instead of stdio")
	flag.Parse()

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
	s.AddTool(mcp.NewTool("crash"), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		fmt.Fprintln(os.Stderr, "panic: the test asked me to crash")
		os.Exit(3)
		return nil, nil
	})

	if *httpAddr != "" {
		log.Fatal(http.ListenAndServe(*httpAddr, legacyOnly(server.NewStreamableHTTPServer(s))))
	}
	err := server.NewStdioServer(s).Listen(context.Background(), os.Stdin, os.Stdout)
	if *stubborn {
		select {} // a server that does not exit when its client goes
	}
	if err != nil {
		log.Fatal(err)
	}
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
