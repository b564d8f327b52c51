package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/egress"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/server"
	"github.com/connector-svc/connector-svc/internal/telemetry"
)

// config is everything an operator can set. Each field has an environment
// variable; a flag of the same meaning overrides it.
type config struct {
	DatabaseURL          string
	GRPCAddr             string
	SecretKey            string // environment only: flags show up in ps
	StdioAllowedCommands []string
	RPCTimeout           time.Duration
	ShutdownGrace        time.Duration
	HealthInterval       time.Duration
	HealthConcurrency    int
	MaxIdleConns         int // per HTTP connector
	SessionIdleTTL       time.Duration
	MaxSessions          int // per per_session connector
	LLMBaseURL           string
	LLMAPIKey            string // environment only
	LLMModel             string
	EmbeddingsModel      string // on the LLM endpoint; "" is none
	QueryTimeout         time.Duration
	ApprovalTimeout      time.Duration
	RunRetention         time.Duration
	// Narrowing of large catalogs: a query of a connector with more enabled
	// tools than NarrowToolsAbove is offered the NarrowToolsTo best.
	NarrowToolsAbove, NarrowToolsTo int
	// AgentResourceBudget is how many bytes of resources one query may
	// read (read_resource).
	AgentResourceBudget int
	LogLevel            slog.Level
	// Egress CIDRs: Deny always wins; Allow opens default-refused ranges.
	EgressAllow, EgressDeny []netip.Prefix
	// Auth is when callers need API keys (AUTH).
	Auth auth.Mode

	// TLS: the server's certificate and key, and the CAs client
	// certificates must chain to (mutual TLS); all files, re-read on change.
	TLSCertFile, TLSKeyFile, TLSClientCAFile string

	// Message sizes, in bytes.
	MaxToolResultBytes    int
	MaxToolArgumentsBytes int
	GRPCMaxRecvBytes      int
	GRPCMaxSendBytes      int

	// The admin HTTP listener and metrics (admin.go); "" is off.
	AdminAddr                   string
	AdminPprof, AdminAnyAddress bool
	MetricsExporters            []string // from OTEL_METRICS_EXPORTER
	OTLPProtocol                string
	// Tracing is OTEL_TRACES_EXPORTER and friends (the SDK reads the
	// exporter's own settings, OTEL_EXPORTER_OTLP_*, itself).
	Tracing telemetry.TracingConfig

	// Cluster is how this replica takes part among those on one database.
	Cluster clusterConfig
	// InternalTLS is mutual TLS on the internal hop between replicas.
	InternalTLS internalTLSConfig

	// OAuth is how end users authorize the service on MCP servers that
	// need OAuth, and where their browsers come back to.
	OAuth oauthConfig
	// AskBack is how servers' requests for input and completions are
	// answered.
	AskBack            askBackConfig
	ElicitationTimeout time.Duration

	// MCP is the MCP endpoint's listener (mcp.go).
	MCP mcpConfig
	// Console is the web console's listener (console.go).
	Console consoleConfig

	// Conn is how the gRPC server treats its clients' connections: their
	// age (so clients balancing over replicas re-resolve), keepalive, and
	// the wait between NOT_SERVING and the drain on SIGTERM.
	Conn connConfig

	// Version is -version: print the version, read nothing else.
	Version bool
}

const defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/connector_svc?sslmode=disable"

// commands are the commands that take the service's flags, before or
// after their name; keys takes flags of its own.
var commands = []string{"serve", "migrate", "reseal", "healthcheck", "version"}

// usageError is a command line that cannot run: main prints it, then the
// usage, to stderr.
type usageError struct {
	err   error
	usage string
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// parseConfig reads flags from args, then, for each flag not given, its
// environment variable through getenv. It returns the remaining arguments:
// the command and, for keys, its arguments. -h prints the usage to stdout
// and returns flag.ErrHelp; a bad command line is a *usageError. Help
// shows the built-in defaults, never the environment's values: those may
// hold secrets (a DATABASE_URL password).
func parseConfig(args []string, getenv func(string) string, stdout io.Writer) (config, []string, error) {
	fs, cfg, v := newFlagSet()
	rest, err := parseArgs(fs, args)
	command := "serve"
	if len(rest) > 0 {
		command = rest[0]
	}
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, commandUsage(fs, command))
		return config{}, nil, err
	}
	if err != nil {
		return config{}, nil, &usageError{err: err, usage: commandUsage(fs, command)}
	}
	// The commands with arguments of their own: a bad one, or -h, before
	// anything is read from the environment.
	switch command {
	case "keys":
		if _, err := parseKeys(rest[1:], stdout); err != nil {
			return config{}, nil, err
		}
	case "oauth":
		issuer, err := parseOAuth(rest[1:], commandUsage(fs, "oauth"), stdout)
		if err != nil {
			return config{}, nil, err
		}
		rest = []string{"oauth", issuer}
	}
	if cfg.Version || rest[0] == "version" {
		return config{Version: true}, rest, nil // whatever the environment holds
	}
	if err := setFromEnv(fs, getenv); err != nil {
		return config{}, nil, err
	}
	if err := cfg.read(v, getenv); err != nil {
		return config{}, nil, err
	}
	return *cfg, rest, nil
}

// flagValues are the settings read as text, parsed by config.read.
type flagValues struct {
	mcpOrigins                                                                                          string
	allowed, rpcTimeout, grace, level, health, queryTimeout, idleTTL, egressAllow, egressDeny, authMode string
	approvalTimeout, runRetention, replicaTTL, reconcile, oauthStateTTL, oauthReturnTo, oauthProxies    string
	conn                                                                                                connFlags
}

// newFlagSet registers every setting's flag: its name, built-in default
// and usage.
func newFlagSet() (*flag.FlagSet, *config, *flagValues) {
	cfg, v := &config{}, &flagValues{}
	fs := flag.NewFlagSet("connector-svc", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // the errors are returned; the usage printed by the caller's choice
	fs.Usage = func() {}
	fs.StringVar(&cfg.DatabaseURL, "database-url", defaultDatabaseURL, "Postgres URL; the database is created if missing (DATABASE_URL)")
	fs.StringVar(&cfg.GRPCAddr, "grpc-addr", "127.0.0.1:50051", "address to serve gRPC on (GRPC_ADDR)")
	fs.StringVar(&v.allowed, "stdio-allowed-commands", "", "comma-separated commands stdio connectors may run (STDIO_ALLOWED_COMMANDS)")
	fs.StringVar(&v.rpcTimeout, "rpc-timeout", "30s", "deadline of an RPC whose caller sets none (RPC_TIMEOUT)")
	fs.StringVar(&v.grace, "shutdown-grace", "10s", "how long SIGTERM waits for in-flight RPCs (SHUTDOWN_GRACE)")
	fs.StringVar(&v.health, "health-interval", "30s", "between tools/list health checks of each connector (HEALTH_INTERVAL)")
	fs.IntVar(&cfg.HealthConcurrency, "health-concurrency", 16, "MCP connects and health checks running at once (HEALTH_CONCURRENCY)")
	fs.IntVar(&cfg.MaxIdleConns, "mcp-http-max-idle-conns-per-connector", 128,
		"idle HTTP connections kept for reuse per host by each of the 4 transports the SSE and streamable-HTTP connectors of one origin share; calls beyond it at once open new ones: keep it above the calls an origin runs at once, twice is ample (MCP_HTTP_MAX_IDLE_CONNS_PER_CONNECTOR)")
	fs.StringVar(&v.idleTTL, "session-idle-ttl", "15m", "a per-session connection unused this long closes (SESSION_IDLE_TTL)")
	fs.IntVar(&cfg.MaxSessions, "max-sessions-per-connector", 64, "open sessions a per_session connector may have (MAX_SESSIONS_PER_CONNECTOR)")
	fs.StringVar(&cfg.LLMBaseURL, "llm-base-url", "", "OpenAI-compatible endpoint, e.g. http://localhost:11434/v1; empty disables queries (LLM_BASE_URL)")
	fs.StringVar(&cfg.LLMModel, "llm-model", "", "default model of the connector agents (LLM_MODEL)")
	fs.StringVar(&cfg.EmbeddingsModel, "embeddings-model", "",
		"embeddings model on the LLM endpoint, for ranking the tools of large catalogs by meaning too; empty ranks by words (EMBEDDINGS_MODEL)")
	fs.StringVar(&v.queryTimeout, "query-timeout", "2m", "deadline of a query whose caller sets none (QUERY_TIMEOUT)")
	fs.StringVar(&v.approvalTimeout, "approval-timeout", "24h", "a query run paused for approval expires when nobody decides for this long (APPROVAL_TIMEOUT)")
	fs.StringVar(&v.runRetention, "run-retention", "720h", "a finished query run's record is kept this long (RUN_RETENTION)")
	fs.IntVar(&cfg.NarrowToolsAbove, "narrow-tools-above", orchestrator.DefaultNarrowAbove,
		"a query of a connector with more enabled tools than this is offered only the best-fitting ones, and search_tools (NARROW_TOOLS_ABOVE)")
	fs.IntVar(&cfg.NarrowToolsTo, "narrow-tools-to", orchestrator.DefaultNarrowTo, "how many tools a narrowed query is offered (NARROW_TOOLS_TO)")
	fs.IntVar(&cfg.AgentResourceBudget, "agent-resource-budget-bytes", orchestrator.DefaultResourceBudget,
		"how many bytes of a connector's resources one query's agent may read with read_resource (AGENT_RESOURCE_BUDGET_BYTES)")
	fs.StringVar(&v.level, "log-level", "info", "debug, info, warn or error (LOG_LEVEL)")
	fs.StringVar(&v.egressAllow, "egress-allow-cidrs", "", "comma-separated CIDRs HTTP connectors may reach though refused by default (EGRESS_ALLOW_CIDRS)")
	fs.StringVar(&v.egressDeny, "egress-deny-cidrs", "", "comma-separated CIDRs HTTP connectors may never reach; wins over the allow list (EGRESS_DENY_CIDRS)")
	fs.StringVar(&v.authMode, "auth", string(auth.ModeAuto),
		"when callers need API keys: auto (once a key exists), keys, none (loopback only) or none-any-address (AUTH)")
	sizeFlags(fs, cfg)
	tlsFlags(fs, cfg)
	adminFlags(fs, cfg)
	mcpFlags(fs, &cfg.MCP, &v.mcpOrigins)
	consoleFlags(fs, &cfg.Console)
	clusterFlags(fs, &cfg.Cluster, &v.replicaTTL, &v.reconcile)
	internalTLSFlags(fs, &cfg.InternalTLS)
	oauthFlags(fs, &cfg.OAuth, &v.oauthStateTTL, &v.oauthReturnTo, &v.oauthProxies)
	askBackFlags(fs, &cfg.AskBack)
	v.conn.register(fs)
	fs.BoolVar(&cfg.Version, "version", false, "print the version and exit, as the version command does")
	return fs, cfg, v
}

// read parses and checks the settings given as text, those read from the
// environment only, and the sub-configurations.
func (cfg *config) read(v *flagValues, getenv func(string) string) error {
	var err error
	cfg.SecretKey = getenv("SECRET_KEY")
	cfg.LLMAPIKey = getenv("LLM_API_KEY")
	otel := readOTelEnv(getenv)
	cfg.StdioAllowedCommands = splitList(v.allowed)

	if cfg.RPCTimeout, err = positiveDuration("RPC_TIMEOUT", v.rpcTimeout); err != nil {
		return err
	}
	if cfg.ShutdownGrace, err = positiveDuration("SHUTDOWN_GRACE", v.grace); err != nil {
		return err
	}
	if cfg.ApprovalTimeout, err = positiveDuration("APPROVAL_TIMEOUT", v.approvalTimeout); err != nil {
		return err
	}
	if cfg.RunRetention, err = positiveDuration("RUN_RETENTION", v.runRetention); err != nil {
		return err
	}
	if cfg.QueryTimeout, err = positiveDuration("QUERY_TIMEOUT", v.queryTimeout); err != nil {
		return err
	}
	if cfg.ElicitationTimeout, err = positiveDuration("ELICITATION_TIMEOUT", cfg.AskBack.ElicitationTimeout); err != nil {
		return err
	}
	if err := cfg.AskBack.Sampling.check(); err != nil {
		return err
	}
	if cfg.EmbeddingsModel != "" && cfg.LLMBaseURL == "" {
		return fmt.Errorf("EMBEDDINGS_MODEL needs LLM_BASE_URL: the embeddings come from the same endpoint")
	}
	if (cfg.LLMBaseURL == "") != (cfg.LLMModel == "") {
		return fmt.Errorf("set both LLM_BASE_URL and LLM_MODEL, or neither (queries are then disabled)")
	}
	if cfg.HealthInterval, err = positiveDuration("HEALTH_INTERVAL", v.health); err != nil {
		return err
	}
	return cfg.readLimits(v, otel)
}

// readLimits reads the limits, the modes and the sub-configurations.
func (cfg *config) readLimits(v *flagValues, otel otelEnv) error {
	var err error
	if cfg.HealthConcurrency <= 0 {
		return fmt.Errorf("HEALTH_CONCURRENCY %d: want a positive number", cfg.HealthConcurrency)
	}
	if cfg.MaxIdleConns <= 0 {
		return fmt.Errorf("MCP_HTTP_MAX_IDLE_CONNS_PER_CONNECTOR %d: want a positive number", cfg.MaxIdleConns)
	}
	if cfg.SessionIdleTTL, err = positiveDuration("SESSION_IDLE_TTL", v.idleTTL); err != nil {
		return err
	}
	if cfg.MaxSessions <= 0 {
		return fmt.Errorf("MAX_SESSIONS_PER_CONNECTOR %d: want a positive number", cfg.MaxSessions)
	}
	if cfg.AgentResourceBudget <= 0 {
		return fmt.Errorf("AGENT_RESOURCE_BUDGET_BYTES %d: want a positive number of bytes", cfg.AgentResourceBudget)
	}
	if cfg.NarrowToolsAbove <= 0 || cfg.NarrowToolsTo <= 0 {
		return fmt.Errorf("NARROW_TOOLS_ABOVE %d, NARROW_TOOLS_TO %d: want positive numbers", cfg.NarrowToolsAbove, cfg.NarrowToolsTo)
	}
	if cfg.Auth, err = auth.ParseMode(v.authMode); err != nil {
		return err
	}
	if err := cfg.LogLevel.UnmarshalText([]byte(v.level)); err != nil {
		return fmt.Errorf("LOG_LEVEL %q: want debug, info, warn or error", v.level)
	}
	if err := cfg.checkSizes(); err != nil {
		return err
	}
	if err := cfg.checkTLS(); err != nil {
		return err
	}
	if err := cfg.readAdmin(otel); err != nil {
		return err
	}
	if err := cfg.Console.read(*cfg); err != nil {
		return err
	}
	if err := cfg.MCP.read(v.mcpOrigins, *cfg); err != nil {
		return err
	}
	if err := cfg.Cluster.read(v.replicaTTL, v.reconcile); err != nil {
		return err
	}
	if err := cfg.InternalTLS.check(); err != nil {
		return err
	}
	if err := cfg.OAuth.read(v.oauthStateTTL, v.oauthReturnTo, v.oauthProxies); err != nil {
		return err
	}
	if cfg.Conn, err = v.conn.read(max(cfg.QueryTimeout, cfg.RPCTimeout)); err != nil {
		return err
	}
	if cfg.EgressAllow, err = egress.ParsePrefixes(v.egressAllow); err != nil {
		return fmt.Errorf("EGRESS_ALLOW_CIDRS: %w", err)
	}
	if cfg.EgressDeny, err = egress.ParsePrefixes(v.egressDeny); err != nil {
		return fmt.Errorf("EGRESS_DENY_CIDRS: %w", err)
	}
	return nil
}

// otelEnv are the standard OTel variables the service reads itself; the
// SDK's exporters read their own (telemetry.SetupTracing names them).
type otelEnv struct {
	MetricsExporter, TracesExporter string // OTEL_METRICS_EXPORTER, OTEL_TRACES_EXPORTER
	Protocol, MetricsProtocol       string // OTEL_EXPORTER_OTLP_PROTOCOL, OTEL_EXPORTER_OTLP_METRICS_PROTOCOL
	SDKDisabled                     bool   // OTEL_SDK_DISABLED=true
}

func readOTelEnv(getenv func(string) string) otelEnv {
	return otelEnv{MetricsExporter: getenv("OTEL_METRICS_EXPORTER"), TracesExporter: getenv("OTEL_TRACES_EXPORTER"),
		Protocol: getenv("OTEL_EXPORTER_OTLP_PROTOCOL"), MetricsProtocol: getenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"),
		SDKDisabled: getenv("OTEL_SDK_DISABLED") == "true"}
}

// devConfig is what the development commands (dev-model, dev-certs) take
// from the environment: none of the service's settings.
type devConfig struct {
	ModelAddr string // DEV_MODEL_ADDR; "" is devmodel.DefaultAddr
	CertsDir  string // DEV_CERTS_DIR; "" is devCertsDir
}

func readDevConfig(getenv func(string) string) devConfig {
	return devConfig{ModelAddr: strings.TrimSpace(getenv("DEV_MODEL_ADDR")), CertsDir: strings.TrimSpace(getenv("DEV_CERTS_DIR"))}
}

// parseArgs parses the flags, the command ("serve" if none) and the flags
// after a command that takes them, and returns the command and, for keys
// and oauth, its arguments. An error after the command (-h included)
// comes with the command.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	rest := fs.Args()
	switch {
	case len(rest) == 0:
		return []string{"serve"}, nil
	case rest[0] == "keys", rest[0] == "oauth":
		return rest, nil
	case !slices.Contains(commands, rest[0]):
		return nil, fmt.Errorf("unknown command %q: want %s, keys or oauth", rest[0], strings.Join(commands, ", "))
	}
	if err := fs.Parse(rest[1:]); err != nil {
		return rest[:1], fmt.Errorf("%s: %w", rest[0], err)
	}
	if fs.NArg() > 0 {
		return rest[:1], fmt.Errorf("%s takes flags only, not %q", rest[0], fs.Args())
	}
	return rest[:1], nil
}

// usageText is the usage printUsage prints.
func usageText(fs *flag.FlagSet) string {
	var b strings.Builder
	printUsage(fs, &b)
	return b.String()
}

// printUsage is the -h text, and serve's: the commands, the flags with
// their built-in defaults, and the settings that are environment only
// (each other command's -h is commandUsage's). The values a
// setting takes come from the code that reads it.
func printUsage(fs *flag.FlagSet, w io.Writer) {
	fmt.Fprintf(w, "Usage: connector-svc [flags] [serve|migrate|reseal|healthcheck|version] [flags]\n"+
		"       connector-svc [flags] keys create|list|revoke ...\n"+
		"       connector-svc [flags] oauth forget-registration <issuer>\n\n"+
		"  serve        apply migrations, then serve gRPC (default)\n"+
		"  migrate      apply migrations and exit\n"+
		"  keys         create, list or revoke API keys\n"+
		"  oauth        forget-registration <issuer>: drop the service's stored client registration with an\n"+
		"               authorization server that no longer knows it; the next authorization registers again\n"+
		"  reseal       seal every stored secret again under the first SECRET_KEY, and exit\n"+
		"  healthcheck  ask the service at GRPC_ADDR for its gRPC health; exit 0 if SERVING, else 1\n"+
		"  version      print the version, VCS revision and Go version the binary was built from (also -version)\n"+
		"  dev-model    development only: serve a scripted stand-in for an OpenAI-compatible model\n"+
		"  dev-certs    development only: make TLS certificates into .dev/tls\n\n"+
		"connector-svc <command> -h shows a command's usage and the settings it reads.\n\n"+
		"Flags, before or after the command (for keys, before it: keys has flags of its own). Each overrides\n"+
		"the environment variable named; defaults are the built-in ones:\n")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
	fmt.Fprintf(w, "\nEnvironment only (a flag would show in ps):\n"+
		"  SECRET_KEY   base64 of 32 random bytes (openssl rand -base64 32) sealing connector secrets;\n"+
		"               several, comma-separated, to rotate: the first seals, all open\n"+
		"  LLM_API_KEY  bearer key for LLM_BASE_URL\n"+
		"\nOpenTelemetry, environment only (the standard variables):\n"+
		"  OTEL_METRICS_EXPORTER  %s (default: /metrics on ADMIN_ADDR), %s, both comma-separated, or %s\n"+
		"  OTEL_TRACES_EXPORTER   %s (default %s); OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES name the spans\n"+
		"  OTEL_EXPORTER_OTLP_*   where otlp pushes: endpoint, protocol (%s or %s), headers\n",
		telemetry.ExporterPrometheus, telemetry.ExporterOTLP, telemetry.ExporterNone,
		orList(telemetry.TraceExporters()), "none", telemetry.ProtocolHTTP, telemetry.ProtocolGRPC)
	fmt.Fprintf(w, "\n%s\n", readBuild())
}

// orList is "a, b or c".
func orList(vs []string) string {
	if len(vs) < 2 {
		return strings.Join(vs, "")
	}
	return strings.Join(vs[:len(vs)-1], ", ") + " or " + vs[len(vs)-1]
}

func sizeFlags(fs *flag.FlagSet, cfg *config) {
	fs.IntVar(&cfg.MaxToolResultBytes, "max-tool-result-bytes", server.DefaultMaxToolResultBytes,
		"largest tool result CallTool returns, and the most contexts a query response carries (MAX_TOOL_RESULT_BYTES)")
	fs.IntVar(&cfg.MaxToolArgumentsBytes, "max-tool-arguments-bytes", server.DefaultMaxToolArgumentsBytes,
		"largest CallTool arguments (MAX_TOOL_ARGUMENTS_BYTES)")
	fs.IntVar(&cfg.GRPCMaxRecvBytes, "grpc-max-recv-bytes", server.DefaultMaxRecvBytes,
		"largest gRPC message the service receives (GRPC_MAX_RECV_BYTES)")
	fs.IntVar(&cfg.GRPCMaxSendBytes, "grpc-max-send-bytes", server.DefaultMaxSendBytes,
		"largest gRPC message the service sends (GRPC_MAX_SEND_BYTES)")
}

func tlsFlags(fs *flag.FlagSet, cfg *config) {
	fs.StringVar(&cfg.TLSCertFile, "tls-cert-file", "", "PEM certificate (then intermediates) to serve TLS with; empty serves plaintext (TLS_CERT_FILE)")
	fs.StringVar(&cfg.TLSKeyFile, "tls-key-file", "", "PEM private key of TLS_CERT_FILE (TLS_KEY_FILE)")
	fs.StringVar(&cfg.TLSClientCAFile, "tls-client-ca-file", "", "PEM CAs that client certificates must chain to; set, clients without one are refused (TLS_CLIENT_CA_FILE)")
}

func (cfg config) checkTLS() error {
	if (cfg.TLSCertFile == "") != (cfg.TLSKeyFile == "") {
		return fmt.Errorf("set both TLS_CERT_FILE and TLS_KEY_FILE, or neither")
	}
	if cfg.TLSClientCAFile != "" && cfg.TLSCertFile == "" {
		return fmt.Errorf("TLS_CLIENT_CA_FILE needs TLS_CERT_FILE and TLS_KEY_FILE")
	}
	return nil
}

// setFromEnv sets each flag not given in args from its environment
// variable, if set: the flag's name in upper case with '_' for '-'
// (database-url: DATABASE_URL).
func setFromEnv(fs *flag.FlagSet, getenv func(string) string) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		name := strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if f.Name == "version" { // a command, not a setting: VERSION may mean anything
			return
		}
		v := getenv(name)
		if err != nil || given[f.Name] || v == "" {
			return
		}
		if setErr := f.Value.Set(v); setErr != nil {
			err = fmt.Errorf("%s %q: %s", name, v, wantOf(f))
		}
	})
	return err
}

// checkSizes wants each cap below the gRPC limit it lives in: otherwise
// gRPC refuses first, with no reason.
func (cfg config) checkSizes() error {
	for _, v := range []struct {
		name string
		n    int
	}{{"MAX_TOOL_RESULT_BYTES", cfg.MaxToolResultBytes}, {"MAX_TOOL_ARGUMENTS_BYTES", cfg.MaxToolArgumentsBytes},
		{"GRPC_MAX_RECV_BYTES", cfg.GRPCMaxRecvBytes}, {"GRPC_MAX_SEND_BYTES", cfg.GRPCMaxSendBytes}} {
		if v.n <= 0 {
			return fmt.Errorf("%s: want a positive number of bytes", v.name)
		}
	}
	if cfg.MaxToolResultBytes >= cfg.GRPCMaxSendBytes {
		return fmt.Errorf("MAX_TOOL_RESULT_BYTES %d must be below GRPC_MAX_SEND_BYTES %d", cfg.MaxToolResultBytes, cfg.GRPCMaxSendBytes)
	}
	if cfg.MaxToolArgumentsBytes >= cfg.GRPCMaxRecvBytes {
		return fmt.Errorf("MAX_TOOL_ARGUMENTS_BYTES %d must be below GRPC_MAX_RECV_BYTES %d", cfg.MaxToolArgumentsBytes, cfg.GRPCMaxRecvBytes)
	}
	return nil
}

func positiveDuration(name, v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s %q: want a positive duration such as 30s", name, v)
	}
	return d, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// connConfig is the gRPC server's connection policy (GRPC_MAX_CONNECTION_AGE
// and friends, SHUTDOWN_DELAY).
type connConfig struct {
	// MaxAge closes a client's connection (GOAWAY, ±10 % jitter) after
	// it, so a client balancing over a headless Service resolves again
	// and reaches new replicas; MaxAgeGrace is how long the calls under
	// way on it may still run.
	MaxAge, MaxAgeGrace time.Duration
	// KeepaliveTime is how long a connection may be silent before the
	// server pings it; KeepaliveTimeout, how long it waits for the ack
	// before closing it.
	KeepaliveTime, KeepaliveTimeout time.Duration
	// ShutdownDelay is how long SIGTERM keeps serving, reporting
	// NOT_SERVING, before the drain.
	ShutdownDelay time.Duration
}

// keepaliveMinTime is how often a client may ping (keepalive enforcement):
// a client pinging more often is sent GOAWAY too_many_pings.
const keepaliveMinTime = 10 * time.Second

// connFlags holds the connection settings as given.
type connFlags struct{ age, grace, kaTime, kaTimeout, delay string }

func (f *connFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.age, "grpc-max-connection-age", "5m",
		"a client's connection is closed with GOAWAY after this (±10%), so clients resolve again and spread over new replicas (GRPC_MAX_CONNECTION_AGE)")
	fs.StringVar(&f.grace, "grpc-max-connection-age-grace", "",
		"how long calls under way on a connection closed for its age may still run; at least QUERY_TIMEOUT and RPC_TIMEOUT; "+
			"empty is the larger of them plus 30s (GRPC_MAX_CONNECTION_AGE_GRACE)")
	fs.StringVar(&f.kaTime, "grpc-keepalive-time", "1m",
		"the server pings a connection silent this long; clients may ping every "+keepaliveMinTime.String()+" at most, even without calls (GRPC_KEEPALIVE_TIME)")
	fs.StringVar(&f.kaTimeout, "grpc-keepalive-timeout", "20s", "a connection whose ping is not acknowledged within this is closed (GRPC_KEEPALIVE_TIMEOUT)")
	fs.StringVar(&f.delay, "shutdown-delay", "0s",
		"on SIGTERM, how long to keep serving while gRPC health and /readyz say NOT_SERVING, before the drain; "+
			"on Kubernetes a preStop sleep does this (SHUTDOWN_DELAY)")
}

// read checks the connection settings. longest is the longest deadline
// the service gives a call whose caller sets none: a connection closed for
// its age must let such a call finish.
func (f connFlags) read(longest time.Duration) (connConfig, error) {
	var c connConfig
	var err error
	if c.MaxAge, err = positiveDuration("GRPC_MAX_CONNECTION_AGE", f.age); err != nil {
		return c, err
	}
	c.MaxAgeGrace = longest + 30*time.Second
	if f.grace != "" {
		if c.MaxAgeGrace, err = positiveDuration("GRPC_MAX_CONNECTION_AGE_GRACE", f.grace); err != nil {
			return c, err
		}
	}
	if c.MaxAgeGrace < longest {
		return c, fmt.Errorf("GRPC_MAX_CONNECTION_AGE_GRACE %v is below QUERY_TIMEOUT and RPC_TIMEOUT (%v): a call under way on a "+
			"connection closed for its age would be cut; raise it, or leave it empty for %v", c.MaxAgeGrace, longest, longest+30*time.Second)
	}
	if c.KeepaliveTime, err = positiveDuration("GRPC_KEEPALIVE_TIME", f.kaTime); err != nil {
		return c, err
	}
	if c.KeepaliveTimeout, err = positiveDuration("GRPC_KEEPALIVE_TIMEOUT", f.kaTimeout); err != nil {
		return c, err
	}
	if c.ShutdownDelay, err = time.ParseDuration(f.delay); err != nil || c.ShutdownDelay < 0 || c.ShutdownDelay > maxShutdownDelay {
		return c, fmt.Errorf("SHUTDOWN_DELAY %q: want a duration from 0 to %v, such as 5s", f.delay, maxShutdownDelay)
	}
	return c, nil
}

// maxShutdownDelay bounds SHUTDOWN_DELAY: while it lasts, a replica that got
// SIGTERM only waits, and a second signal does not cut it short.
const maxShutdownDelay = 10 * time.Minute

// wantOf says what a flag's value must look like, for an environment
// variable that does not parse (the flag package says only "parse error").
func wantOf(f *flag.Flag) string {
	switch f.Value.(interface{ Get() any }).Get().(type) {
	case bool:
		return "want true or false"
	case int, int64, uint, uint64:
		return "want a whole number"
	case float64:
		return "want a number"
	case time.Duration:
		return "want a duration such as 30s"
	}
	return "not a valid value"
}
