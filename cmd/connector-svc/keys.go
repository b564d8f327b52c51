package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/server"
	"github.com/connector-svc/connector-svc/internal/store"
)

// keysUsage is the keys -h text. The RPCs of scope query come from the
// table the auth guard enforces.
func keysUsage() string {
	return `Usage:
  connector-svc keys create --workspace W --scope admin|query|call[,users] [--name N]
      prints the new key's token, once, and nothing else: KEY=$(connector-svc keys create …)
  connector-svc keys list --workspace W
  connector-svc keys revoke ID
      calls with the key fail at once, in every running service

A key belongs to one workspace. Scope admin: connectors, tools and keys (admin
may also query); scope query: ` + wrap(strings.Join(server.ScopeMethods(auth.ScopeQuery), ", ")+"; query may also call.", 80, len("may also query); scope query: ")) + `
Scope call: ` + wrap(strings.Join(server.ScopeMethods(auth.ScopeCall), ", ")+
		", and the MCP endpoint's tools (not its agent tools, which need query).", 80, len("Scope call: ")) + `
Scope users: the MCP endpoint takes the end user's id from the key's
X-Connector-User-Id header; add it to one of the others (call,users).
The token is csk_<id>_<secret>: its id is what list shows and revoke takes.
The database is DATABASE_URL (or -database-url before "keys").
`
}

// wrap breaks s at spaces into lines of at most width columns, the first
// of which starts at column first.
func wrap(s string, width, first int) string {
	var b strings.Builder
	col := first
	for i, w := range strings.Fields(s) {
		if i > 0 && col+1+len(w) > width {
			b.WriteString("\n")
			col = 0
		} else if i > 0 {
			b.WriteString(" ")
			col++
		}
		b.WriteString(w)
		col += len(w)
	}
	return b.String()
}

// keysCommand is one parsed `keys` subcommand, run on the key store.
type keysCommand func(ctx context.Context, keys *auth.Keys, stdout io.Writer) error

// runKeys runs `connector-svc keys …` against cfg's database. Nothing but
// the command's output reaches stdout: no log lines.
func runKeys(ctx context.Context, cfg config, args []string, stdout io.Writer) error {
	cmd, err := parseKeys(args, stdout)
	if err != nil {
		return err
	}
	db, err := openDB(ctx, cfg.DatabaseURL, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	defer db.Close()
	return cmd(ctx, auth.NewKeys(db, auth.Config{}, nil), stdout)
}

// parseKeys parses the arguments of keys. -h prints the usage to usage
// and returns flag.ErrHelp; bad arguments are a *usageError that names
// what is missing or extra.
func parseKeys(args []string, usage io.Writer) (keysCommand, error) {
	if len(args) == 0 {
		return nil, badKeys("keys: want create, list or revoke")
	}
	if args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
		fmt.Fprint(usage, keysUsage())
		return nil, flag.ErrHelp
	}
	fs := flag.NewFlagSet("connector-svc keys "+args[0], flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	workspace := fs.String("workspace", "", "the key's workspace")
	scope := fs.String("scope", "", "create: admin, query or call, with users if the key names end users on the MCP endpoint (call,users)")
	name := fs.String("name", "", "create: what the key is for")
	if err := fs.Parse(args[1:]); errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(usage, keysUsage())
		return nil, err
	} else if err != nil {
		return nil, badKeys("keys %s: %v", args[0], err)
	}
	switch args[0] {
	case "create", "list":
		if fs.NArg() > 0 {
			return nil, badKeys("keys %s takes flags only, not %q", args[0], fs.Args())
		}
		if *workspace == "" {
			return nil, badKeys("keys %s: --workspace is missing: a key belongs to one workspace", args[0])
		}
	case "revoke":
		switch fs.NArg() {
		case 1:
		case 0:
			return nil, badKeys("keys revoke: the key ID is missing (connector-svc keys list --workspace W shows them)")
		default:
			return nil, badKeys("keys revoke: want one key ID (connector-svc keys list --workspace W shows them), not %q", fs.Args())
		}
	default:
		return nil, badKeys("keys %s: unknown; want create, list or revoke", args[0])
	}
	return keysCommandOf(args[0], *workspace, *scope, *name, fs.Arg(0))
}

// keysCommandOf is the keys subcommand sub with the arguments parseKeys
// checked (create's scope is checked here); id is the key revoke revokes.
func keysCommandOf(sub, workspace, scope, name, id string) (keysCommand, error) {
	switch sub {
	case "create":
		if scope == "" {
			return nil, badKeys("keys create: --scope is missing: admin, query or call (and users: call,users)")
		}
		scopes, err := auth.ParseScopes(strings.Split(scope, ","))
		if err != nil {
			return nil, badKeys("keys create: --scope: %v", err)
		}
		return func(ctx context.Context, keys *auth.Keys, stdout io.Writer) error {
			_, token, err := keys.Create(ctx, workspace, scopes, name)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(stdout, token)
			return err
		}, nil
	case "list":
		return func(ctx context.Context, keys *auth.Keys, stdout io.Writer) error {
			return listKeys(ctx, keys, workspace, stdout)
		}, nil
	}
	return func(ctx context.Context, keys *auth.Keys, stdout io.Writer) error {
		k, err := keys.Revoke(ctx, "", id)
		if errors.Is(err, store.ErrAPIKeyNotFound) {
			return fmt.Errorf("keys revoke: no API key %q (connector-svc keys list --workspace W shows them)", id)
		}
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(stdout, "revoked API key %s of workspace %s\n", k.ID, k.WorkspaceID)
		return err
	}, nil
}

// badKeys is a keys command line that cannot run, with the keys usage.
func badKeys(format string, a ...any) error {
	return &usageError{err: fmt.Errorf(format, a...), usage: keysUsage()}
}

// listKeys prints a workspace's keys as a table, revoked ones included.
func listKeys(ctx context.Context, keys *auth.Keys, workspace string, stdout io.Writer) error {
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tSCOPES\tTOKEN\tNAME\tCREATED\tREVOKED")
	after := ""
	for {
		page, err := keys.List(ctx, workspace, after, 1000)
		if err != nil {
			return err
		}
		for _, k := range page {
			revoked := "-"
			if k.RevokedAt != nil {
				revoked = k.RevokedAt.UTC().Format(time.RFC3339)
			}
			names := make([]string, len(k.Scopes))
			for i, s := range k.Scopes {
				names[i] = string(s)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, strings.Join(names, ","), k.Masked(), k.Name,
				k.CreatedAt.UTC().Format(time.RFC3339), revoked)
		}
		if len(page) < 1000 {
			return w.Flush()
		}
		after = page[len(page)-1].ID
	}
}
