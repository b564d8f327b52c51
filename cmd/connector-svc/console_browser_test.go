package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/loudskip"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

// screenshotsDir is where the browser tests save screenshots of the
// console's pages (CI keeps them as artifacts); CONSOLE_SCREENSHOTS
// overrides it.
func screenshotsDir(t *testing.T) string {
	dir := os.Getenv("CONSOLE_SCREENSHOTS")
	if dir == "" {
		dir, _ = filepath.Abs("../../.artifacts/console")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// browser starts the system's Chromium headless, as a person's browser
// with its own profile, and returns a context to drive it with.
func consoleBrowser(t *testing.T) context.Context {
	t.Helper()
	path := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		loudskip.Skip(t, "no Chromium on PATH (apt-get install chromium); the console's browser tests drive it")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.Flag("disable-gpu", true), chromedp.Flag("disable-quic", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 900))
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start %s: %v", path, err)
	}
	return ctx
}

// do runs browser actions within a generous bound, so that a page that
// never shows what is waited for fails the test instead of hanging it.
func do(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	run, cancel := context.WithTimeout(ctx, 45*time.Second)
	defer cancel()
	if err := chromedp.Do(run, actions...); err != nil {
		failAt(t, ctx, what, err)
	}
}

// read runs one browser action that returns a value.
func read[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	run, cancel := context.WithTimeout(ctx, 45*time.Second)
	defer cancel()
	v, err := chromedp.Run(run, a)
	if err != nil {
		failAt(t, ctx, what, err)
	}
	return v
}

// failAt fails the test with the page the browser is on.
func failAt(t *testing.T, ctx context.Context, what string, err error) {
	t.Helper()
	short, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	loc, _ := chromedp.Run(short, chromedp.Location())
	body, _ := chromedp.Run(short, chromedp.Text(chromedp.CSS("body")))
	t.Fatalf("%s: %v\nat %s:\n%s", what, err, loc, body)
}

// evaluate runs a script in the page for its effect.
func evaluate(js string) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		_, err := chromedp.Evaluate[any](js+"; null")(ctx, t)
		return chromedp.Void{}, err
	}
}

func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png := read(t, ctx, "screenshot "+name, chromedp.FullScreenshot(100))
	if err := os.WriteFile(filepath.Join(screenshotsDir(t), name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

func pageText(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	return read(t, ctx, "read "+sel, chromedp.Text(chromedp.CSS(sel)))
}

// TestConsoleInABrowser drives the console in Chromium as an operator
// would: sign in, create a connector to the reference MCP server, watch it
// become READY on the live list, disable a tool, call one from its form,
// edit and approve a paused run's call, and see the server run it with the
// edited arguments; then the refusals (a wrong key, a forged form, a key
// without admin scope).
func TestConsoleInABrowser(t *testing.T) {
	script, _ := everythingScript(t)
	ctx := consoleBrowser(t)
	model := llmtest.New(t,
		llmtest.CallToolsSaying("The user wants their words echoed.", llmtest.Call{Tool: "echo", Args: `{"message":"hello from the model"}`}),
		llmtest.Answer("Echoed."))
	url := storetest.NewURL(t)
	admin := createKey(t, url, "acme", "admin")
	caller := createKey(t, url, "acme", "call")
	svc := start(t, url, map[string]string{"SECRET_KEY": testKey, "LLM_BASE_URL": model.URL(), "LLM_MODEL": "fake-model",
		"HEALTH_INTERVAL": "1s", "STDIO_ALLOWED_COMMANDS": script}, "-console-addr", "127.0.0.1:0")
	if svc.console == "" {
		t.Fatalf("the service did not log its console's address:\n%s", svc.out.String())
	}
	base := "http://" + svc.console
	client := connectorv1.NewConnectorServiceClient(dial(t, svc.addr))

	// A wrong key is refused on the sign-in page.
	do(t, ctx, "open the console", chromedp.Navigate(base+"/connectors"), chromedp.WaitVisible(chromedp.CSS("#key")))
	screenshot(t, ctx, "signin")
	do(t, ctx, "sign in with a wrong key", chromedp.SendKeys(chromedp.CSS("#key"), "csk_aaaaaaaa_"+strings.Repeat("x", 43)),
		chromedp.Submit(chromedp.CSS("#key")), chromedp.WaitVisible(chromedp.CSS(".error")))
	if got := pageText(t, ctx, ".error"); !strings.Contains(got, "not known") {
		t.Errorf("a wrong key's page says %q; want it to say the key is not known", got)
	}

	// The right key, typed into the focused field and sent with Enter,
	// lands on the page asked for.
	if !read(t, ctx, "focus", chromedp.Evaluate[bool](`document.activeElement && document.activeElement.id === "key"`)) {
		t.Error("the sign-in page does not put the focus in the key's field")
	}
	do(t, ctx, "sign in from the keyboard", chromedp.Clear(chromedp.CSS("#key")), chromedp.SendKeys(chromedp.CSS("#key"), admin+kb.Enter),
		chromedp.WaitVisible(chromedp.CSS("#connector-rows")))

	// A new stdio connector to the reference server; every call waits.
	do(t, ctx, "fill the new connector's form", chromedp.Click(chromedp.CSS(`a[href="/connectors/new"]`)),
		chromedp.WaitVisible(chromedp.CSS("#id")),
		chromedp.SendKeys(chromedp.CSS("#id"), "everything"),
		chromedp.SetValue(chromedp.CSS("#transport"), "stdio"),
		chromedp.SendKeys(chromedp.CSS("#command"), script),
		chromedp.SetValue(chromedp.CSS("#approval"), "all"),
		chromedp.SendKeys(chromedp.CSS("#env"), "CONSOLE_TEST_SECRET=hunter2"))
	screenshot(t, ctx, "connector-new")
	do(t, ctx, "create it", chromedp.Submit(chromedp.CSS("#id")), chromedp.WaitVisible(chromedp.CSS(".flash")))
	if got := pageText(t, ctx, ".flash"); !strings.Contains(got, "Created connector everything") {
		t.Errorf("after create the page says %q", got)
	}

	// The live list shows it READY without a reload.
	do(t, ctx, "watch the live list", chromedp.Navigate(base+"/connectors"), chromedp.WaitVisible(chromedp.CSS("#connector-rows")),
		evaluate(`window.notReloaded = true`),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-connector="everything"] td[data-state="READY"]`)))
	if !read(t, ctx, "look for the mark", chromedp.Evaluate[bool](`window.notReloaded === true`)) {
		t.Error("the list reloaded the page to show READY; want it updated in place (server-sent events)")
	}
	screenshot(t, ctx, "connectors")
	if body := pageText(t, ctx, "body"); strings.Contains(body, "hunter2") {
		t.Error("the console shows an environment value")
	}

	// Disable a tool from the connector's page.
	do(t, ctx, "disable get-env", chromedp.Navigate(base+"/connectors/everything"),
		chromedp.Click(chromedp.CSS(`tr[data-tool="get-env"] button[aria-label="Disable get-env"]`)),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-tool="get-env"] button[aria-label="Enable get-env"]`)))
	tools, err := client.ListTools(withKey(testCtx(t), admin), &connectorv1.ListToolsRequest{WorkspaceId: "acme", ConnectorId: "everything"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tools.GetTools() {
		if want := tool.GetName() != "get-env"; tool.GetEnabled() != want {
			t.Errorf("tool %s enabled = %v after disabling get-env in the console", tool.GetName(), tool.GetEnabled())
		}
	}
	screenshot(t, ctx, "connector")

	// Call a tool from the form made from its schema.
	do(t, ctx, "call echo", chromedp.Navigate(base+"/connectors/everything/tools/echo"),
		chromedp.SendKeys(chromedp.CSS(`[name="arg.message"]`), "typed in a form"),
		chromedp.Click(chromedp.CSS("#approved")),
		chromedp.Submit(chromedp.CSS(`[name="arg.message"]`)),
		chromedp.WaitVisible(chromedp.CSS("#result")))
	if got := pageText(t, ctx, "#result"); !strings.Contains(got, "Echo: typed in a form") {
		t.Errorf("echo's result in the console = %q", got)
	}
	screenshot(t, ctx, "tool")

	// A run pauses for approval; the person edits the model's arguments.
	res, err := client.QueryConnector(withKey(testCtx(t), admin), &connectorv1.QueryConnectorRequest{WorkspaceId: "acme",
		ConnectorId: "everything", Query: "echo something"})
	if err != nil {
		t.Fatal(err)
	}
	runID := res.GetResult().GetRunId()
	if res.GetResult().GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_AWAITING_APPROVAL {
		t.Fatalf("query = %v; want it awaiting approval", res.GetResult())
	}
	do(t, ctx, "find the run", chromedp.Navigate(base+"/runs?status=AWAITING_APPROVAL"),
		chromedp.Click(chromedp.CSS(fmt.Sprintf(`tr[data-run=%q] a`, runID))),
		chromedp.WaitVisible(chromedp.CSS(`[name="c0.arg.message"]`)))
	prefilled := read(t, ctx, "read the prefilled arguments", chromedp.Value(chromedp.CSS(`[name="c0.arg.message"]`)))
	if prefilled != "hello from the model" {
		t.Errorf("the approval form holds %q; want the model's arguments", prefilled)
	}
	do(t, ctx, "edit the arguments", chromedp.Clear(chromedp.CSS(`[name="c0.arg.message"]`)),
		chromedp.SendKeys(chromedp.CSS(`[name="c0.arg.message"]`), "edited by a person"))
	screenshot(t, ctx, "approval")
	do(t, ctx, "approve", chromedp.Click(chromedp.CSS(`form.decisions button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(".flash")))
	if got := pageText(t, ctx, "#run-status"); got != "COMPLETED" {
		t.Errorf("after approval the run's page says %q; want COMPLETED", got)
	}
	run, err := client.GetQueryRun(withKey(testCtx(t), admin), &connectorv1.GetQueryRunRequest{WorkspaceId: "acme", RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	call := run.GetRun().GetResult().GetSteps()[0].GetCalls()[0]
	if call.GetArguments().AsMap()["message"] != "edited by a person" || !strings.Contains(call.GetResultExcerpt(), "Echo: edited by a person") ||
		call.GetDecision().GetKind() != connectorv1.DecisionKind_DECISION_KIND_APPROVE_EDITED {
		t.Errorf("the approved call = %v; want it run with the edited arguments", call)
	}
	screenshot(t, ctx, "run")

	// A form without its CSRF token is refused, and nothing changes.
	do(t, ctx, "forge a form", chromedp.Navigate(base+"/connectors/everything"),
		evaluate(`document.querySelectorAll('input[name=csrf]').forEach(function (e) { e.remove(); })`),
		chromedp.Click(chromedp.CSS(`tr[data-tool="echo"] button[aria-label="Disable echo"]`)),
		chromedp.WaitVisible(chromedp.CSS(".error")))
	if got := pageText(t, ctx, ".error"); !strings.Contains(got, "CSRF") {
		t.Errorf("a form without its CSRF token: the page says %q", got)
	}

	// Sign out; a key without admin scope sees no connector.
	do(t, ctx, "sign out", chromedp.Navigate(base+"/runs"), chromedp.Click(chromedp.CSS(".signout button")),
		chromedp.WaitVisible(chromedp.CSS("#key")),
		chromedp.SetValue(chromedp.CSS("#key"), caller), chromedp.Submit(chromedp.CSS("#key")),
		chromedp.WaitVisible(chromedp.CSS("main h1")))
	if nav := pageText(t, ctx, "header nav"); strings.Contains(nav, "Connectors") || !strings.Contains(nav, "Sessions") {
		t.Errorf("a call key's navigation shows %q; want Sessions and no Connectors", nav)
	}
	do(t, ctx, "open connectors with a call key", chromedp.Navigate(base+"/connectors"), chromedp.WaitVisible(chromedp.CSS(".error")))
	if got := pageText(t, ctx, ".error"); !strings.Contains(got, "needs an API key with scope admin") {
		t.Errorf("a call key on the connectors page: %q", got)
	}
	if strings.Contains(svc.out.String(), "hunter2") || strings.Contains(svc.out.String(), admin) {
		t.Error("the service's log holds a secret or a key's token")
	}

	// A sign-in past its end: the service again, with sign-ins of 2s.
	if err := svc.stop(); err != nil {
		t.Fatal(err)
	}
	svc = start(t, url, map[string]string{"SECRET_KEY": testKey, "STDIO_ALLOWED_COMMANDS": script},
		"-console-addr", "127.0.0.1:0", "-console-session-ttl", "2s")
	base = "http://" + svc.console
	do(t, ctx, "sign in again", chromedp.Navigate(base+"/signin"), chromedp.SendKeys(chromedp.CSS("#key"), admin+kb.Enter),
		chromedp.WaitVisible(chromedp.CSS("#connector-rows")))
	// The open list notices the end on its own and goes to the sign-in
	// page, which says why.
	do(t, ctx, "wait for the sign-in's end", chromedp.WaitVisible(chromedp.CSS("#key")))
	if got := pageText(t, ctx, ".error"); !strings.Contains(got, "The sign-in has expired. Sign in again.") {
		t.Errorf("an expired sign-in's page says %q", got)
	}
}
