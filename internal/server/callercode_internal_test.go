package server

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestCallerCode: an RPC whose context was cancelled at its deadline, as a
// gRPC server sees a caller's deadline pass when the caller's cancel
// arrives first, is mapped with the code the caller got (and logged so:
// rpcmw's TestCallerCode).
func TestCallerCode(t *testing.T) {
	atDeadline, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	cancel() // the caller's cancel, a moment before the deadline
	early, cancel := context.WithTimeout(context.Background(), time.Hour)
	cancel()
	expired, cancel := context.WithTimeout(context.Background(), 0)
	defer cancel()
	s := &Server{logger: slog.New(slog.DiscardHandler)}
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
			if got := status.Code(s.toStatus(tt.ctx, tt.err)); got != tt.want {
				t.Errorf("toStatus(%v) = %v; want %v", tt.err, got, tt.want)
			}
		})
	}
}
