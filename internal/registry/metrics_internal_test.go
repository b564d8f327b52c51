package registry

import (
	"context"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// BenchmarkRecordCall is the cost of recording one successful call: on
// the SDK (what a call pays with metrics on) and on none.
func BenchmarkRecordCall(b *testing.B) {
	for _, tt := range []struct {
		name string
		mp   metric.MeterProvider
	}{{"off", nil}, {"on", sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))}} {
		b.Run(tt.name, func(b *testing.B) {
			r := New(nil, Config{MeterProvider: tt.mp}, nil)
			c := newConn(r, Spec{ID: 1, WorkspaceID: "acme", ConnectorID: "github", Transport: TransportStreamableHTTP})
			defer c.pool.Close()
			res := &mcp.CallToolResult{}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				r.metrics.called(ctx, c, "search_issues", 250*time.Microsecond, res, nil)
			}
		})
	}
}

// TestErrorKindFollowsTheDeadline: a call the caller's deadline ended is
// a timeout though the service saw a cancel (gRPC cancels the handler's
// context when the caller's deadline passes, a moment before the
// handler's own copy of it); a cancel well before the deadline is not.
func TestErrorKindFollowsTheDeadline(t *testing.T) {
	atDeadline, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	cancel()
	early, cancel := context.WithTimeout(context.Background(), time.Hour)
	cancel()
	for _, tt := range []struct {
		name string
		ctx  context.Context
		err  error
		want string
	}{
		{"deadline exceeded", context.Background(), context.DeadlineExceeded, "timeout"},
		{"cancelled at the deadline", atDeadline, context.Canceled, "timeout"},
		{"cancelled by the caller", early, context.Canceled, "canceled"},
		{"unavailable", context.Background(), ErrUnavailable, "unavailable"},
	} {
		if got := errorKind(tt.ctx, nil, tt.err); got != tt.want {
			t.Errorf("%s: kind %q, want %q", tt.name, got, tt.want)
		}
	}
}
