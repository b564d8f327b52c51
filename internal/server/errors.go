package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/mark3labs/mcp-go/mcp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/connector-svc/connector-svc/internal/calls"
	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/llm"
	"github.com/connector-svc/connector-svc/internal/oauth"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/store"
)

// errorDomain is the ErrorInfo domain of every error the service returns.
const errorDomain = "connector-svc"

// Stable machine-readable reasons, sent as google.rpc.ErrorInfo.
const (
	ReasonInvalidArgument        = "INVALID_ARGUMENT"
	ReasonConnectorNotFound      = "CONNECTOR_NOT_FOUND"
	ReasonToolNotFound           = "TOOL_NOT_FOUND"
	ReasonConnectorAlreadyExists = "CONNECTOR_ALREADY_EXISTS"
	ReasonAPIKeyNotFound         = "API_KEY_NOT_FOUND"
	ReasonStdioCommandNotAllowed = "STDIO_COMMAND_NOT_ALLOWED"
	ReasonEgressDenied           = "EGRESS_DENIED"
	ReasonSecretKeyMissing       = "SECRET_KEY_MISSING"
	ReasonSecretsUndecryptable   = "SECRETS_UNDECRYPTABLE"
	ReasonConnectorInactive      = "CONNECTOR_INACTIVE"
	ReasonConnectorUnavailable   = "CONNECTOR_UNAVAILABLE"
	ReasonToolDisabled           = "TOOL_DISABLED"
	ReasonToolExecutionFailed    = "TOOL_EXECUTION_FAILED"
	ReasonRateLimited            = "RATE_LIMITED"
	ReasonSessionLimit           = "SESSION_LIMIT"
	ReasonToolResultTooLarge     = "TOOL_RESULT_TOO_LARGE"
	ReasonArgumentsTooLarge      = "ARGUMENTS_TOO_LARGE"
	ReasonLLMNotConfigured       = "LLM_NOT_CONFIGURED"
	ReasonLLMUnavailable         = "LLM_UNAVAILABLE"
	ReasonOrchestrationFailed    = "MCP_ORCHESTRATION_FAILED"
	ReasonInternal               = "INTERNAL"
	ReasonApprovalRequired       = "APPROVAL_REQUIRED"
	ReasonRunNotFound            = "RUN_NOT_FOUND"
	ReasonRunNotAwaiting         = "RUN_NOT_AWAITING_APPROVAL"
	ReasonRunExpired             = "RUN_EXPIRED"
	ReasonRunTaken               = "RUN_TAKEN"
	// ReasonRunNotAwaitingInput: the answers name input requests that are
	// not open (answered already, or past their deadline).
	ReasonRunNotAwaitingInput = "RUN_NOT_AWAITING_INPUT"
	// ReasonInputNotFound: AnswerInput names no input request that waits.
	ReasonInputNotFound = "INPUT_NOT_FOUND"
	// ReasonInputRequired: a unary CallTool's server needs the user's
	// input, which only StreamCallTool can carry.
	ReasonInputRequired = "INPUT_REQUIRED"
	// ReasonTaskUnsupported: the tool must run as an MCP task, which the
	// connection's protocol generation does not carry here.
	ReasonTaskUnsupported = "TASK_UNSUPPORTED"
)

// newStatus builds a status error with an ErrorInfo detail.
func newStatus(code codes.Code, reason, msg string) error {
	return newStatusWith(code, reason, msg, nil)
}

// newStatusWith is newStatus with the ErrorInfo's metadata.
func newStatusWith(code codes.Code, reason, msg string, metadata map[string]string) error {
	st := status.New(code, msg)
	withInfo, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: errorDomain, Metadata: metadata})
	if err != nil {
		return st.Err()
	}
	return withInfo.Err()
}

// toStatus is the one place domain errors become gRPC statuses. Status
// errors pass through; unknown errors become a generic INTERNAL whose cause
// is logged once: in the RPC's log line, or here outside an RPC.
func (s *Server) toStatus(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if st, ok := status.FromError(err); ok {
		return st.Err()
	}
	// The registry and the LLM client take secret values out of their
	// errors where they make them (URL query values included).
	msg := err.Error()
	var invalid *invalidError
	var llmErr *llm.Error
	var sessionLimit *registry.SessionLimitError
	var egressDenied *egressDeniedError
	var discovery *oauth.DiscoveryError
	var refused *oauth.AuthServerError
	var unavailable *calls.UnavailableError
	var approval *calls.ApprovalRequiredError
	var limited *calls.RateLimitedError
	var inputRequired *calls.InputRequiredError
	var connectorNotFound *store.ConnectorNotFoundError
	switch {
	case errors.Is(err, calls.ErrInactive):
		return newStatus(codes.FailedPrecondition, ReasonConnectorInactive, msg)
	case errors.As(err, &unavailable):
		return newStatus(codes.Unavailable, ReasonConnectorUnavailable, msg)
	case errors.As(err, &approval):
		return newStatus(codes.FailedPrecondition, ReasonApprovalRequired, msg)
	case errors.As(err, &limited):
		return newStatus(codes.ResourceExhausted, ReasonRateLimited, msg)
	case errors.As(err, &inputRequired):
		return newStatus(codes.FailedPrecondition, ReasonInputRequired, msg)
	case errors.As(err, &invalid):
		return invalidStatus(invalid)
	case errors.As(err, &discovery):
		// Which URLs were tried and what each answered: no secret.
		return newStatus(codes.FailedPrecondition, ReasonOAuthDiscovery,
			"the connector's server cannot be authorized as the MCP specification asks: "+msg)
	case errors.As(err, &refused):
		// The server's error code and its description, scrubbed of what
		// the service sent it: the message names both.
		return newStatus(codes.FailedPrecondition, ReasonAuthorizationFailed, msg)
	case errors.Is(err, oauth.ErrStateInvalid):
		return invalidStatus(&invalidError{violations: []violation{{field: "state", problem: msg}}})
	case errors.Is(err, oauth.ErrIssuerMismatch):
		return invalidStatus(&invalidError{violations: []violation{{field: "iss", problem: msg}}})
	case errors.Is(err, oauth.ErrReturnToNotAllowed):
		return invalidStatus(&invalidError{violations: []violation{{field: "return_to", problem: msg}}})
	case errors.Is(err, oauth.ErrNoGrant):
		return newStatus(codes.NotFound, ReasonAuthorizationMissing, "the user has no authorization of this connector")
	case errors.As(err, &egressDenied):
		// Only a create or update: a dial refused later is the connector
		// being unavailable, with the refusal as its last error.
		return newStatus(codes.FailedPrecondition, ReasonEgressDenied, msg)
	case errors.Is(err, registry.ErrSessionRequired):
		return invalidStatus(sessionRequired())
	case errors.Is(err, registry.ErrUserRequired):
		return invalidStatus(&invalidError{violations: []violation{{field: "user_id", problem: err.Error()}}})
	case errors.Is(err, registry.ErrNoUserConnection):
		return newStatus(codes.FailedPrecondition, ReasonConnectorUnavailable, msg)
	case registry.IsAuthError(err):
		// Not a user's missing token (the handlers answer that), but the
		// authorizing itself failing: the authorization server is down,
		// say. The connection to the MCP server is fine.
		return newStatus(codes.Unavailable, ReasonConnectorUnavailable, "authorizing the request failed: "+msg)
	case errors.As(err, &sessionLimit):
		return newStatus(codes.ResourceExhausted, ReasonSessionLimit, fmt.Sprintf(
			"the connector has %d open sessions, the most MAX_SESSIONS_PER_CONNECTOR allows; close one with CloseSession, or wait for an idle one to close",
			sessionLimit.Limit))
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled) && registry.EndedByDeadline(ctx):
		// The second: the caller's deadline passed, and its cancel came
		// first; the caller sees DEADLINE_EXCEEDED.
		return status.Error(codes.DeadlineExceeded, "deadline exceeded")
	case errors.Is(err, context.Canceled) && ctx.Err() != nil:
		return status.Error(codes.Canceled, "canceled")
	case errors.Is(err, context.Canceled):
		// Not the caller's doing: the connection closed under the call.
		return newStatus(codes.Unavailable, ReasonConnectorUnavailable, "the connection to the MCP server closed during the call: "+err.Error())
	case errors.Is(err, registry.ErrToolNotFound):
		return newStatus(codes.NotFound, ReasonToolNotFound, err.Error())
	case errors.Is(err, registry.ErrToolDisabled):
		return newStatus(codes.FailedPrecondition, ReasonToolDisabled, "tool is disabled; enable it with UpdateTool")
	case errors.Is(err, errReplicaStopping):
		return newStatus(codes.Unavailable, ReasonConnectorUnavailable, err.Error())
	case errors.Is(err, registry.ErrTaskUnsupported):
		return newStatus(codes.FailedPrecondition, ReasonTaskUnsupported,
			err.Error()+": set the connector's protocol_preference to PROTOCOL_PREFERENCE_CLASSIC")
	case errors.Is(err, store.ErrToolNotFound):
		return newStatus(codes.NotFound, ReasonToolNotFound, "tool not found")
	case errors.Is(err, store.ErrRunNotFound):
		return newStatus(codes.NotFound, ReasonRunNotFound, "query run not found in this workspace")
	case errors.Is(err, store.ErrAPIKeyNotFound):
		return newStatus(codes.NotFound, ReasonAPIKeyNotFound, "API key not found in this workspace")
	case errors.As(err, &connectorNotFound):
		return newStatus(codes.NotFound, ReasonConnectorNotFound, connectorNotFound.Error())
	case errors.Is(err, store.ErrConnectorNotFound):
		return newStatus(codes.NotFound, ReasonConnectorNotFound, "connector not found")
	case errors.Is(err, store.ErrConflict):
		return newStatus(codes.AlreadyExists, ReasonConnectorAlreadyExists, "a connector with this connector_id already exists in the workspace")
	case errors.Is(err, registry.ErrDeleted):
		return newStatus(codes.NotFound, ReasonConnectorNotFound, msg)
	case errors.Is(err, registry.ErrDeactivated):
		return newStatus(codes.FailedPrecondition, ReasonConnectorInactive, msg+"; activate it with ActivateConnector")
	case errors.Is(err, registry.ErrUnavailable), errors.Is(err, registry.ErrNotLoaded), errors.Is(err, registry.ErrClosed),
		errors.Is(err, live.ErrNoRoute):
		// The message is the MCP server's connection error: addresses and
		// reasons, never header or env values, URL query values redacted.
		return newStatus(codes.Unavailable, ReasonConnectorUnavailable, msg)
	case errors.Is(err, mcp.ErrInvalidParams):
		return newStatus(codes.InvalidArgument, ReasonToolExecutionFailed, "the MCP server rejected the arguments: "+msg)
	case isJSONRPCError(err):
		return newStatus(codes.FailedPrecondition, ReasonToolExecutionFailed, "the MCP server answered with an error: "+msg)
	case errors.Is(err, llm.ErrNotConfigured):
		return newStatus(codes.FailedPrecondition, ReasonLLMNotConfigured, msg)
	case errors.As(err, &llmErr) && llmErr.Temporary():
		return newStatus(codes.Unavailable, ReasonLLMUnavailable, msg)
	case errors.As(err, &llmErr):
		return newStatus(codes.FailedPrecondition, ReasonLLMUnavailable, msg)
	case errors.Is(err, orchestrator.ErrBadPlan):
		return newStatus(codes.FailedPrecondition, ReasonOrchestrationFailed, msg)
	case errors.Is(err, orchestrator.ErrPanic):
		return newStatus(codes.Internal, ReasonInternal, "internal error")
	case errors.Is(err, secret.ErrNoKey):
		return newStatus(codes.FailedPrecondition, ReasonSecretKeyMissing,
			"connector header, env and URL query values are encrypted at rest, and the service has no SECRET_KEY; set SECRET_KEY (base64 of 32 bytes) and restart")
	case errors.Is(err, secret.ErrOpen):
		s.logger.ErrorContext(ctx, "stored secrets do not decrypt", slog.String("error", msg))
		return newStatus(codes.FailedPrecondition, ReasonSecretsUndecryptable, msg)
	default:
		if !noteCause(ctx, msg) {
			s.logger.ErrorContext(ctx, "internal error", slog.String("error", msg))
		}
		return newStatus(codes.Internal, ReasonInternal, "internal error")
	}
}

// isJSONRPCError reports whether err is an error answer from the MCP server
// (as opposed to a transport failure).
func isJSONRPCError(err error) bool {
	for _, target := range []error{mcp.ErrMethodNotFound, mcp.ErrInvalidRequest, mcp.ErrInternalError,
		mcp.ErrResourceNotFound, mcp.ErrRequestInterrupted, mcp.ErrParseError} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

func invalidStatus(e *invalidError) error {
	st := status.New(codes.InvalidArgument, e.Error())
	br := &errdetails.BadRequest{}
	for _, v := range e.violations {
		br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{Field: v.field, Description: v.problem})
	}
	withDetails, err := st.WithDetails(&errdetails.ErrorInfo{Reason: ReasonInvalidArgument, Domain: errorDomain}, br)
	if err != nil {
		return st.Err()
	}
	return withDetails.Err()
}
