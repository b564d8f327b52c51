package main

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
)

// TestReplicasConsole signs in on one replica's console and goes on on
// another's, as behind a balancer without sticky sessions: the cookie and
// its CSRF token are good on every replica sharing SECRET_KEY, the list
// shows each connector's owner, and a run paused on one replica is approved
// (with edited arguments) from the other's console, where the API forwards
// it to the connector's owner.
func TestReplicasConsole(t *testing.T) {
	model := llmtest.New(t,
		llmtest.CallToolsSaying("Echo it.", llmtest.Call{Tool: "echo", Args: `{"text":"from the model"}`}),
		llmtest.Answer("Done."))
	c := newCluster(t, map[string]string{"CONSOLE_ADDR": "127.0.0.1:0", "LLM_BASE_URL": model.URL(), "LLM_MODEL": "fake-model"}, "a", "b")
	admin := createKey(t, c.url, "acme", "admin")
	a, b := "http://"+c.get("a").console, "http://"+c.get("b").console
	browser := consoleClient(t)

	// Signed in on a, the next page comes from b.
	if code, body := consolePost(t, browser, a+"/signin", url.Values{"key": {admin}}); code != http.StatusOK || !strings.Contains(body, "<title>Connectors") {
		t.Fatalf("sign in on a: %d\n%s", code, body)
	}
	code, body := consoleGet(t, browser, b+"/connectors/new")
	m := csrfField.FindStringSubmatch(body)
	if code != http.StatusOK || m == nil {
		t.Fatalf("a's sign-in on b: %d\n%s", code, body)
	}
	code, body = consolePost(t, browser, b+"/connectors", url.Values{"csrf": {m[1]}, "id": {"pipe"}, "transport": {"stdio"},
		"command": {c.stdio}, "args": {"-pidfile\n" + c.pidFile("pipe")}, "approval": {"all"}, "session_mode": {"shared"}, "active": {"on"}})
	if code != http.StatusOK || !strings.Contains(body, "Created connector pipe") {
		t.Fatalf("create on b with the CSRF token of b's page: %d\n%s", code, body)
	}
	owner := regexp.MustCompile(`<dt>Owner replica</dt><dd>([ab])</dd>`)
	if !poll(30*time.Second, func() bool {
		_, body = consoleGet(t, browser, a+"/connectors/pipe")
		return strings.Contains(body, `data-state="READY"`) && owner.MatchString(body)
	}) {
		t.Fatalf("pipe not READY with an owner on a's console:\n%s", body)
	}

	// A run paused through a's API is approved, edited, on b's console.
	res, err := c.client("a").QueryConnector(withKey(ctxFor(t, 30*time.Second), admin), &connectorv1.QueryConnectorRequest{
		WorkspaceId: "acme", ConnectorId: "pipe", Query: "echo"})
	if err != nil || res.GetResult().GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_AWAITING_APPROVAL {
		t.Fatalf("query = %v, %v; want it awaiting approval", res.GetResult(), err)
	}
	run := res.GetResult().GetRunId()
	_, body = consoleGet(t, browser, b+"/runs/"+run)
	if !strings.Contains(body, `name="c0.arg.text"`) || !strings.Contains(body, `value="from the model"`) {
		t.Fatalf("b's run page has no form prefilled with the model's arguments:\n%s", body)
	}
	code, body = consolePost(t, browser, b+"/runs/"+run+"/resume", url.Values{"csrf": {csrfField.FindStringSubmatch(body)[1]},
		"c0.decision": {"approve"}, "c0.arg.text": {"edited on b"}})
	if code != http.StatusOK || !strings.Contains(body, `<dd id="run-status">COMPLETED</dd>`) {
		t.Fatalf("approve on b: %d\n%s", code, body)
	}
	got, err := c.client("b").GetQueryRun(withKey(ctxFor(t, 10*time.Second), admin), &connectorv1.GetQueryRunRequest{WorkspaceId: "acme", RunId: run})
	if err != nil {
		t.Fatal(err)
	}
	call := got.GetRun().GetResult().GetSteps()[0].GetCalls()[0]
	if call.GetResultExcerpt() != "edited on b" || call.GetDecision().GetKind() != connectorv1.DecisionKind_DECISION_KIND_APPROVE_EDITED ||
		call.GetDecision().GetActorId() != "console:"+keyID(t, admin) {
		t.Errorf("the approved call = %v; want it run with b's edit, decided by the console's key", call)
	}

	// The replicas page shows both, the leader, and who owns pipe.
	_, body = consoleGet(t, browser, a+"/replicas")
	for _, want := range []string{"<td>a", "<td>b", "(leader)", `<a href="/connectors/pipe">pipe</a>`} {
		if !strings.Contains(body, want) {
			t.Errorf("a's replicas page lacks %q:\n%s", want, body)
		}
	}
}

// consoleClient is a browser's cookie jar, shared by every replica's
// console on one host, as behind a balancer.
func consoleClient(t *testing.T) *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, Timeout: 30 * time.Second}
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func consoleGet(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func consolePost(t *testing.T, c *http.Client, u string, form url.Values) (int, string) {
	t.Helper()
	resp, err := c.PostForm(u, form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
