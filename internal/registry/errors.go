package registry

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/mark3labs/mcp-go/client/transport"

	"github.com/connector-svc/connector-svc/internal/registry/msglimit"
	"github.com/connector-svc/connector-svc/internal/registry/tasks"
)

var (
	// ErrResultTooLarge means the server's answer was over the registry's
	// limit (see Config.MaxResultBytes) and was refused unread.
	ErrResultTooLarge = msglimit.ErrTooLarge
	// ErrTaskUnsupported is the error of a call of a tool that must run
	// as a task, on a connection that cannot run it so (see
	// tasks.ErrUnsupported).
	ErrTaskUnsupported = tasks.ErrUnsupported
	// ErrNotLoaded means the registry holds no connection for the connector:
	// it is inactive, deleted, or was never added.
	ErrNotLoaded = errors.New("connector is not active in the registry")
	// ErrUnavailable means the connector's MCP server cannot be reached now.
	// Errors wrapping it carry the last connection error.
	ErrUnavailable = errors.New("connector unavailable")
	// ErrClosed means the registry was closed: the service is shutting
	// down.
	ErrClosed = errors.New("the service is shutting down")
	// ErrDeleted means the connector was deleted while a call ran on it or
	// waited for it. It wraps ErrNotLoaded.
	ErrDeleted error = &removedError{"deleted"}
	// ErrDeactivated means the connector was deactivated while a call ran
	// on it or waited for it. It wraps ErrNotLoaded.
	ErrDeactivated error = &removedError{"deactivated"}
	// ErrToolNotFound means the connector's server does not list the tool
	// now (it may have listed it once).
	ErrToolNotFound = errors.New("tool not found")
	// ErrToolDisabled means an operator switched the tool off.
	ErrToolDisabled = errors.New("tool is disabled")

	// errReplaced means a conn was replaced by a new one for the same
	// connector; the caller looks the connector up again.
	errReplaced = errors.New("connection replaced")

	// errNoAnswer marks a failure where the server took a request and gave
	// no answer in time (a connect, a health check or a probe timed out),
	// as opposed to one that answered with a refusal.
	errNoAnswer = errors.New("no answer")
)

// removedError is a connector removed from the registry under a call.
type removedError struct{ how string }

func (e *removedError) Error() string { return "the connector was " + e.how + " during the call" }
func (e *removedError) Unwrap() error { return ErrNotLoaded }

// deadlineSlack is how close to its deadline a context may be cancelled
// and still count as ended by it. A gRPC client whose deadline passes
// cancels the call, and the server's context, a copy of that deadline
// made when the request arrived, may see that cancel a moment before its
// own timer fires.
const deadlineSlack = 100 * time.Millisecond

// EndedByDeadline reports whether ctx ended because its deadline passed:
// it is past its deadline, or it was cancelled within a moment of it (see
// deadlineSlack), which is how a gRPC server sees its caller's deadline
// pass. A context cancelled earlier, or not ended, did not.
func EndedByDeadline(ctx context.Context) bool {
	switch ctx.Err() {
	case context.DeadlineExceeded:
		return true
	case context.Canceled:
		d, ok := ctx.Deadline()
		return ok && time.Until(d) < deadlineSlack
	}
	return false
}

// endedWith is err, from a request whose ctx has ended, made to say so:
// mcp-go's streamable-HTTP transport may answer a request cancelled
// mid-stream with "unexpected nil response" rather than the context's error
// (its stream reader closes the response channel as the context ends, and
// its select may take either), and a caller that checks for
// context.Canceled must still find it.
func endedWith(ctx context.Context, err error) error {
	if cause := ctx.Err(); cause != nil && !errors.Is(err, cause) {
		return fmt.Errorf("%w: %w", cause, err)
	}
	return err
}

// unavailable wraps cause as ErrUnavailable.
func unavailable(cause error) error {
	if cause == nil {
		return ErrUnavailable
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, cause)
}

// gatewayStatus matches mcp-go's words for an HTTP answer of 502, 503 or
// 504: "unexpected status code: 502" (the SSE stream's GET), "request
// failed with status 503: ..." (a POST).
var gatewayStatus = regexp.MustCompile(`(unexpected status code: |request failed with status )50[234]\b`)

// isRefusal reports whether err is a refused connection, or a gateway's
// 502, 503 or 504, which stands for one: the server behind it is not
// there now (restarting, say). mcp-go's errors carry only text.
func isRefusal(err error) bool {
	if errors.Is(err, syscall.ECONNREFUSED) {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "connection refused") || gatewayStatus.MatchString(msg)
}

// retryNext wraps cause as ErrUnavailable for a connection that the next
// call opens afresh (a session's, or a per_session connector's listing):
// its next attempt is that call's.
func retryNext(cause error) error {
	return unavailable(fmt.Errorf("%w; next attempt with the next call, at once", cause))
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

// sendPrefix is what mcp-go's HTTP transports put before a failed send, at
// two layers (SendRequest around sendHTTP), so that it comes twice.
const sendPrefix = "failed to send request: "

// sayOnce returns msg, an error's text, with what mcp-go repeats in it said
// once: "failed to send request: failed to send request: x" becomes
// "failed to send request: x".
func sayOnce(msg string) string {
	for strings.Contains(msg, sendPrefix+sendPrefix) {
		msg = strings.ReplaceAll(msg, sendPrefix+sendPrefix, sendPrefix)
	}
	return msg
}

// Hints at the transport, for a connector whose server speaks the other
// HTTP transport.
const (
	hintStreamable = "is this a streamable_http server? the SSE transport expects GET to open an event stream that " +
		"names an endpoint; set the connector's transport to streamable_http"
	hintSSE = "is this an SSE server? the streamable_http transport POSTs initialize to the URL; " +
		"set the connector's transport to sse"
)

// transportHint adds a hint at the transport to err, a failed start or
// initialize of a session over tr, when the server looks like one of the
// other HTTP transport: an SSE GET refused with a 4xx, or answered with an
// event stream (streamed) that never named its endpoint; a streamable-HTTP
// initialize refused with a 4xx, which mcp-go reports as
// ErrLegacySSEServer. errors.Is and errors.As still see what err wraps.
func transportHint(tr string, err error, streamed bool) error {
	var hint string
	switch {
	case tr == TransportSSE && (sseStreamRefused(err) || streamed):
		hint = hintStreamable
	case tr == TransportStreamableHTTP && errors.Is(err, transport.ErrLegacySSEServer):
		hint = hintSSE
	default:
		return err
	}
	return fmt.Errorf("%w — %s", err, hint)
}

// sseStreamRefused reports whether err is mcp-go's SSE transport saying
// the server answered its GET with a 4xx other than an authorization
// failure or a rate limit. mcp-go gives only text ("unexpected status
// code: 400"), so the text is matched here, in one place.
func sseStreamRefused(err error) bool {
	_, after, ok := strings.Cut(err.Error(), "unexpected status code: ")
	if !ok || len(after) < 3 || after[0] != '4' {
		return false
	}
	switch after[:3] {
	case "401", "403", "429":
		return false
	}
	return true
}
