package mcpserve_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mcpclient "github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/mcpserve"
	"github.com/connector-svc/connector-svc/internal/store"
)

// TestAnswerOnAnotherReplica: a 2025-11-25 client's answer to an approval
// form reaches a replica other than the one whose open call asked (a
// balancer without affinity): it is relayed, through Postgres, to the one
// that asked, and the call runs with the edited arguments.
func TestAnswerOnAnotherReplica(t *testing.T) {
	e := newEnv(t, false, nil)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	serve := func(h *mcpserve.Handler) *url.URL {
		l := e.db.NewListener(time.Second, nil)
		l.Handle(store.MCPAnswersChannel, h.Deliver)
		go func() { _ = l.Run(ctx) }()
		go func() { _ = h.Run(ctx) }()
		mux := http.NewServeMux()
		mux.Handle("/mcp/", h)
		hs := httptest.NewServer(mux)
		t.Cleanup(hs.Close)
		u, _ := url.Parse(hs.URL)
		return u
	}
	a, b := serve(e.newHandler(e.db)), serve(e.newHandler(e.db))
	time.Sleep(300 * time.Millisecond) // both listeners listen
	// The balancer: requests and notifications to a, the client's answers
	// (JSON-RPC responses) to b.
	var toB atomic.Int32
	proxy := &httputil.ReverseProxy{FlushInterval: -1, Rewrite: func(pr *httputil.ProxyRequest) {
		target := a
		if pr.In.Method == http.MethodPost {
			body, _ := io.ReadAll(pr.In.Body)
			pr.Out.Body = io.NopCloser(bytes.NewReader(body))
			var msg struct {
				Method string `json:"method"`
			}
			if json.Unmarshal(body, &msg) == nil && msg.Method == "" {
				target = b
				toB.Add(1)
			}
		}
		pr.SetURL(target)
	}}
	lb := httptest.NewServer(proxy)
	t.Cleanup(lb.Close)

	approve := &elicitor{answer: func(mcp.ElicitationRequest) *mcp.ElicitationResult {
		return &mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{Action: mcp.ElicitationResponseActionAccept,
			Content: map[string]any{"approve": true, "arguments": `{"what":"across replicas"}`}}}
	}}
	c := connect(t, lb.URL+"/mcp/ws/alpha", nil, mcpclient.WithLegacyProtocolOnly(), mcpclient.WithElicitationHandler(approve))
	res := call(t, c, "wipe", map[string]any{"what": "everything"})
	if res.IsError || text(res) != "wiped across replicas" {
		t.Fatalf("wipe approved through another replica = %q (error %v)", text(res), res.IsError)
	}
	if toB.Load() == 0 || !strings.Contains(approve.asked[0].Params.Message, "everything") {
		t.Errorf("the answer went to the other replica %d times; asked %+v", toB.Load(), approve.asked)
	}
}
