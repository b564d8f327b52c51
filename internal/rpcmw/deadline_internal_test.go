package rpcmw

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
)

// TestDeadline: a unary RPC whose caller set no deadline gets its
// method's own, or the default; a caller's deadline stays as it is.
func TestDeadline(t *testing.T) {
	m := newMiddleware(Config{DefaultTimeout: time.Minute, Timeouts: map[string]time.Duration{"/s/Slow": time.Hour}})
	left := func(ctx context.Context, method string) time.Duration {
		var d time.Duration
		_, _ = m.deadlineUnary(ctx, nil, &grpc.UnaryServerInfo{FullMethod: method}, func(ctx context.Context, _ any) (any, error) {
			deadline, ok := ctx.Deadline()
			if !ok {
				t.Fatalf("%s: no deadline", method)
			}
			d = time.Until(deadline)
			return nil, nil
		})
		return d
	}
	if d := left(context.Background(), "/s/Fast"); d > time.Minute || d < 50*time.Second {
		t.Errorf("default deadline in %v; want a minute", d)
	}
	if d := left(context.Background(), "/s/Slow"); d > time.Hour || d < 59*time.Minute {
		t.Errorf("the method's own deadline in %v; want an hour", d)
	}
	callers, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if d := left(callers, "/s/Slow"); d > time.Second {
		t.Errorf("the caller's deadline became %v; want its second", d)
	}
}
