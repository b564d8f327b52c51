package orchestrator

import (
	"context"

	"github.com/mark3labs/mcp-go/mcp"
	openai "github.com/sashabaranov/go-openai"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/connector-svc/connector-svc/internal/ask"
)

// ChatModel answers chat completion requests. It is an interface here so
// the agent can be driven by any OpenAI-compatible client.
type ChatModel interface {
	Chat(ctx context.Context, req openai.ChatCompletionRequest) (openai.ChatCompletionResponse, error)
}

// ToolCaller runs a tool of a connector over its persistent session. It is
// an interface here so the agent needs no MCP connection code.
type ToolCaller interface {
	CallTool(ctx context.Context, connectorID int64, name string, args map[string]any, opts CallOptions) (*mcp.CallToolResult, error)
}

// CallOptions are what the agent adds to one tool call, besides the tool
// and its arguments.
type CallOptions struct {
	// Session is the caller's session id (Request.Session): a per_session
	// connector runs the call on that session's own connection.
	Session string
	// UserID is the end user the run is for (Request.UserID): an
	// oauth_user connector runs the call with that user's token.
	UserID string
	// Progress, when set, asks the call's server for progress: every
	// update reaches it, in order, before CallTool returns and never
	// after.
	Progress func(Progress)
	// Retry, when set, sends again a call that ended needing the user's
	// input (ask.InputRequiredError), with the answers.
	Retry *ask.Retry
	// TaskID, when set, receives the id of the task the call ran as, if
	// its server ran it as one.
	TaskID *string
	// Restarted, when set, is set to true if the call ran on a new MCP
	// session in place of the one the caller's session had (see
	// Result.SessionRestarted).
	Restarted *bool
}

// Progress is one progress update that a server sent for a running tool
// call.
type Progress struct {
	Progress float64 // how far the tool is; rises with every update
	Total    float64 // what Progress counts up to; 0 when the server does not say
	Message  string  // what the tool is doing, if the server says
}

// Embedder turns texts into embedding vectors, in order. It is an
// interface here so the agent can use any OpenAI-compatible endpoint's.
type Embedder interface {
	Embed(ctx context.Context, texts []string) ([][]float32, error)
}

// Budget limits.
const (
	DefaultMaxTools = 10
	MaxMaxTools     = 50
)

// Narrowing defaults (Config.NarrowAbove, Config.NarrowTo).
const (
	DefaultNarrowAbove = 32
	DefaultNarrowTo    = 24
)

// Config tunes the agent; zero fields take defaults.
type Config struct {
	MaxTurns    int // model turns with tools before a forced answer; 8
	ResultLimit int // characters of one tool result sent to the model; 8000
	ExcerptSize int // characters of a result kept in the trace; 500
	// NarrowAbove is how many enabled tools a connector may have before a
	// query is offered only the NarrowTo best-ranked for it (and
	// search_tools to find the others); 32. A connector's Profile may
	// override it.
	NarrowAbove int
	NarrowTo    int // 24
	// SearchResults is how many tools one search_tools call finds; 8.
	SearchResults int
	// ResourceBudget is how many bytes of resources one run may read
	// (read_resource); 256 KiB.
	ResourceBudget int
	// Embedder, when set, adds a semantic ranking to narrowing: the
	// query's embedding against the tools' (Connector.WithVectors).
	Embedder Embedder
	// MeterProvider records the runs (see metrics.go); nil records none.
	MeterProvider metric.MeterProvider
	// TracerProvider makes the spans of queries and model calls; nil means
	// otel's global one.
	TracerProvider trace.TracerProvider
}
