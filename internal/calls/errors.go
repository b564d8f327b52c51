package calls

import (
	"errors"
	"fmt"

	"github.com/connector-svc/connector-svc/internal/oauth"
	"github.com/connector-svc/connector-svc/internal/store"
)

// ErrInactive: the connector is inactive.
var ErrInactive = errors.New("connector is inactive; activate it with ActivateConnector")

// UnavailableError: the connector is active but not connected here.
type UnavailableError struct {
	LastError string // its last health error, if any
}

func (e *UnavailableError) Error() string {
	msg := "connector is active but not connected"
	if e.LastError != "" {
		msg += ": " + e.LastError
	}
	return msg
}

// ApprovalRequiredError: the tool needs a person's approval and the
// caller did not say it has it.
type ApprovalRequiredError struct{ Tool string }

func (e *ApprovalRequiredError) Error() string {
	return fmt.Sprintf("tool %q needs a person's approval: show the call to the user, and call again with user_approved once they approve", e.Tool)
}

// RateLimitedError: the connector's rate limit is used up.
type RateLimitedError struct{ Limit store.RateLimit }

func (e *RateLimitedError) Error() string {
	return fmt.Sprintf("the connector's rate_limit (%g per second, burst %d) is used up: each tool call counts, and each query; try again shortly",
		e.Limit.RequestsPerSecond, max(e.Limit.Burst, 1))
}

// InputRequiredError: the server still needs the user's input, which the
// call could not get.
type InputRequiredError struct {
	// Rounds is how many answered rounds the call went through.
	Rounds int
	// URLHosts, for a URL the user must open: its hosts.
	URLHosts string
	// Unary: the caller cannot carry the request (a unary call).
	Unary bool
	// Refused is the user's answer when they did not accept to open it.
	Refused string
}

func (e *InputRequiredError) Error() string {
	switch {
	case e.URLHosts != "" && e.Unary:
		return fmt.Sprintf("the server needs the user to open a URL (%s) before the call can run, which a unary CallTool cannot ask; use StreamCallTool", e.URLHosts)
	case e.URLHosts != "" && e.Refused != "":
		return fmt.Sprintf("the user answered %s to the server's request to open a URL; the call was not tried again", e.Refused)
	case e.URLHosts != "":
		return "the server still needs the user to open a URL after they said they had"
	}
	return fmt.Sprintf("the server still needs the user's input after %d answered round(s); call the tool with StreamCallTool and answer its input requests", e.Rounds)
}

// AuthorizationRequiredError: the call's user (or the connector's own
// identity) must authorize first.
type AuthorizationRequiredError struct {
	Row      *store.Connector
	UserID   string
	Required *oauth.RequiredError
}

func (e *AuthorizationRequiredError) Error() string { return e.Required.Error() }
func (e *AuthorizationRequiredError) Unwrap() error { return e.Required }

// ArgumentsTooLargeError: the call's arguments are over the limit, as the
// front door received them (Request.ArgumentsBytes).
type ArgumentsTooLargeError struct{ Size, Limit int }

func (e *ArgumentsTooLargeError) Error() string {
	return fmt.Sprintf("the arguments are %d bytes, over the limit of %d bytes (MAX_TOOL_ARGUMENTS_BYTES)", e.Size, e.Limit)
}

// ResultTooLargeError: the tool's result is over the limit. Its message
// names the sizes, never the content. Size 0: the registry stopped
// reading it at the limit, and its size is not known.
type ResultTooLargeError struct {
	Size, Limit int
	// What was read: "" for a tool result, else what ("resource", "prompt").
	What string
}

func (e *ResultTooLargeError) Error() string {
	what, from := "tool result", "ask the tool for less"
	if e.What != "" {
		what, from = e.What, "read less"
	}
	advice := "; " + from + ", or raise MAX_TOOL_RESULT_BYTES with GRPC_MAX_SEND_BYTES and the client's receive limit"
	if e.Size == 0 {
		return fmt.Sprintf("the %s is over the limit of %d bytes (MAX_TOOL_RESULT_BYTES) and was not read", what, e.Limit) + advice
	}
	return fmt.Sprintf("the %s is %d bytes, over the limit of %d bytes (MAX_TOOL_RESULT_BYTES)", what, e.Size, e.Limit) + advice
}

// InputNotFoundError: no question of a direct call waits for the answer
// to input request ID on the answer's connector, session and user;
// Meanwhile: it did when the answer came, and was answered, or its
// deadline passed, before the answer was delivered.
type InputNotFoundError struct {
	ID        string
	Meanwhile bool
}

func (e *InputNotFoundError) Error() string {
	if e.Meanwhile {
		return fmt.Sprintf("input request %q was answered, or its deadline passed, meanwhile", e.ID)
	}
	return fmt.Sprintf("no input request %q waits for an answer on this connector, session and user: it was answered, "+
		"its deadline passed, or its call ended", e.ID)
}
