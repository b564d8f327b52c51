// Package telemetrytest gives tests a meter provider whose metrics they
// read when they like, by name and attributes, and a fake OpenTelemetry
// collector that keeps the spans exported to it over OTLP.
package telemetrytest

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Meters is an SDK meter provider with a manual reader.
type Meters struct {
	Provider *sdkmetric.MeterProvider
	reader   *sdkmetric.ManualReader
}

// New returns Meters shut down when t ends.
func New(t testing.TB) *Meters {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return &Meters{Provider: mp, reader: reader}
}

// Point returns the value of metric name's data point with exactly attrs
// (for a histogram, its count), and whether there is one.
func (m *Meters) Point(t testing.TB, name string, attrs ...attribute.KeyValue) (float64, bool) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := m.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	want := attribute.NewSet(attrs...)
	for _, sm := range rm.ScopeMetrics {
		for _, md := range sm.Metrics {
			if md.Name != name {
				continue
			}
			switch d := md.Data.(type) {
			case metricdata.Sum[int64]:
				return find(d.DataPoints, want, intAttrs, intValue)
			case metricdata.Gauge[int64]:
				return find(d.DataPoints, want, intAttrs, intValue)
			case metricdata.Histogram[float64]:
				return find(d.DataPoints, want,
					func(p metricdata.HistogramDataPoint[float64]) attribute.Set { return p.Attributes },
					func(p metricdata.HistogramDataPoint[float64]) float64 { return float64(p.Count) })
			default:
				t.Fatalf("metric %s is a %T", name, md.Data)
			}
		}
	}
	return 0, false
}

// Value is Point's value, 0 when there is none.
func (m *Meters) Value(t testing.TB, name string, attrs ...attribute.KeyValue) float64 {
	t.Helper()
	v, _ := m.Point(t, name, attrs...)
	return v
}

func intAttrs(p metricdata.DataPoint[int64]) attribute.Set { return p.Attributes }
func intValue(p metricdata.DataPoint[int64]) float64       { return float64(p.Value) }

// Attrs are string attributes from key, value pairs.
func Attrs(kv ...string) []attribute.KeyValue {
	out := make([]attribute.KeyValue, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, attribute.String(kv[i], kv[i+1]))
	}
	return out
}

// find returns the value of the point with attributes want.
func find[P any](points []P, want attribute.Set, attrs func(P) attribute.Set, value func(P) float64) (float64, bool) {
	for _, p := range points {
		if got := attrs(p); got.Equals(&want) {
			return value(p), true
		}
	}
	return 0, false
}
