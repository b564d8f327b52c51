package mcptest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
)

// Subscribable is an mcp-go server over streamable HTTP (at URL + "/mcp")
// with a tool "noop" and the resources mem://a and mem://b, which takes
// subscriptions to them or not, and counts the subscribe and unsubscribe
// requests it gets. It closes when the test ends.
type Subscribable struct {
	MCP  *mcpserver.MCPServer
	HTTP *httptest.Server

	mu     sync.Mutex
	counts map[string]int
}

// NewSubscribable starts a Subscribable; subscribe says whether it
// declares the subscribe capability.
func NewSubscribable(t testing.TB, subscribe bool) *Subscribable {
	t.Helper()
	s := &Subscribable{counts: map[string]int{}}
	s.MCP = mcpserver.NewMCPServer("subs", "1", mcpserver.WithResourceCapabilities(subscribe, true))
	s.MCP.AddTool(mcp.NewTool("noop"), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("ok"), nil
	})
	for _, uri := range []string{"mem://a", "mem://b"} {
		s.MCP.AddResource(mcp.NewResource(uri, uri), func(_ context.Context, req mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
			return []mcp.ResourceContents{mcp.TextResourceContents{URI: req.Params.URI, Text: "v"}}, nil
		})
	}
	h := mcpserver.NewStreamableHTTPServer(s.MCP)
	s.HTTP = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			var msg struct {
				Method string
				Params struct{ URI string }
			}
			if json.Unmarshal(body, &msg) == nil && (msg.Method == "resources/subscribe" || msg.Method == "resources/unsubscribe") {
				s.mu.Lock()
				s.counts[msg.Method+" "+msg.Params.URI]++
				s.mu.Unlock()
			}
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(s.HTTP.Close)
	return s
}

// Count is how many requests of what ("resources/subscribe mem://a") the
// server got.
func (s *Subscribable) Count(what string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[what]
}

// Update notifies every client of an update of uri.
func (s *Subscribable) Update(uri string) {
	s.MCP.SendNotificationToAllClients(mcp.MethodNotificationResourceUpdated, map[string]any{"uri": uri})
}
