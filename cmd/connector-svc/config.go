package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"
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
	LLMBaseURL           string
	LLMAPIKey            string // environment only
	LLMModel             string
	QueryTimeout         time.Duration
	LogLevel             slog.Level
}

const defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/connector_svc?sslmode=disable"

// parseConfig reads the environment through getenv, then flags from args.
// It returns the remaining arguments (the subcommand).
func parseConfig(args []string, getenv func(string) string, usage io.Writer) (config, []string, error) {
	env := func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
	fs := flag.NewFlagSet("connector-svc", flag.ContinueOnError)
	fs.SetOutput(usage)
	fs.Usage = func() {
		fmt.Fprintf(usage, "Usage: connector-svc [flags] [serve|migrate]\n\n"+
			"  serve    apply migrations, then serve gRPC (default)\n"+
			"  migrate  apply migrations and exit\n\nFlags (each overrides the environment variable named):\n")
		fs.PrintDefaults()
	}
	var cfg config
	var allowed, rpcTimeout, grace, level, health, queryTimeout string
	fs.StringVar(&cfg.DatabaseURL, "database-url", env("DATABASE_URL", defaultDatabaseURL), "Postgres URL; the database is created if missing (DATABASE_URL)")
	fs.StringVar(&cfg.GRPCAddr, "grpc-addr", env("GRPC_ADDR", "127.0.0.1:50051"), "address to serve gRPC on (GRPC_ADDR)")
	fs.StringVar(&allowed, "stdio-allowed-commands", env("STDIO_ALLOWED_COMMANDS", ""), "comma-separated commands stdio connectors may run (STDIO_ALLOWED_COMMANDS)")
	fs.StringVar(&rpcTimeout, "rpc-timeout", env("RPC_TIMEOUT", "30s"), "deadline of an RPC whose caller sets none (RPC_TIMEOUT)")
	fs.StringVar(&grace, "shutdown-grace", env("SHUTDOWN_GRACE", "10s"), "how long SIGTERM waits for in-flight RPCs (SHUTDOWN_GRACE)")
	fs.StringVar(&health, "health-interval", env("HEALTH_INTERVAL", "30s"), "between tools/list health checks of each connector (HEALTH_INTERVAL)")
	fs.IntVar(&cfg.HealthConcurrency, "health-concurrency", envInt(getenv, "HEALTH_CONCURRENCY", 16), "MCP connects and health checks running at once (HEALTH_CONCURRENCY)")
	fs.StringVar(&cfg.LLMBaseURL, "llm-base-url", env("LLM_BASE_URL", ""), "OpenAI-compatible endpoint, e.g. http://localhost:11434/v1; empty disables queries (LLM_BASE_URL)")
	fs.StringVar(&cfg.LLMModel, "llm-model", env("LLM_MODEL", ""), "default model of the connector agents (LLM_MODEL)")
	fs.StringVar(&queryTimeout, "query-timeout", env("QUERY_TIMEOUT", "2m"), "deadline of a query whose caller sets none (QUERY_TIMEOUT)")
	fs.StringVar(&level, "log-level", env("LOG_LEVEL", "info"), "debug, info, warn or error (LOG_LEVEL)")
	if err := fs.Parse(args); err != nil {
		return config{}, nil, err
	}
	cfg.SecretKey = getenv("SECRET_KEY")
	cfg.LLMAPIKey = getenv("LLM_API_KEY")
	cfg.StdioAllowedCommands = splitList(allowed)

	var err error
	if cfg.RPCTimeout, err = positiveDuration("RPC_TIMEOUT", rpcTimeout); err != nil {
		return config{}, nil, err
	}
	if cfg.ShutdownGrace, err = positiveDuration("SHUTDOWN_GRACE", grace); err != nil {
		return config{}, nil, err
	}
	if cfg.QueryTimeout, err = positiveDuration("QUERY_TIMEOUT", queryTimeout); err != nil {
		return config{}, nil, err
	}
	if (cfg.LLMBaseURL == "") != (cfg.LLMModel == "") {
		return config{}, nil, fmt.Errorf("set both LLM_BASE_URL and LLM_MODEL, or neither (queries are then disabled)")
	}
	if cfg.HealthInterval, err = positiveDuration("HEALTH_INTERVAL", health); err != nil {
		return config{}, nil, err
	}
	if cfg.HealthConcurrency <= 0 {
		return config{}, nil, fmt.Errorf("HEALTH_CONCURRENCY %d: want a positive number", cfg.HealthConcurrency)
	}
	if err := cfg.LogLevel.UnmarshalText([]byte(level)); err != nil {
		return config{}, nil, fmt.Errorf("LOG_LEVEL %q: want debug, info, warn or error", level)
	}
	return cfg, fs.Args(), nil
}

// envInt reads an integer variable; a value that is not one becomes -1,
// which the caller's check reports.
func envInt(getenv func(string) string, name string, def int) int {
	v := getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return -1
	}
	return n
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
