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
	"google.golang.org/protobuf/protoadapt"

	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/authorizations"
	"github.com/connector-svc/connector-svc/internal/calls"
	"github.com/connector-svc/connector-svc/internal/connectors"
	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/llm"
	"github.com/connector-svc/connector-svc/internal/oauth"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/queries"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/resources"
	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/watches"
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
	// ReasonRunStateNewer: the paused run's state was written by a newer
	// build than this replica's; the run stays paused.
	ReasonRunStateNewer = "RUN_STATE_NEWER"
	// ReasonTaskUnsupported: the tool must run as an MCP task, which the
	// connection's protocol generation does not carry here.
	ReasonTaskUnsupported = "TASK_UNSUPPORTED"
	// The connector's server offers no resources, prompts, completions or
	// subscriptions (it did not declare them), or does not list the
	// prompt or resource asked for; or it refused the request (its
	// message says why).
	ReasonNoResources      = "NO_RESOURCES"
	ReasonNoPrompts        = "NO_PROMPTS"
	ReasonNoCompletions    = "NO_COMPLETIONS"
	ReasonNoSubscribe      = "NO_SUBSCRIBE"
	ReasonPromptNotFound   = "PROMPT_NOT_FOUND"
	ReasonResourceNotFound = "RESOURCE_NOT_FOUND"
	ReasonServerRefused    = "SERVER_REFUSED"
)

// newStatus builds a status error with an ErrorInfo detail.
func newStatus(code codes.Code, reason, msg string) error {
	return newStatusWith(code, reason, msg, nil)
}

// newStatusWith is newStatus with the ErrorInfo's metadata, and more
// details after it.
func newStatusWith(code codes.Code, reason, msg string, metadata map[string]string, more ...protoadapt.MessageV1) error {
	st := status.New(code, msg)
	withInfo, err := st.WithDetails(append([]protoadapt.MessageV1{
		&errdetails.ErrorInfo{Reason: reason, Domain: errorDomain, Metadata: metadata}}, more...)...)
	if err != nil {
		return st.Err()
	}
	return withInfo.Err()
}

// toStatus is the one place domain errors become gRPC statuses. Status
// errors pass through; invalid requests carry their field violations;
// every other known error is a row of errorTable, the caller's deadline
// and cancellation included; unknown errors become a generic INTERNAL
// whose cause is logged once: in the RPC's log line, or here outside an
// RPC.
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
	if errors.As(err, &invalid) {
		return invalidStatus(invalid)
	}
	var invalidQuery *queries.InvalidError
	if errors.As(err, &invalidQuery) {
		return invalidStatus(invalidOf(invalidQuery))
	}
	for _, row := range errorTable {
		if row.contextChecks {
			if st := contextStatus(ctx, err); st != nil {
				return st
			}
			continue
		}
		if !row.match(err) {
			continue
		}
		text := msg
		if row.message != nil {
			text = row.message(err)
		}
		if row.log != "" {
			s.logger.ErrorContext(ctx, row.log, slog.String("error", msg))
		}
		if row.field != "" {
			return invalidStatus(&invalidError{violations: []violation{{field: row.field, problem: text}}})
		}
		return row.status(err, text)
	}
	if !noteCause(ctx, msg) {
		s.logger.ErrorContext(ctx, "internal error", slog.String("error", msg))
	}
	return newStatus(codes.Internal, ReasonInternal, "internal error")
}

// errorRow maps the errors match accepts to a status: an INVALID_ARGUMENT
// naming field, or code and reason with message's text (nil: the
// error's own, which the packages that make it keep free of secrets),
// logged at error level as log says if not empty; metadata, if not nil,
// is the ErrorInfo's, and detail a detail after it. A row with
// contextChecks stands for contextStatus, at its place in the order.
type errorRow struct {
	match         func(error) bool
	field         string
	code          codes.Code
	reason        string
	message       func(error) string
	log           string
	contextChecks bool
	metadata      func(error) map[string]string
	detail        func(error) protoadapt.MessageV1
}

// status is the row's status of err, with text as its message.
func (row errorRow) status(err error, text string) error {
	var metadata map[string]string
	if row.metadata != nil {
		metadata = row.metadata(err)
	}
	if row.detail == nil {
		return newStatusWith(row.code, row.reason, text, metadata)
	}
	return newStatusWith(row.code, row.reason, text, metadata, row.detail(err))
}

// contextStatus is the caller's deadline or cancellation, nil for other
// errors.
func contextStatus(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled) && registry.EndedByDeadline(ctx):
		// The second: the caller's deadline passed, and its cancel came
		// first; the caller sees DEADLINE_EXCEEDED.
		return status.Error(codes.DeadlineExceeded, "deadline exceeded")
	case errors.Is(err, context.Canceled) && ctx.Err() != nil:
		return status.Error(codes.Canceled, "canceled")
	}
	return nil
}

// is matches errors that are target.
func is(target error) func(error) bool { return func(err error) bool { return errors.Is(err, target) } }

// as matches errors that are a T.
func as[T error]() func(error) bool {
	return func(err error) bool { var t T; return errors.As(err, &t) }
}

// own is the text of the T in the error's chain, without what wraps it.
func own[T error]() func(error) string {
	return func(err error) string {
		var t T
		if errors.As(err, &t) {
			return t.Error()
		}
		return err.Error()
	}
}

// text is a fixed message.
func text(msg string) func(error) string { return func(error) string { return msg } }

// prefixed is the error's text after prefix.
func prefixed(prefix string) func(error) string {
	return func(err error) string { return prefix + err.Error() }
}

// errorTable is every known error's status, first match wins.
var errorTable = []errorRow{
	{match: is(calls.ErrInactive), code: codes.FailedPrecondition, reason: ReasonConnectorInactive},
	{match: as[*calls.UnavailableError](), code: codes.Unavailable, reason: ReasonConnectorUnavailable},
	{match: as[*calls.ApprovalRequiredError](), code: codes.FailedPrecondition, reason: ReasonApprovalRequired},
	{match: as[*calls.RateLimitedError](), code: codes.ResourceExhausted, reason: ReasonRateLimited},
	{match: as[*calls.InputRequiredError](), code: codes.FailedPrecondition, reason: ReasonInputRequired},
	{match: as[*queries.RunNotAwaitingError](), code: codes.FailedPrecondition, reason: ReasonRunNotAwaiting},
	{match: as[*queries.RunNotAwaitingInputError](), code: codes.FailedPrecondition, reason: ReasonRunNotAwaitingInput},
	{match: as[*queries.RunExpiredError](), code: codes.FailedPrecondition, reason: ReasonRunExpired},
	{match: is(queries.ErrRunTaken), code: codes.Aborted, reason: ReasonRunTaken},
	// Resumes go where the run's tool call is open: that moved, or is
	// moving.
	{match: as[*queries.RunElsewhereError](), code: codes.Unavailable, reason: ReasonConnectorUnavailable},
	// Which URLs were tried and what each answered: no secret.
	{match: as[*oauth.DiscoveryError](), code: codes.FailedPrecondition, reason: ReasonOAuthDiscovery,
		message: prefixed("the connector's server cannot be authorized as the MCP specification asks: ")},
	// The server's error code and its description, scrubbed of what the
	// service sent it: the message names both.
	// The metadata's error is there with a return_to or without one.
	{match: as[*oauth.AuthServerError](), code: codes.FailedPrecondition, reason: ReasonAuthorizationFailed,
		metadata: authServerMetadata},
	{match: is(oauth.ErrStateInvalid), field: "state"},
	{match: is(oauth.ErrIssuerMismatch), field: "iss"},
	{match: is(oauth.ErrReturnToNotAllowed), field: "return_to"},
	// A step-up that could not help: the server asks for scopes the
	// token holds. Before IsAuthError, which wraps it.
	{match: as[*oauth.ScopesHeldError](), code: codes.PermissionDenied, reason: ReasonStepUpLimit},
	{match: is(oauth.ErrNoGrant), code: codes.NotFound, reason: ReasonAuthorizationMissing,
		message: text("the user has no authorization of this connector")},
	// Only a create or update: a dial refused later is the connector being
	// unavailable, with the refusal as its last error.
	{match: as[*connectors.EgressDeniedError](), code: codes.FailedPrecondition, reason: ReasonEgressDenied},
	{match: as[*connectors.CommandNotAllowedError](), code: codes.FailedPrecondition, reason: ReasonStdioCommandNotAllowed},
	{match: is(registry.ErrSessionRequired), field: "session_id",
		message: func(error) string { return sessionRequired().violations[0].problem }},
	{match: is(registry.ErrUserRequired), field: "user_id"},
	{match: is(registry.ErrNoUserConnection), code: codes.FailedPrecondition, reason: ReasonConnectorUnavailable},
	// Not a user's missing token (the handlers answer that), but the
	// authorizing itself failing: the authorization server is down, say.
	// The connection to the MCP server is fine.
	{match: registry.IsAuthError, code: codes.Unavailable, reason: ReasonConnectorUnavailable,
		message: prefixed("authorizing the request failed: ")},
	{match: as[*registry.SessionLimitError](), code: codes.ResourceExhausted, reason: ReasonSessionLimit,
		message: func(err error) string {
			var e *registry.SessionLimitError
			errors.As(err, &e)
			return fmt.Sprintf("the connector has %d open sessions, the most MAX_SESSIONS_PER_CONNECTOR allows; "+
				"close one with CloseSession, or wait for an idle one to close", e.Limit)
		}},
	{contextChecks: true},
	// Not the caller's doing (the row above took those): the connection
	// closed under the call.
	{match: is(context.Canceled), code: codes.Unavailable, reason: ReasonConnectorUnavailable,
		message: prefixed("the connection to the MCP server closed during the call: ")},
	{match: is(registry.ErrToolNotFound), code: codes.NotFound, reason: ReasonToolNotFound},
	{match: is(registry.ErrToolDisabled), code: codes.FailedPrecondition, reason: ReasonToolDisabled,
		message: text("tool is disabled; enable it with UpdateTool")},
	{match: is(queries.ErrReplicaStopping), code: codes.Unavailable, reason: ReasonConnectorUnavailable},
	{match: is(watches.ErrStopping), code: codes.Unavailable, reason: ReasonConnectorUnavailable},
	{match: is(registry.ErrTaskUnsupported), code: codes.FailedPrecondition, reason: ReasonTaskUnsupported,
		message: func(err error) string {
			return err.Error() + ": set the connector's protocol_preference to PROTOCOL_PREFERENCE_CLASSIC"
		}},
	{match: is(store.ErrToolNotFound), code: codes.NotFound, reason: ReasonToolNotFound, message: text("tool not found")},
	{match: is(store.ErrRunNotFound), code: codes.NotFound, reason: ReasonRunNotFound,
		message: text("query run not found in this workspace")},
	{match: is(store.ErrAPIKeyNotFound), code: codes.NotFound, reason: ReasonAPIKeyNotFound,
		message: text("API key not found in this workspace")},
	{match: as[*store.ConnectorNotFoundError](), code: codes.NotFound, reason: ReasonConnectorNotFound,
		message: own[*store.ConnectorNotFoundError]()},
	{match: is(store.ErrConnectorNotFound), code: codes.NotFound, reason: ReasonConnectorNotFound, message: text("connector not found")},
	{match: is(store.ErrConflict), code: codes.AlreadyExists, reason: ReasonConnectorAlreadyExists,
		message: text("a connector with this connector_id already exists in the workspace")},
	{match: is(registry.ErrDeleted), code: codes.NotFound, reason: ReasonConnectorNotFound},
	{match: is(registry.ErrDeactivated), code: codes.FailedPrecondition, reason: ReasonConnectorInactive,
		message: func(err error) string { return err.Error() + "; activate it with ActivateConnector" }},
	// The message is the MCP server's connection error: addresses and
	// reasons, never header or env values, URL query values redacted.
	{match: is(registry.ErrUnavailable), code: codes.Unavailable, reason: ReasonConnectorUnavailable},
	{match: is(registry.ErrNotLoaded), code: codes.Unavailable, reason: ReasonConnectorUnavailable},
	{match: is(registry.ErrClosed), code: codes.Unavailable, reason: ReasonConnectorUnavailable},
	{match: is(live.ErrNoRoute), code: codes.Unavailable, reason: ReasonConnectorUnavailable},
	// Resources, prompts and completions: what the server does not offer,
	// and its own refusals (before the tool calls' rows of JSON-RPC errors).
	{match: is(resources.ErrNoResources), code: codes.FailedPrecondition, reason: ReasonNoResources},
	{match: is(resources.ErrNoPrompts), code: codes.FailedPrecondition, reason: ReasonNoPrompts},
	{match: is(resources.ErrNoCompletions), code: codes.FailedPrecondition, reason: ReasonNoCompletions},
	{match: is(registry.ErrNoSubscribe), code: codes.FailedPrecondition, reason: ReasonNoSubscribe},
	{match: is(registry.ErrSubscribeShared), code: codes.FailedPrecondition, reason: ReasonNoSubscribe},
	{match: as[*resources.UnknownPromptError](), code: codes.NotFound, reason: ReasonPromptNotFound},
	{match: as[*resources.MissingArgumentsError](), field: "arguments"},
	{match: func(err error) bool {
		var e *resources.ServerError
		return errors.As(err, &e) && errors.Is(err, mcp.ErrResourceNotFound)
	},
		code: codes.NotFound, reason: ReasonResourceNotFound, message: own[*resources.ServerError]()},
	{match: as[*resources.ServerError](), code: codes.FailedPrecondition, reason: ReasonServerRefused,
		message: own[*resources.ServerError]()},
	{match: is(mcp.ErrInvalidParams), code: codes.InvalidArgument, reason: ReasonToolExecutionFailed,
		message: prefixed("the MCP server rejected the arguments: ")},
	{match: isJSONRPCError, code: codes.FailedPrecondition, reason: ReasonToolExecutionFailed,
		message: prefixed("the MCP server answered with an error: ")},
	{match: is(llm.ErrNotConfigured), code: codes.FailedPrecondition, reason: ReasonLLMNotConfigured},
	{match: func(err error) bool { var e *llm.Error; return errors.As(err, &e) && e.Temporary() },
		code: codes.Unavailable, reason: ReasonLLMUnavailable},
	{match: as[*llm.Error](), code: codes.FailedPrecondition, reason: ReasonLLMUnavailable},
	// A replica of an earlier build: the run stays paused for an
	// upgraded one, which the retry may reach.
	{match: as[*orchestrator.NewerStateError](), code: codes.Unavailable, reason: ReasonRunStateNewer},
	{match: is(orchestrator.ErrBadPlan), code: codes.FailedPrecondition, reason: ReasonOrchestrationFailed},
	{match: is(orchestrator.ErrPanic), code: codes.Internal, reason: ReasonInternal, message: text("internal error")},
	{match: is(secret.ErrNoKey), code: codes.FailedPrecondition, reason: ReasonSecretKeyMissing,
		message: text("connector header, env and URL query values are encrypted at rest, and the service has no SECRET_KEY; " +
			"set SECRET_KEY (base64 of 32 bytes) and restart")},
	{match: is(secret.ErrOpen), code: codes.FailedPrecondition, reason: ReasonSecretsUndecryptable, log: "stored secrets do not decrypt"},
	{match: is(authorizations.ErrNotConfigured), code: codes.FailedPrecondition, reason: ReasonOAuthNotConfigured},
	{match: as[*authorizations.RequiredError](), code: codes.FailedPrecondition, reason: ReasonAuthorizationRequired,
		message: requiredMessage, metadata: requiredMetadata, detail: requiredDetail},
	{match: as[*authorizations.OwnAuthorizationError](), code: codes.FailedPrecondition, reason: ReasonAuthorizationFailed},
	{match: as[*authorizations.StepUpLimitError](), code: codes.PermissionDenied, reason: ReasonStepUpLimit},
	{match: as[*authorizations.RefusedError](), code: codes.FailedPrecondition, reason: ReasonAuthorizationFailed,
		metadata: refusedMetadata},
	{match: as[*authorizations.WrongWorkspaceError](), code: codes.PermissionDenied, reason: auth.ReasonWrongWorkspace},
	{match: as[*authorizations.NotOAuthUserError](), code: codes.FailedPrecondition, reason: ReasonNotOAuthUser,
		message: notOAuthUserMessage},
	{match: as[*authorizations.UserRequiredError](), field: "user_id", message: userRequiredMessage},
	{match: is(authorizations.ErrBadCursor), field: "page_token", message: text("not a token from a previous response")},
	// Sizes and limits only, never the content.
	{match: as[*calls.ArgumentsTooLargeError](), code: codes.ResourceExhausted, reason: ReasonArgumentsTooLarge},
	{match: as[*calls.ResultTooLargeError](), code: codes.ResourceExhausted, reason: ReasonToolResultTooLarge},
	{match: as[*calls.InputNotFoundError](), code: codes.NotFound, reason: ReasonInputNotFound},
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

// invalidOf is a use case's invalid request as the adapter's.
func invalidOf(e *queries.InvalidError) *invalidError {
	out := &invalidError{}
	for _, v := range e.Violations {
		out.violations = append(out.violations, violation{field: v.Field, problem: v.Problem})
	}
	return out
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
