package main

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/loudskip"
)

// tsOAuthExample is the TypeScript SDK's example MCP server, which with
// --oauth also runs a demo authorization server that approves every
// request at once.
const tsOAuthExample = "../../.tools/npm/node_modules/@modelcontextprotocol/sdk/dist/esm/examples/server/simpleStreamableHttp.js"

// tsOAuthServer is one run of the SDK's example server with --oauth.
type tsOAuthServer struct {
	MCPURL string // http://localhost:<MCP_PORT>/mcp, as its metadata names it
	Issuer string // its authorization server: http://localhost:<MCP_AUTH_PORT>/
	log    *lockedBuffer
}

// Log is what the server printed so far.
func (s *tsOAuthServer) Log() string { return s.log.String() }

// bearerTokens are the access tokens the MCP server accepted, as it logs
// them ("Authenticated user: { token: '…', … }").
func (s *tsOAuthServer) bearerTokens() []string {
	var out []string
	for _, m := range tsTokenLog.FindAllStringSubmatch(s.Log(), -1) {
		out = append(out, m[1])
	}
	return out
}

var tsTokenLog = regexp.MustCompile(`token: '([0-9a-f-]{36})'`)

// startTSOAuthServer runs the SDK's example server with --oauth (and
// --oauth-strict: tokens must be issued for its MCP URL) on free ports,
// and waits until both of its listeners accept. Without node or the npm
// packages it skips loudly (failing under CI=true).
func startTSOAuthServer(t *testing.T, strict bool) *tsOAuthServer {
	t.Helper()
	js := needFile(t, tsOAuthExample, "make tools")
	if _, err := exec.LookPath("node"); err != nil {
		loudskip.Skip(t, "node is not on PATH; the TypeScript SDK's OAuth example server runs with it")
	}
	var pkg struct{ Version string }
	if b, err := os.ReadFile(filepath.Join(filepath.Dir(js), "../../../../package.json")); err == nil {
		_ = json.Unmarshal(b, &pkg)
	}
	t.Logf("the TypeScript SDK's OAuth example server, @modelcontextprotocol/sdk %s", pkg.Version)
	mcpAddr, authAddr := freeAddr(t), freeAddr(t)
	_, mcpPort, _ := net.SplitHostPort(mcpAddr)
	_, authPort, _ := net.SplitHostPort(authAddr)
	// --oauth-strict alone does not turn OAuth on: the example looks for
	// the exact argument --oauth.
	args := []string{js, "--oauth"}
	if strict {
		args = append(args, "--oauth-strict")
	}
	cmd := exec.Command("node", args...)
	cmd.Env = append(os.Environ(), "MCP_PORT="+mcpPort, "MCP_AUTH_PORT="+authPort)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	s := &tsOAuthServer{MCPURL: "http://localhost:" + mcpPort + "/mcp", Issuer: "http://localhost:" + authPort + "/", log: &lockedBuffer{}}
	cmd.Stdout, cmd.Stderr = s.log, s.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("the TypeScript OAuth example server printed (the end):\n%s", lastLines(tsTokenLog.ReplaceAllString(s.Log(), "token: '…'"), 60))
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for _, addr := range []string{mcpAddr, authAddr} {
		for {
			c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
			if err == nil {
				c.Close()
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the TypeScript OAuth example server does not listen on %s after 30s:\n%s", addr, s.Log())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return s
}

// browser is an end user's browser that does not follow redirects, so
// the test sees each one.
var browser = &http.Client{
	Timeout:       10 * time.Second,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// browse GETs rawURL as a browser and returns the status, the Location
// and the body.
func browse(t *testing.T, rawURL string) (int, string, string) {
	t.Helper()
	resp, err := browser.Get(rawURL)
	if err != nil {
		t.Fatalf("GET %s: %v", redactQuery(rawURL), err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, resp.Header.Get("Location"), string(body)
}

// authorizeInBrowser plays the user's browser on an authorization URL of
// the demo authorization server, which approves at once: its 302 must go
// to the service's callback (redirectURL) with the URL's state and a code;
// the callback's answer is returned. It returns the code, so the test can
// check it never shows in the service's output.
func authorizeInBrowser(t *testing.T, authURL, redirectURL string) (callbackStatus int, location, body, code string) {
	t.Helper()
	st, loc, b := browse(t, authURL)
	if st != http.StatusFound {
		t.Fatalf("the authorization server answered %d (%q), want 302 to the callback", st, b)
	}
	cb, err := url.Parse(loc)
	if err != nil || !strings.HasPrefix(loc, redirectURL+"?") {
		t.Fatalf("the authorization server redirected to %q, want %s?…", redactQuery(loc), redirectURL)
	}
	want, _ := url.Parse(authURL)
	q := cb.Query()
	if e := q.Get("error"); e != "" {
		t.Fatalf("the authorization server refused: %s: %s", e, q.Get("error_description"))
	}
	if q.Get("state") != want.Query().Get("state") || q.Get("code") == "" {
		t.Fatalf("the redirect carries state %t (the URL's: %t) and code %t, want the URL's state and a code",
			q.Has("state"), q.Get("state") == want.Query().Get("state"), q.Has("code"))
	}
	st, loc, b = browse(t, loc)
	return st, loc, b, q.Get("code")
}

// redactQuery is rawURL without its query, which holds state and code.
func redactQuery(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "(unparsable URL)"
	}
	u.RawQuery = ""
	return u.String() + "?…"
}

// needsAuthorization checks that err is FAILED_PRECONDITION with reason
// AUTHORIZATION_REQUIRED and an AuthorizationRequired for user whose
// authorization URL is at the authorization server issuer, and returns it.
func needsAuthorization(t *testing.T, err error, user, issuer string) *connectorv1.AuthorizationRequired {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.FailedPrecondition {
		t.Fatalf("%s's call: %v (%s), want FAILED_PRECONDITION", user, st.Code(), st.Message())
	}
	var info *errdetails.ErrorInfo
	var ar *connectorv1.AuthorizationRequired
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *connectorv1.AuthorizationRequired:
			ar = d
		}
	}
	if info.GetReason() != "AUTHORIZATION_REQUIRED" || ar == nil || ar.GetUserId() != user ||
		!strings.HasPrefix(ar.GetAuthorizationUrl(), issuer+"authorize?") || info.GetMetadata()["authorization_url"] != ar.GetAuthorizationUrl() {
		t.Fatalf("%s's call: details %v, %v; want ErrorInfo AUTHORIZATION_REQUIRED and an AuthorizationRequired for %s at %sauthorize",
			user, info, ar, user, issuer)
	}
	return ar
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
