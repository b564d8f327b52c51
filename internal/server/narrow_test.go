package server_test

import (
	"hash/fnv"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/fieldmaskpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
)

// conceptEmbedding is a deterministic fake embedding: words that mean the
// same (forecast, weather, temperature) share a dimension, other words
// are hashed into the rest. It proves the wiring, not the quality.
func conceptEmbedding(text string) []float32 {
	concepts := map[string]int{"forecast": 0, "weather": 0, "temperature": 0, "echo": 1, "repeat": 1, "say": 1}
	v := make([]float32, 32)
	for _, w := range strings.FieldsFunc(strings.ToLower(text), func(r rune) bool { return r < 'a' || r > 'z' }) {
		if d, ok := concepts[w]; ok {
			v[d] += 4
			continue
		}
		h := fnv.New32a()
		h.Write([]byte(w))
		v[2+h.Sum32()%30]++
	}
	return v
}

// With an embeddings model, narrowing ranks by meaning too: "forecast"
// shares no word with the weather tool ("Structured weather") but its
// embedding does. Tool embeddings are computed once, stored, and reused
// when the agent is rebuilt; the query's is computed per query.
func TestNarrowingWithEmbeddings(t *testing.T) {
	model := llmtest.New(t)
	model.Embeddings(conceptEmbedding)
	f := setup(t, options{llmURL: model.URL(), embeddings: true, narrowTo: 1})
	srv := newTestMCP(t)
	spec := mcpConnector("m", srv.url())
	spec.NarrowToolsAbove = 1
	f.create(t, "ws", spec)
	f.waitReady(t, "ws", "m")

	// The tools' embeddings are made in the background once the agent is
	// built (by the first query); until then a query ranks by words.
	ask := func() []string {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			model.Then(llmtest.Answer("Cold."))
			res, err := f.query(t, &connectorv1.QueryConnectorRequest{Query: "What is the forecast for Oslo?"})
			if err != nil {
				t.Fatal(err)
			}
			if !res.GetNarrowed() || res.GetToolsTotal() != 5 {
				t.Fatalf("result: narrowed %v, %d tools", res.GetNarrowed(), res.GetToolsTotal())
			}
			if slices.Equal(res.GetToolsOffered(), []string{"weather"}) || time.Now().After(deadline) {
				return res.GetToolsOffered()
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if offered := ask(); !slices.Equal(offered, []string{"weather"}) {
		t.Fatalf("offered %v, want the weather tool", offered)
	}
	toolTexts := func() (n int) {
		for _, text := range model.Embedded() {
			if !strings.Contains(text, "forecast for Oslo") {
				n++
			}
		}
		return n
	}
	if n := toolTexts(); n != 5 {
		t.Errorf("embedded %d tool texts, want each of the 5 tools once", n)
	}
	row, err := f.db.GetConnector(ctx(t), "ws", "m")
	if err != nil {
		t.Fatal(err)
	}
	if stored, err := f.db.ToolEmbeddings(ctx(t), row.ID, "fake-embeddings"); err != nil || len(stored) != 5 {
		t.Fatalf("stored %d embeddings, %v", len(stored), err)
	}

	// A new agent (the connector's settings changed) reuses them.
	if _, err := f.client.UpdateConnector(ctx(t), &connectorv1.UpdateConnectorRequest{WorkspaceId: "ws",
		Connector: &connectorv1.Connector{ConnectorId: "m", Name: "Weather desk"}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"name"}}}); err != nil {
		t.Fatal(err)
	}
	if offered := ask(); !slices.Equal(offered, []string{"weather"}) {
		t.Fatalf("after the update, offered %v", offered)
	}
	if n := toolTexts(); n != 5 {
		t.Errorf("after the rebuild, %d tool texts embedded in all, want the 5 stored ones reused", n)
	}
}

// A disabled tool stays out of reach when the connector narrows: search
// cannot find it, and a call to it is refused, not run.
func TestSearchNeverFindsADisabledTool(t *testing.T) {
	model := llmtest.New(t,
		llmtest.CallTools(llmtest.Call{Tool: "search_tools", Args: `{"query":"structured weather"}`}),
		llmtest.CallTools(llmtest.Call{Tool: "weather", Args: `{}`}),
		llmtest.Answer("No weather tool."))
	f := setup(t, options{llmURL: model.URL(), narrowTo: 1})
	srv := newTestMCP(t)
	spec := mcpConnector("m", srv.url())
	spec.NarrowToolsAbove = 1
	f.create(t, "ws", spec)
	f.waitReady(t, "ws", "m")
	no := false
	if _, err := f.client.UpdateTool(ctx(t), &connectorv1.UpdateToolRequest{WorkspaceId: "ws", ConnectorId: "m", ToolName: "weather", Enabled: &no}); err != nil {
		t.Fatal(err)
	}
	res, err := f.query(t, &connectorv1.QueryConnectorRequest{Query: "weather in Oslo?"})
	if err != nil {
		t.Fatal(err)
	}
	steps := res.GetSteps()
	if len(steps) != 2 || strings.Contains(steps[0].GetCalls()[0].GetResultExcerpt(), "- weather") ||
		steps[1].GetCalls()[0].GetRejectedReason() == "" || slices.Contains(res.GetToolsUsed(), "weather") ||
		res.GetToolsTotal() != 4 || slices.Contains(res.GetToolsOffered(), "weather") {
		t.Errorf("result: %v", res)
	}
}
