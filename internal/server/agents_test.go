package server_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/fieldmaskpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/store"
)

// A connector's agent lives between queries: its settings are not read
// from the store again by each query; a change made through the API is
// seen by the next query, so is a tool switched off, a change made behind
// the server's back (SQL, another replica) once its notification arrives,
// and a warm connector answers with Postgres gone.
func TestQueryUsesTheLiveAgent(t *testing.T) {
	f, model, _ := queryFixture(t, llmtest.Answer("one"), llmtest.Answer("two"), llmtest.Answer("three"),
		llmtest.Answer("four"), llmtest.Answer("five"))
	prompt := func(i int) string { return model.Requests()[i].Messages[0].Content }
	ask := func(want string) {
		t.Helper()
		res, err := f.query(t, &connectorv1.QueryConnectorRequest{Query: "q"})
		if err != nil || res.GetAnswer() != want {
			t.Fatalf("query = %v, %v; want answer %q", res, err, want)
		}
	}

	ask("one")
	if !strings.Contains(prompt(0), `"m" connector`) || !slices.Contains(offeredTools(model, 0), "echo") {
		t.Fatalf("first request: prompt %q, tools %v", prompt(0), offeredTools(model, 0))
	}

	changed, err := f.db.UpdateConnector(ctx(t), "ws", "m", func(c *store.Connector) error { c.Name = "behind-the-back"; return nil })
	if err != nil {
		t.Fatal(err)
	}
	// A query reads the agent's settings, which Apply settles after it
	// has published the row (and updated the connection): wait for those,
	// not the row, or a busy machine runs the query in between.
	notLoaded := func() (*store.Connector, error) { return nil, errors.New("not live") }
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if la, err := f.live.Settings(changed.ID, notLoaded); err == nil && la.Row.Name == "behind-the-back" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the change made behind the server's back never reached its live copy")
		}
	}
	ask("two")
	if !strings.Contains(prompt(1), `"behind-the-back" connector`) {
		t.Errorf("after a change behind the server's back, prompt %q", prompt(1))
	}

	no := false
	if _, err := f.client.UpdateTool(ctx(t), &connectorv1.UpdateToolRequest{WorkspaceId: "ws", ConnectorId: "m", ToolName: "echo", Enabled: &no}); err != nil {
		t.Fatal(err)
	}
	ask("three")
	if tools := offeredTools(model, 2); slices.Contains(tools, "echo") || len(tools) != len(offeredTools(model, 0))-1 {
		t.Errorf("after disabling echo, offered %v", tools)
	}

	if _, err := f.client.UpdateConnector(ctx(t), &connectorv1.UpdateConnectorRequest{WorkspaceId: "ws",
		Connector:  &connectorv1.Connector{ConnectorId: "m", Name: "Shop"},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"name"}}}); err != nil {
		t.Fatal(err)
	}
	ask("four")
	if !strings.Contains(prompt(3), `"Shop" connector`) {
		t.Errorf("after UpdateConnector, prompt %q", prompt(3))
	}

	f.db.Close()
	ask("five")
}
