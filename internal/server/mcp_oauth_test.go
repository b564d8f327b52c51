package server_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	mcpclient "github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/mcpserve"
	"github.com/connector-svc/connector-svc/internal/oauthtest"
)

// urlElicitor accepts every URL elicitation and keeps the URLs.
type urlElicitor struct {
	mu   sync.Mutex
	urls []string
}

func (u *urlElicitor) Elicit(_ context.Context, req mcp.ElicitationRequest) (*mcp.ElicitationResult, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.urls = append(u.urls, req.Params.URL)
	return &mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{Action: mcp.ElicitationResponseActionAccept}}, nil
}

// An oauth_user connector over the MCP endpoint: a user with no token is
// sent the authorization URL as a URL elicitation, and once they have
// authorized, the call runs as them.
func TestMCPEndpointAuthorization(t *testing.T) {
	as := oauthtest.Start(t, oauthtest.Options{})
	f := setup(t, options{realOAuth: true})
	f.create(t, "ws", mcpConnector("p", as.MCPURL))
	if _, err := update(f, t, &connectorv1.Connector{ConnectorId: "p",
		Auth: &connectorv1.AuthConfig{Mode: connectorv1.AuthMode_AUTH_MODE_OAUTH_USER}}, "auth"); err != nil {
		t.Fatal(err)
	}
	f.waitReachable(t, "ws", "p")
	// Alice authorizes and calls through gRPC: the connector's catalog is
	// listed through her connection.
	st, err := f.client.StartAuthorization(ctx(t), &connectorv1.StartAuthorizationRequest{WorkspaceId: "ws", ConnectorId: "p",
		UserId: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	f.authorizeAs(t, as, st.GetAuthorizationUrl(), "alice")
	if who, err := f.callAs(t, "p", "whoami", "alice"); err != nil || !strings.HasPrefix(who, "user=alice ") {
		t.Fatalf("alice's whoami = %q, %v", who, err)
	}
	uc := f.srv.UseCases()
	h := mcpserve.New(mcpserve.Deps{Calls: uc.Calls, Queries: uc.Queries, Placer: uc.Placer, Sessions: uc.Sessions,
		Authorizations: uc.Authorizations, Live: f.live, Registry: f.reg, Tools: f.db}, mcpserve.Config{Auth: auth.ModeNone})
	mux := http.NewServeMux()
	mux.Handle("/mcp/", h)
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)

	el := &urlElicitor{}
	tr, err := transport.NewStreamableHTTP(hs.URL+"/mcp/ws/p", transport.WithHTTPHeaders(map[string]string{mcpserve.UserHeader: "bob"}))
	if err != nil {
		t.Fatal(err)
	}
	c := mcpclient.NewClient(tr, mcpclient.WithLegacyProtocolOnly(), mcpclient.WithElicitationHandler(el),
		mcpclient.WithClientCapabilities(mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapability{Form: &struct{}{}, URL: &struct{}{}}}))
	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Start(cctx); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Initialize(cctx, mcp.InitializeRequest{Params: mcp.InitializeParams{ProtocolVersion: "2025-11-25",
		ClientInfo: mcp.Implementation{Name: "t", Version: "1"}}}); err != nil {
		t.Fatal(err)
	}
	whoami := func() *mcp.CallToolResult {
		res, err := c.CallTool(cctx, mcp.CallToolRequest{Params: mcp.CallToolParams{Name: "whoami"}})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	res := whoami()
	if !res.IsError || len(el.urls) != 1 || !strings.HasPrefix(el.urls[0], as.Issuer) {
		t.Fatalf("bob's first whoami = %+v, URLs elicited %v; want an error after a URL elicitation of the authorization server", res, el.urls)
	}
	f.authorizeAs(t, as, el.urls[0], "bob")
	res = whoami()
	if text := res.Content[0].(mcp.TextContent).Text; res.IsError || !strings.HasPrefix(text, "user=bob ") {
		t.Fatalf("bob's whoami once authorized = %q (error %v)", text, res.IsError)
	}
}
