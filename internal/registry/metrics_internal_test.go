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
			defer c.pool.close()
			res := &mcp.CallToolResult{}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				r.metrics.called(ctx, c, "search_issues", 250*time.Microsecond, res, nil)
			}
		})
	}
}
