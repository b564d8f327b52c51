// Package mcptest gives the tests' mcp-go servers a long-running tool that
// reports MCP progress the way a well-behaved server does: every
// notifications/progress written out before the result.
//
// mcp-go's servers queue a tool's notifications apart from its result
// (stdio, SSE and streamable HTTP alike), so the result can overtake the
// last ones, and a client rightly drops progress for a request it has
// its answer to. The tool therefore waits until its notifications have
// been written to the client before it answers: Written counts them on
// their way out.
package mcptest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"sync"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

// ProgressTool is the tool's name.
const ProgressTool = "progress"

// AddProgressTool adds ProgressTool to m. Called with {"steps": n,
// "label": l} it sends n notifications/progress with the request's
// progress token (progress i, total n, message "l i"), waits until out has
// seen each written, and answers "done n"; with "hold": true it does not
// answer, and waits for the request to be cancelled instead. A request
// without a progress token gets no notifications and the answer "done n
// without a token".
func AddProgressTool(m *server.MCPServer, out *Written) {
	tool := mcp.NewTool(ProgressTool, mcp.WithDescription("Works in steps, reporting progress"),
		mcp.WithNumber("steps", mcp.Required()), mcp.WithString("label"), mcp.WithBoolean("hold"))
	m.AddTool(tool, func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		steps, label := req.GetInt("steps", 0), req.GetString("label", "")
		var token mcp.ProgressToken
		if req.Params.Meta != nil {
			token = req.Params.Meta.ProgressToken
		}
		if token == nil {
			return mcp.NewToolResultText(fmt.Sprintf("done %d without a token", steps)), nil
		}
		for i := 1; i <= steps; i++ {
			err := m.SendNotificationToClient(ctx, string(mcp.MethodNotificationProgress), map[string]any{
				"progressToken": token, "progress": i, "total": steps, "message": fmt.Sprintf("%s %d", label, i)})
			if err != nil {
				return nil, err
			}
		}
		if err := out.wait(ctx, fmt.Sprint(token), steps); err != nil {
			return nil, err
		}
		if req.GetBool("hold", false) {
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return mcp.NewToolResultText(fmt.Sprintf("done %d", steps)), nil
	})
}

// Written counts the progress notifications a server has written to its
// clients, by progress token. Safe for concurrent use.
type Written struct {
	mu      sync.Mutex
	counts  map[string]int
	changed chan struct{} // closed and replaced on every count
}

// NewWritten returns an empty count.
func NewWritten() *Written {
	return &Written{counts: map[string]int{}, changed: make(chan struct{})}
}

// progressToken finds the (string) token of each progress notification in
// what a server writes: one or more whole messages per write, as mcp-go's
// servers write them.
var progressToken = regexp.MustCompile(`"progressToken":"([^"]+)"`)

func (w *Written) saw(b []byte) {
	if !bytes.Contains(b, []byte(mcp.MethodNotificationProgress)) {
		return
	}
	ms := progressToken.FindAllSubmatch(b, -1)
	if len(ms) == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, m := range ms {
		w.counts[string(m[1])]++
	}
	close(w.changed)
	w.changed = make(chan struct{})
}

// wait returns once n notifications with token were written, or ctx ends.
func (w *Written) wait(ctx context.Context, token string, n int) error {
	for {
		w.mu.Lock()
		done, changed := w.counts[token] >= n, w.changed
		w.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d progress notifications to be written: %w", n, ctx.Err())
		}
	}
}

// Writer counts what the server writes to out (a stdio server's stdout).
func (w *Written) Writer(out io.Writer) io.Writer { return writer{out, w} }

type writer struct {
	out io.Writer
	w   *Written
}

func (x writer) Write(b []byte) (int, error) {
	n, err := x.out.Write(b)
	x.w.saw(b[:n])
	return n, err
}

// Handler counts what next writes to HTTP clients (response bodies and
// SSE streams).
func (w *Written) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(&responseWriter{ResponseWriter: rw, w: w}, r)
	})
}

type responseWriter struct {
	http.ResponseWriter
	w *Written
}

func (x *responseWriter) Write(b []byte) (int, error) {
	n, err := x.ResponseWriter.Write(b)
	x.w.saw(b[:n])
	return n, err
}

// Flush lets mcp-go stream (it looks for http.Flusher).
func (x *responseWriter) Flush() {
	if f, ok := x.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (x *responseWriter) Unwrap() http.ResponseWriter { return x.ResponseWriter }
