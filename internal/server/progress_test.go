package server_test

import (
	"context"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/testing/protocmp"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/mcptest"
	"github.com/connector-svc/connector-svc/internal/server"
)

// newProgressMCP serves mcptest's progress tool, and the "big" tool of
// newTestMCP, over streamable HTTP, and returns its URL.
func newProgressMCP(t *testing.T) string {
	t.Helper()
	m := mcpserver.NewMCPServer("progress", "1.0", mcpserver.WithToolCapabilities(true))
	written := mcptest.NewWritten()
	mcptest.AddProgressTool(m, written)
	m.AddTool(mcp.NewTool("big", mcp.WithString("kind", mcp.Required()), mcp.WithNumber("bytes", mcp.Required())),
		func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return bigResult(req.GetString("kind", ""), req.GetInt("bytes", 0)), nil
		})
	hs := httptest.NewServer(written.Handler(mcpserver.NewStreamableHTTPServer(m)))
	t.Cleanup(hs.Close)
	return hs.URL + "/mcp"
}

// wantProgress is what the progress tool sends for steps and label.
func wantProgress(steps int, label string) []*connectorv1.Progress {
	var want []*connectorv1.Progress
	for i := 1; i <= steps; i++ {
		want = append(want, &connectorv1.Progress{Progress: float64(i), Total: float64(steps), Message: fmt.Sprint(label, " ", i)})
	}
	return want
}

// streamCall runs StreamCallTool and returns its messages, or its error.
func (f *fixture) streamCall(ctx context.Context, req *connectorv1.StreamCallToolRequest) ([]*connectorv1.StreamCallToolResponse, error) {
	stream, err := f.client.StreamCallTool(ctx, req)
	if err != nil {
		return nil, err
	}
	var msgs []*connectorv1.StreamCallToolResponse
	for {
		msg, err := stream.Recv()
		if err == io.EOF {
			return msgs, nil
		}
		if err != nil {
			return msgs, err
		}
		msgs = append(msgs, msg)
	}
}

func TestStreamCallToolSendsProgressThenTheResult(t *testing.T) {
	f := setup(t)
	f.create(t, "ws", mcpConnector("p", newProgressMCP(t)))
	f.waitReady(t, "ws", "p")
	msgs, err := f.streamCall(ctx(t), &connectorv1.StreamCallToolRequest{WorkspaceId: "ws", ConnectorId: "p",
		ToolName: mcptest.ProgressTool, Arguments: toStructT(t, map[string]any{"steps": 4, "label": "step"})})
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) == 0 || msgs[len(msgs)-1].GetResult() == nil {
		t.Fatalf("messages %v; want the result last", msgs)
	}
	var got []*connectorv1.Progress
	for _, msg := range msgs[:len(msgs)-1] {
		got = append(got, msg.GetProgress())
	}
	if diff := cmp.Diff(wantProgress(4, "step"), got, protocmp.Transform()); diff != "" {
		t.Errorf("progress before the result (-want +got):\n%s", diff)
	}
	res := msgs[len(msgs)-1].GetResult()
	if text := res.GetContent()[0].GetText().GetText(); text != "done 4" || res.GetDuration() == nil {
		t.Errorf("result = %v", res)
	}

	// A server's long message is cut, not sent whole.
	msgs, err = f.streamCall(ctx(t), &connectorv1.StreamCallToolRequest{WorkspaceId: "ws", ConnectorId: "p",
		ToolName: mcptest.ProgressTool, Arguments: toStructT(t, map[string]any{"steps": 1, "label": strings.Repeat("x", 64<<10)})})
	if err != nil || len(msgs) != 2 {
		t.Fatalf("long message: %v, %v", msgs, err)
	}
	if msg := msgs[0].GetProgress().GetMessage(); len(msg) > 5<<10 || !strings.Contains(msg, "…[truncated: showing 4096 of") {
		t.Errorf("a 64 KiB message arrived as %d bytes, ending %q", len(msg), msg[max(0, len(msg)-60):])
	}
}

// Progress is streamed as it comes, while the tool runs: the tool here
// never answers, and the caller hangs up on its first update.
func TestStreamCallToolIsLive(t *testing.T) {
	f := setup(t)
	f.create(t, "ws", mcpConnector("p", newProgressMCP(t)))
	f.waitReady(t, "ws", "p")
	cctx, cancel := context.WithCancel(ctx(t))
	defer cancel()
	stream, err := f.client.StreamCallTool(cctx, &connectorv1.StreamCallToolRequest{WorkspaceId: "ws", ConnectorId: "p",
		ToolName: mcptest.ProgressTool, Arguments: toStructT(t, map[string]any{"steps": 1, "label": "live", "hold": true})})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(wantProgress(1, "live")[0], msg.GetProgress(), protocmp.Transform()); diff != "" {
		t.Errorf("first message (-want +got):\n%s", diff)
	}
}

// StreamCallTool refuses what CallTool refuses, the same way.
func TestStreamCallToolErrorsAreCallTools(t *testing.T) {
	f := setup(t)
	url := newProgressMCP(t)
	f.create(t, "ws", mcpConnector("p", url))
	f.create(t, "ws", perSessionConnector("s", url))
	f.waitReady(t, "ws", "p")
	f.waitReady(t, "ws", "s")
	for _, tt := range []struct {
		name          string
		req           *connectorv1.CallToolRequest
		code          codes.Code
		reason, field string
	}{
		{"no tool name", &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: "p"},
			codes.InvalidArgument, server.ReasonInvalidArgument, "tool_name"},
		{"unknown tool", &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: "p", ToolName: "nope"},
			codes.NotFound, server.ReasonToolNotFound, ""},
		{"arguments too large", &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: "p", ToolName: "big",
			Arguments: toStructT(t, map[string]any{"kind": strings.Repeat("a", 5<<20)})},
			codes.ResourceExhausted, server.ReasonArgumentsTooLarge, ""},
		{"result too large", &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: "p", ToolName: "big",
			Arguments: toStructT(t, map[string]any{"kind": "text", "bytes": server.DefaultMaxToolResultBytes + 1})},
			codes.ResourceExhausted, server.ReasonToolResultTooLarge, ""},
		{"per-session connector without a session", &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: "s",
			ToolName: mcptest.ProgressTool, Arguments: toStructT(t, map[string]any{"steps": 1})},
			codes.InvalidArgument, server.ReasonInvalidArgument, "session_id"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := f.client.CallTool(ctx(t), tt.req)
			wantStatus(t, err, tt.code, tt.reason, tt.field)
			msgs, err := f.streamCall(ctx(t), &connectorv1.StreamCallToolRequest{WorkspaceId: tt.req.WorkspaceId,
				ConnectorId: tt.req.ConnectorId, ToolName: tt.req.ToolName, Arguments: tt.req.Arguments, SessionId: tt.req.SessionId})
			wantStatus(t, err, tt.code, tt.reason, tt.field)
			if len(msgs) != 0 {
				t.Errorf("messages before the error: %v", msgs)
			}
		})
	}
	// With its session, the per-session connector streams progress too.
	msgs, err := f.streamCall(ctx(t), &connectorv1.StreamCallToolRequest{WorkspaceId: "ws", ConnectorId: "s", SessionId: "alice",
		ToolName: mcptest.ProgressTool, Arguments: toStructT(t, map[string]any{"steps": 2, "label": "alice"})})
	if err != nil || len(msgs) != 3 || msgs[1].GetProgress().GetMessage() != "alice 2" || msgs[2].GetResult() == nil {
		t.Errorf("per-session StreamCallTool = %v, %v", msgs, err)
	}
}

// A streamed query's tool calls stream their progress: each call's
// updates, in order, between its started and finished events. The calls
// come in two turns, one at a time: mcp-go's streamable-HTTP server hands a
// session's notifications to whichever of its running requests' streams
// takes them first, so with two calls at once it may deliver them out of
// order, or drop one whose stream has just ended.
func TestStreamQueryToolCallProgress(t *testing.T) {
	model := llmtest.New(t,
		llmtest.CallTools(llmtest.Call{Tool: mcptest.ProgressTool, Args: `{"steps":3,"label":"a"}`}),
		llmtest.CallTools(llmtest.Call{Tool: mcptest.ProgressTool, Args: `{"steps":2,"label":"b"}`}),
		llmtest.Answer("both done"),
		llmtest.CallTools(llmtest.Call{Tool: mcptest.ProgressTool, Args: `{"steps":3,"label":"c"}`}),
		llmtest.Answer("unstreamed"))
	f := setup(t, options{llmURL: model.URL()})
	f.create(t, "ws", mcpConnector("p", newProgressMCP(t)))
	f.waitReady(t, "ws", "p")
	stream, err := f.client.StreamQueryConnector(ctx(t), &connectorv1.StreamQueryConnectorRequest{WorkspaceId: "ws", ConnectorId: "p", Query: "q"})
	if err != nil {
		t.Fatal(err)
	}
	msgs := recvAll(t, stream)
	// Each call's events, as the stream told them.
	calls := map[string][]string{}
	var got []*connectorv1.ToolCallProgress
	for _, msg := range msgs {
		switch {
		case msg.GetToolCallStarted() != nil:
			e := msg.GetToolCallStarted()
			id := fmt.Sprint(e.GetStepIndex(), "/", e.GetCall().GetId())
			calls[id] = append(calls[id], "started")
		case msg.GetToolCallProgress() != nil:
			p := msg.GetToolCallProgress()
			id := fmt.Sprint(p.GetStepIndex(), "/", p.GetCallId())
			calls[id] = append(calls[id], p.GetProgress().GetMessage())
			got = append(got, p)
		case msg.GetToolCallFinished() != nil:
			e := msg.GetToolCallFinished()
			id := fmt.Sprint(e.GetStepIndex(), "/", e.GetCall().GetId())
			calls[id] = append(calls[id], "finished: "+e.GetCall().GetResultExcerpt())
		}
	}
	want := map[string][]string{
		"0/call_1": {"started", "a 1", "a 2", "a 3", "finished: done 3"},
		"1/call_1": {"started", "b 1", "b 2", "finished: done 2"},
	}
	if diff := cmp.Diff(want, calls); diff != "" {
		t.Errorf("events by call (-want +got):\n%s", diff)
	}
	for _, p := range got {
		if p.GetStepIndex() > 1 || p.GetTool() != mcptest.ProgressTool || p.GetProgress().GetTotal() == 0 {
			t.Errorf("progress event %v", p)
		}
	}
	if last := msgs[len(msgs)-1].GetResult(); last.GetAnswer() != "both done" {
		t.Errorf("last message = %v; want the result", msgs[len(msgs)-1])
	}

	// An unstreamed query has nobody to tell: its calls ask for no progress.
	res, err := f.query(t, &connectorv1.QueryConnectorRequest{WorkspaceId: "ws", ConnectorId: "p", Query: "q"})
	if err != nil {
		t.Fatal(err)
	}
	if got := res.GetSteps()[0].GetCalls()[0].GetResultExcerpt(); got != "done 3 without a token" {
		t.Errorf("unstreamed call's result = %q", got)
	}
}
