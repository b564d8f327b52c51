package mcpservetest

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// tsClientTimeout bounds one run of client.mjs.
const tsClientTimeout = 2 * time.Minute

// TSClientOutput is the JSON line client.mjs prints.
type TSClientOutput struct {
	ServerInfo      map[string]any   `json:"serverInfo"`
	ProtocolVersion string           `json:"protocolVersion"`
	Capabilities    map[string]any   `json:"capabilities"`
	SessionID       string           `json:"sessionId"`
	Tools           []string         `json:"tools"`
	ToolList        []map[string]any `json:"toolList"`
	// Call is the tools/call result when a tool was named: content,
	// isError, structuredContent, _meta.
	Call *ToolResult `json:"call"`
	// Elicitations are the params of each elicitation/create the server
	// sent (message, requestedSchema, …), in order.
	Elicitations []map[string]any `json:"elicitations"`
	// Samplings are the params of each sampling/createMessage.
	Samplings []map[string]any `json:"samplings"`
	// Notifications are the logging messages and progress the client got.
	Notifications []map[string]any `json:"notifications"`
	// Error is set when the client failed (it then exits 1): connecting,
	// listing, or a tools/call answered with a JSON-RPC error. Code is the
	// JSON-RPC error code, or the HTTP status for a refused HTTP request
	// (401 for a missing or wrong API key).
	Error *TSClientError `json:"error"`
	// Stderr is what the client wrote to stderr.
	Stderr string `json:"-"`
}

// ToolResult is a tools/call result.
type ToolResult struct {
	Content           []map[string]any `json:"content"`
	IsError           bool             `json:"isError"`
	StructuredContent any              `json:"structuredContent"`
	Meta              map[string]any   `json:"_meta"`
}

// Text joins the result's text content.
func (r *ToolResult) Text() string {
	if r == nil {
		return ""
	}
	var parts []string
	for _, c := range r.Content {
		if c["type"] == "text" {
			if s, ok := c["text"].(string); ok {
				parts = append(parts, s)
			}
		}
	}
	return strings.Join(parts, "\n")
}

// TSClientError is how client.mjs failed.
type TSClientError struct {
	Message string `json:"message"`
	Code    any    `json:"code"`
	Data    any    `json:"data"`
}

// TSClientOptions are the client's scripted answers to the server.
type TSClientOptions struct {
	// ElicitAnswers answer elicitation/create in order, the last one
	// repeating: e.g. {"action":"accept","content":{"name":"x"}}. Without
	// any the client does not declare the elicitation capability.
	ElicitAnswers []map[string]any
	// SampleAnswer is the text the client answers sampling/createMessage
	// with; empty: no sampling capability.
	SampleAnswer string
}

// RunTSClient runs testdata/node/client.mjs, an MCP client on the pinned
// TypeScript SDK, against the Streamable HTTP endpoint at url with headers
// on every request. args are client.mjs's after the URL: a tool name and
// its arguments as a JSON object, or nothing to only connect and list the
// tools. The client's failure is in the output's Error, not a test
// failure; a client that prints nothing readable fails t.
func RunTSClient(t testing.TB, url string, headers map[string]string, args ...string) TSClientOutput {
	t.Helper()
	return RunTSClientWith(t, url, headers, TSClientOptions{}, args...)
}

// RunTSClientWith is RunTSClient with scripted answers to elicitation and
// sampling requests.
func RunTSClientWith(t testing.TB, url string, headers map[string]string, opts TSClientOptions, args ...string) TSClientOutput {
	t.Helper()
	dir := NodeDir(t)
	var env []string
	if len(headers) > 0 {
		env = append(env, "MCP_HEADERS="+mustJSON(t, headers))
	}
	if len(opts.ElicitAnswers) > 0 {
		env = append(env, "ELICIT_ANSWER="+mustJSON(t, opts.ElicitAnswers))
	}
	if opts.SampleAnswer != "" {
		env = append(env, "SAMPLE_ANSWER="+opts.SampleAnswer)
	}
	run := runNode(t, dir, tsClientTimeout, env, append([]string{"client.mjs", url}, args...)...)
	if run.timedOut {
		t.Fatalf("mcpservetest: client.mjs did not finish within %v; stderr:\n%s", tsClientTimeout, run.stderr)
	}
	var out TSClientOutput
	line := strings.TrimSpace(run.stdout)
	if i := strings.LastIndexByte(line, '\n'); i >= 0 {
		line = line[i+1:]
	}
	if err := json.Unmarshal([]byte(line), &out); err != nil {
		t.Fatalf("mcpservetest: client.mjs (exit %d) printed no JSON line (%v); stdout:\n%s\nstderr:\n%s", run.exitCode, err, run.stdout, run.stderr)
	}
	if run.exitCode != 0 && out.Error == nil {
		t.Fatalf("mcpservetest: client.mjs exited %d without an error; stderr:\n%s", run.exitCode, run.stderr)
	}
	out.Stderr = run.stderr
	return out
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("mcpservetest: %v", err)
	}
	return string(b)
}
