package rpcmw

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestRPCLevel(t *testing.T) {
	expired, cancel := context.WithTimeout(context.Background(), 0)
	defer cancel()
	live := context.Background()
	for _, tt := range []struct {
		ctx  context.Context
		code codes.Code
		want slog.Level
	}{
		{live, codes.OK, slog.LevelInfo},
		{live, codes.Internal, slog.LevelError},
		{live, codes.Unknown, slog.LevelError},
		{live, codes.Unavailable, slog.LevelWarn},
		{live, codes.DeadlineExceeded, slog.LevelWarn}, // ours: RPC_TIMEOUT, a call timeout
		{expired, codes.DeadlineExceeded, slog.LevelInfo},
		{live, codes.InvalidArgument, slog.LevelInfo},
		{live, codes.NotFound, slog.LevelInfo},
		{live, codes.PermissionDenied, slog.LevelInfo},
		{live, codes.Unauthenticated, slog.LevelInfo},
		{live, codes.FailedPrecondition, slog.LevelInfo},
		{live, codes.AlreadyExists, slog.LevelInfo},
		{live, codes.ResourceExhausted, slog.LevelInfo},
		{expired, codes.Canceled, slog.LevelInfo},
	} {
		if got := rpcLevel(tt.ctx, tt.code); got != tt.want {
			t.Errorf("rpcLevel(%v, caller's deadline passed %t) = %v; want %v", tt.code, tt.ctx.Err() != nil, got, tt.want)
		}
	}
}

// TestCallerCode: an RPC whose context was cancelled at its deadline, as a
// gRPC server sees a caller's deadline pass when the caller's cancel
// arrives first, is logged with the code the caller got.
func TestCallerCode(t *testing.T) {
	atDeadline, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	cancel() // the caller's cancel, a moment before the deadline
	early, cancel := context.WithTimeout(context.Background(), time.Hour)
	cancel()
	expired, cancel := context.WithTimeout(context.Background(), 0)
	defer cancel()
	for _, tt := range []struct {
		name string
		ctx  context.Context
		err  error
		want codes.Code
	}{
		{"cancelled at its deadline", atDeadline, context.Canceled, codes.DeadlineExceeded},
		{"past its deadline", expired, context.DeadlineExceeded, codes.DeadlineExceeded},
		{"cancelled well before its deadline", early, context.Canceled, codes.Canceled},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// A status made elsewhere (gRPC's own, say) is logged the same.
			if got := callerCode(tt.ctx, status.FromContextError(tt.err).Code()); got != tt.want {
				t.Errorf("callerCode(%v) = %v; want %v", status.FromContextError(tt.err).Code(), got, tt.want)
			}
		})
	}
	if got := callerCode(atDeadline, codes.Unavailable); got != codes.Unavailable {
		t.Errorf("callerCode(Unavailable) at the deadline = %v; want it as it is", got)
	}
}
