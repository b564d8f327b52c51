package registry

// Protocol generations: which handshake a connection opens with.

import (
	"context"
	"errors"
	"log/slog"
	"net/http"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
)

// Protocol preferences a Spec may name: the protocol generation a
// connector opens with where its server offers both. Either way a server
// that speaks only the other generation is still served.
const (
	// ProtocolAuto (or empty) is the service's choice, ProtocolClassic: a
	// call on it costs less (mcp-go adds per-request metadata and headers
	// to every sessionless request), and it has MCP sessions, which
	// per_session connectors need.
	ProtocolAuto = "auto"
	// ProtocolClassic is the initialize handshake of the protocol versions
	// up to 2025-11-25, with an MCP session.
	ProtocolClassic = "classic"
	// ProtocolSessionless is the 2026-07-28 generation: server/discover,
	// and no session.
	ProtocolSessionless = "sessionless"
)

// classicFirst reports whether the next connection opens with the classic
// handshake: as it did last time, if the server refused one generation
// before, else as the connector prefers.
func (c *conn) classicFirst() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.legacy: // the server answered the classic handshake last time
		return true
	case c.noClassic:
		return false
	}
	return c.spec.Protocol != ProtocolSessionless
}

// openBare starts a session for spec and initializes it, without listing
// tools, on the generation classicFirst picks. A server that refuses the
// classic handshake is opened again sessionless, and remembered as such.
// mcp-go falls back the other way by itself: a sessionless open of a
// server that does not answer server/discover (within DiscoverTimeout)
// goes on with the classic handshake. It returns the protocol version
// agreed.
func (c *conn) openBare(ctx context.Context, spec Spec, hc *http.Client) (*session, string, error) {
	classic := c.classicFirst()
	s, version, err := c.openAs(ctx, spec, hc, classic)
	if err == nil || !classic || !refusedClassic(err) || ctx.Err() != nil {
		return s, version, err
	}
	c.reg.logger.Debug("server refused the classic handshake; opening with the sessionless protocol",
		append(c.logAttrs(), slog.String("error", c.redact.err(err).Error()))...)
	s, version, err = c.openAs(ctx, spec, hc, false)
	if err == nil && mcp.IsModernProtocol(version) {
		c.mu.Lock()
		c.noClassic = true
		c.mu.Unlock()
	}
	return s, version, err
}

// clientOptions are the mcp-go options of a client that opens with the
// classic handshake, or else with the sessionless one.
func (c *conn) clientOptions(classic bool) []client.ClientOption {
	if classic {
		// A version before 2026-07-28 keeps the client on initialize.
		return []client.ClientOption{client.WithProtocolVersion(mcp.LATEST_LEGACY_PROTOCOL_VERSION)}
	}
	return []client.ClientOption{client.WithDiscoverTimeout(c.reg.cfg.DiscoverTimeout)}
}

// refusedClassic reports whether the server answered the initialize
// handshake with a refusal, as a server of the sessionless generation only
// does: an HTTP 4xx (which mcp-go reports as ErrLegacySSEServer), or a
// JSON-RPC error saying it does not know the method or the version.
func refusedClassic(err error) bool {
	var unsupported mcp.UnsupportedProtocolVersionError
	return errors.Is(err, transport.ErrLegacySSEServer) || errors.Is(err, mcp.ErrMethodNotFound) ||
		errors.Is(err, mcp.ErrInvalidRequest) || errors.As(err, &unsupported)
}
