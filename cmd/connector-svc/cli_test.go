package main

import (
	"bytes"
	"errors"
	"flag"
	"io"
	neturl "net/url"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/server"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
	"github.com/connector-svc/connector-svc/internal/telemetry"
)

// TestVersion: version, -version and --version print the build info and
// nothing else, whatever the environment holds; the start-up line carries
// the same version.
func TestVersion(t *testing.T) {
	want := "connector-svc " + readBuild().Version
	for _, args := range [][]string{{"version"}, {"-version"}, {"--version"}, {"-log-level", "debug", "version"}} {
		var out bytes.Buffer
		if err := run(testCtx(t), args, getenv(map[string]string{"LOG_LEVEL": "loud", "VERSION": "x"}), &out); err != nil {
			t.Errorf("run %v: %v", args, err)
			continue
		}
		if got := out.String(); !strings.HasPrefix(got, want) || !strings.Contains(got, runtime.Version()) || strings.Count(got, "\n") != 1 {
			t.Errorf("run %v printed %q; want one line starting %q, naming %s", args, got, want, runtime.Version())
		}
	}
	svc := start(t, storetest.NewURL(t), nil)
	if line := logLine(t, svc.out.String(), "serving"); !strings.Contains(line, `"version":"`+readBuild().Version+`"`) {
		t.Errorf("the start-up line has no version: %s", line)
	}
}

// logLine is the first line of log whose msg is msg.
func logLine(t *testing.T, log, msg string) string {
	t.Helper()
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, `"msg":"`+msg+`"`) {
			return line
		}
	}
	t.Fatalf("no log line %q in:\n%s", msg, log)
	return ""
}

// TestFlagsAfterTheCommand: the commands that take the service's flags
// take them after their name too; serve -h is the help.
func TestFlagsAfterTheCommand(t *testing.T) {
	url := storetest.NewURL(t)
	if err := run(testCtx(t), []string{"migrate", "-database-url", url}, getenv(nil), io.Discard); err != nil {
		t.Errorf("migrate -database-url …: %v", err)
	}
	var out bytes.Buffer
	if err := run(testCtx(t), []string{"serve", "-h"}, getenv(nil), &out); !errors.Is(err, flag.ErrHelp) || !strings.Contains(out.String(), "Usage:") {
		t.Errorf("serve -h = %v, printed %q; want the usage and flag.ErrHelp", err, out.String())
	}
	for args, want := range map[string]string{
		"migrate -nope":          "migrate: flag provided but not defined: -nope",
		"migrate now":            `migrate takes flags only, not ["now"]`,
		"frobnicate":             `unknown command "frobnicate": want serve, migrate, reseal, healthcheck, version, keys or oauth`,
		"keys list -grpc-addr x": "keys list: flag provided but not defined: -grpc-addr",
	} {
		err := run(testCtx(t), strings.Fields(args), getenv(nil), io.Discard)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("run %s = %v; want an error saying %q", args, err, want)
		}
	}
}

// TestUsageGoesWithTheError: -h prints the usage to stdout; a bad command
// line prints nothing there and returns a *usageError, which main prints
// with the usage to stderr.
func TestUsageGoesWithTheError(t *testing.T) {
	for _, tt := range []struct {
		args      []string
		wantUsage string
	}{
		{[]string{"-nope"}, "Usage: connector-svc"},
		{[]string{"serve", "-health-concurrency", "many"}, "Usage: connector-svc"},
		{[]string{"keys"}, "connector-svc keys create"},
		{[]string{"keys", "create", "--scope", "admin"}, "connector-svc keys create"},
		{[]string{"keys", "rotate"}, "connector-svc keys create"},
	} {
		var out bytes.Buffer
		err := run(testCtx(t), tt.args, getenv(nil), &out)
		var usage *usageError
		if !errors.As(err, &usage) || !strings.Contains(usage.usage, tt.wantUsage) {
			t.Errorf("run %v = %v; want a usage error with the usage", tt.args, err)
		}
		if out.Len() > 0 {
			t.Errorf("run %v printed to stdout: %q", tt.args, out.String())
		}
	}
}

// TestHelpListsEveryValue: -h lists every value of the settings whose
// values come from the code that reads them.
func TestHelpListsEveryValue(t *testing.T) {
	var out bytes.Buffer
	if err := run(testCtx(t), []string{"-h"}, getenv(nil), &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("run -h = %v", err)
	}
	lines := map[string]string{}
	for _, line := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			lines[f[0]] = line
		}
	}
	for setting, values := range map[string][]string{
		"OTEL_TRACES_EXPORTER":  telemetry.TraceExporters(),
		"OTEL_METRICS_EXPORTER": {telemetry.ExporterPrometheus, telemetry.ExporterOTLP, telemetry.ExporterNone},
		"OTEL_EXPORTER_OTLP_*":  {telemetry.ProtocolHTTP, telemetry.ProtocolGRPC},
	} {
		for _, v := range values {
			if !strings.Contains(lines[setting], v) {
				t.Errorf("-h does not list %s for %s: %q", v, setting, lines[setting])
			}
		}
	}
	if !strings.Contains(out.String(), "-version") {
		t.Error("-h does not show -version")
	}
}

// TestKeysHelpListsTheQueryScope: keys -h names every RPC the guard lets a
// query key call.
func TestKeysHelpListsTheQueryScope(t *testing.T) {
	var out bytes.Buffer
	if err := run(testCtx(t), []string{"keys", "-h"}, getenv(nil), &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("keys -h = %v", err)
	}
	methods := server.ScopeMethods(auth.ScopeQuery)
	for _, m := range methods {
		if !strings.Contains(out.String(), m) {
			t.Errorf("keys -h does not name %s, which a query key may call:\n%s", m, out.String())
		}
	}
	for _, m := range server.ScopeMethods(auth.ScopeCall) {
		if !strings.Contains(out.String(), m) {
			t.Errorf("keys -h does not name %s, which a call key may call:\n%s", m, out.String())
		}
	}
	if len(methods) < 9 {
		t.Errorf("the query scope has %d RPCs: %v", len(methods), methods)
	}
}

// TestFirstKeyIsLogged: a service running without keys (AUTH=auto) logs
// that keys are now required when the first one is created, by the CLI on
// its database or by CreateApiKey.
func TestFirstKeyIsLogged(t *testing.T) {
	const msg = "API keys are now required"
	t.Run("by the CLI", func(t *testing.T) {
		url := storetest.NewURL(t)
		svc := start(t, url, nil)
		createKey(t, url, "acme", "admin")
		waitLog(t, svc, msg)
	})
	t.Run("by CreateApiKey", func(t *testing.T) {
		svc := start(t, storetest.NewURL(t), nil)
		_, err := connectorv1.NewConnectorServiceClient(dial(t, svc.addr)).CreateApiKey(testCtx(t), &connectorv1.CreateApiKeyRequest{
			WorkspaceId: "acme", Scopes: []connectorv1.ApiKeyScope{connectorv1.ApiKeyScope_API_KEY_SCOPE_ADMIN}})
		if err != nil {
			t.Fatal(err)
		}
		waitLog(t, svc, msg)
		if n := strings.Count(svc.out.String(), msg); n != 1 {
			t.Errorf("%q logged %d times", msg, n)
		}
	})
}

// waitLog waits until svc has logged a line containing s.
func waitLog(t *testing.T, svc *service, s string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(svc.out.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("the service never logged %q:\n%s", s, svc.out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSecondInstanceOnTheSameAddresses: a second service on the first's
// gRPC or admin address says another connector-svc probably runs there.
func TestSecondInstanceOnTheSameAddresses(t *testing.T) {
	url := storetest.NewURL(t)
	first := start(t, url, nil)
	for name, args := range map[string][]string{
		"admin": {"-admin-addr", first.admin, "-grpc-addr", "127.0.0.1:0"},
		"gRPC":  {"-admin-addr", "127.0.0.1:0", "-grpc-addr", first.addr},
	} {
		err := run(testCtx(t), append([]string{"-database-url", url}, args...), getenv(nil), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "another connector-svc is probably running there") {
			t.Errorf("%s address in use: run = %v; want it to say another connector-svc is probably running", name, err)
		}
	}
}

// TestCommandHelp: each command's -h prints that command's usage, short,
// with the settings it reads and not the others, exits 0 (flag.ErrHelp),
// and reads neither the environment nor the database: -h is never taken
// for an argument (oauth's issuer). A flag given before -h is not shown as
// a default.
func TestCommandHelp(t *testing.T) {
	// An unreachable database and settings that do not parse: none is read.
	env := map[string]string{"DATABASE_URL": "postgres://postgres@127.0.0.1:1/x", "LOG_LEVEL": "loud", "SECRET_KEY": "short"}
	for _, tt := range []struct {
		args      string
		want, not []string
	}{
		{"migrate -h", []string{"Usage: connector-svc [flags] migrate", "-database-url", "-log-level"}, []string{"-grpc-addr", "SECRET_KEY"}},
		{"reseal -h", []string{"Usage: connector-svc [flags] reseal", "-database-url", "SECRET_KEY"}, []string{"-grpc-addr"}},
		{"healthcheck -h", []string{"Usage: connector-svc [flags] healthcheck", "-grpc-addr", "-tls-cert-file", "-tls-client-ca-file"},
			[]string{"-database-url", "Environment only"}},
		{"version -h", []string{"Usage: connector-svc version"}, []string{"-database-url"}},
		{"oauth -h", []string{"Usage: connector-svc [flags] oauth forget-registration <issuer>", "-database-url", "SECRET_KEY"}, []string{"-grpc-addr"}},
		{"oauth forget-registration -h", []string{"Usage: connector-svc [flags] oauth forget-registration <issuer>"}, []string{"-grpc-addr"}},
		{"oauth forget-registration --help", []string{"Usage: connector-svc [flags] oauth forget-registration <issuer>"}, nil},
		{"-database-url postgres://u:hunter2@db/x oauth forget-registration -h", []string{"forget-registration <issuer>"}, []string{"hunter2"}},
		{"-database-url postgres://u:hunter2@db/x migrate -h", []string{"migrate"}, []string{"hunter2"}},
		{"keys -h", []string{"connector-svc keys create"}, []string{"-grpc-addr"}},
		{"keys create -h", []string{"connector-svc keys create"}, []string{"-grpc-addr"}},
		{"serve -h", []string{"Usage: connector-svc", "-grpc-addr", "-database-url"}, nil},
	} {
		var out bytes.Buffer
		err := run(testCtx(t), strings.Fields(tt.args), getenv(env), &out)
		if !errors.Is(err, flag.ErrHelp) {
			t.Errorf("%s = %v; want flag.ErrHelp (exit 0)", tt.args, err)
		}
		for _, w := range tt.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("%s does not say %q:\n%s", tt.args, w, out.String())
			}
		}
		for _, n := range tt.not {
			if strings.Contains(out.String(), n) {
				t.Errorf("%s says %q:\n%s", tt.args, n, out.String())
			}
		}
		if n := strings.Count(out.String(), "\n"); n > 30 && !strings.HasPrefix(tt.args, "serve") {
			t.Errorf("%s printed %d lines; want the command's usage only:\n%s", tt.args, n, out.String())
		}
	}
}

// TestOAuthCommandLine: oauth's command line is checked before the
// database is opened; the real binary exits 0 on -h and 2 on a bad line,
// with the oauth usage on stderr.
func TestOAuthCommandLine(t *testing.T) {
	for _, args := range []string{"oauth", "oauth forget", "oauth forget-registration", "oauth forget-registration a b",
		"oauth -nope", "oauth forget-registration https://as.example.com -h"} {
		err := run(testCtx(t), strings.Fields(args), getenv(map[string]string{"DATABASE_URL": "postgres://postgres@127.0.0.1:1/x"}), io.Discard)
		var usage *usageError
		if !errors.As(err, &usage) || !strings.Contains(usage.usage, "oauth forget-registration <issuer>") {
			t.Errorf("%s = %v; want a usage error with the oauth usage, before the database", args, err)
		}
	}
	svc, _ := binaries(t)
	for args, want := range map[string]int{"oauth -h": 0, "oauth forget-registration -h": 0, "migrate -h": 0, "oauth forget": 2} {
		cmd := exec.Command(svc, strings.Fields(args)...)
		cmd.Env = append(os.Environ(), "DATABASE_URL=postgres://postgres@127.0.0.1:1/x")
		out, _ := cmd.CombinedOutput()
		if got := cmd.ProcessState.ExitCode(); got != want || !strings.Contains(string(out), "Usage: connector-svc") {
			t.Errorf("connector-svc %s exited %d, printed:\n%s\nwant exit %d and the usage", args, got, out, want)
		}
	}
}

// TestPostgresHintOnlyWhenRefused: the hint to start Postgres comes with
// a refused connection only, not with a malformed URL or a role the
// server does not know.
func TestPostgresHintOnlyWhenRefused(t *testing.T) {
	const hint = "pg_ctlcluster"
	u, err := neturl.Parse(storetest.NewURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = neturl.User("no_such_role_" + strconv.Itoa(os.Getpid()))
	for name, tt := range map[string]struct {
		url, want string
		hint      bool
	}{
		"refused":            {"postgres://postgres@127.0.0.1:1/x?sslmode=disable", "connection refused", true},
		"refused, localhost": {"postgres://postgres@localhost:1/x?sslmode=disable", "connection refused", true},
		"malformed":          {"postgres://%zz", "not a valid postgres:// URL", false},
		"unknown role":       {u.String(), "28000", false},
	} {
		err := run(testCtx(t), []string{"-database-url", tt.url, "migrate"}, getenv(nil), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: run = %v; want an error saying %q", name, err, tt.want)
			continue
		}
		if got := strings.Contains(err.Error(), hint); got != tt.hint {
			t.Errorf("%s: the error has the Postgres hint: %v, want %v:\n%v", name, got, tt.hint, err)
		}
	}
}
