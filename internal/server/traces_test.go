package server_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc/metadata"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
)

// The caller's trace: W3C traceparent of its span.
const (
	callerTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	callerSpanID  = "00f067aa0ba902b7"
)

// argValue is a tool argument no span may carry.
const argValue = "arg-PLANTED-e6d1"

// TestQueryTrace runs one query in a caller's trace and checks the spans
// the service makes: gRPC server span, then the query, with its model
// calls and its tool call beneath; the trace context the MCP server and
// the LLM receive; and that no span carries a secret or an argument.
func TestQueryTrace(t *testing.T) {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	model := llmtest.New(t, llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"` + argValue + `"}`}), llmtest.Answer("echoed"))
	f := setup(t, options{llmURL: model.URL(), tracer: tp})
	srv := newTestMCP(t)
	c := mcpConnector("m", srv.url()+"?key="+distinctive+"-query")
	c.GetHttp().Headers = map[string]string{"Authorization": "Bearer " + distinctive}
	f.create(t, "ws", c)
	f.waitReady(t, "ws", "m")

	ctx := metadata.AppendToOutgoingContext(ctx(t), "traceparent", "00-"+callerTraceID+"-"+callerSpanID+"-01")
	if _, err := f.client.QueryConnector(ctx, &connectorv1.QueryConnectorRequest{WorkspaceId: "ws", ConnectorId: "m", Query: "echo it"}); err != nil {
		t.Fatal(err)
	}
	rpc := waitSpan(t, exp, "connector.v1.ConnectorService/QueryConnector")
	spans := exp.GetSpans()
	if rpc.SpanKind != trace.SpanKindServer || rpc.Parent.SpanID().String() != callerSpanID || rpc.SpanContext.TraceID().String() != callerTraceID {
		t.Fatalf("gRPC span: kind %v, parent %v; want a server span continuing the caller's", rpc.SpanKind, rpc.Parent)
	}
	query := child(t, spans, rpc, "connector.query")
	chats := children(spans, query, "llm.chat")
	call := child(t, spans, query, "mcp.tools/call")
	if len(chats) != 2 {
		t.Errorf("query has %d llm.chat spans; want 2", len(chats))
	}
	for _, s := range []tracetest.SpanStub{rpc, query, call} {
		if a := attrs(s); a["connector.workspace_id"] != "ws" || a["connector.id"] != "m" {
			t.Errorf("%s attributes %v; want the workspace and connector", s.Name, a)
		}
	}
	if a := attrs(call); a["mcp.tool"] != "echo" {
		t.Errorf("tool call attributes %v; want mcp.tool echo", a)
	}

	// The servers got the trace, each request as a child of its span.
	if got := srv.toolCallHeaders(); len(got) != 1 || got[0].Get("Traceparent") != traceparent(call) {
		t.Errorf("MCP server got tools/call with %v; want traceparent %s", traceparents(got), traceparent(call))
	}
	wantLLM := []string{traceparent(chats[0]), traceparent(chats[1])}
	if got := traceparents(model.Headers()); !slices.Equal(got, wantLLM) {
		t.Errorf("LLM got traceparents %v; want %v", got, wantLLM)
	}
	for _, s := range exp.GetSpans() {
		for _, text := range texts(s) {
			if strings.Contains(text, distinctive) || strings.Contains(text, argValue) {
				t.Errorf("span %s carries %q", s.Name, text)
			}
		}
	}
}

// waitSpan waits for a span to end: the gRPC server span ends after the
// client has its answer.
func waitSpan(t *testing.T, exp *tracetest.InMemoryExporter, name string) tracetest.SpanStub {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, s := range exp.GetSpans() {
			if s.Name == name {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s span within 10s", name)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func children(spans tracetest.SpanStubs, parent tracetest.SpanStub, name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == name && s.Parent.SpanID() == parent.SpanContext.SpanID() && s.Parent.TraceID() == parent.SpanContext.TraceID() {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) })
	return out
}

func child(t *testing.T, spans tracetest.SpanStubs, parent tracetest.SpanStub, name string) tracetest.SpanStub {
	t.Helper()
	c := children(spans, parent, name)
	if len(c) != 1 {
		var names []string
		for _, s := range spans {
			names = append(names, s.Name+" (parent "+s.Parent.SpanID().String()+")")
		}
		t.Fatalf("%s has %d %s children; want 1. Spans: %v", parent.Name, len(c), name, names)
	}
	return c[0]
}

func attrs(s tracetest.SpanStub) map[string]string {
	m := map[string]string{}
	for _, a := range s.Attributes {
		m[string(a.Key)] = a.Value.Emit()
	}
	return m
}

// texts is every string a span carries besides its name.
func texts(s tracetest.SpanStub) []string {
	out := []string{s.Status.Description}
	for _, a := range s.Attributes {
		out = append(out, a.Value.Emit())
	}
	for _, e := range s.Events {
		out = append(out, e.Name)
		for _, a := range e.Attributes {
			out = append(out, a.Value.Emit())
		}
	}
	for _, l := range s.Links {
		for _, a := range l.Attributes {
			out = append(out, a.Value.Emit())
		}
	}
	return out
}

func traceparent(s tracetest.SpanStub) string {
	return "00-" + s.SpanContext.TraceID().String() + "-" + s.SpanContext.SpanID().String() + "-01"
}

func traceparents(hs []http.Header) []string {
	var out []string
	for _, h := range hs {
		out = append(out, h.Get("Traceparent"))
	}
	return out
}

// TestUntracedCallContinuesTrace checks that with traces off (a no-op
// provider, as telemetry.SetupTracing gives by default) a call still
// carries the caller's trace on: its trace id in the RPC's log line, its
// traceparent to the MCP server, unchanged.
func TestUntracedCallContinuesTrace(t *testing.T) {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	f := setup(t, options{tracer: noop.NewTracerProvider()})
	srv := newTestMCP(t)
	f.create(t, "ws", mcpConnector("m", srv.url()))
	f.waitReady(t, "ws", "m")
	parent := "00-" + callerTraceID + "-" + callerSpanID + "-01"
	before := len(rpcLines(t, f.logs.String()))
	traced := metadata.AppendToOutgoingContext(ctx(t), "traceparent", parent)
	if _, err := f.client.CallTool(traced, &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: "m", ToolName: "echo"}); err != nil {
		t.Fatal(err)
	}
	if line := nextRPCLine(t, f.logs, before); line["trace_id"] != callerTraceID {
		t.Errorf("log line trace_id %v; want %s", line["trace_id"], callerTraceID)
	}
	if got := srv.toolCallHeaders(); len(got) != 1 || got[0].Get("Traceparent") != parent {
		t.Errorf("MCP server got tools/call with %v; want traceparent %s", traceparents(got), parent)
	}
}
