package server

import (
	"context"
	"errors"
	"log/slog"

	"github.com/mark3labs/mcp-go/mcp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/connector-svc/connector-svc/internal/llm"
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
	ReasonStdioCommandNotAllowed = "STDIO_COMMAND_NOT_ALLOWED"
	ReasonSecretKeyMissing       = "SECRET_KEY_MISSING"
	ReasonSecretsUndecryptable   = "SECRETS_UNDECRYPTABLE"
	ReasonConnectorInactive      = "CONNECTOR_INACTIVE"
	ReasonConnectorUnavailable   = "CONNECTOR_UNAVAILABLE"
	ReasonToolDisabled           = "TOOL_DISABLED"
	ReasonToolExecutionFailed    = "TOOL_EXECUTION_FAILED"
	ReasonRateLimited            = "RATE_LIMITED"
	ReasonLLMNotConfigured       = "LLM_NOT_CONFIGURED"
	ReasonLLMUnavailable         = "LLM_UNAVAILABLE"
	ReasonOrchestrationFailed    = "MCP_ORCHESTRATION_FAILED"
	ReasonInternal               = "INTERNAL"
)

// newStatus builds a status error with an ErrorInfo detail.
func newStatus(code codes.Code, reason, msg string) error {
	st := status.New(code, msg)
	withInfo, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: errorDomain})
	if err != nil {
		return st.Err()
	}
	return withInfo.Err()
}

// toStatus is the one place domain errors become gRPC statuses. Status
// errors pass through; unknown errors become a generic INTERNAL, logged once
// here with the RPC's context.
func (s *Server) toStatus(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if st, ok := status.FromError(err); ok {
		return st.Err()
	}
	var invalid *invalidError
	var llmErr *llm.Error
	switch {
	case errors.As(err, &invalid):
		return invalidStatus(invalid)
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, "deadline exceeded")
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, "canceled")
	case errors.Is(err, store.ErrToolNotFound):
		return newStatus(codes.NotFound, ReasonToolNotFound, "tool not found")
	case errors.Is(err, store.ErrConnectorNotFound):
		return newStatus(codes.NotFound, ReasonConnectorNotFound, "connector not found")
	case errors.Is(err, store.ErrConflict):
		return newStatus(codes.AlreadyExists, ReasonConnectorAlreadyExists, "a connector with this connector_id already exists in the workspace")
	case errors.Is(err, registry.ErrUnavailable), errors.Is(err, registry.ErrNotLoaded), errors.Is(err, registry.ErrClosed):
		// The message is the MCP server's connection error: addresses and
		// reasons, never header or env values.
		return newStatus(codes.Unavailable, ReasonConnectorUnavailable, err.Error())
	case errors.Is(err, mcp.ErrInvalidParams):
		return newStatus(codes.InvalidArgument, ReasonToolExecutionFailed, "the MCP server rejected the arguments: "+err.Error())
	case isJSONRPCError(err):
		return newStatus(codes.FailedPrecondition, ReasonToolExecutionFailed, "the MCP server answered with an error: "+err.Error())
	case errors.Is(err, llm.ErrNotConfigured):
		return newStatus(codes.FailedPrecondition, ReasonLLMNotConfigured, err.Error())
	case errors.As(err, &llmErr) && llmErr.Temporary():
		return newStatus(codes.Unavailable, ReasonLLMUnavailable, err.Error())
	case errors.As(err, &llmErr):
		return newStatus(codes.FailedPrecondition, ReasonLLMUnavailable, err.Error())
	case errors.Is(err, orchestrator.ErrBadPlan):
		return newStatus(codes.FailedPrecondition, ReasonOrchestrationFailed, err.Error())
	case errors.Is(err, orchestrator.ErrPanic):
		return newStatus(codes.Internal, ReasonInternal, "internal error")
	case errors.Is(err, secret.ErrNoKey):
		return newStatus(codes.FailedPrecondition, ReasonSecretKeyMissing,
			"connector headers and env values are encrypted at rest, and the service has no SECRET_KEY; set SECRET_KEY (base64 of 32 bytes) and restart")
	case errors.Is(err, secret.ErrOpen):
		s.logger.ErrorContext(ctx, "stored secrets do not decrypt", slog.String("error", err.Error()))
		return newStatus(codes.FailedPrecondition, ReasonSecretsUndecryptable, err.Error())
	default:
		s.logger.ErrorContext(ctx, "internal error", slog.String("error", err.Error()))
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
