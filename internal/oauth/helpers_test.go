package oauth

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	mcpclient "github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/mcptest"
	"github.com/connector-svc/connector-svc/internal/oauthtest"
	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

func TestMain(m *testing.M) { os.Exit(storetest.Main(m)) }

// redirectURL is the callback the tests' Managers name; nothing listens
// there: oauthtest's Authorize returns the redirect without following it.
const redirectURL = "http://127.0.0.1:9/oauth/callback"

// env is one test's database, key and captured logs, shared by the
// Managers (replicas) the test makes.
type env struct {
	t    *testing.T
	url  string
	db   *store.DB
	key  []byte // box's key
	box  *secret.Box
	logs *syncBuffer

	mu   sync.Mutex
	errs []string // every error the test saw, for the canary checks
}

func newEnv(t *testing.T) *env {
	t.Helper()
	u := storetest.NewURL(t)
	db, err := store.Open(context.Background(), u, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	box, err := secret.NewBox(key)
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, url: u, db: db, key: key, box: box, logs: &syncBuffer{}}
}

// manager is a new Manager (replica) on e's database; mod changes its
// configuration first.
func (e *env) manager(mod func(*Config)) *Manager {
	e.t.Helper()
	cfg := Config{
		DB: e.db, Box: e.box, RedirectURL: redirectURL,
		ReturnToAllowed: []string{"https://app.example/"},
		Logger:          slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if mod != nil {
		mod(&cfg)
	}
	m, err := New(cfg)
	if err != nil {
		e.t.Fatalf("New: %v", err)
	}
	return m
}

// connector stores a connector of workspace ws and returns it as the
// package sees it.
func (e *env) connector(ws, id, mcpURL, mode string) Connector {
	e.t.Helper()
	row, err := e.db.CreateConnector(context.Background(), &store.Connector{
		WorkspaceID: ws, ExternalID: id, Name: id, Transport: store.TransportStreamableHTTP,
		Config: store.Config{URL: mcpURL}, Active: true,
	})
	if err != nil {
		e.t.Fatalf("CreateConnector: %v", err)
	}
	return Connector{ID: row.ID, WorkspaceID: ws, ExternalID: id, URL: mcpURL, Mode: mode}
}

// seen records err for the canary checks and returns it.
func (e *env) seen(err error) error {
	if err != nil {
		e.mu.Lock()
		e.errs = append(e.errs, err.Error())
		e.mu.Unlock()
	}
	return err
}

// authorize runs user's whole authorization of c through m: Start, the
// user's consent at the authorization server, Complete.
func (e *env) authorize(ctx context.Context, m *Manager, as *oauthtest.Server, c Connector, user string, extra ...string) *Completed {
	e.t.Helper()
	done, err := e.tryAuthorize(ctx, m, as, c, user, extra...)
	if err != nil {
		e.t.Fatalf("authorize %s: %v", user, err)
	}
	return done
}

func (e *env) tryAuthorize(ctx context.Context, m *Manager, as *oauthtest.Server, c Connector, user string, extra ...string) (*Completed, error) {
	st, err := m.Start(ctx, c, user, "", extra)
	if err != nil {
		return nil, e.seen(fmt.Errorf("Start: %w", err))
	}
	loc, err := as.Authorize(ctx, st.URL, user)
	if err != nil {
		return nil, e.seen(fmt.Errorf("at the authorization server: %w", err))
	}
	q := loc.Query()
	done, err := m.Complete(ctx, q.Get("state"), q.Get("code"), q.Get("iss"), q.Get("error"))
	return done, e.seen(err)
}

// call opens an MCP connection to c as user through m's Transport, calls
// tool and returns its text.
func (e *env) call(ctx context.Context, m *Manager, c Connector, user, tool string) (string, error) {
	text, err := callTool(ctx, m.Transport(http.DefaultTransport, c, user), c.URL, tool)
	return text, e.seen(err)
}

func callTool(ctx context.Context, rt http.RoundTripper, mcpURL, tool string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	cl, err := mcptest.Dial(ctx, mcpURL, "2025-06-18", &http.Client{Transport: rt})
	if err != nil {
		return "", err
	}
	defer closeClient(cl)
	var req mcp.CallToolRequest
	req.Params.Name = tool
	res, err := cl.CallTool(ctx, req)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	if res.IsError {
		return b.String(), fmt.Errorf("tool error: %s", b.String())
	}
	return b.String(), nil
}

func closeClient(c *mcpclient.Client) { _ = c.Close() }

// whoami is the user the MCP server says a call through m was made as.
func (e *env) whoami(ctx context.Context, m *Manager, c Connector, user string) (string, error) {
	text, err := e.call(ctx, m, c, user, "whoami")
	if err != nil {
		return "", err
	}
	who, _, _ := strings.Cut(strings.TrimPrefix(text, "user="), " ")
	return who, nil
}

// mustWhoami fails the test unless a call as user is made as user.
func (e *env) mustWhoami(ctx context.Context, m *Manager, c Connector, user string) {
	e.t.Helper()
	who, err := e.whoami(ctx, m, c, user)
	if err != nil {
		e.t.Fatalf("whoami as %s: %v", user, err)
	}
	if who != user {
		e.t.Fatalf("whoami as %s answered %q", user, who)
	}
}

// required returns the *RequiredError in err, failing the test if there
// is none or its reason is not reason.
func required(t *testing.T, err error, reason string) *RequiredError {
	t.Helper()
	var re *RequiredError
	if !errors.As(err, &re) {
		t.Fatalf("error %v is not a *RequiredError", err)
	}
	if re.Reason != reason {
		t.Fatalf("RequiredError reason %s, want %s (%v)", re.Reason, reason, err)
	}
	return re
}

// tokens opens the stored tokens of c and user: the canaries.
func (e *env) tokens(c Connector, user string) (access, refresh string) {
	e.t.Helper()
	row, err := e.db.OAuthToken(context.Background(), c.ID, user)
	if err != nil {
		e.t.Fatalf("OAuthToken: %v", err)
	}
	a, err := e.box.OpenBytes(row.SealedAccess, tokenContext("access", c.ID, user))
	if err != nil {
		e.t.Fatal(err)
	}
	r, err := e.box.OpenBytes(row.SealedRefresh, tokenContext("refresh", c.ID, user))
	if err != nil {
		e.t.Fatal(err)
	}
	return string(a), string(r)
}

// assertNowhere fails the test if any of secrets shows in the OAuth
// tables' rows (read as text, bytea as hex), the logs or the errors seen.
func (e *env) assertNowhere(secrets ...string) {
	e.t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, e.url)
	if err != nil {
		e.t.Fatal(err)
	}
	defer conn.Close(ctx)
	var dump strings.Builder
	for _, table := range []string{"oauth_clients", "oauth_pending", "oauth_tokens"} {
		rows, err := conn.Query(ctx, "SELECT t::text FROM "+table+" t")
		if err != nil {
			e.t.Fatal(err)
		}
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				e.t.Fatal(err)
			}
			dump.WriteString(s + "\n")
		}
		if rows.Err() != nil {
			e.t.Fatal(rows.Err())
		}
	}
	e.mu.Lock()
	errs := strings.Join(e.errs, "\n")
	e.mu.Unlock()
	places := map[string]string{"the database": dump.String(), "the logs": e.logs.String(), "an error": errs}
	for _, s := range secrets {
		if len(s) < 8 {
			e.t.Fatalf("canary %d bytes long: too short to search for", len(s))
		}
		for where, text := range places {
			if strings.Contains(text, s) || strings.Contains(text, hex.EncodeToString([]byte(s))) {
				e.t.Errorf("a secret (%d bytes) shows in %s", len(s), where)
			}
		}
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writes (log handlers).
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
