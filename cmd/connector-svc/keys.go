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
	"github.com/connector-svc/connector-svc/internal/store"
)

const keysUsage = `Usage:
  connector-svc keys create --workspace W --scope admin[,query] [--name N]
      prints the new key's token, once, and nothing else: KEY=$(connector-svc keys create …)
  connector-svc keys list --workspace W
  connector-svc keys revoke ID
      calls with the key fail at once, in every running service

A key belongs to one workspace. Scope admin: connectors, tools and keys (admin
may also query); scope query: CallTool, QueryConnector, StreamQueryConnector,
ListSessions, CloseSession. The token is csk_<id>_<secret>: its id is what list
shows and revoke takes. The database is DATABASE_URL (or -database-url before
"keys").
`

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

func parseKeys(args []string, usage io.Writer) (keysCommand, error) {
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
		fmt.Fprint(usage, keysUsage)
		if len(args) > 0 {
			return nil, flag.ErrHelp
		}
		return nil, errors.New("keys: want create, list or revoke")
	}
	fs := flag.NewFlagSet("connector-svc keys "+args[0], flag.ContinueOnError)
	fs.SetOutput(usage)
	fs.Usage = func() { fmt.Fprint(usage, keysUsage) }
	workspace := fs.String("workspace", "", "the key's workspace")
	scope := fs.String("scope", "", "create: admin, query or admin,query")
	name := fs.String("name", "", "create: what the key is for")
	if err := fs.Parse(args[1:]); err != nil {
		return nil, err
	}
	switch {
	case args[0] == "create" && fs.NArg() == 0:
		scopes, err := auth.ParseScopes(strings.Split(*scope, ","))
		if err != nil || *workspace == "" {
			return nil, fmt.Errorf("keys create: want --workspace W --scope admin[,query]: %v", err)
		}
		return func(ctx context.Context, keys *auth.Keys, stdout io.Writer) error {
			_, token, err := keys.Create(ctx, *workspace, scopes, *name)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(stdout, token)
			return err
		}, nil
	case args[0] == "list" && fs.NArg() == 0 && *workspace != "":
		return func(ctx context.Context, keys *auth.Keys, stdout io.Writer) error {
			return listKeys(ctx, keys, *workspace, stdout)
		}, nil
	case args[0] == "revoke" && fs.NArg() == 1:
		id := fs.Arg(0)
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
	fmt.Fprint(usage, keysUsage)
	return nil, fmt.Errorf("keys %s: bad arguments %q", args[0], args[1:])
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
