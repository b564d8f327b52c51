package orchestrator

import (
	"cmp"
	"context"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	openai "github.com/sashabaranov/go-openai"
)

// Reading resources. When the connector's server offers resources, a run
// is offered one more tool, read_resource (renamed if a server tool has
// that name), whose description lists the resources most relevant to the
// query. The model reads with it what a tool result links to, what it
// embeds by reference, or what the list offers. Reads are answered here,
// like search_tools, and count against the run's byte budget, not its tool
// calls; each is a call of its step, with the uri and size read.

// ResourceReader is the ToolCaller's optional side that reads a
// connector's resources: a ToolCaller that has it gives the agent
// read_resource.
type ResourceReader interface {
	// Resources returns connector id's resources as last listed, and
	// whether its server offers resources at all.
	Resources(ctx context.Context, id int64, opts CallOptions) ([]mcp.Resource, bool)
	// ReadResource reads one, over the connection a tool call with opts
	// would use.
	ReadResource(ctx context.Context, id int64, uri string, opts CallOptions) (*mcp.ReadResourceResult, error)
}

// Defaults of reading (Config.ResourceBudget, the listed resources).
const (
	DefaultResourceBudget = 256 << 10
	listedResources       = 20
)

// ResourceRead is a read of a resource by the agent.
type ResourceRead struct {
	URI   string
	Bytes int
}

var readParameters = []byte(`{"type":"object","properties":{"uri":{"type":"string",` +
	`"description":"The resource's URI: one listed here, or one a tool result links to"}},"required":["uri"]}`)

// offerRead adds read_resource to what the run offers, when the
// connector's server has resources.
func (r *run) offerRead(ctx context.Context) {
	reader, ok := r.agent.tools.(ResourceReader)
	if !ok {
		return
	}
	list, has := reader.Resources(ctx, r.conn.ID, CallOptions{Session: r.req.Session, UserID: r.req.UserID})
	if !has {
		return
	}
	r.read = "read_resource"
	for r.conn.tools[r.read] != nil || r.read == r.conn.search {
		r.read = "_" + r.read
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Reads a resource of this connector by its URI: a file, record or page its server offers, or one a tool "+
		"result links to. At most %d bytes in all for this query.", r.budget())
	if picked := relevantResources(list, r.req.Query+" "+r.req.Context, listedResources); len(picked) > 0 {
		b.WriteString(" Resources that may help:")
		for _, res := range picked {
			fmt.Fprintf(&b, "\n- %s", res.URI)
			if d := strings.TrimSpace(cmp.Or(res.Description, res.Title, res.Name)); d != "" {
				fmt.Fprintf(&b, ": %s", Truncate(d, 200))
			}
		}
		if len(list) > len(picked) {
			fmt.Fprintf(&b, "\n(%d more not listed)", len(list)-len(picked))
		}
	}
	r.defs = append(slices.Clip(r.defs), openai.Tool{Type: openai.ToolTypeFunction, Function: &openai.FunctionDefinition{
		Name: r.read, Description: b.String(), Parameters: readParameters}})
}

// budget is the run's byte budget for reads.
func (r *run) budget() int { return cmp.Or(r.agent.cfg.ResourceBudget, DefaultResourceBudget) }

// isRead reports whether a call is one of read_resource.
func (r *run) isRead(name string) bool { return r.read != "" && name == r.read }

// readResource runs a read_resource call and returns what the model
// sees, recording the read in call.
func (r *run) readResource(ctx context.Context, arguments string, call *Call) string {
	start := time.Now()
	defer func() { call.Duration = time.Since(start) }()
	args, err := decodeArguments(arguments)
	uri, _ := args["uri"].(string)
	call.Arguments = args
	if err != nil || strings.TrimSpace(uri) == "" {
		return fmt.Sprintf(`Error: call %s with {"uri": "<the resource's URI>"}`, r.read)
	}
	left := r.budget() - r.res.ResourceBytes
	if left <= 0 {
		return fmt.Sprintf("Error: this query has read its %d bytes of resources; answer with what you have", r.budget())
	}
	reader := r.agent.tools.(ResourceReader)
	res, err := reader.ReadResource(ctx, r.conn.ID, uri, CallOptions{Session: r.req.Session, UserID: r.req.UserID})
	if err != nil {
		return "Error: " + err.Error()
	}
	text, n := resourceText(res.Contents)
	call.Resource = &ResourceRead{URI: uri, Bytes: n}
	if n > left {
		r.res.ResourceBytes = r.budget()
		return fmt.Sprintf("Error: %s is %d bytes, over the %d bytes left of this query's budget for resources; it was not "+
			"given to you", uri, n, left)
	}
	r.res.ResourceBytes += n
	return text
}

// resourceText renders a read for the model, and its size: text and
// decoded binary data.
func resourceText(cs []mcp.ResourceContents) (string, int) {
	var parts []string
	n := 0
	for _, c := range cs {
		switch c := c.(type) {
		case mcp.TextResourceContents:
			parts = append(parts, c.Text)
			n += len(c.Text)
		case mcp.BlobResourceContents:
			size := base64.StdEncoding.DecodedLen(len(c.Blob)) - (len(c.Blob) - len(strings.TrimRight(c.Blob, "=")))
			parts = append(parts, fmt.Sprintf("[binary resource %s, %s, %d bytes]", c.URI, cmp.Or(c.MIMEType, "of unknown type"), size))
			n += size
		}
	}
	return strings.Join(parts, "\n"), n
}

// relevantResources picks at most n resources for text: those sharing
// the most words with it first, then the others in their order.
func relevantResources(list []mcp.Resource, text string, n int) []mcp.Resource {
	words := map[string]bool{}
	for _, w := range strings.FieldsFunc(strings.ToLower(text), notWordRune) {
		if len(w) > 2 {
			words[w] = true
		}
	}
	score := make([]int, len(list))
	for i, res := range list {
		for _, w := range strings.FieldsFunc(strings.ToLower(res.URI+" "+res.Name+" "+res.Title+" "+res.Description), notWordRune) {
			if words[w] {
				score[i]++
			}
		}
	}
	idx := make([]int, len(list))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return score[b] - score[a] })
	out := make([]mcp.Resource, 0, min(n, len(list)))
	for _, i := range idx[:min(n, len(idx))] {
		out = append(out, list[i])
	}
	return out
}

func notWordRune(r rune) bool {
	return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127)
}
