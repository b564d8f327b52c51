package server_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
)

// docsServer has a tool that links to a resource it serves, 200 other
// resources, and a big one.
func docsServer(t *testing.T) string {
	t.Helper()
	m := mcpserver.NewMCPServer("docs", "1", mcpserver.WithResourceCapabilities(false, true))
	m.AddTool(mcp.NewTool("find_report", mcp.WithDescription("Finds the quarterly report")),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{mcp.NewTextContent("Found it."),
				mcp.NewResourceLink("docs://reports/q3", "Q3 report", "The third quarter's report", "text/plain")}}, nil
		})
	text := func(body string) mcpserver.ResourceHandlerFunc {
		return func(_ context.Context, r mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
			return []mcp.ResourceContents{mcp.TextResourceContents{URI: r.Params.URI, MIMEType: "text/plain", Text: body}}, nil
		}
	}
	m.AddResource(mcp.NewResource("docs://reports/q3", "Q3 report"), text("Revenue grew 12% in Q3."))
	m.AddResource(mcp.NewResource("docs://big", "big"), text(strings.Repeat("b", 300<<10)))
	for i := range 200 {
		m.AddResource(mcp.NewResource(fmt.Sprintf("docs://misc/%03d", i), fmt.Sprintf("misc %d", i),
			mcp.WithResourceDescription("an unrelated note")), text("note"))
	}
	m.AddResource(mcp.NewResource("docs://pricing", "pricing", mcp.WithResourceDescription("The pricing table for enterprise plans")),
		text("Enterprise: 99 per seat."))
	srv := httptest.NewServer(mcpserver.NewStreamableHTTPServer(m))
	t.Cleanup(srv.Close)
	return srv.URL + "/mcp"
}

// A tool result links to a resource; the agent reads it with
// read_resource, the read is a call of its step with its uri and size, and
// the model got the text.
func TestAgentFollowsAResourceLink(t *testing.T) {
	model := llmtest.New(t,
		llmtest.CallTools(llmtest.Call{Tool: "find_report", Args: `{}`}),
		llmtest.CallTools(llmtest.Call{Tool: "read_resource", Args: `{"uri":"docs://reports/q3"}`}),
		llmtest.Answer("Revenue grew 12%."))
	f := setup(t, options{llmURL: model.URL()})
	f.create(t, "ws", mcpConnector("docs", docsServer(t)))
	f.waitReady(t, "ws", "docs")
	res, err := f.query(t, &connectorv1.QueryConnectorRequest{WorkspaceId: "ws", ConnectorId: "docs", Query: "How did the enterprise pricing and Q3 go?"})
	if err != nil {
		t.Fatal(err)
	}
	if res.GetAnswer() != "Revenue grew 12%." || len(res.GetSteps()) != 2 {
		t.Fatalf("result = %v", res)
	}
	read := res.GetSteps()[1].GetCalls()[0]
	if read.GetTool() != "read_resource" || read.GetResourceUri() != "docs://reports/q3" ||
		read.GetResourceBytes() != int64(len("Revenue grew 12% in Q3.")) || read.GetIsError() {
		t.Errorf("the read's call = %v", read)
	}
	reqs := model.Requests()
	// The link reached the model, and then what it links to.
	if !strings.Contains(lastToolMessage(model, 1), "docs://reports/q3") || lastToolMessage(model, 2) != "Revenue grew 12% in Q3." {
		t.Errorf("the model saw %q, then %q", lastToolMessage(model, 1), lastToolMessage(model, 2))
	}
	// Offered with the resources relevant to the query, not all 203.
	var desc string
	for _, tool := range reqs[0].Tools {
		if tool.Function.Name == "read_resource" {
			desc = tool.Function.Description
		}
	}
	if !strings.Contains(desc, "docs://pricing") || strings.Count(desc, "\n- ") != 20 || !strings.Contains(desc, "183 more not listed") {
		t.Errorf("read_resource's description:\n%s", desc)
	}
}

// Reads past the run's budget are refused, and say so; nothing of the
// refused read reaches the model.
func TestAgentResourceBudget(t *testing.T) {
	model := llmtest.New(t,
		llmtest.CallTools(llmtest.Call{Tool: "read_resource", Args: `{"uri":"docs://big"}`}),
		llmtest.Answer("Too big."))
	f := setup(t, options{llmURL: model.URL()})
	f.create(t, "ws", mcpConnector("docs", docsServer(t)))
	f.waitReady(t, "ws", "docs")
	res, err := f.query(t, &connectorv1.QueryConnectorRequest{WorkspaceId: "ws", ConnectorId: "docs", Query: "read the big one"})
	if err != nil {
		t.Fatal(err)
	}
	read := res.GetSteps()[0].GetCalls()[0]
	if !read.GetIsError() || read.GetResourceBytes() != 300<<10 {
		t.Errorf("the read's call = %v", read)
	}
	out := lastToolMessage(model, 1)
	if !strings.Contains(out, "over the 262144 bytes left") || strings.Contains(out, "bbbb") {
		t.Errorf("the model saw %q", orchestrator.Truncate(out, 300))
	}
}

// A connector whose server has no resources offers no read_resource.
func TestAgentWithoutResources(t *testing.T) {
	f, model, _ := queryFixture(t, llmtest.Answer("ok"))
	if _, err := f.query(t, &connectorv1.QueryConnectorRequest{Query: "hi"}); err != nil {
		t.Fatal(err)
	}
	for _, tool := range model.Requests()[0].Tools {
		if strings.Contains(tool.Function.Name, "read_resource") {
			t.Errorf("offered %s", tool.Function.Name)
		}
	}
}
