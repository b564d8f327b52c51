package server

import (
	"context"
	"log/slog"
	"testing"

	"google.golang.org/grpc/codes"
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
