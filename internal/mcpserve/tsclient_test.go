package mcpserve_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/mcpserve/mcpservetest"
)

// TestTypeScriptClient drives the endpoint with the TypeScript SDK's
// client (testdata/node/client.mjs): list and call on both endpoints with
// a key, an approval form answered with edited arguments, and a 401
// without the key.
func TestTypeScriptClient(t *testing.T) {
	mcpservetest.NodeDir(t) // skips loudly without the packages (fails under CI=true)
	e := newEnv(t, true, nil)
	_, key, err := e.keys.Create(context.Background(), "ws", []auth.Scope{auth.ScopeCall}, "ts")
	if err != nil {
		t.Fatal(err)
	}
	hdr := map[string]string{"Authorization": "Bearer " + key}
	out := mcpservetest.RunTSClient(t, e.url+"/mcp/ws/alpha", hdr, "echo", `{"message":"hello from TypeScript"}`)
	if out.Error != nil || out.Call.Text() != "hello from TypeScript" || !slices.Contains(out.Tools, "wipe") {
		t.Fatalf("TS client on /mcp/ws/alpha: tools %v, call %q, error %+v", out.Tools, out.Call.Text(), out.Error)
	}
	out = mcpservetest.RunTSClientWith(t, e.url+"/mcp/ws", hdr, mcpservetest.TSClientOptions{ElicitAnswers: []map[string]any{
		{"action": "accept", "content": map[string]any{"approve": true, "arguments": `{"what":"the TS edit"}`}}}},
		"alpha__wipe", `{"what":"everything"}`)
	if out.Error != nil || out.Call.Text() != "wiped the TS edit" || len(out.Elicitations) != 1 {
		t.Fatalf("TS client approving alpha__wipe: call %q, asked %d forms, error %+v", out.Call.Text(), len(out.Elicitations), out.Error)
	}
	if msg, _ := out.Elicitations[0]["message"].(string); !strings.Contains(msg, "everything") {
		t.Errorf("the approval form says %q, want the model's arguments", msg)
	}
	out = mcpservetest.RunTSClient(t, e.url+"/mcp/ws", nil)
	if out.Error == nil || out.Error.Code != float64(401) {
		t.Errorf("TS client without a key: error %+v, want 401", out.Error)
	}
}
