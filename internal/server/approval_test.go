package server_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	openai "github.com/sashabaranov/go-openai"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/server"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

// approvalFixture is a server with an agent on a fake LLM and one READY
// connector "m" with approval policy, on a real MCP server (echo is
// annotated read-only; weather, fail, big and block have mcp-go's default
// hints: not read-only, destructive).
func approvalFixture(t *testing.T, policy connectorv1.ApprovalPolicy, o options, steps ...llmtest.Step) (*fixture, *llmtest.Server, *testMCP) {
	t.Helper()
	model := llmtest.New(t, steps...)
	o.llmURL = model.URL()
	f := setup(t, o)
	srv := newTestMCP(t)
	c := mcpConnector("m", srv.url())
	c.ApprovalPolicy = policy
	f.create(t, "ws", c)
	f.waitReady(t, "ws", "m")
	return f, model, srv
}

func (f *fixture) resume(t *testing.T, runID string, decisions ...*connectorv1.Decision) (*connectorv1.QueryResult, error) {
	t.Helper()
	resp, err := f.client.ResumeQuery(ctx(t), &connectorv1.ResumeQueryRequest{WorkspaceId: "ws", RunId: runID,
		Decisions: decisions, ActorId: "alice"})
	return resp.GetResult(), err
}

func (f *fixture) getRun(t *testing.T, runID string) *connectorv1.QueryRun {
	t.Helper()
	resp, err := f.client.GetQueryRun(ctx(t), &connectorv1.GetQueryRunRequest{WorkspaceId: "ws", RunId: runID})
	if err != nil {
		t.Fatalf("GetQueryRun(%s): %v", runID, err)
	}
	return resp.GetRun()
}

func approve(id string) *connectorv1.Decision {
	return &connectorv1.Decision{CallId: id, Kind: connectorv1.DecisionKind_DECISION_KIND_APPROVE}
}

// paused runs a query that must pause, and returns its result.
func (f *fixture) paused(t *testing.T, req *connectorv1.QueryConnectorRequest) *connectorv1.QueryResult {
	t.Helper()
	res, err := f.query(t, req)
	if err != nil {
		t.Fatal(err)
	}
	if res.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_AWAITING_APPROVAL || res.GetRunId() == "" {
		t.Fatalf("query = %v; want AWAITING_APPROVAL with a run_id", res)
	}
	return res
}

// toolMessages are the tool messages of a model request, in order.
func toolMessages(req openai.ChatCompletionRequest) []string {
	var out []string
	for _, m := range req.Messages {
		if m.Role == openai.ChatMessageRoleTool {
			out = append(out, m.Content)
		}
	}
	return out
}

func TestGatedCallPausesAndApprovalRunsIt(t *testing.T) {
	f, model, srv := approvalFixture(t, connectorv1.ApprovalPolicy_APPROVAL_POLICY_ALL, options{},
		llmtest.CallToolsSaying("I will echo it to check the connection.", llmtest.Call{Tool: "echo", Args: `{"text":"hi"}`}),
		llmtest.Answer("It said hi."))
	res := f.paused(t, &connectorv1.QueryConnectorRequest{Query: "say hi"})

	want := &connectorv1.PendingCall{CallId: "call_1", Tool: "echo", ToolDescription: "Echoes text",
		Reasoning: "I will echo it to check the connection.", Arguments: mustStruct(t, map[string]any{"text": "hi"})}
	got := res.GetPendingCalls()
	if len(got) != 1 || got[0].GetCallId() != want.CallId || got[0].GetTool() != want.Tool ||
		got[0].GetToolDescription() != want.ToolDescription || got[0].GetReasoning() != want.Reasoning ||
		got[0].GetArguments().AsMap()["text"] != "hi" || !got[0].GetAnnotations().GetReadOnlyHint() {
		t.Fatalf("pending calls = %v; want %v with echo's read-only hint", got, want)
	}
	if res.GetExpireTime() == nil || res.GetSteps()[0].GetReasoning() != want.Reasoning || !res.GetSteps()[0].GetCalls()[0].GetPending() {
		t.Errorf("paused result = %v; want an expiry and the pending step with its reasoning", res)
	}
	if n := len(srv.toolCallHeaders()); n != 0 {
		t.Fatalf("the MCP server got %d tools/call before anyone approved", n)
	}
	if run := f.getRun(t, res.GetRunId()); run.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_AWAITING_APPROVAL ||
		len(run.GetResult().GetPendingCalls()) != 1 {
		t.Errorf("GetQueryRun while paused = %v", run)
	}

	done, err := f.resume(t, res.GetRunId(), approve("call_1"))
	if err != nil {
		t.Fatal(err)
	}
	if done.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_COMPLETED || done.GetAnswer() != "It said hi." || done.GetRunId() != res.GetRunId() {
		t.Fatalf("resumed = %v; want COMPLETED with the answer", done)
	}
	if n := len(srv.toolCallHeaders()); n != 1 {
		t.Errorf("the MCP server got %d tools/call, want 1", n)
	}
	if msgs := toolMessages(model.Requests()[1]); !slices.Equal(msgs, []string{"hi"}) {
		t.Errorf("the model's tool messages after approval = %q, want [hi]", msgs)
	}
	call := done.GetSteps()[0].GetCalls()[0]
	if d := call.GetDecision(); d.GetKind() != connectorv1.DecisionKind_DECISION_KIND_APPROVE || d.GetActorId() != "alice" ||
		d.GetDecideTime() == nil || call.GetPending() || call.GetResultExcerpt() != "hi" {
		t.Errorf("approved call = %v; want the decision, who made it and the result", call)
	}
	if u := done.GetUsage(); u.GetPromptTokens() != 200 {
		t.Errorf("usage = %v; want both model requests of the run (200 prompt tokens)", u)
	}

	// A decision is used once.
	_, err = f.resume(t, res.GetRunId(), approve("call_1"))
	wantStatus(t, err, codes.FailedPrecondition, server.ReasonRunNotAwaiting, "")
	run := f.getRun(t, res.GetRunId())
	if run.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_COMPLETED && run.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_RUNNING {
		t.Errorf("run after resume = %v", run.GetStatus())
	}
}

func mustStruct(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestApproveWithEditedArguments(t *testing.T) {
	f, model, srv := approvalFixture(t, connectorv1.ApprovalPolicy_APPROVAL_POLICY_ALL, options{},
		llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"send 100 EUR"}`}),
		llmtest.Answer("Done."))
	res := f.paused(t, &connectorv1.QueryConnectorRequest{Query: "pay"})

	// Arguments the schema refuses: nothing runs, the run still waits.
	_, err := f.resume(t, res.GetRunId(), &connectorv1.Decision{CallId: "call_1", Kind: connectorv1.DecisionKind_DECISION_KIND_APPROVE_EDITED,
		EditedArguments: mustStruct(t, map[string]any{"text": 5.0})})
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "decisions[0].edited_arguments")
	_, err = f.resume(t, res.GetRunId(), &connectorv1.Decision{CallId: "call_1", Kind: connectorv1.DecisionKind_DECISION_KIND_APPROVE_EDITED})
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "decisions[0].edited_arguments")
	if n := len(srv.toolCallHeaders()); n != 0 {
		t.Fatalf("the MCP server got %d tools/call after refused decisions", n)
	}

	done, err := f.resume(t, res.GetRunId(), &connectorv1.Decision{CallId: "call_1", Kind: connectorv1.DecisionKind_DECISION_KIND_APPROVE_EDITED,
		EditedArguments: mustStruct(t, map[string]any{"text": "send 10 EUR"})})
	if err != nil {
		t.Fatal(err)
	}
	// echo answers with what it received.
	if msgs := toolMessages(model.Requests()[1]); !slices.Equal(msgs, []string{"send 10 EUR"}) {
		t.Errorf("the server answered %q; want it to have received the edited arguments", msgs)
	}
	call := done.GetSteps()[0].GetCalls()[0]
	if call.GetArguments().AsMap()["text"] != "send 10 EUR" || call.GetDecision().GetOriginalArguments().AsMap()["text"] != "send 100 EUR" ||
		call.GetDecision().GetKind() != connectorv1.DecisionKind_DECISION_KIND_APPROVE_EDITED {
		t.Errorf("edited call = %v; want the arguments that ran and the model's originals", call)
	}
	// The record keeps the same, once written (in the background).
	testsupport.WaitFor(t, "the run's record to be written", func() bool {
		return f.getRun(t, res.GetRunId()).GetStatus() == connectorv1.QueryStatus_QUERY_STATUS_COMPLETED
	})
	rec := f.getRun(t, res.GetRunId()).GetResult().GetSteps()[0].GetCalls()[0]
	if rec.GetArguments().AsMap()["text"] != "send 10 EUR" || rec.GetDecision().GetActorId() != "alice" {
		t.Errorf("recorded call = %v", rec)
	}
}

func TestDenyTellsTheModel(t *testing.T) {
	f, model, srv := approvalFixture(t, connectorv1.ApprovalPolicy_APPROVAL_POLICY_ALL, options{},
		llmtest.CallTools(llmtest.Call{Tool: "weather", Args: `{}`}),
		llmtest.Answer("I could not check the weather."))
	res := f.paused(t, &connectorv1.QueryConnectorRequest{Query: "weather?"})
	done, err := f.resume(t, res.GetRunId(), &connectorv1.Decision{CallId: "call_1", Kind: connectorv1.DecisionKind_DECISION_KIND_DENY,
		Message: "not now"})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(srv.toolCallHeaders()); n != 0 {
		t.Errorf("the MCP server got %d tools/call for a denied call", n)
	}
	msgs := toolMessages(model.Requests()[1])
	if len(msgs) != 1 || !strings.Contains(msgs[0], "the user declined this call: not now") {
		t.Errorf("the model's tool messages = %q; want the refusal with the user's message", msgs)
	}
	call := done.GetSteps()[0].GetCalls()[0]
	if done.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_COMPLETED || !strings.Contains(call.GetRejectedReason(), "declined") ||
		call.GetDecision().GetKind() != connectorv1.DecisionKind_DECISION_KIND_DENY || len(done.GetToolsUsed()) != 0 {
		t.Errorf("denied run = %v", done)
	}
}

// TestMixedTurn: of one turn's calls, those that need no approval run at
// once; the run waits for the others.
func TestMixedTurn(t *testing.T) {
	f, model, srv := approvalFixture(t, connectorv1.ApprovalPolicy_APPROVAL_POLICY_DESTRUCTIVE, options{},
		llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"a"}`}, llmtest.Call{Tool: "weather", Args: `{}`}),
		llmtest.Answer("a; Oslo 4°C."))
	res := f.paused(t, &connectorv1.QueryConnectorRequest{Query: "both"})
	if p := res.GetPendingCalls(); len(p) != 1 || p[0].GetTool() != "weather" || p[0].GetCallId() != "call_2" {
		t.Fatalf("pending = %v; want only weather (echo is read-only)", p)
	}
	if n := len(srv.toolCallHeaders()); n != 1 {
		t.Fatalf("tools/call before the decision = %d; want echo's alone", n)
	}
	if c := res.GetSteps()[0].GetCalls()[0]; c.GetResultExcerpt() != "a" || c.GetPending() {
		t.Errorf("echo in the paused step = %v; want its result", c)
	}
	// A decision must come for each pending call, and only for them.
	_, err := f.resume(t, res.GetRunId(), approve("call_1"))
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "decisions[0].call_id")
	_, err = f.resume(t, res.GetRunId(), approve("call_2"), approve("call_2"))
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "decisions[1].call_id")

	done, err := f.resume(t, res.GetRunId(), approve("call_2"))
	if err != nil {
		t.Fatal(err)
	}
	if msgs := toolMessages(model.Requests()[1]); len(msgs) != 2 || msgs[0] != "a" || !strings.Contains(msgs[1], "Oslo") {
		t.Errorf("the model's tool messages = %q; want echo's then weather's, in the order of the calls", msgs)
	}
	if !cmp.Equal(done.GetToolsUsed(), []string{"echo", "weather"}) || len(srv.toolCallHeaders()) != 2 {
		t.Errorf("tools used = %v, tools/call = %d", done.GetToolsUsed(), len(srv.toolCallHeaders()))
	}
}

// TestBudgetSpansTheRun: the call that waited counts against max_tools.
func TestBudgetSpansTheRun(t *testing.T) {
	f, _, srv := approvalFixture(t, connectorv1.ApprovalPolicy_APPROVAL_POLICY_ALL, options{},
		llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"a"}`}),
		llmtest.Answer("a."))
	res := f.paused(t, &connectorv1.QueryConnectorRequest{Query: "q", MaxTools: 1})
	done, err := f.resume(t, res.GetRunId(), approve("call_1"))
	if err != nil {
		t.Fatal(err)
	}
	// The budget of 1 was spent: the answer is forced, with no tools.
	if done.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_BUDGET_EXHAUSTED || len(srv.toolCallHeaders()) != 1 {
		t.Errorf("resumed = %v; want BUDGET_EXHAUSTED after the one call", done)
	}
}

func TestConcurrentResumesOneWins(t *testing.T) {
	f, _, srv := approvalFixture(t, connectorv1.ApprovalPolicy_APPROVAL_POLICY_ALL, options{},
		llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"once"}`}),
		llmtest.Answer("once."))
	res := f.paused(t, &connectorv1.QueryConnectorRequest{Query: "q"})
	const n = 4
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = f.resume(t, res.GetRunId(), approve("call_1"))
		}()
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		switch c := status.Code(err); c {
		case codes.OK:
			won++
		case codes.Aborted, codes.FailedPrecondition:
		default:
			t.Errorf("a losing resume got %v, want ABORTED or FAILED_PRECONDITION", err)
		}
	}
	if won != 1 || len(srv.toolCallHeaders()) != 1 {
		t.Errorf("%d resumes won and the server got %d tools/call; want exactly one of each (%v)", won, len(srv.toolCallHeaders()), errs)
	}
}

func TestPausedRunExpires(t *testing.T) {
	f, _, srv := approvalFixture(t, connectorv1.ApprovalPolicy_APPROVAL_POLICY_ALL,
		options{approvalTimeout: 200 * time.Millisecond, runSweep: time.Hour},
		llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"late"}`}))
	res := f.paused(t, &connectorv1.QueryConnectorRequest{Query: "q"})
	testsupport.WaitFor(t, "the paused run to show as expired", func() bool {
		return f.getRun(t, res.GetRunId()).GetStatus() == connectorv1.QueryStatus_QUERY_STATUS_EXPIRED
	})
	_, err := f.resume(t, res.GetRunId(), approve("call_1"))
	wantStatus(t, err, codes.FailedPrecondition, server.ReasonRunExpired, "")
	// Listed as expired, not as awaiting, before any sweep marks it so.
	for st, want := range map[connectorv1.QueryStatus]int{connectorv1.QueryStatus_QUERY_STATUS_EXPIRED: 1,
		connectorv1.QueryStatus_QUERY_STATUS_AWAITING_APPROVAL: 0} {
		resp, err := f.client.ListQueryRuns(ctx(t), &connectorv1.ListQueryRunsRequest{WorkspaceId: "ws", Status: st})
		if err != nil || len(resp.GetRuns()) != want {
			t.Errorf("ListQueryRuns(%v) = %v, %v; want %d", st, resp.GetRuns(), err, want)
		}
	}
	if n := len(srv.toolCallHeaders()); n != 0 {
		t.Errorf("an expired run's call ran (%d tools/call)", n)
	}
}

func TestCallToolNeedsTheUsersApproval(t *testing.T) {
	f, _, srv := approvalFixture(t, connectorv1.ApprovalPolicy_APPROVAL_POLICY_DESTRUCTIVE, options{})
	call := func(tool string, approved bool) error {
		_, err := f.client.CallTool(ctx(t), &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: "m", ToolName: tool,
			Arguments: mustStruct(t, map[string]any{"text": "x"}), UserApproved: approved})
		return err
	}
	wantStatus(t, call("weather", false), codes.FailedPrecondition, server.ReasonApprovalRequired, "")
	if n := len(srv.toolCallHeaders()); n != 0 {
		t.Fatalf("a refused call reached the server (%d tools/call)", n)
	}
	if err := call("weather", true); err != nil {
		t.Errorf("CallTool(weather, user_approved): %v", err)
	}
	if err := call("echo", false); err != nil {
		t.Errorf("CallTool(echo, read-only): %v", err)
	}

	// Overrides, either way.
	for tool, o := range map[string]connectorv1.ApprovalOverride{"weather": connectorv1.ApprovalOverride_APPROVAL_OVERRIDE_NEVER,
		"echo": connectorv1.ApprovalOverride_APPROVAL_OVERRIDE_ALWAYS} {
		resp, err := f.client.UpdateTool(ctx(t), &connectorv1.UpdateToolRequest{WorkspaceId: "ws", ConnectorId: "m", ToolName: tool, ApprovalOverride: o})
		if err != nil || resp.GetTool().GetApprovalOverride() != o {
			t.Fatalf("UpdateTool(%s, %v) = %v, %v", tool, o, resp, err)
		}
	}
	if err := call("weather", false); err != nil {
		t.Errorf("CallTool(weather, override NEVER): %v", err)
	}
	wantStatus(t, call("echo", false), codes.FailedPrecondition, server.ReasonApprovalRequired, "")
	tools := map[string]*connectorv1.Tool{}
	for _, tool := range f.listTools(t) {
		tools[tool.GetName()] = tool
	}
	if !tools["echo"].GetRequiresApproval() || tools["weather"].GetRequiresApproval() || !tools["fail"].GetRequiresApproval() ||
		tools["fail"].GetApprovalOverride() != connectorv1.ApprovalOverride_APPROVAL_OVERRIDE_POLICY {
		t.Errorf("ListTools: echo %v, weather %v, fail %v", tools["echo"], tools["weather"], tools["fail"])
	}
	_, err := f.client.UpdateTool(ctx(t), &connectorv1.UpdateToolRequest{WorkspaceId: "ws", ConnectorId: "m", ToolName: "echo",
		RequiresApproval: new(true), ApprovalOverride: connectorv1.ApprovalOverride_APPROVAL_OVERRIDE_NEVER})
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "requires_approval")
}

// TestNewConnectorsWaitForDestructiveCalls: the default policy.
func TestNewConnectorsWaitForDestructiveCalls(t *testing.T) {
	f := setup(t)
	c := mcpConnector("m", "http://127.0.0.1:9/mcp")
	c.ApprovalPolicy = connectorv1.ApprovalPolicy_APPROVAL_POLICY_UNSPECIFIED
	resp, err := f.client.CreateConnector(ctx(t), &connectorv1.CreateConnectorRequest{WorkspaceId: "ws", Connector: c})
	if err != nil {
		t.Fatal(err)
	}
	if p := resp.GetConnector().GetApprovalPolicy(); p != connectorv1.ApprovalPolicy_APPROVAL_POLICY_DESTRUCTIVE {
		t.Errorf("a new connector's approval policy = %v, want DESTRUCTIVE", p)
	}
	_, err = f.client.CreateConnector(ctx(t), &connectorv1.CreateConnectorRequest{WorkspaceId: "ws",
		Connector: &connectorv1.Connector{ConnectorId: "x", Transport: connectorv1.Transport_TRANSPORT_STREAMABLE_HTTP,
			Connection: &connectorv1.Connector_Http{Http: &connectorv1.HttpConfig{Url: "http://127.0.0.1:9/mcp"}}, ApprovalPolicy: 7}})
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "connector.approval_policy")
}

func TestListQueryRuns(t *testing.T) {
	var steps []llmtest.Step
	for range 5 {
		steps = append(steps, llmtest.Answer(`{"plan": []}`))
	}
	steps = append(steps, llmtest.Fail(400, "the model refuses", nil))
	f, _, _ := approvalFixture(t, connectorv1.ApprovalPolicy_APPROVAL_POLICY_ALL, options{runSweep: 20 * time.Millisecond}, steps...)
	start := time.Now()
	var ids []string
	for i := range 4 {
		res, err := f.query(t, &connectorv1.QueryConnectorRequest{Query: "q" + string(rune('a'+i)), PlanOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		ids = append([]string{res.GetRunId()}, ids...) // newest first
	}
	// A run of another connector, and one that fails.
	other := newTestMCP(t)
	f.create(t, "ws", mcpConnector("other", other.url()))
	f.waitReady(t, "ws", "other")
	if _, err := f.query(t, &connectorv1.QueryConnectorRequest{WorkspaceId: "ws", ConnectorId: "other", Query: "x", PlanOnly: true}); err != nil {
		t.Fatal(err)
	}
	_, err := f.query(t, &connectorv1.QueryConnectorRequest{Query: "the model fails", PlanOnly: true})
	if err == nil {
		t.Fatal("a query past the model's script succeeded")
	}
	list := func(req *connectorv1.ListQueryRunsRequest) ([]string, string) {
		t.Helper()
		req.WorkspaceId = "ws"
		resp, err := f.client.ListQueryRuns(ctx(t), req)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range resp.GetRuns() {
			out = append(out, r.GetRunId())
			if r.GetResult().GetRunId() != r.GetRunId() {
				t.Errorf("run %s's result names run %s", r.GetRunId(), r.GetResult().GetRunId())
			}
		}
		return out, resp.GetNextPageToken()
	}
	// Finished runs are written in the background.
	testsupport.WaitFor(t, "six runs to be listed", func() bool { got, _ := list(&connectorv1.ListQueryRunsRequest{PageSize: 100}); return len(got) == 6 })

	var paged []string
	token := ""
	for pages := 0; ; pages++ {
		got, next := list(&connectorv1.ListQueryRunsRequest{ConnectorId: "m", Status: connectorv1.QueryStatus_QUERY_STATUS_PLANNED,
			PageSize: 3, PageToken: token})
		paged = append(paged, got...)
		if token = next; token == "" {
			if pages != 1 {
				t.Errorf("listed in %d pages, want 2", pages+1)
			}
			break
		}
	}
	if diff := cmp.Diff(ids, paged); diff != "" {
		t.Errorf("planned runs of m, newest first, in pages (-want +got):\n%s", diff)
	}
	if got, _ := list(&connectorv1.ListQueryRunsRequest{Status: connectorv1.QueryStatus_QUERY_STATUS_FAILED}); len(got) != 1 {
		t.Errorf("failed runs = %v, want 1", got)
	}
	if got, _ := list(&connectorv1.ListQueryRunsRequest{ConnectorId: "other"}); len(got) != 1 {
		t.Errorf("runs of other = %v, want 1", got)
	}
	if got, _ := list(&connectorv1.ListQueryRunsRequest{StartTime: timestamppb.New(time.Now().Add(time.Minute))}); len(got) != 0 {
		t.Errorf("runs created after now = %v, want none", got)
	}
	if got, _ := list(&connectorv1.ListQueryRunsRequest{EndTime: timestamppb.New(start)}); len(got) != 0 {
		t.Errorf("runs created before the first = %v, want none", got)
	}
	failed := f.getRun(t, func() string {
		got, _ := list(&connectorv1.ListQueryRunsRequest{Status: connectorv1.QueryStatus_QUERY_STATUS_FAILED})
		return got[0]
	}())
	if failed.GetError() == "" || failed.GetQuery() != "the model fails" || failed.GetFinishTime() == nil {
		t.Errorf("failed run = %v; want its query, error and finish time", failed)
	}
	_, err = f.client.ListQueryRuns(ctx(t), &connectorv1.ListQueryRunsRequest{WorkspaceId: "ws", PageToken: "nonsense"})
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "page_token")
	_, err = f.client.GetQueryRun(ctx(t), &connectorv1.GetQueryRunRequest{WorkspaceId: "other-ws", RunId: ids[0]})
	wantStatus(t, err, codes.NotFound, server.ReasonRunNotFound, "")
}

func TestOldRunsArePurged(t *testing.T) {
	f, _, _ := approvalFixture(t, connectorv1.ApprovalPolicy_APPROVAL_POLICY_NONE,
		options{runRetention: 100 * time.Millisecond, runSweep: 20 * time.Millisecond},
		llmtest.Answer("now"), llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"x"}`}))
	res, err := f.query(t, &connectorv1.QueryConnectorRequest{Query: "q"})
	if err != nil {
		t.Fatal(err)
	}
	testsupport.WaitFor(t, "the finished run to be written", func() bool {
		_, err := f.client.GetQueryRun(ctx(t), &connectorv1.GetQueryRunRequest{WorkspaceId: "ws", RunId: res.GetRunId()})
		return err == nil
	})
	// A paused run is not finished: retention does not purge it.
	if _, err := f.client.UpdateTool(ctx(t), &connectorv1.UpdateToolRequest{WorkspaceId: "ws", ConnectorId: "m", ToolName: "echo",
		ApprovalOverride: connectorv1.ApprovalOverride_APPROVAL_OVERRIDE_ALWAYS}); err != nil {
		t.Fatal(err)
	}
	paused := f.paused(t, &connectorv1.QueryConnectorRequest{Query: "q2"})
	testsupport.WaitFor(t, "the finished run to be purged", func() bool {
		_, err := f.client.GetQueryRun(ctx(t), &connectorv1.GetQueryRunRequest{WorkspaceId: "ws", RunId: res.GetRunId()})
		return status.Code(err) == codes.NotFound
	})
	if run := f.getRun(t, paused.GetRunId()); run.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_AWAITING_APPROVAL {
		t.Errorf("paused run after the purge = %v", run.GetStatus())
	}
}

func TestStreamApprovalEventOrder(t *testing.T) {
	f, _, _ := approvalFixture(t, connectorv1.ApprovalPolicy_APPROVAL_POLICY_DESTRUCTIVE, options{},
		llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"a"}`}, llmtest.Call{Tool: "weather", Args: `{}`}),
		llmtest.Answer("done"))
	stream, err := f.client.StreamQueryConnector(ctx(t), &connectorv1.StreamQueryConnectorRequest{WorkspaceId: "ws", ConnectorId: "m", Query: "q"})
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	var runID string
	for _, msg := range recvAll(t, stream) {
		kinds = append(kinds, eventKind(msg))
		if a := msg.GetApprovalRequired(); a != nil {
			runID = a.GetRunId()
			if len(a.GetPendingCalls()) != 1 || a.GetPendingCalls()[0].GetTool() != "weather" || a.GetExpireTime() == nil {
				t.Errorf("approval_required = %v", a)
			}
		}
	}
	want := []string{"step_planned", "tool_call_started", "tool_call_finished", "approval_required", "result"}
	if diff := cmp.Diff(want, kinds); diff != "" {
		t.Fatalf("stream events (-want +got):\n%s", diff)
	}
	rs, err := f.client.StreamResumeQuery(ctx(t), &connectorv1.StreamResumeQueryRequest{WorkspaceId: "ws", RunId: runID,
		Decisions: []*connectorv1.Decision{approve("call_2")}})
	if err != nil {
		t.Fatal(err)
	}
	kinds = nil
	var last *connectorv1.StreamQueryConnectorResponse
	for _, msg := range recvAll(t, rs) {
		kinds = append(kinds, eventKind(msg.GetEvent()))
		last = msg.GetEvent()
	}
	want = []string{"tool_call_started", "tool_call_finished", "answer", "result"}
	if diff := cmp.Diff(want, kinds); diff != "" {
		t.Errorf("resume stream events (-want +got):\n%s", diff)
	}
	if last.GetResult().GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_COMPLETED {
		t.Errorf("last event = %v", last)
	}
}

func eventKind(m *connectorv1.StreamQueryConnectorResponse) string {
	switch m.GetEvent().(type) {
	case *connectorv1.StreamQueryConnectorResponse_StepPlanned:
		return "step_planned"
	case *connectorv1.StreamQueryConnectorResponse_ToolCallStarted:
		return "tool_call_started"
	case *connectorv1.StreamQueryConnectorResponse_ToolCallFinished:
		return "tool_call_finished"
	case *connectorv1.StreamQueryConnectorResponse_ToolCallProgress:
		return "tool_call_progress"
	case *connectorv1.StreamQueryConnectorResponse_Answer:
		return "answer"
	case *connectorv1.StreamQueryConnectorResponse_ApprovalRequired:
		return "approval_required"
	case *connectorv1.StreamQueryConnectorResponse_Result:
		return "result"
	}
	return "?"
}

// heldAnswer answers once released, telling reached when the request
// came: a model still thinking while the test looks.
func heldAnswer(text string, reached, release chan struct{}) llmtest.Step {
	answer := llmtest.Answer(text)
	return func(req openai.ChatCompletionRequest) llmtest.Reply {
		close(reached)
		<-release
		return answer(req)
	}
}

// TestResumeOutlivesItsCaller: once a resume has claimed the run, the
// decisions are in its record, and the run goes on to its end even if the
// caller gives up.
func TestResumeOutlivesItsCaller(t *testing.T) {
	reached, release := make(chan struct{}), make(chan struct{})
	f, _, srv := approvalFixture(t, connectorv1.ApprovalPolicy_APPROVAL_POLICY_ALL, options{},
		llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"hi"}`}),
		heldAnswer("It said hi.", reached, release))
	res := f.paused(t, &connectorv1.QueryConnectorRequest{Query: "q"})
	caller, cancel := context.WithCancel(ctx(t))
	errs := make(chan error, 1)
	go func() {
		_, err := f.client.ResumeQuery(caller, &connectorv1.ResumeQueryRequest{WorkspaceId: "ws", RunId: res.GetRunId(), ActorId: "alice",
			Decisions: []*connectorv1.Decision{approve("call_1")}})
		errs <- err
	}()
	<-reached // the approved call ran; the model is asked again
	cancel()
	if err := <-errs; status.Code(err) != codes.Canceled {
		t.Fatalf("ResumeQuery cancelled by its caller: %v, want CANCELED", err)
	}
	// Meanwhile the record says who decided what.
	if run := f.getRun(t, res.GetRunId()); run.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_RUNNING ||
		run.GetResult().GetSteps()[0].GetCalls()[0].GetDecision().GetActorId() != "alice" {
		t.Errorf("run while resumed = %v; want RUNNING with alice's decision", run)
	}
	close(release)
	testsupport.WaitFor(t, "the resumed run to complete", func() bool {
		return f.getRun(t, res.GetRunId()).GetStatus() == connectorv1.QueryStatus_QUERY_STATUS_COMPLETED
	})
	if run := f.getRun(t, res.GetRunId()); run.GetResult().GetAnswer() != "It said hi." || len(srv.toolCallHeaders()) != 1 {
		t.Errorf("completed run = %v", run)
	}
}

// TestDeletingAConnectorEndsItsPausedRuns: a paused run of a deleted
// connector can never go on; its record says so at once.
func TestDeletingAConnectorEndsItsPausedRuns(t *testing.T) {
	f, _, _ := approvalFixture(t, connectorv1.ApprovalPolicy_APPROVAL_POLICY_ALL, options{},
		llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"hi"}`}))
	res := f.paused(t, &connectorv1.QueryConnectorRequest{Query: "q"})
	if _, err := f.client.DeleteConnector(ctx(t), &connectorv1.DeleteConnectorRequest{WorkspaceId: "ws", ConnectorId: "m"}); err != nil {
		t.Fatal(err)
	}
	run := f.getRun(t, res.GetRunId())
	if run.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_FAILED || !strings.Contains(run.GetError(), "deleted") || run.GetConnectorId() != "m" {
		t.Errorf("paused run after DeleteConnector = %v; want FAILED, saying why, still naming m", run)
	}
	_, err := f.resume(t, res.GetRunId(), approve("call_1"))
	wantStatus(t, err, codes.FailedPrecondition, server.ReasonRunNotAwaiting, "")
}

// TestADeclinedCallIsNotAskedAgain: a model that asks again for the call
// the user declined gets the refusal at once; the person is not asked
// twice.
func TestADeclinedCallIsNotAskedAgain(t *testing.T) {
	f, _, srv := approvalFixture(t, connectorv1.ApprovalPolicy_APPROVAL_POLICY_ALL, options{},
		llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"hi"}`}),
		llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"hi"}`}),
		llmtest.Answer("I could not."))
	res := f.paused(t, &connectorv1.QueryConnectorRequest{Query: "q"})
	done, err := f.resume(t, res.GetRunId(), &connectorv1.Decision{CallId: "call_1", Kind: connectorv1.DecisionKind_DECISION_KIND_DENY})
	if err != nil {
		t.Fatal(err)
	}
	if done.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_COMPLETED || len(done.GetSteps()) != 2 ||
		!strings.Contains(done.GetSteps()[1].GetCalls()[0].GetRejectedReason(), "already declined") || len(srv.toolCallHeaders()) != 0 {
		t.Errorf("resumed = %v; want the repeated call refused and the run completed", done)
	}
}

// TestRunRecordsHoldNoSecret: a connector's header and URL query values
// never reach its runs' rows, paused or finished.
func TestRunRecordsHoldNoSecret(t *testing.T) {
	model := llmtest.New(t,
		llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"hi"}`}, llmtest.Call{Tool: "fail", Args: `{}`}),
		llmtest.Answer("done"))
	f := setup(t, options{llmURL: model.URL()})
	srv := newTestMCP(t)
	c := mcpConnector("m", srv.url()+"?api_key="+distinctive)
	c.GetHttp().Headers = map[string]string{"Authorization": "Bearer " + distinctive}
	c.ApprovalPolicy = connectorv1.ApprovalPolicy_APPROVAL_POLICY_DESTRUCTIVE
	f.create(t, "ws", c)
	f.waitReady(t, "ws", "m")
	res := f.paused(t, &connectorv1.QueryConnectorRequest{Query: "q"})
	if _, err := f.resume(t, res.GetRunId(), approve("call_2")); err != nil {
		t.Fatal(err)
	}
	var rows string
	err := f.db.InTx(context.Background(), func(tx pgx.Tx) error {
		return tx.QueryRow(context.Background(), `SELECT coalesce(string_agg(q::text, ' '), '') FROM query_runs q`).Scan(&rows)
	})
	if err != nil || !strings.Contains(rows, res.GetRunId()) {
		t.Fatalf("query_runs = %q, %v", rows, err)
	}
	if strings.Contains(rows, distinctive) {
		t.Error("a run row holds a connector secret")
	}
}

// TestDecisionsRecordTheirAPIKey: with auth on, a decision's record names
// the API key it came with, beside the actor the caller names.
func TestDecisionsRecordTheirAPIKey(t *testing.T) {
	model := llmtest.New(t, llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"hi"}`}), llmtest.Answer("ok"))
	f := setup(t, options{llmURL: model.URL(), auth: auth.ModeAuto})
	key := f.createKey(t, "", "ws", scopeAdmin)
	c := bearer(ctx(t), key.GetToken())
	srv := newTestMCP(t)
	conn := mcpConnector("m", srv.url())
	conn.ApprovalPolicy = connectorv1.ApprovalPolicy_APPROVAL_POLICY_ALL
	if _, err := f.client.CreateConnector(c, &connectorv1.CreateConnectorRequest{WorkspaceId: "ws", Connector: conn}); err != nil {
		t.Fatal(err)
	}
	q, err := f.client.QueryConnector(c, &connectorv1.QueryConnectorRequest{WorkspaceId: "ws", ConnectorId: "m", Query: "q"})
	if err != nil || q.GetResult().GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_AWAITING_APPROVAL {
		t.Fatalf("query = %v, %v", q, err)
	}
	done, err := f.client.ResumeQuery(c, &connectorv1.ResumeQueryRequest{WorkspaceId: "ws", RunId: q.GetResult().GetRunId(),
		ActorId: "alice", Decisions: []*connectorv1.Decision{approve("call_1")}})
	if err != nil {
		t.Fatal(err)
	}
	d := done.GetResult().GetSteps()[0].GetCalls()[0].GetDecision()
	if d.GetApiKeyId() != key.GetApiKey().GetKeyId() || d.GetActorId() != "alice" {
		t.Errorf("decision = %v; want actor alice and key %s", d, key.GetApiKey().GetKeyId())
	}
}
