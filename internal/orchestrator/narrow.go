package orchestrator

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"

	openai "github.com/sashabaranov/go-openai"
)

// Narrowing. A connector with more enabled tools than its threshold does
// not offer them all: a query is offered the best-ranked for its text and
// context (index), and a search_tools meta-tool that finds the others.
// What search_tools finds is offered from the next model turn on, with the
// usual checks; a call to a tool that is not offered is refused like a
// call to an unknown one, so the model can search and try again.

// searchParameters is the meta-tool's input schema.
var searchParameters = json.RawMessage(`{"type":"object","properties":{"query":{"type":"string",` +
	`"description":"What the tool you need does, in a few words"}},"required":["query"]}`)

// selectTools decides what the run offers: every tool, or a selection.
func (r *run) selectTools(ctx context.Context) {
	c := r.conn
	r.res.ToolsTotal = len(c.order)
	if len(c.order) <= cmp.Or(c.NarrowAbove, r.agent.cfg.NarrowAbove) {
		r.head, r.defs, r.res.ToolsOffered = c.prompt, c.defs, c.order
		return
	}
	order, _ := r.rank(ctx, r.req.Query+"\n"+r.req.Context)
	r.offerSearch()
	for _, i := range order[:min(r.agent.cfg.NarrowTo, len(order))] {
		r.offer(i)
	}
	r.head = promptHead(c.Profile, c, r.res.ToolsOffered, true)
	r.res.Narrowed = true
	r.agent.counters.narrowed.Add(ctx, 1, connectorAttrs(c))
}

// restoreTools offers a resumed run what it was offered before it paused
// (the tools search_tools found included), as far as the connector still
// has them.
func (r *run) restoreTools() {
	c := r.conn
	if !r.res.Narrowed {
		r.defs = c.defs
		return
	}
	names := r.res.ToolsOffered
	r.res.ToolsOffered = nil
	r.offerSearch()
	pos := make(map[string]int, len(c.list))
	for i, t := range c.list {
		pos[t.Name] = i
	}
	for _, name := range names {
		if i, ok := pos[name]; ok {
			r.offer(i)
		}
	}
}

// rank orders the connector's tools for text, best first, and returns
// their scores (0: no match). Lexically (BM25) alone, or, with an Embedder
// and the tools' vectors, fused with the semantic ranking (cosine
// similarity of the embeddings) by reciprocal rank: a tool scores
// 1/(60+rank) in each ranking it is in — the lexical one if it shares a
// word with text, the semantic one if it has a vector — and the sums
// decide. If the text cannot be embedded, the lexical ranking stands.
func (r *run) rank(ctx context.Context, text string) ([]int, []float64) {
	c := r.conn
	lex := c.index.scores(text)
	order := rank(lex)
	if r.agent.cfg.Embedder == nil || c.vectors == nil {
		return order, lex
	}
	ectx, cancel := context.WithTimeout(ctx, embedTimeout)
	defer cancel()
	q, err := r.agent.cfg.Embedder.Embed(ectx, []string{Truncate(text, maxEmbedText)})
	if err != nil {
		r.agent.logger.WarnContext(ctx, "embed the query; ranking the tools by their words alone",
			slog.String("connector_id", c.ExternalID), slog.String("error", err.Error()))
		return order, lex
	}
	sem := make([]float64, len(c.list))
	for i, v := range c.vectors {
		sem[i] = cosine(q[0], v)
	}
	const k = 60
	fused := make([]float64, len(c.list))
	for pos, i := range order {
		if lex[i] > 0 {
			fused[i] += 1 / float64(k+pos+1)
		}
	}
	for pos, i := range rank(sem) {
		if c.vectors[i] != nil {
			fused[i] += 1 / float64(k+pos+1)
		}
	}
	return rank(fused), fused
}

// Bounds of a query's embedding: it must not hold a query up for long.
const (
	embedTimeout = 2 * time.Second
	maxEmbedText = 8000
)

// cosine is the cosine similarity of a and b; -1 when either is missing
// or they differ in length.
func cosine(a, b []float32) float64 {
	if len(a) == 0 || len(a) != len(b) {
		return -1
	}
	var dot, na, nb float64
	for i := range a {
		dot += float64(a[i]) * float64(b[i])
		na += float64(a[i]) * float64(a[i])
		nb += float64(b[i]) * float64(b[i])
	}
	if na == 0 || nb == 0 {
		return -1
	}
	return dot / math.Sqrt(na*nb)
}

// offerSearch starts a narrowed offer: search_tools alone.
func (r *run) offerSearch() {
	r.offered = map[string]bool{}
	r.defs = make([]openai.Tool, 0, r.agent.cfg.NarrowTo+r.agent.cfg.SearchResults+1)
	r.defs = append(r.defs, openai.Tool{Type: openai.ToolTypeFunction, Function: &openai.FunctionDefinition{
		Name: r.conn.search, Parameters: searchParameters,
		Description: fmt.Sprintf("Finds more of this connector's tools by what they do: up to %d names and descriptions, "+
			"callable from your next turn.", r.agent.cfg.SearchResults)}})
}

// offer adds the connector's tool i to what the model is offered.
func (r *run) offer(i int) {
	t := r.conn.list[i]
	r.offered[t.Name] = true
	r.defs = append(r.defs, r.conn.defs[i])
	r.res.ToolsOffered = append(r.res.ToolsOffered, t.Name)
}

// isOffered reports whether the model may call the tool now.
func (r *run) isOffered(name string) bool {
	return r.offered == nil || r.offered[name]
}

// isSearch reports whether a call is one of search_tools.
func (r *run) isSearch(name string) bool {
	return r.offered != nil && name == r.conn.search
}

// search runs a search_tools call: the best-ranked tools for its phrase
// that are not offered yet become offered, and the model gets their names
// and descriptions.
func (r *run) search(ctx context.Context, arguments string) string {
	r.agent.counters.searches.Add(ctx, 1, connectorAttrs(r.conn))
	args, err := decodeArguments(arguments)
	phrase, _ := args["query"].(string)
	if err != nil || strings.TrimSpace(phrase) == "" {
		return fmt.Sprintf(`Error: call %s with {"query": "<what the tool does>"}`, r.conn.search)
	}
	order, scores := r.rank(ctx, phrase)
	var found []string
	for _, i := range order {
		if len(found) == r.agent.cfg.SearchResults || scores[i] == 0 {
			break
		}
		if t := r.conn.list[i]; !r.offered[t.Name] {
			r.offer(i)
			found = append(found, fmt.Sprintf("- %s: %s", t.Name, cmp.Or(strings.TrimSpace(t.Description), "(no description)")))
		}
	}
	if len(found) == 0 {
		return fmt.Sprintf("No other tool matches %q. The tools you were offered are all there is for it.", phrase)
	}
	return "These tools are now available; call them in your next turn:\n" + strings.Join(found, "\n")
}

// notOffered is what a call to a tool that exists but is not offered is
// told.
func (r *run) notOffered(name string) string {
	return fmt.Sprintf("there is no tool %q among the tools offered; call %s to find more tools, then call the one you need",
		name, r.conn.search)
}
