package telemetry

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelbridge "go.opentelemetry.io/contrib/bridges/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
)

// Exporters OTEL_METRICS_EXPORTER may name.
const (
	ExporterPrometheus = "prometheus" // pulled from /metrics on the admin address
	ExporterOTLP       = "otlp"       // pushed to OTEL_EXPORTER_OTLP_(METRICS_)ENDPOINT
	ExporterNone       = "none"
)

// OTLP protocols OTEL_EXPORTER_OTLP_(METRICS_)PROTOCOL may name.
const (
	ProtocolHTTP = "http/protobuf" // the default
	ProtocolGRPC = "grpc"
)

// ParseExporters reads OTEL_METRICS_EXPORTER: a comma-separated list of
// prometheus and otlp, or none. Empty means prometheus if the admin
// address serves /metrics (admin), else none. The result holds no "none".
func ParseExporters(v string, admin bool) ([]string, error) {
	var out []string
	for _, f := range strings.Split(v, ",") {
		switch f = strings.TrimSpace(f); f {
		case "":
		case ExporterPrometheus, ExporterOTLP, ExporterNone:
			if !slices.Contains(out, f) {
				out = append(out, f)
			}
		default:
			return nil, fmt.Errorf("OTEL_METRICS_EXPORTER %q: want prometheus, otlp or none, or a comma-separated list of prometheus and otlp", v)
		}
	}
	switch {
	case len(out) == 0 && admin:
		return []string{ExporterPrometheus}, nil
	case slices.Contains(out, ExporterNone) && len(out) > 1:
		return nil, fmt.Errorf("OTEL_METRICS_EXPORTER %q: none cannot be listed with other exporters", v)
	case slices.Contains(out, ExporterNone):
		return nil, nil
	}
	return out, nil
}

// ParseProtocol reads the OTLP protocol: metricsProto
// (OTEL_EXPORTER_OTLP_METRICS_PROTOCOL) if set, else proto
// (OTEL_EXPORTER_OTLP_PROTOCOL), else http/protobuf.
func ParseProtocol(metricsProto, proto string) (string, error) {
	v := metricsProto
	if v == "" {
		v = proto
	}
	switch v {
	case "":
		return ProtocolHTTP, nil
	case ProtocolHTTP, ProtocolGRPC:
		return v, nil
	}
	return "", fmt.Errorf("OTLP protocol %q: want http/protobuf or grpc", v)
}

// MetricsConfig says where metrics go.
type MetricsConfig struct {
	// Exporters are what ParseExporters returned; none means metrics are
	// off and every instrument is a no-op.
	Exporters []string
	// OTLPProtocol is ProtocolHTTP (or empty) or ProtocolGRPC. The OTLP
	// exporter reads its endpoint, headers, timeout, and
	// OTEL_METRIC_EXPORT_INTERVAL (default 60s), from the standard OTEL_*
	// environment variables itself.
	OTLPProtocol string
	// Build labels the connector_svc.build_info gauge (always 1): the
	// version, revision and Go version the binary was built from.
	Build []attribute.KeyValue
}

// Metrics is the service's meter provider and its exporters.
type Metrics struct {
	provider metric.MeterProvider
	sdk      *sdkmetric.MeterProvider // nil when metrics are off
	handler  http.Handler             // nil without the Prometheus exporter
	// runtime gathers the Go runtime's and the process's metrics from
	// Prometheus's own collectors: /metrics serves them as they are, and
	// the OTLP exporter receives them through the Prometheus bridge.
	runtime *prometheus.Registry
	once    sync.Once
}

// NewMetrics builds the meter provider of cfg.Exporters. It starts
// nothing that needs joining: the OTLP exporter's periodic reader runs
// until Shutdown. Besides what the service's parts record, every exporter
// gets the Go runtime's metrics (go_goroutines, go_memstats_*,
// go_gc_duration_seconds, …), the process's (process_resident_memory_bytes,
// process_open_fds, process_cpu_seconds_total, …) and the build info.
func NewMetrics(ctx context.Context, cfg MetricsConfig) (*Metrics, error) {
	m := &Metrics{provider: noop.NewMeterProvider()}
	if len(cfg.Exporters) == 0 {
		return m, nil
	}
	m.runtime = prometheus.NewRegistry()
	m.runtime.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override the name.
	res, err := resource.New(ctx, resource.WithAttributes(attribute.String("service.name", "connector-svc")),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return nil, fmt.Errorf("metrics resource: %w", err)
	}
	opts := []sdkmetric.Option{sdkmetric.WithResource(res)}
	for _, e := range cfg.Exporters {
		reader, err := m.reader(ctx, e, cfg.OTLPProtocol)
		if err != nil {
			return nil, err
		}
		opts = append(opts, sdkmetric.WithReader(reader))
	}
	m.sdk = sdkmetric.NewMeterProvider(opts...)
	m.provider = m.sdk
	if err := buildInfo(m.sdk, cfg.Build); err != nil {
		return nil, err
	}
	return m, nil
}

// buildInfo registers the build info gauge: 1, labelled with build.
func buildInfo(mp metric.MeterProvider, build []attribute.KeyValue) error {
	meter := mp.Meter("github.com/connector-svc/connector-svc/internal/telemetry")
	set := metric.WithAttributeSet(attribute.NewSet(build...))
	_, err := meter.Int64ObservableGauge("connector_svc.build_info",
		metric.WithDescription("1, labelled with the version, VCS revision and Go version of the running binary."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			o.Observe(1, set)
			return nil
		}))
	if err != nil {
		return fmt.Errorf("build info gauge: %w", err)
	}
	return nil
}

// reader returns the reader of one exporter; the Prometheus one also sets
// m.handler.
func (m *Metrics) reader(ctx context.Context, exporter, protocol string) (sdkmetric.Reader, error) {
	switch exporter {
	case ExporterPrometheus:
		// A registry of our own: only the service's metrics, none of the
		// process-wide default registry's.
		reg := prometheus.NewRegistry()
		exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
		if err != nil {
			return nil, fmt.Errorf("prometheus exporter: %w", err)
		}
		m.handler = promhttp.HandlerFor(prometheus.Gatherers{reg, m.runtime}, promhttp.HandlerOpts{})
		return exp, nil
	case ExporterOTLP:
		var exp sdkmetric.Exporter
		var err error
		if protocol == ProtocolGRPC {
			exp, err = otlpmetricgrpc.New(ctx)
		} else {
			exp, err = otlpmetrichttp.New(ctx)
		}
		if err != nil {
			return nil, fmt.Errorf("otlp metric exporter: %w", err)
		}
		return sdkmetric.NewPeriodicReader(exp, sdkmetric.WithProducer(otelbridge.NewMetricProducer(otelbridge.WithGatherer(m.runtime)))), nil
	}
	return nil, fmt.Errorf("unknown metrics exporter %q", exporter)
}

// MeterProvider is what the service's parts record on: a no-op one when
// metrics are off.
func (m *Metrics) MeterProvider() metric.MeterProvider { return m.provider }

// Handler serves the Prometheus exposition of every metric; nil without
// the Prometheus exporter.
func (m *Metrics) Handler() http.Handler { return m.handler }

// Shutdown pushes what the OTLP exporter has not sent yet, within ctx,
// and stops the exporters. Safe to call twice.
func (m *Metrics) Shutdown(ctx context.Context) error {
	var err error
	m.once.Do(func() {
		if m.sdk != nil {
			err = m.sdk.Shutdown(ctx)
		}
	})
	return err
}
