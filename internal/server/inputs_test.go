package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/server"
	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/telemetry/telemetrytest"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

// askSchema is the form the "ask" tool requests.
var askSchema = map[string]any{
	"type": "object",
	"properties": map[string]any{
		"name": map[string]any{"type": "string", "minLength": 1},
		"age":  map[string]any{"type": "integer", "minimum": 0},
	},
	"required": []any{"name"},
}

// askDefaultsSchema is a form whose "lang" has a default (SEP-1034).
var askDefaultsSchema = map[string]any{
	"type": "object",
	"properties": map[string]any{
		"name": map[string]any{"type": "string"},
		"lang": map[string]any{"type": "string", "default": "en"},
	},
	"required": []any{"name"},
}

// askMCP is a real mcp-go server over streamable HTTP whose tools ask
// back, on either protocol generation (mcp-go sends an input request as
// elicitation/create to a classic client, as input_required to a
// sessionless one):
//   - ask: elicits askSchema as "who", and says the answer it got;
//   - askdefaults: the same with askDefaultsSchema;
//   - needurl: fails with -32042 (a URL to open) the first time, and
//     answers "granted" after.
type askMCP struct {
	url string

	mu      sync.Mutex
	answers []string // what "ask" got, as it says it
	urlHits int
}

func newAskMCP(t *testing.T) *askMCP { t.Helper(); return newAskMCPB(t) }

func newAskMCPB(t testing.TB) *askMCP {
	t.Helper()
	a := &askMCP{}
	m := mcpserver.NewMCPServer("asks", "1.0", mcpserver.WithToolCapabilities(true), mcpserver.WithElicitation())
	m.AddTool(mcp.NewTool("ask", mcp.WithDescription("Asks who you are")), a.asker("state-ask", askSchema))
	m.AddTool(mcp.NewTool("askdefaults", mcp.WithDescription("Asks who you are, in a form with a default")),
		a.asker("state-askdefaults", askDefaultsSchema))
	m.AddTool(mcp.NewTool("needurl", mcp.WithDescription("Needs a login first")), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		a.mu.Lock()
		a.urlHits++
		first := a.urlHits == 1
		a.mu.Unlock()
		if first {
			return nil, mcp.URLElicitationRequiredError{Elicitations: []mcp.ElicitationParams{{
				Mode: mcp.ElicitationModeURL, Message: "Grant access", URL: "https://auth.example.com/login?state=abc", ElicitationID: "el-9"}}}
		}
		return mcp.NewToolResultText("granted"), nil
	})
	m.AddTool(mcp.NewTool("sample", mcp.WithDescription("Asks the client's model")), func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if res := mcpserver.SamplingResponse(req.Params.InputResponses, "s"); res != nil {
			text := ""
			if tc, ok := mcp.AsTextContent(res.Content); ok {
				text = tc.Text
			} else if m, ok := res.Content.(map[string]any); ok {
				text, _ = m["text"].(string)
			}
			return mcp.NewToolResultText("sampled=" + text), nil
		}
		return mcpserver.NewInputRequestBuilder("state-sample").Sample("s", mcp.CreateMessageParams{
			Messages:  []mcp.SamplingMessage{{Role: mcp.RoleUser, Content: mcp.NewTextContent("hello")}},
			MaxTokens: 50}).ToolResult(), nil
	})
	hs := httptest.NewServer(mcpserver.NewStreamableHTTPServer(m))
	t.Cleanup(hs.Close)
	a.url = hs.URL + "/mcp"
	return a
}

// asker is a tool that elicits schema as "who" and says the answer it got.
func (a *askMCP) asker(state string, schema map[string]any) mcpserver.ToolHandlerFunc {
	return func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if ans := mcpserver.ElicitationResponse(req.Params.InputResponses, "who"); ans != nil {
			b, _ := json.Marshal(ans.Content)
			got := fmt.Sprintf("action=%s content=%s", ans.Action, b)
			a.mu.Lock()
			a.answers = append(a.answers, got)
			a.mu.Unlock()
			return mcp.NewToolResultText(got), nil
		}
		return mcpserver.NewInputRequestBuilder(state).Elicit("who", mcp.ElicitationParams{
			Message: "Who are you?", RequestedSchema: schema}).ToolResult(), nil
	}
}

func (a *askMCP) got() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.answers...)
}

// inputFixture is a server with an agent on a fake LLM and one READY
// per-session connector "m" with elicitation on, on an askMCP speaking
// protocol.
func inputFixture(t *testing.T, protocol connectorv1.ProtocolPreference, o options, steps ...llmtest.Step) (*fixture, *llmtest.Server, *askMCP) {
	t.Helper()
	model := llmtest.New(t, steps...)
	o.llmURL = model.URL()
	f := setup(t, o)
	srv := newAskMCP(t)
	c := mcpConnector("m", srv.url)
	c.SessionMode, c.ProtocolPreference, c.Elicitation = connectorv1.SessionMode_SESSION_MODE_PER_SESSION, protocol, true
	f.create(t, "ws", c)
	f.waitReady(t, "ws", "m")
	return f, model, srv
}

func (f *fixture) answer(t *testing.T, runID string, answers ...*connectorv1.InputAnswer) (*connectorv1.QueryResult, error) {
	t.Helper()
	resp, err := f.client.ResumeQuery(ctx(t), &connectorv1.ResumeQueryRequest{WorkspaceId: "ws", RunId: runID, Inputs: answers, ActorId: "alice"})
	return resp.GetResult(), err
}

// awaitingInput runs a query that must pause for one input, and returns
// it.
func (f *fixture) awaitingInput(t *testing.T) *connectorv1.QueryResult {
	t.Helper()
	res := f.awaitingInputs(t)
	if len(res.GetInputRequests()) != 1 {
		t.Fatalf("query = %v; want one input request", res)
	}
	return res
}

// awaitingInputs runs a query that must pause for input, and returns it.
func (f *fixture) awaitingInputs(t *testing.T) *connectorv1.QueryResult {
	t.Helper()
	res, err := f.query(t, &connectorv1.QueryConnectorRequest{Query: "who am I?", SessionId: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	if res.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_AWAITING_INPUT || res.GetRunId() == "" || len(res.GetInputRequests()) == 0 {
		t.Fatalf("query = %v; want AWAITING_INPUT with a run id and input requests", res)
	}
	return res
}

func accept(id string, content map[string]any) *connectorv1.InputAnswer {
	return &connectorv1.InputAnswer{InputId: id, Action: connectorv1.InputAction_INPUT_ACTION_ACCEPT, Content: mustStructT(content)}
}

func mustStructT(m map[string]any) *structpb.Struct {
	st, err := structpb.NewStruct(m)
	if err != nil {
		panic(err)
	}
	return st
}

// lastToolMessage is the last tool message of the model's request i.
func lastToolMessage(model *llmtest.Server, i int) string {
	msgs := toolMessages(model.Requests()[i])
	if len(msgs) == 0 {
		return ""
	}
	return msgs[len(msgs)-1]
}

func TestQueryLiveInputAnswered(t *testing.T) {
	f, model, srv := inputFixture(t, connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_CLASSIC, options{},
		llmtest.CallTools(llmtest.Call{Tool: "ask", Args: `{}`}), llmtest.Answer("You are Ada."))
	res := f.awaitingInput(t)
	in := res.GetInputRequests()[0]
	if in.GetInputId() != "call_1.1" || in.GetMode() != connectorv1.InputMode_INPUT_MODE_FORM || in.GetMessage() != "Who are you?" ||
		in.GetCallId() != "call_1" || in.GetTool() != "ask" || in.GetDeadline() == nil || in.GetDurable() ||
		in.GetRequestedSchema().AsMap()["required"] == nil || in.GetConnectorId() != "m" {
		t.Fatalf("input request = %v; want the live form of call_1 with its schema and deadline", in)
	}
	if run := f.getRun(t, res.GetRunId()); run.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_AWAITING_INPUT ||
		len(run.GetResult().GetInputRequests()) != 1 {
		t.Errorf("GetQueryRun while paused = %v", run)
	}

	// Content the schema refuses never reaches the server.
	_, err := f.answer(t, res.GetRunId(), accept(in.GetInputId(), map[string]any{"age": -1}))
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "inputs[0].content")
	_, err = f.answer(t, res.GetRunId(), &connectorv1.InputAnswer{InputId: in.GetInputId()})
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "inputs[0].action")
	_, err = f.answer(t, res.GetRunId(), accept("call_9.1", map[string]any{"name": "x"}))
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "inputs[0].input_id")
	if got := srv.got(); len(got) != 0 {
		t.Fatalf("the server got %v before a valid answer", got)
	}

	done, err := f.answer(t, res.GetRunId(), accept(in.GetInputId(), map[string]any{"name": "Ada", "age": 36}))
	if err != nil {
		t.Fatal(err)
	}
	if done.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_COMPLETED || done.GetAnswer() != "You are Ada." || done.GetRunId() != res.GetRunId() {
		t.Fatalf("resumed = %v; want COMPLETED", done)
	}
	want := `action=accept content={"age":36,"name":"Ada"}`
	if got := srv.got(); len(got) != 1 || got[0] != want {
		t.Errorf("the server got %v, want [%s]", got, want)
	}
	if got := lastToolMessage(model, 1); got != want {
		t.Errorf("the model read %q, want %q", got, want)
	}
	call := done.GetSteps()[0].GetCalls()[0]
	if len(call.GetInputs()) != 1 || call.GetInputs()[0].GetAnswer().GetAction() != connectorv1.InputAction_INPUT_ACTION_ACCEPT ||
		call.GetInputs()[0].GetAnswer().GetActorId() != "alice" {
		t.Errorf("recorded call = %v; want its input with the answer", call)
	}
	run := f.getRun(t, res.GetRunId())
	if run.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_COMPLETED || len(run.GetResult().GetSteps()[0].GetCalls()[0].GetInputs()) != 1 {
		t.Errorf("GetQueryRun after = %v", run)
	}
	// An answer is given once.
	_, err = f.answer(t, res.GetRunId(), accept(in.GetInputId(), map[string]any{"name": "Ada"}))
	wantStatus(t, err, codes.FailedPrecondition, server.ReasonRunNotAwaitingInput, "")
	testsupport.WaitFor(t, "input_count 1", func() bool {
		c, err := f.client.GetConnector(ctx(t), &connectorv1.GetConnectorRequest{WorkspaceId: "ws", ConnectorId: "m"})
		return err == nil && c.GetConnector().GetCounters().GetInputCount() == 1 && c.GetConnector().GetCounters().GetQueryCount() == 1
	})
}

func TestQueryLiveInputDeclinedOrCancelled(t *testing.T) {
	meters := telemetrytest.New(t)
	f, model, srv := inputFixture(t, connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_CLASSIC, options{meters: meters})
	for i, action := range []connectorv1.InputAction{connectorv1.InputAction_INPUT_ACTION_DECLINE, connectorv1.InputAction_INPUT_ACTION_CANCEL} {
		model.Then(llmtest.CallTools(llmtest.Call{Tool: "ask", Args: `{}`}), llmtest.Answer("ok"))
		res := f.awaitingInput(t)
		id := res.GetInputRequests()[0].GetInputId()
		_, err := f.answer(t, res.GetRunId(), &connectorv1.InputAnswer{InputId: id, Action: action, Content: mustStructT(map[string]any{"name": "x"})})
		wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "inputs[0].content")
		done, err := f.answer(t, res.GetRunId(), &connectorv1.InputAnswer{InputId: id, Action: action})
		if err != nil {
			t.Fatal(err)
		}
		word := strings.ToLower(strings.TrimPrefix(action.String(), "INPUT_ACTION_"))
		want := "action=" + word + " content=null"
		if done.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_COMPLETED || lastToolMessage(model, 2*i+1) != want {
			t.Errorf("%s: resumed %v, the model read %q; want COMPLETED and %q", word, done.GetStatus(), lastToolMessage(model, 2*i+1), want)
		}
		if got := srv.got(); len(got) != i+1 || got[i] != want {
			t.Errorf("%s: the server got %v", word, got)
		}
		attrs := telemetrytest.Attrs("workspace", "ws", "connector", "m", "mode", "form", "outcome", word)
		if got := meters.Value(t, "connector.inputs", attrs...); got != 1 {
			t.Errorf("connector.inputs %v = %v, want 1", attrs, got)
		}
	}
}

func TestQueryLiveInputTimesOut(t *testing.T) {
	f, model, srv := inputFixture(t, connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_CLASSIC, options{elicitationTimeout: 3 * time.Second},
		llmtest.CallTools(llmtest.Call{Tool: "ask", Args: `{}`}), llmtest.Answer("Nobody answered."))
	res := f.awaitingInput(t)
	testsupport.WaitFor(t, "the run to finish", func() bool {
		return f.getRun(t, res.GetRunId()).GetStatus() == connectorv1.QueryStatus_QUERY_STATUS_COMPLETED
	})
	if got := srv.got(); len(got) != 1 || got[0] != "action=cancel content=null" {
		t.Errorf("the server got %v; want a cancel", got)
	}
	if got := lastToolMessage(model, 1); !strings.Contains(got, "action=cancel") || !strings.Contains(got, "did not answer the server's request in time") {
		t.Errorf("the model read %q; want the cancel and the note", got)
	}
	_, err := f.answer(t, res.GetRunId(), accept(res.GetInputRequests()[0].GetInputId(), map[string]any{"name": "late"}))
	wantStatus(t, err, codes.FailedPrecondition, server.ReasonRunNotAwaitingInput, "")
}

func TestStreamQueryLiveInput(t *testing.T) {
	f, _, _ := inputFixture(t, connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_CLASSIC, options{},
		llmtest.CallTools(llmtest.Call{Tool: "ask", Args: `{}`}), llmtest.Answer("You are Bo."))
	stream, err := f.client.StreamQueryConnector(ctx(t), &connectorv1.StreamQueryConnectorRequest{WorkspaceId: "ws", ConnectorId: "m",
		Query: "who?", SessionId: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	msgs := recvAll(t, stream)
	n := len(msgs)
	if n < 2 || msgs[n-2].GetInputRequired() == nil || msgs[n-1].GetResult().GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_AWAITING_INPUT {
		t.Fatalf("stream ended with %v; want input_required then the AWAITING_INPUT result", msgs[max(n-2, 0):])
	}
	ir := msgs[n-2].GetInputRequired()
	if ir.GetRunId() == "" || len(ir.GetInputRequests()) != 1 {
		t.Fatalf("input_required = %v", ir)
	}
	rs, err := f.client.StreamResumeQuery(ctx(t), &connectorv1.StreamResumeQueryRequest{WorkspaceId: "ws", RunId: ir.GetRunId(),
		Inputs: []*connectorv1.InputAnswer{accept(ir.GetInputRequests()[0].GetInputId(), map[string]any{"name": "Bo"})}})
	if err != nil {
		t.Fatal(err)
	}
	resumed := recvAll(t, rs)
	var finished, answer bool
	for _, m := range resumed {
		finished = finished || m.GetEvent().GetToolCallFinished() != nil
		answer = answer || m.GetEvent().GetAnswer().GetAnswer() == "You are Bo."
	}
	last := resumed[len(resumed)-1].GetEvent().GetResult()
	if !finished || !answer || last.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_COMPLETED {
		t.Errorf("resumed stream = %v; want the call's finish, the answer and the result", resumed)
	}
}

// sessionlessFixture is a server with one READY oauth_user connector "m"
// with elicitation on, on an askMCP speaking the sessionless protocol,
// and user u1 authorized. Elicitation is declared on connections of one
// user: on the sessionless protocol, an oauth_user connector's.
func sessionlessFixture(t *testing.T, o options) (*fixture, *fakeOAuth, *askMCP) {
	t.Helper()
	oa := newFakeOAuth()
	o.oauth = oa
	f := setup(t, o)
	srv := newAskMCP(t)
	c := oauthUserConnector("m", srv.url)
	c.ProtocolPreference, c.Elicitation = connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_SESSIONLESS, true
	f.create(t, "ws", c)
	f.waitReachable(t, "ws", "m")
	oa.grant(mustLookup(t, f, "ws", "m"), "u1", "read")
	return f, oa, srv
}

func TestQueryDurableInputSurvivesARestart(t *testing.T) {
	model := llmtest.New(t, llmtest.CallTools(llmtest.Call{Tool: "ask", Args: `{}`}), llmtest.Answer("You are Cy."))
	f, oa, srv := sessionlessFixture(t, options{llmURL: model.URL()})

	res, err := f.query(t, &connectorv1.QueryConnectorRequest{Query: "who am I?", UserId: "u1"})
	if err != nil {
		t.Fatal(err)
	}
	if res.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_AWAITING_INPUT || len(res.GetInputRequests()) != 1 {
		t.Fatalf("query = %v; want AWAITING_INPUT with one input request", res)
	}
	in := res.GetInputRequests()[0]
	if in.GetInputId() != "call_1/who" || !in.GetDurable() || in.GetDeadline() != nil || res.GetExpireTime() == nil {
		t.Fatalf("input request = %v (expires %v); want the durable form call_1/who", in, res.GetExpireTime())
	}
	// Another service on the same database: a new server, registry and
	// connections; the first one's state is in the row alone.
	f.stop()
	g := setup(t, options{llmURL: model.URL(), oauth: oa, shared: f})
	g.waitReachable(t, "ws", "m")
	_, err = g.answer(t, res.GetRunId(), accept(in.GetInputId(), map[string]any{"name": ""}))
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "inputs[0].content")
	done, err := g.answer(t, res.GetRunId(), accept(in.GetInputId(), map[string]any{"name": "Cy"}))
	if err != nil {
		t.Fatal(err)
	}
	want := `action=accept content={"name":"Cy"}`
	if done.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_COMPLETED || lastToolMessage(model, 1) != want {
		t.Fatalf("resumed = %v, the model read %q; want COMPLETED and %q", done.GetStatus(), lastToolMessage(model, 1), want)
	}
	if got := srv.got(); len(got) != 1 || got[0] != want {
		t.Errorf("the server got %v", got)
	}
	_, err = g.answer(t, res.GetRunId(), accept(in.GetInputId(), map[string]any{"name": "Cy"}))
	wantStatus(t, err, codes.FailedPrecondition, server.ReasonRunNotAwaitingInput, "")
}

func TestQueryURLRequired(t *testing.T) {
	f, model, srv := inputFixture(t, connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_CLASSIC, options{},
		llmtest.CallTools(llmtest.Call{Tool: "needurl", Args: `{}`}), llmtest.Answer("Granted."))
	res := f.awaitingInput(t)
	in := res.GetInputRequests()[0]
	if in.GetMode() != connectorv1.InputMode_INPUT_MODE_URL || in.GetUrlHost() != "auth.example.com" || !in.GetDurable() ||
		in.GetUrl() != "https://auth.example.com/login?state=abc" {
		t.Fatalf("input request = %v; want the URL with its host", in)
	}
	_, err := f.answer(t, res.GetRunId(), accept(in.GetInputId(), map[string]any{"x": 1}))
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "inputs[0].content")
	done, err := f.answer(t, res.GetRunId(), &connectorv1.InputAnswer{InputId: in.GetInputId(), Action: connectorv1.InputAction_INPUT_ACTION_ACCEPT})
	if err != nil {
		t.Fatal(err)
	}
	if done.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_COMPLETED || lastToolMessage(model, 1) != "granted" {
		t.Errorf("resumed = %v, the model read %q; want the call retried", done.GetStatus(), lastToolMessage(model, 1))
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.urlHits != 2 {
		t.Errorf("needurl ran %d times, want 2", srv.urlHits)
	}
}

// streamAsk starts a StreamCallTool of "ask" on connector "m" (req says
// the session or user) and returns it with its first message, which must
// be input_required.
func (f *fixture) streamAsk(t *testing.T, req *connectorv1.StreamCallToolRequest) (connectorv1.ConnectorService_StreamCallToolClient, *connectorv1.InputRequest) {
	t.Helper()
	req.WorkspaceId, req.ConnectorId, req.ToolName = "ws", "m", "ask"
	stream, err := f.client.StreamCallTool(ctx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if msg.GetInputRequired() == nil {
		t.Fatalf("first message = %v; want input_required", msg)
	}
	return stream, msg.GetInputRequired()
}

func TestStreamCallToolAnswerInput(t *testing.T) {
	f, _, srv := inputFixture(t, connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_CLASSIC, options{})
	stream, in := f.streamAsk(t, &connectorv1.StreamCallToolRequest{SessionId: "s1"})
	if in.GetMode() != connectorv1.InputMode_INPUT_MODE_FORM || in.GetInputId() == "" || in.GetDeadline() == nil {
		t.Fatalf("input_required = %v; want a form with a deadline", in)
	}
	answer := func(session string, a *connectorv1.InputAnswer) error {
		_, err := f.client.AnswerInput(ctx(t), &connectorv1.AnswerInputRequest{WorkspaceId: "ws", ConnectorId: "m", SessionId: session, Answer: a})
		return err
	}
	wantStatus(t, answer("s1", accept("in_nope", map[string]any{"name": "x"})), codes.NotFound, server.ReasonInputNotFound, "")
	wantStatus(t, answer("s2", accept(in.GetInputId(), map[string]any{"name": "x"})), codes.NotFound, server.ReasonInputNotFound, "")
	wantStatus(t, answer("s1", accept(in.GetInputId(), map[string]any{"age": 3})), codes.InvalidArgument, server.ReasonInvalidArgument, "answer.content")
	if err := answer("s1", accept(in.GetInputId(), map[string]any{"name": "Di"})); err != nil {
		t.Fatal(err)
	}
	msgs := recvAll(t, stream)
	res := msgs[len(msgs)-1].GetResult()
	if got := res.GetContent()[0].GetText().GetText(); got != `action=accept content={"name":"Di"}` {
		t.Errorf("result = %q", got)
	}
	if got := srv.got(); len(got) != 1 {
		t.Errorf("the server got %v", got)
	}
}

func TestCallToolCancelsInputs(t *testing.T) {
	f, _, _ := inputFixture(t, connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_CLASSIC, options{})
	resp, err := f.client.CallTool(ctx(t), &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: "m", ToolName: "ask", SessionId: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetContent()[0].GetText().GetText(); got != "action=cancel content=null" {
		t.Errorf("result = %q; want the server told cancel", got)
	}
	if c := resp.GetCancelledInputs(); len(c) != 1 || c[0].GetMessage() != "Who are you?" || c[0].GetMode() != connectorv1.InputMode_INPUT_MODE_FORM {
		t.Errorf("cancelled inputs = %v", c)
	}
	// A URL to open cannot be asked on a unary call.
	_, err = f.client.CallTool(ctx(t), &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: "m", ToolName: "needurl", SessionId: "s1"})
	wantStatus(t, err, codes.FailedPrecondition, server.ReasonInputRequired, "")
	if err != nil && !strings.Contains(err.Error(), "auth.example.com") {
		t.Errorf("error %v does not name the URL's host", err)
	}
}

// fakeSample answers sampling requests as the connector's model would,
// within the caller's budget, and records each on the caller's Asker.
func fakeSample(_ context.Context, _ int64, a ask.Asker, call ask.Call, _ mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
	if a == nil {
		return nil, fmt.Errorf("no asker")
	}
	if b := a.Sampling(); b != nil {
		if _, err := b.Reserve(50); err != nil {
			a.Sampled(call, ask.SamplingRecord{Err: err.Error()})
			return nil, err
		}
	}
	a.Sampled(call, ask.SamplingRecord{Model: "fake-model", Messages: 1, PromptTokens: 11, CompletionTokens: 5, StopReason: "endTurn"})
	return &mcp.CreateMessageResult{SamplingMessage: mcp.SamplingMessage{Role: mcp.RoleAssistant, Content: mcp.NewTextContent("hi")},
		Model: "fake-model", StopReason: "endTurn"}, nil
}

func TestSamplingCountsInRunsAndCounters(t *testing.T) {
	model := llmtest.New(t, llmtest.CallTools(llmtest.Call{Tool: "sample", Args: `{}`}), llmtest.Answer("It said hi."),
		llmtest.CallTools(llmtest.Call{Tool: "sample", Args: `{}`}), llmtest.Answer("Out of budget."))
	f := setup(t, options{llmURL: model.URL(), sample: fakeSample,
		samplingBudget: func(*store.Connector) *ask.Budget { return ask.NewBudget(1, 1000) }})
	srv := newAskMCP(t)
	c := mcpConnector("m", srv.url)
	c.ProtocolPreference = connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_SESSIONLESS
	c.Sampling = &connectorv1.SamplingConfig{Enabled: true}
	f.create(t, "ws", c)
	f.waitReady(t, "ws", "m")

	res, err := f.query(t, &connectorv1.QueryConnectorRequest{Query: "sample"})
	if err != nil {
		t.Fatal(err)
	}
	if got := lastToolMessage(model, 1); got != "sampled=hi" {
		t.Fatalf("the model read %q", got)
	}
	call := res.GetSteps()[0].GetCalls()[0]
	if s := call.GetSamplings(); len(s) != 1 || s[0].GetPromptTokens() != 11 || s[0].GetCallId() != "call_1" || s[0].GetModel() != "fake-model" {
		t.Errorf("samplings = %v", s)
	}
	if u := res.GetUsage(); u.GetPromptTokens() != 2*100+11 || u.GetCompletionTokens() != 2*20+5 {
		t.Errorf("usage = %v; want the model's tokens and the sampling's", u)
	}
	// A direct call has a budget of its own; the second sampling of a
	// query's budget of one request is refused.
	if resp, err := f.call(t, "ws", "m", "sample", nil); err != nil || resp.GetContent()[0].GetText().GetText() != "sampled=hi" {
		t.Fatalf("CallTool(sample) = %v, %v", resp, err)
	}
	testsupport.WaitFor(t, "the counters", func() bool {
		c, err := f.client.GetConnector(ctx(t), &connectorv1.GetConnectorRequest{WorkspaceId: "ws", ConnectorId: "m"})
		n := c.GetConnector().GetCounters()
		return err == nil && n.GetSamplingCount() == 2 && n.GetPromptTokens() == 2*100+2*11 && n.GetCompletionTokens() == 2*20+2*5
	})
}

func TestDirectCallsOnTheSessionlessProtocol(t *testing.T) {
	f, _, srv := sessionlessFixture(t, options{})

	// Unary: the call is sent again once, with cancel.
	resp, err := f.client.CallTool(ctx(t), &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: "m", ToolName: "ask", UserId: "u1"})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetContent()[0].GetText().GetText(); got != "action=cancel content=null" || len(resp.GetCancelledInputs()) != 1 ||
		!resp.GetCancelledInputs()[0].GetDurable() {
		t.Errorf("unary ask = %q, cancelled %v", got, resp.GetCancelledInputs())
	}

	// Streamed: the call is sent again with the answer.
	stream, in := f.streamAsk(t, &connectorv1.StreamCallToolRequest{UserId: "u1"})
	if !in.GetDurable() {
		t.Fatalf("input_required = %v; want a durable one", in)
	}
	if _, err := f.client.AnswerInput(ctx(t), &connectorv1.AnswerInputRequest{WorkspaceId: "ws", ConnectorId: "m", UserId: "u1",
		Answer: accept(in.GetInputId(), map[string]any{"name": "Ed"})}); err != nil {
		t.Fatal(err)
	}
	msgs := recvAll(t, stream)
	if got := msgs[len(msgs)-1].GetResult().GetContent()[0].GetText().GetText(); got != `action=accept content={"name":"Ed"}` {
		t.Errorf("streamed ask = %q", got)
	}
	if got := srv.got(); len(got) != 2 {
		t.Errorf("the server got %v; want the cancel, then the answer", got)
	}
}

func TestQueryTwoLiveInputsOfOneTurn(t *testing.T) {
	f, model, srv := inputFixture(t, connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_CLASSIC, options{},
		llmtest.CallTools(llmtest.Call{Tool: "ask", Args: `{}`}, llmtest.Call{Tool: "ask", Args: `{}`}), llmtest.Answer("Both asked."))
	res := f.awaitingInputs(t)
	// The calls ask concurrently: the run pauses on what is open, and
	// again on what opens after, until every request is answered.
	answered := map[string]bool{}
	for round := 0; res.GetStatus() == connectorv1.QueryStatus_QUERY_STATUS_AWAITING_INPUT; round++ {
		if round == 2 {
			t.Fatalf("still awaiting input after two rounds: %v", res)
		}
		var answers []*connectorv1.InputAnswer
		for _, in := range res.GetInputRequests() {
			if answered[in.GetInputId()] {
				t.Fatalf("input %s asked again", in.GetInputId())
			}
			answered[in.GetInputId()] = true
			answers = append(answers, accept(in.GetInputId(), map[string]any{"name": in.GetCallId()}))
		}
		var err error
		if res, err = f.answer(t, res.GetRunId(), answers...); err != nil {
			t.Fatal(err)
		}
	}
	if res.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_COMPLETED || len(answered) != 2 || !answered["call_1.1"] || !answered["call_2.1"] {
		t.Fatalf("result %v after answering %v", res.GetStatus(), answered)
	}
	if got := srv.got(); len(got) != 2 {
		t.Errorf("the server got %v", got)
	}
	if msgs := toolMessages(model.Requests()[1]); len(msgs) != 2 || msgs[0] != `action=accept content={"name":"call_1"}` ||
		msgs[1] != `action=accept content={"name":"call_2"}` {
		t.Errorf("the model read %q", msgs)
	}
}

// A live pause is answered through any replica: the answer goes where the
// run's session is held, which is where its tool call is open.
func TestLiveInputAnsweredThroughAnotherReplica(t *testing.T) {
	model := llmtest.New(t, llmtest.CallTools(llmtest.Call{Tool: "ask", Args: `{}`}), llmtest.Answer("You are Fay."))
	a := setup(t, options{llmURL: model.URL(), replica: "replica-a"})
	b := setup(t, options{llmURL: model.URL(), replica: "replica-b", shared: a})
	waitReplicas(t, a, b)
	srv := newAskMCP(t)
	c := mcpConnector("m", srv.url)
	c.SessionMode, c.ProtocolPreference, c.Elicitation = connectorv1.SessionMode_SESSION_MODE_PER_SESSION,
		connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_CLASSIC, true
	a.create(t, "ws", c)
	a.waitReady(t, "ws", "m")
	b.waitReady(t, "ws", "m")

	res := a.awaitingInput(t)
	if run := b.getRun(t, res.GetRunId()); run.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_AWAITING_INPUT {
		t.Fatalf("the run on b = %v", run.GetStatus())
	}
	done, err := b.answer(t, res.GetRunId(), accept(res.GetInputRequests()[0].GetInputId(), map[string]any{"name": "Fay"}))
	if err != nil {
		t.Fatal(err)
	}
	if done.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_COMPLETED || done.GetAnswer() != "You are Fay." {
		t.Fatalf("answered through b = %v", done)
	}
	if got := srv.got(); len(got) != 1 || got[0] != `action=accept content={"name":"Fay"}` {
		t.Errorf("the server got %v", got)
	}

	// A direct call's request too.
	stream, in := a.streamAsk(t, &connectorv1.StreamCallToolRequest{SessionId: "s1"})
	if _, err := b.client.AnswerInput(ctx(t), &connectorv1.AnswerInputRequest{WorkspaceId: "ws", ConnectorId: "m", SessionId: "s1",
		Answer: accept(in.GetInputId(), map[string]any{"name": "Gil"})}); err != nil {
		t.Fatal(err)
	}
	msgs := recvAll(t, stream)
	if got := msgs[len(msgs)-1].GetResult().GetContent()[0].GetText().GetText(); got != `action=accept content={"name":"Gil"}` {
		t.Errorf("streamed ask = %q", got)
	}
}

// A replica that stops while a run waits on its open tool call fails the
// run before the call's connection closes: the closing is never taken for
// the call's answer, and the model is not asked on.
func TestStopLiveRunsFailsPausedRuns(t *testing.T) {
	f, model, _ := inputFixture(t, connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_CLASSIC, options{},
		llmtest.CallTools(llmtest.Call{Tool: "ask", Args: `{}`}), llmtest.Answer("must not be asked"))
	res := f.awaitingInput(t)
	asked := len(model.Requests())
	f.srv.StopLiveRuns(10 * time.Second)
	run := f.getRun(t, res.GetRunId())
	if run.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_FAILED || !strings.Contains(run.GetError(), "replica running this query stopped") {
		t.Fatalf("after StopLiveRuns the run is %v (%q); want FAILED saying the replica stopped", run.GetStatus(), run.GetError())
	}
	if n := len(model.Requests()); n != asked {
		t.Errorf("the model was asked %d more times after the replica stopped", n-asked)
	}
	_, err := f.answer(t, res.GetRunId(), accept(res.GetInputRequests()[0].GetInputId(), map[string]any{"name": "late"}))
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("an answer after the stop: %v; want FAILED_PRECONDITION", err)
	}
}

// TestQueryInputFormDefaults checks SEP-1034 end to end: the input request
// names the fields with a default, and an accept that leaves them out
// reaches the server with the schema's defaults filled in.
func TestQueryInputFormDefaults(t *testing.T) {
	f, _, srv := inputFixture(t, connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_CLASSIC, options{},
		llmtest.CallTools(llmtest.Call{Tool: "askdefaults", Args: `{}`}), llmtest.Answer("You are Ada."))
	res := f.awaitingInput(t)
	in := res.GetInputRequests()[0]
	if got := in.GetDefaultedFields(); len(got) != 1 || got[0] != "lang" {
		t.Fatalf("input request's defaulted_fields = %v, want [lang]", got)
	}
	done, err := f.answer(t, res.GetRunId(), accept(in.GetInputId(), map[string]any{"name": "Ada"}))
	if err != nil {
		t.Fatal(err)
	}
	if done.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_COMPLETED {
		t.Fatalf("resumed = %v; want COMPLETED", done)
	}
	want := `action=accept content={"lang":"en","name":"Ada"}`
	if got := srv.got(); len(got) != 1 || got[0] != want {
		t.Errorf("the server got %v, want [%s]", got, want)
	}
}
