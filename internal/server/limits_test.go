package server_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/server"
)

// bigResult is the "big" tool's result: about n bytes of one kind of
// content. "numbers" is small as JSON and about five times larger as
// protobuf.
func bigResult(kind string, n int) *mcp.CallToolResult {
	switch kind {
	case "image":
		return mcp.NewToolResultImage("", base64.StdEncoding.EncodeToString(make([]byte, n)), "image/png")
	case "structured":
		return &mcp.CallToolResult{Content: []mcp.Content{}, StructuredContent: map[string]any{"data": strings.Repeat("y", n)}}
	case "numbers":
		return &mcp.CallToolResult{Content: []mcp.Content{}, StructuredContent: map[string]any{"n": make([]int, n/2)}}
	default:
		return mcp.NewToolResultText(strings.Repeat("x", n))
	}
}

// TestCallToolResultCap calls tools whose results are over and under
// MAX_TOOL_RESULT_BYTES, through a default gRPC client (4 MiB receive
// limit): over the cap the service answers with a reason, not the
// client's own decode error.
func TestCallToolResultCap(t *testing.T) {
	f := setup(t)
	srv := newTestMCP(t)
	f.create(t, "ws", mcpConnector("m", srv.url()))
	f.waitReady(t, "ws", "m")
	const limit = server.DefaultMaxToolResultBytes
	for _, tt := range []struct {
		name  string
		kind  string
		bytes int
		fits  bool
	}{
		{"6 MiB of text", "text", 6 << 20, false},
		{"6 MiB image", "image", 6 << 20, false},
		{"6 MiB of structured content", "structured", 6 << 20, false},
		{"640 KB of JSON numbers, 3.4 MiB as protobuf", "numbers", 640_000, false},
		{"text one byte over the cap", "text", limit + 1, false},
		{"text just under the cap", "text", limit - 64, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// A minute, not ctx's 20 s: hundreds of thousands of values
			// decoded and converted under the race detector on a busy
			// machine take most of 20 s.
			c, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			args, _ := structpb.NewStruct(map[string]any{"kind": tt.kind, "bytes": tt.bytes})
			resp, err := f.client.CallTool(c, &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: "m", ToolName: "big", Arguments: args})
			if tt.fits {
				if err != nil {
					t.Fatalf("CallTool: %v", err)
				}
				if got := len(resp.GetContent()[0].GetText().GetText()); got != tt.bytes {
					t.Errorf("text of %d bytes, want %d", got, tt.bytes)
				}
				return
			}
			wantStatus(t, err, codes.ResourceExhausted, server.ReasonToolResultTooLarge, "")
			msg := status.Convert(err).Message()
			// A result the registry stopped reading is "over the limit": its size is not known.
			if !regexp.MustCompile(`is (over the limit of )?\d+ bytes`).MatchString(msg) || !strings.Contains(msg, fmt.Sprint(limit)) ||
				!strings.Contains(msg, "MAX_TOOL_RESULT_BYTES") {
				t.Errorf("message %q does not name the size, the limit and the setting", msg)
			}
			if len(msg) > 500 {
				t.Errorf("message of %d bytes carries content", len(msg))
			}
		})
	}
	if _, err := f.call(t, "ws", "m", "echo", map[string]any{"text": "still here"}); err != nil {
		t.Errorf("the connector after refused results: %v", err)
	}
}

// TestCallToolArgumentsCap sends arguments over MAX_TOOL_ARGUMENTS_BYTES
// (refused with a reason), then a request over GRPC_MAX_RECV_BYTES, which
// gRPC refuses before the service sees it: that error has no reason.
func TestCallToolArgumentsCap(t *testing.T) {
	f := setup(t)
	srv := newTestMCP(t)
	f.create(t, "ws", mcpConnector("m", srv.url()))
	f.waitReady(t, "ws", "m")

	_, err := f.call(t, "ws", "m", "echo", map[string]any{"text": strings.Repeat("a", 5<<20)})
	wantStatus(t, err, codes.ResourceExhausted, server.ReasonArgumentsTooLarge, "")
	if msg := status.Convert(err).Message(); !strings.Contains(msg, fmt.Sprint(server.DefaultMaxToolArgumentsBytes)) ||
		!strings.Contains(msg, "MAX_TOOL_ARGUMENTS_BYTES") {
		t.Errorf("message %q does not name the limit and the setting", msg)
	}

	_, err = f.call(t, "ws", "m", "echo", map[string]any{"text": strings.Repeat("a", server.DefaultMaxRecvBytes+1)})
	wantStatus(t, err, codes.ResourceExhausted, "", "")
}

// TestQueryContextsAreBounded runs queries whose tools return large
// structured content: the response carries what fits, cuts the rest with a
// visible marker, and stays within a default client's receive limit.
func TestQueryContextsAreBounded(t *testing.T) {
	big := func(n int) llmtest.Call {
		return llmtest.Call{Tool: "big", Args: fmt.Sprintf(`{"kind":"structured","bytes":%d}`, n)}
	}
	f, _, _ := queryFixture(t,
		llmtest.CallTools(big(6<<20), llmtest.Call{Tool: "weather", Args: `{}`}), llmtest.Answer("one"),
		llmtest.CallTools(big(2<<20), big(2<<20)), llmtest.Answer("two"))

	// A minute, not ctx's 20 s: 6 MiB of structured content decoded,
	// recorded and converted under the race detector on a busy machine
	// take most of 20 s.
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := f.client.QueryConnector(c, &connectorv1.QueryConnectorRequest{WorkspaceId: "ws", ConnectorId: "m", Query: "one"})
	if err != nil {
		t.Fatal(err)
	}
	res := resp.GetResult()
	whole, cut := splitContexts(t, res)
	if len(whole) != 1 || whole[0].GetStructuredContent().GetFields()["city"].GetStringValue() != "Oslo" || len(cut) != 1 {
		t.Errorf("contexts: %d whole (%v), %d cut; want the weather whole and the big one cut", len(whole), whole, len(cut))
	}

	stream, err := f.client.StreamQueryConnector(c, &connectorv1.StreamQueryConnectorRequest{WorkspaceId: "ws", ConnectorId: "m", Query: "two"})
	if err != nil {
		t.Fatal(err)
	}
	msgs := recvAll(t, stream)
	final := msgs[len(msgs)-1].GetResult()
	whole, cut = splitContexts(t, final)
	if len(whole) != 1 || len(whole[0].GetStructuredContent().GetFields()["data"].GetStringValue()) != 2<<20 || len(cut) != 1 {
		t.Errorf("contexts: %d whole, %d cut; want one 2 MiB context whole and the other cut", len(whole), len(cut))
	}
	if n := proto.Size(final); n > server.DefaultMaxSendBytes {
		t.Errorf("result of %d bytes", n)
	}
}

// splitContexts sorts a result's contexts into whole and cut ones, and
// checks each cut one carries the marker and a bounded excerpt.
func splitContexts(t *testing.T, res *connectorv1.QueryResult) (whole, cut []*connectorv1.QueryContext) {
	t.Helper()
	for _, c := range res.GetContexts() {
		fields := c.GetStructuredContent().GetFields()
		note, ok := fields["truncated"]
		if !ok {
			whole = append(whole, c)
			continue
		}
		cut = append(cut, c)
		excerpt := fields["excerpt"].GetStringValue()
		if !strings.Contains(note.GetStringValue(), "MAX_TOOL_RESULT_BYTES") || !strings.HasPrefix(excerpt, `{"data":"yyy`) ||
			!strings.Contains(excerpt, "…[truncated: showing") || len(excerpt) > 9<<10 {
			t.Errorf("cut context: note %q, excerpt of %d bytes starting %.40q", note.GetStringValue(), len(excerpt), excerpt)
		}
	}
	return whole, cut
}
