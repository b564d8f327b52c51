package main

import (
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
	"github.com/connector-svc/connector-svc/internal/telemetry/telemetrytest"
)

// TestEndToEndTraces runs the service with traces exported over OTLP, as
// the OTEL_* environment asks, and checks what the collector has once the
// service stopped: a call that continues its caller's trace, down to the
// tool call, under the service name asked for; the re-initialize of a
// session the server forgot, in a trace of its own linked to the call that
// found it lost; a failed connect with its error; and no secret or tool
// argument anywhere.
func TestEndToEndTraces(t *testing.T) {
	collector := telemetrytest.NewHTTP(t)
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.Endpoint)
	t.Setenv("OTEL_SERVICE_NAME", "connectors-e2e")
	const (
		traceID     = "0af7651916cd43dd8448eb211c80319c"
		afterExpiry = "6e0c63257de34c92bf9efcd03927272e"
		parentID    = "b7ad6b7169203331"
		secret      = "q-PLANTED-trace-71d0"
		argValue    = "arg-PLANTED-trace-3c58"
	)
	mcp := newForgetfulMCP(t, "Bearer "+secret)
	// The service's configuration reads OTEL_TRACES_EXPORTER through
	// getenv; the SDK's exporter reads the rest from the process.
	svc := start(t, storetest.NewURL(t), map[string]string{"SECRET_KEY": testKey, "OTEL_TRACES_EXPORTER": "otlp",
		"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"})
	client := connectorv1.NewConnectorServiceClient(dial(t, svc.addr))
	for id, url := range map[string]string{"echo": mcp.url(), "dead": "http://127.0.0.1:9/mcp"} {
		_, err := client.CreateConnector(testCtx(t), &connectorv1.CreateConnectorRequest{WorkspaceId: "acme", Connector: &connectorv1.Connector{
			ConnectorId: id, Transport: connectorv1.Transport_TRANSPORT_STREAMABLE_HTTP, ApprovalPolicy: noApproval, Connection: &connectorv1.Connector_Http{Http: &connectorv1.HttpConfig{
				Url: url + "?key=" + secret, Headers: map[string]string{"Authorization": "Bearer " + secret}}}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	waitTools(t, client, "acme", "echo", 1)
	waitLastError(t, client, "acme", "dead", "127.0.0.1:9")
	args, _ := structpb.NewStruct(map[string]any{"text": argValue})
	call := func(traceID string) {
		ctx := metadata.AppendToOutgoingContext(testCtx(t), "traceparent", "00-"+traceID+"-"+parentID+"-01")
		if _, err := client.CallTool(ctx, &connectorv1.CallToolRequest{WorkspaceId: "acme", ConnectorId: "echo", ToolName: "echo", Arguments: args}); err != nil {
			t.Fatal(err)
		}
	}
	call(traceID)
	mcp.forget()
	call(afterExpiry)
	if err := svc.stop(); err != nil {
		t.Fatal(err)
	}

	spans := collector.Spans() // all there: run flushed them before it returned
	var rpc, toolCall, failedConnect, reinit, expiredCall *telemetrytest.Span
	for i, s := range spans {
		switch {
		case s.Name == "connector.v1.ConnectorService/CallTool" && s.TraceID == traceID:
			rpc = &spans[i]
		case s.Name == "mcp.tools/call" && s.TraceID == traceID:
			toolCall = &spans[i]
		case s.Name == "mcp.tools/call" && s.TraceID == afterExpiry:
			expiredCall = &spans[i]
		case s.Name == "mcp.reinitialize":
			reinit = &spans[i]
		case s.Name == "mcp.connect" && s.Attributes["connector.id"] == "dead":
			failedConnect = &spans[i]
		}
		for _, text := range s.Texts {
			if strings.Contains(text, secret) || strings.Contains(text, argValue) {
				t.Errorf("span %s carries %q", s.Name, text)
			}
		}
	}
	if rpc == nil || toolCall == nil || failedConnect == nil || reinit == nil || expiredCall == nil {
		t.Fatalf("collector lacks a CallTool span, a tool call span, a failed connect or the re-initialize in %d spans: %+v", len(spans), spans)
	}
	if rpc.ParentID != parentID || toolCall.ParentID != rpc.SpanID || toolCall.Attributes["mcp.tool"] != "echo" {
		t.Errorf("CallTool span %+v, tool call span %+v; want the caller's span, then CallTool, then the tool call", rpc, toolCall)
	}
	if reinit.TraceID == afterExpiry || reinit.ParentID != "" || len(reinit.Links) != 1 || reinit.Links[0] != afterExpiry+"-"+expiredCall.SpanID {
		t.Errorf("re-initialize span %+v; want a root linked to the tool call %s that found the session lost", reinit, expiredCall.SpanID)
	}
	if rpc.Resource["service.name"] != "connectors-e2e" {
		t.Errorf("resource %v; want OTEL_SERVICE_NAME's", rpc.Resource)
	}
	if !strings.Contains(strings.Join(failedConnect.Texts, " "), "127.0.0.1:9/mcp?key=REDACTED") {
		t.Errorf("failed connect span %+v; want its error, the URL's query values redacted", failedConnect)
	}
}
