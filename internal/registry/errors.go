package registry

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/mark3labs/mcp-go/client/transport"
)

var (
	// ErrNotLoaded means the registry holds no connection for the connector:
	// it is inactive, deleted, or was never added.
	ErrNotLoaded = errors.New("connector is not active in the registry")
	// ErrUnavailable means the connector's MCP server cannot be reached now.
	// Errors wrapping it carry the last connection error.
	ErrUnavailable = errors.New("connector unavailable")
	// ErrClosed means the registry or connection was closed.
	ErrClosed = errors.New("registry closed")
	// ErrToolNotFound means the connector's server does not list the tool
	// now (it may have listed it once).
	ErrToolNotFound = errors.New("tool not found")
	// ErrToolDisabled means an operator switched the tool off.
	ErrToolDisabled = errors.New("tool is disabled")

	// errReplaced means a conn was replaced by a new one for the same
	// connector; the caller looks the connector up again.
	errReplaced = errors.New("connection replaced")
)

// unavailable wraps cause as ErrUnavailable.
func unavailable(cause error) error {
	if cause == nil {
		return ErrUnavailable
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, cause)
}

// isSessionLost reports whether err means the server no longer knows our
// session, so the request never ran and re-initializing on the same client
// then retrying is safe. mcp-go reports an HTTP 404 as ErrSessionTerminated;
// the reference TypeScript server answers HTTP 400 with JSON-RPC -32000
// "Bad Request: No valid session ID provided", which mcp-go turns into an
// error carrying only that text, so the text is matched here, in one place.
func isSessionLost(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, transport.ErrSessionTerminated) {
		return true
	}
	msg := strings.ToLower(err.Error())
	for _, s := range []string{"no valid session id", "session not found", "invalid session id", "session terminated"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// isConnectionBroken reports whether err came from the transport (the process
// died, the stream broke, the server went away) rather than from the server
// answering, so the client should be rebuilt. Callers rule out their own
// context's end first: a context error that remains is the session's.
func isConnectionBroken(err error) bool {
	if err == nil {
		return false
	}
	var te *transport.Error
	return errors.As(err, &te) || errors.Is(err, ErrClosed) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
