package orchestrator

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/santhosh-tekuri/jsonschema/v6"
	openai "github.com/sashabaranov/go-openai"
)

// Profile is who a connector is, as its agent tells the model and labels
// its spans and metrics.
type Profile struct {
	ID          int64  // the store's row id, which the ToolCaller takes
	WorkspaceID string // with ExternalID, the connector as callers name it
	ExternalID  string
	Name        string
	Description string
	Model       string // empty: the ChatModel's default
	// NarrowAbove overrides Config.NarrowAbove for this connector; 0
	// keeps the agent's.
	NarrowAbove int
}

// Tool is an enabled tool of the connector, as the model sees it.
type Tool struct {
	Name        string
	Description string
	InputSchema json.RawMessage
	// Annotations are the server's hints, shown with a pending call.
	Annotations mcp.ToolAnnotation
	// RequiresApproval makes a run pause before calling the tool, until a
	// person decides (Agent.Resume).
	RequiresApproval bool
}

// Connector is one connector's live agent: its profile and its enabled
// tools made ready for the model once — the OpenAI tool definitions, the
// compiled argument validators and the system prompt's head. The service
// keeps one per connector between queries and builds a new one only when
// the connector's settings or tool catalog change. It is never changed
// once built, so concurrent queries read it without locks.
type Connector struct {
	Profile
	tools  map[string]*tool
	order  []string      // tool names, as listed
	list   []*tool       // the tools in that order
	defs   []openai.Tool // the tools as the model is offered them, in that order
	prompt string        // the system prompt up to the per-query rules, all tools offered
	index  *index        // ranks the tools for a query (narrowing, search_tools)
	// vectors are the tools' embeddings, in list order (nil where not
	// known); nil when there are none (WithVectors).
	vectors [][]float32
	search  string // the name of the search_tools meta-tool: one no tool of the connector has
}

// tool is an enabled tool with its compiled schema; a nil schema is not
// enforced (the server will judge the arguments).
type tool struct {
	Tool
	schema *jsonschema.Schema
}

// NewConnector prepares a connector's agent for tools, its enabled tools.
// A tool listed twice keeps its last entry.
func NewConnector(p Profile, tools []Tool) *Connector {
	c := &Connector{Profile: p, tools: make(map[string]*tool, len(tools))}
	for _, t := range tools {
		if _, dup := c.tools[t.Name]; !dup {
			c.order = append(c.order, t.Name)
		}
		c.tools[t.Name] = &tool{Tool: t, schema: compileSchema(t.Name, t.InputSchema)}
	}
	c.defs = make([]openai.Tool, 0, len(c.order))
	for _, name := range c.order {
		t := c.tools[name]
		c.list = append(c.list, t)
		c.defs = append(c.defs, openai.Tool{Type: openai.ToolTypeFunction, Function: &openai.FunctionDefinition{
			Name: t.Name, Description: t.Description, Parameters: parameters(t.InputSchema)}})
	}
	c.prompt = promptHead(p, c, c.order, false)
	c.index = newIndex(c.list)
	c.search = "search_tools"
	for c.tools[c.search] != nil {
		c.search = "_" + c.search
	}
	return c
}

// WithVectors returns c with its tools' embeddings, by tool name, for the
// semantic ranking; the rest of c is shared.
func (c *Connector) WithVectors(byName map[string][]float32) *Connector {
	next := *c
	next.vectors = make([][]float32, len(c.list))
	for i, t := range c.list {
		next.vectors[i] = byName[t.Name]
	}
	return &next
}

// EmbeddingText is what a tool's embedding is made of: its name,
// description and parameters, as the lexical ranking reads them.
func EmbeddingText(t Tool) string {
	return strings.TrimSpace(t.Name + ": " + t.Description + "\n" + schemaText(t.InputSchema))
}

// Tools returns the names of the enabled tools, in order.
func (c *Connector) Tools() []string { return c.order }

// parameters is a tool's input schema as the model gets it: compact JSON,
// passed through as is; no schema, or one that is not JSON, offers an
// object of any shape.
func parameters(schema json.RawMessage) json.RawMessage {
	var b bytes.Buffer
	if len(bytes.TrimSpace(schema)) == 0 || json.Compact(&b, schema) != nil {
		return json.RawMessage(`{"type":"object"}`)
	}
	return b.Bytes()
}

// validate checks args, as decodeArguments read them (numbers as
// json.Number: the JSON form the server will see), against the tool's
// schema.
func (t *tool) validate(args map[string]any) error {
	if t.schema == nil {
		return nil
	}
	return t.schema.Validate(args)
}

// jsonschemaDoc reads JSON as the validator takes it.
func jsonschemaDoc(b []byte) (any, error) {
	return jsonschema.UnmarshalJSON(bytes.NewReader(b))
}

func compileSchema(name string, raw json.RawMessage) *jsonschema.Schema {
	return compile(name, raw, false)
}

// compile compiles raw as compileSchema does; with formats, the "format"
// of strings (email, uri, date, date-time…) is checked, not only noted.
func compile(name string, raw json.RawMessage, formats bool) *jsonschema.Schema {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil
	}
	url := "mem://tools/" + name + ".json"
	comp := jsonschema.NewCompiler()
	comp.UseLoader(loadNothing{})
	if formats {
		comp.AssertFormat()
	}
	if err := comp.AddResource(url, doc); err != nil {
		return nil
	}
	sch, err := comp.Compile(url)
	if err != nil {
		return nil
	}
	return sch
}

// loadNothing refuses every document a schema refers to. Schemas come from
// MCP servers: a "$ref" to file:///… or http://… must not make the service
// read its own files (whose content would show in validation errors) or
// fetch URLs. The JSON Schema meta-schemas are built in and still load.
type loadNothing struct{}

func (loadNothing) Load(url string) (any, error) {
	return nil, fmt.Errorf("a tool schema may not load %s", url)
}

// missing is what a call to a tool outside the catalog is told.
func (c *Connector) missing(name string) string {
	return fmt.Sprintf("there is no tool %q; the available tools are: %s", name, strings.Join(c.order, ", "))
}
