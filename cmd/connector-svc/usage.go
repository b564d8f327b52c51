package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// commandHelp is what a command's -h says: its synopsis, what it does, the
// flags (service settings) it reads, and the environment-only settings it
// reads. serve reads every setting: its -h is the whole usage.
type commandHelp struct {
	synopsis, what string
	flags          []string
	env            []string
}

// secretKeyEnv is the SECRET_KEY line of a command's -h.
const secretKeyEnv = "SECRET_KEY   base64 of 32 random bytes; several, comma-separated, to rotate: the first seals, all open"

// commandHelps are the commands other than serve and keys (keysUsage).
var commandHelps = map[string]commandHelp{
	"migrate": {
		synopsis: "[flags] migrate [flags]",
		what:     "Applies the migrations in the database (created if missing) and exits; applying twice is a no-op.",
		flags:    []string{"database-url", "log-level"},
	},
	"reseal": {
		synopsis: "[flags] reseal [flags]",
		what: "Seals every stored secret (connectors' headers, env and URL query values, OAuth tokens and clients) again\n" +
			"under the first SECRET_KEY, and exits; the keys after it can then be retired.",
		flags: []string{"database-url", "log-level"},
		env:   []string{secretKeyEnv},
	},
	"healthcheck": {
		synopsis: "[flags] healthcheck [flags]",
		what: "Asks the service at GRPC_ADDR for its gRPC health: prints SERVING and exits 0, else exits 1. A wildcard\n" +
			"host (0.0.0.0, ::) is dialled on loopback. With the service's TLS settings it speaks TLS, trusting the\n" +
			"certificate in TLS_CERT_FILE, and under mutual TLS (TLS_CLIENT_CA_FILE) presents it as its client\n" +
			"certificate. It needs no database and no SECRET_KEY.",
		flags: []string{"grpc-addr", "tls-cert-file", "tls-key-file", "tls-client-ca-file"},
	},
	"version": {
		synopsis: "version | -version",
		what:     "Prints the version, VCS revision and Go version the binary was built from; reads no setting.",
	},
	"oauth": {
		synopsis: "[flags] oauth forget-registration <issuer>",
		what: "Drops the service's stored client registrations (for every callback URL) with the authorization server\n" +
			"<issuer>, the issuer as ListAuthorizations shows it: for a server that forgot them (its consent page\n" +
			"answers invalid_client). The next authorization registers again.",
		flags: []string{"database-url"},
		env:   []string{secretKeyEnv},
	},
}

// commandUsage is command's -h text. fs holds the service's flags, with
// their built-in defaults: the environment's values are never shown.
func commandUsage(fs *flag.FlagSet, command string) string {
	h, ok := commandHelps[command]
	if !ok { // serve: every setting
		return usageText(fs)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Usage: connector-svc %s\n\n%s\n", h.synopsis, h.what)
	if len(h.flags) > 0 {
		where := "before or after the command"
		if command == "oauth" {
			where = "before the command"
		}
		fmt.Fprintf(&b, "\nFlags, %s; each overrides the environment variable named:\n", where)
		sub := flag.NewFlagSet("", flag.ContinueOnError)
		for _, name := range h.flags {
			f := fs.Lookup(name)
			sub.Var(f.Value, f.Name, f.Usage)
			sub.Lookup(name).DefValue = f.DefValue // a flag given before -h is not a default
		}
		sub.SetOutput(&b)
		sub.PrintDefaults()
	}
	if len(h.env) > 0 {
		b.WriteString("\nEnvironment only (a flag would show in ps):\n")
		for _, e := range h.env {
			fmt.Fprintf(&b, "  %s\n", e)
		}
	}
	return b.String()
}

// parseOAuth parses the arguments of oauth, forget-registration and the
// issuer, and returns the issuer. -h, after oauth or after
// forget-registration, prints text, the oauth usage, to usage and returns
// flag.ErrHelp; anything else is a *usageError.
func parseOAuth(args []string, text string, usage io.Writer) (issuer string, err error) {
	fs := flag.NewFlagSet("connector-svc oauth", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err = fs.Parse(args) // oauth has no flags: only -h
	rest := fs.Args()
	if err == nil && len(rest) > 0 {
		sub := rest[0]
		err = fs.Parse(rest[1:])
		rest = append([]string{sub}, fs.Args()...)
	}
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(usage, text)
		return "", err
	}
	if err != nil || len(rest) != 2 || rest[0] != "forget-registration" {
		return "", &usageError{err: fmt.Errorf("oauth %q: want oauth forget-registration <issuer>, the issuer as "+
			"ListAuthorizations shows it", args), usage: text}
	}
	return rest[1], nil
}
