package mcptest

import (
	"context"
	"fmt"
	"net/http"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
)

// Dial starts an mcp-go client of the streamable-HTTP server at url, on hc
// (nil: mcp-go's default client), and initializes it at version: the
// classic handshake for a version before 2026-07-28. It fails if the
// server agrees another version. The caller closes the client.
func Dial(ctx context.Context, url, version string, hc *http.Client) (*client.Client, error) {
	var opts []transport.StreamableHTTPCOption
	if hc != nil {
		opts = append(opts, transport.WithHTTPBasicClient(hc))
	}
	tr, err := transport.NewStreamableHTTP(url, opts...)
	if err != nil {
		return nil, err
	}
	c := client.NewClient(tr, client.WithProtocolVersion(version))
	if err := c.Start(ctx); err != nil {
		c.Close()
		return nil, err
	}
	var init mcp.InitializeRequest
	init.Params.ClientInfo = mcp.Implementation{Name: "bench", Version: "1"}
	res, err := c.Initialize(ctx, init)
	if err == nil && res.ProtocolVersion != version {
		err = fmt.Errorf("the client negotiated %s, want %s", res.ProtocolVersion, version)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}
