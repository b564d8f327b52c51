package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/telemetry"
)

const defaultAdminAddr = "127.0.0.1:9464"

func adminFlags(fs *flag.FlagSet, cfg *config) {
	fs.StringVar(&cfg.AdminAddr, "admin-addr", defaultAdminAddr,
		"admin HTTP address: /metrics, /healthz, /readyz, and pprof if on; off turns it off (ADMIN_ADDR)")
	fs.BoolVar(&cfg.AdminPprof, "admin-pprof", false, "serve net/http/pprof under /debug/pprof/ on ADMIN_ADDR (ADMIN_PPROF)")
	fs.BoolVar(&cfg.AdminAnyAddress, "admin-any-address", false,
		"let ADMIN_ADDR be a non-loopback address; nothing it serves asks for credentials (ADMIN_ANY_ADDRESS)")
}

// readAdmin checks the admin settings and reads the metrics and traces
// exporters from the standard OTel variables. The admin address serves without
// credentials, so it stays on loopback unless the operator says otherwise.
func (cfg *config) readAdmin(otel otelEnv) error {
	if cfg.AdminAddr == "off" {
		cfg.AdminAddr = ""
	}
	switch loopback, err := isLoopback(cfg.AdminAddr); {
	case cfg.AdminAddr == "" && cfg.AdminPprof:
		return fmt.Errorf("ADMIN_PPROF needs ADMIN_ADDR: pprof is served there")
	case cfg.AdminAddr == "":
	case err != nil:
		return fmt.Errorf("ADMIN_ADDR %s: %w", cfg.AdminAddr, err)
	case !loopback && !cfg.AdminAnyAddress:
		return fmt.Errorf("refusing ADMIN_ADDR %s, which is not a loopback address: nothing there asks for credentials, and "+
			"/metrics names every workspace's connectors (pprof, if on, shows the process's memory and stacks). Serve it on "+
			"127.0.0.1, or, where only operators and your scraper reach it, set ADMIN_ANY_ADDRESS=true", cfg.AdminAddr)
	}
	var err error
	if cfg.MetricsExporters, err = telemetry.ParseExporters(otel.MetricsExporter, cfg.AdminAddr != ""); err != nil {
		return err
	}
	if slices.Contains(cfg.MetricsExporters, telemetry.ExporterPrometheus) && cfg.AdminAddr == "" {
		return fmt.Errorf("OTEL_METRICS_EXPORTER=prometheus needs ADMIN_ADDR: /metrics is served there")
	}
	if otel.SDKDisabled {
		cfg.MetricsExporters = nil
	}
	cfg.Tracing = telemetry.TracingConfig{Exporter: otel.TracesExporter, Protocol: otel.Protocol, Disabled: otel.SDKDisabled}
	cfg.OTLPProtocol, err = telemetry.ParseProtocol(otel.MetricsProtocol, otel.Protocol)
	return err
}

// observability is what serve reports to: the meter provider its parts
// record on, and whether it is ready.
type observability struct {
	meters  metric.MeterProvider
	ready   *telemetry.Readiness
	build   build // what the binary was built from: in the start-up line and a metric
	metrics *telemetry.Metrics
}

// newObservability builds the metrics exporters and binds the admin
// listener, whose job (nil without ADMIN_ADDR) serve runs last.
func newObservability(ctx context.Context, cfg config, db *store.DB, logger *slog.Logger) (observability, *adminJob, error) {
	b := readBuild()
	metrics, err := telemetry.NewMetrics(ctx, telemetry.MetricsConfig{Exporters: cfg.MetricsExporters, OTLPProtocol: cfg.OTLPProtocol,
		Build: b.attrs()})
	if err != nil {
		return observability{}, nil, err
	}
	obs := observability{meters: metrics.MeterProvider(), ready: telemetry.NewReadiness(db, telemetry.ReadinessConfig{}, logger),
		build: b, metrics: metrics}
	if cfg.AdminAddr == "" {
		return obs, nil, nil
	}
	admin, err := telemetry.ListenAdmin(telemetry.AdminConfig{Addr: cfg.AdminAddr, Metrics: metrics.Handler(),
		Ready: obs.ready, Pprof: cfg.AdminPprof}, logger)
	if err != nil {
		obs.flush(ctx, logger)
		return observability{}, nil, inUse(err, "ADMIN_ADDR (-admin-addr, or off)")
	}
	logger.InfoContext(ctx, "admin serving", slog.String("addr", admin.Addr()), slog.Bool("metrics", metrics.Handler() != nil),
		slog.Bool("pprof", cfg.AdminPprof), slog.Any("metrics_exporters", cfg.MetricsExporters))
	return obs, &adminJob{admin: admin}, nil
}

// flush pushes the metrics not exported yet.
func (o observability) flush(ctx context.Context, logger *slog.Logger) {
	flush, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := o.metrics.Shutdown(flush); err != nil {
		logger.Warn("metrics not flushed", slog.String("error", err.Error()))
	}
}
