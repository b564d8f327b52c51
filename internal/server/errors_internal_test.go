package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/connector-svc/connector-svc/internal/calls"
	"github.com/connector-svc/connector-svc/internal/connectors"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/queries"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/store"
)

// TestErrorTable maps the use cases' typed errors, wrapped as the layers
// wrap them, to their statuses and reasons, with their own messages.
func TestErrorTable(t *testing.T) {
	s := &Server{logger: slog.New(slog.DiscardHandler)}
	wrap := func(err error) error { return fmt.Errorf("call tool: %w", err) }
	for _, tt := range []struct {
		err    error
		code   codes.Code
		reason string
		msg    string
	}{
		{wrap(&store.ConnectorNotFoundError{WorkspaceID: "ws", ConnectorID: "c"}), codes.NotFound, ReasonConnectorNotFound,
			`connector "c" not found in workspace "ws"`},
		{wrap(calls.ErrInactive), codes.FailedPrecondition, ReasonConnectorInactive, "call tool: " + calls.ErrInactive.Error()},
		{wrap(&calls.ApprovalRequiredError{Tool: "wipe"}), codes.FailedPrecondition, ReasonApprovalRequired, ""},
		{wrap(&calls.RateLimitedError{Limit: store.RateLimit{RequestsPerSecond: 1, Burst: 2}}), codes.ResourceExhausted, ReasonRateLimited, ""},
		{wrap(&calls.InputRequiredError{URLHosts: "auth.example.com", Unary: true}), codes.FailedPrecondition, ReasonInputRequired, ""},
		{wrap(&connectors.CommandNotAllowedError{Command: "bash"}), codes.FailedPrecondition, ReasonStdioCommandNotAllowed, ""},
		{wrap(&orchestrator.NewerStateError{Version: 3}), codes.Unavailable, ReasonRunStateNewer, ""},
		{wrap(&registry.SessionLimitError{Limit: 7}), codes.ResourceExhausted, ReasonSessionLimit, ""},
		{&queries.RunNotAwaitingError{Msg: "the run is completed"}, codes.FailedPrecondition, ReasonRunNotAwaiting, "the run is completed"},
		{&queries.RunNotAwaitingInputError{Msg: "not open"}, codes.FailedPrecondition, ReasonRunNotAwaitingInput, "not open"},
		{&queries.RunExpiredError{Waited: "input"}, codes.FailedPrecondition, ReasonRunExpired,
			"the run waited for input longer than APPROVAL_TIMEOUT allows and expired; ask again with QueryConnector"},
		{queries.ErrRunTaken, codes.Aborted, ReasonRunTaken, queries.ErrRunTaken.Error()},
		{&queries.RunElsewhereError{}, codes.Unavailable, ReasonConnectorUnavailable, ""},
		{wrap(queries.ErrReplicaStopping), codes.Unavailable, ReasonConnectorUnavailable, ""},
		{&queries.InvalidError{Violations: []queries.Violation{{Field: "decisions", Problem: "required"}}}, codes.InvalidArgument,
			ReasonInvalidArgument, "invalid request: decisions: required"},
		{wrap(registry.ErrToolDisabled), codes.FailedPrecondition, ReasonToolDisabled, "tool is disabled; enable it with UpdateTool"},
		{wrap(context.Canceled), codes.Unavailable, ReasonConnectorUnavailable, ""},
		{errors.New("something nobody mapped"), codes.Internal, ReasonInternal, "internal error"},
	} {
		st := status.Convert(s.toStatus(context.Background(), tt.err))
		var reason string
		for _, d := range st.Details() {
			if info, ok := d.(*errdetails.ErrorInfo); ok {
				reason = info.GetReason()
			}
		}
		if st.Code() != tt.code || reason != tt.reason || (tt.msg != "" && st.Message() != tt.msg) {
			t.Errorf("toStatus(%v) = %v %s %q; want %v %s %q", tt.err, st.Code(), reason, st.Message(), tt.code, tt.reason, tt.msg)
		}
	}
}

// TestErrorTableContextChecks: the caller's own deadline and cancellation
// are theirs, at their place in the table's order.
func TestErrorTableContextChecks(t *testing.T) {
	s := &Server{logger: slog.New(slog.DiscardHandler)}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	for _, tt := range []struct {
		ctx  context.Context
		err  error
		code codes.Code
	}{
		{context.Background(), fmt.Errorf("call: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{cancelled, fmt.Errorf("call: %w", context.Canceled), codes.Canceled},
		{expired, fmt.Errorf("call: %w", context.Canceled), codes.DeadlineExceeded},
		// The session limit comes before the context in the table.
		{cancelled, fmt.Errorf("%w: %w", &registry.SessionLimitError{Limit: 1}, context.Canceled), codes.ResourceExhausted},
	} {
		if got := status.Code(s.toStatus(tt.ctx, tt.err)); got != tt.code {
			t.Errorf("toStatus(%v) = %v, want %v", tt.err, got, tt.code)
		}
	}
}
