// Package devmodel is the development model: a scripted stand-in for an
// OpenAI-compatible chat model, so that the connector agent, approvals and
// a server's sampling requests can be tried on a machine with no model. It
// is not a language model and understands nothing; it follows fixed rules:
//
//   - Offered tools, and no tool result yet: it calls each offered tool whose
//     name the query contains ("echo", "get-sum" or "get sum"); if none, the
//     tool whose name shares the most words with the query; if none shares
//     any, the first tool offered. The arguments follow the tool's input
//     schema: each required string gets the query, each required number the
//     query's numbers in turn (0 when it has no more), a boolean false, an
//     enum its first value, a field with a default its default.
//   - Tool results in the conversation: it answers with them, one line each.
//   - Asked for a plan (the connector agent's plan_only): the same choice,
//     as {"plan": [...]}, from the tool names in the system prompt.
//   - Otherwise (no tools, as in a server's sampling request): it answers
//     with the last user message it got.
//
// Every answer starts with [Label], and every plan's purpose says so too.
// It answers POST /v1/chat/completions (not streamed) and POST
// /v1/embeddings (a hashed bag of words: texts that share words are near).
package devmodel

import (
	"cmp"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode"

	openai "github.com/sashabaranov/go-openai"
)

// Label starts every answer: nobody mistakes the stand-in for a model.
const Label = "dev-model (a scripted stand-in, not a real model)"

// DefaultAddr is where the development model listens unless told otherwise.
const DefaultAddr = "127.0.0.1:11435"

// maxResult bounds how much of one tool result an answer repeats.
const maxResult = 400

// embeddingDims is the length of the vectors /v1/embeddings returns.
const embeddingDims = 64

// Handler serves the development model's OpenAI-compatible endpoints under
// /v1. Each answered request is reported to log (nil: not reported) as one
// line.
func Handler(log func(line string)) http.Handler {
	if log == nil {
		log = func(string) {}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", chatCompletions(log))
	mux.HandleFunc("POST /v1/embeddings", embeddings(log))
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, map[string]any{"object": "list", "data": []map[string]any{{"id": "dev-model", "object": "model", "owned_by": "connector-svc"}}})
	})
	return mux
}

// chatCompletions answers chat completion requests with Reply, numbering
// them in its log lines.
func chatCompletions(log func(line string)) http.HandlerFunc {
	var n atomic.Int64
	return func(w http.ResponseWriter, r *http.Request) {
		var req openai.ChatCompletionRequest
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 32<<20)).Decode(&req); err != nil {
			apiError(w, http.StatusBadRequest, "the request is not a chat completion request: "+err.Error())
			return
		}
		if req.Stream {
			apiError(w, http.StatusBadRequest, "the dev-model does not stream: send stream=false")
			return
		}
		msg, what := Reply(req)
		id := n.Add(1)
		log(fmt.Sprintf("request %d (model %q, %d messages, %d tools): %s", id, req.Model, len(req.Messages), len(req.Tools), what))
		prompt := 0
		for _, m := range req.Messages {
			prompt += tokens(msgText(m))
		}
		completion := tokens(msg.Content)
		for _, c := range msg.ToolCalls {
			completion += tokens(c.Function.Name + c.Function.Arguments)
		}
		finish := openai.FinishReasonStop
		if len(msg.ToolCalls) > 0 {
			finish = openai.FinishReasonToolCalls
		}
		writeJSON(w, openai.ChatCompletionResponse{
			ID: fmt.Sprintf("devmodel-%d", id), Object: "chat.completion", Created: time.Now().Unix(), Model: req.Model,
			Choices: []openai.ChatCompletionChoice{{Index: 0, Message: msg, FinishReason: finish}},
			Usage:   openai.Usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion},
		})
	}
}

// embeddings answers embeddings requests with Embed.
func embeddings(log func(line string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Input any    `json:"input"`
			Model string `json:"model"`
		}
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 32<<20)).Decode(&req); err != nil {
			apiError(w, http.StatusBadRequest, "the request is not an embeddings request: "+err.Error())
			return
		}
		var texts []string
		switch in := req.Input.(type) {
		case string:
			texts = []string{in}
		case []any:
			for _, v := range in {
				s, ok := v.(string)
				if !ok {
					apiError(w, http.StatusBadRequest, "the dev-model embeds strings only")
					return
				}
				texts = append(texts, s)
			}
		default:
			apiError(w, http.StatusBadRequest, "input: want a string or a list of strings")
			return
		}
		resp := openai.EmbeddingResponse{Object: "list", Model: openai.EmbeddingModel(req.Model)}
		for i, t := range texts {
			resp.Data = append(resp.Data, openai.Embedding{Object: "embedding", Index: i, Embedding: Embed(t)})
			resp.Usage.PromptTokens += tokens(t)
		}
		resp.Usage.TotalTokens = resp.Usage.PromptTokens
		log(fmt.Sprintf("embedded %d texts (model %q)", len(texts), req.Model))
		writeJSON(w, resp)
	}
}

// Reply is the development model's answer to req, and a short account of
// what it did, for its log.
func Reply(req openai.ChatCompletionRequest) (openai.ChatCompletionMessage, string) {
	query := lastUser(req.Messages)
	if results := toolResults(req.Messages); len(results) > 0 {
		return answer(Label + ": " + strings.Join(results, "; ")), fmt.Sprintf("answered from %d tool results", len(results))
	}
	if len(req.Tools) > 0 && choice(req.ToolChoice) != "none" {
		var tools []offered
		for _, t := range req.Tools {
			if t.Function != nil {
				tools = append(tools, offered{name: t.Function.Name, schema: t.Function.Parameters})
			}
		}
		if forced := forcedTool(req.ToolChoice); forced != "" {
			tools = slices.DeleteFunc(tools, func(o offered) bool { return o.name != forced })
		}
		if picked, _ := pick(tools, query); len(picked) > 0 {
			msg := openai.ChatCompletionMessage{Role: openai.ChatMessageRoleAssistant}
			var names []string
			for i, t := range picked {
				args, _ := json.Marshal(arguments(t.schema, query))
				msg.ToolCalls = append(msg.ToolCalls, openai.ToolCall{ID: fmt.Sprintf("call_%d", i+1), Type: openai.ToolTypeFunction,
					Function: openai.FunctionCall{Name: t.name, Arguments: string(args)}})
				names = append(names, t.name)
			}
			return msg, "called " + strings.Join(names, ", ")
		}
	}
	if system := firstSystem(req.Messages); strings.Contains(system, `{"plan": [`) {
		return plan(system, query)
	}
	return answer(Label + " got: " + oneLine(query, maxResult)), "answered with the query"
}

// offered is a tool the request offers.
type offered struct {
	name   string
	schema any // the JSON schema of its arguments, decoded
}

// pick chooses the tools to call for query, and says why (for a plan's
// purpose): every tool whose whole name the query contains, else the one
// sharing the most words with it, else the first.
func pick(tools []offered, query string) ([]offered, string) {
	if len(tools) == 0 {
		return nil, ""
	}
	q := words(query)
	var named []offered
	best, bestScore := -1, 0
	for i, t := range tools {
		w := words(t.name)
		if len(w) > 0 && contains(q, w) {
			named = append(named, t)
		}
		score := 0
		for _, x := range uniq(w) {
			if slices.Contains(q, x) {
				score++
			}
		}
		if score > bestScore {
			best, bestScore = i, score
		}
	}
	switch {
	case len(named) > 0:
		return named, "the query names it"
	case best >= 0:
		return tools[best : best+1], "its name is the closest to the query"
	}
	return tools[:1], "the first tool offered"
}

// plan answers the connector agent's plan_only request: the tools it would
// call, from the "- name: description" lines of the system prompt.
func plan(system, query string) (openai.ChatCompletionMessage, string) {
	var tools []offered
	for _, l := range strings.Split(system, "\n") {
		if m := promptTool.FindStringSubmatch(l); m != nil {
			tools = append(tools, offered{name: m[1]})
		}
	}
	type step struct {
		Tool    string `json:"tool"`
		Purpose string `json:"purpose"`
	}
	out := struct {
		Plan []step `json:"plan"`
	}{Plan: []step{}}
	picked, why := pick(tools, query)
	for _, t := range picked {
		out.Plan = append(out.Plan, step{Tool: t.name, Purpose: "dev-model (a scripted stand-in): " + why})
	}
	b, _ := json.Marshal(out)
	return answer(string(b)), fmt.Sprintf("planned %d tools", len(out.Plan))
}

// promptTool is a tool's line in the agent's system prompt.
var promptTool = regexp.MustCompile(`^- ([A-Za-z0-9_.\-/]+): `)

// arguments builds a tool call's arguments from its input schema: the
// required properties only, each filled from the query.
func arguments(schema any, query string) map[string]any {
	args := map[string]any{}
	s, _ := schema.(map[string]any)
	props, _ := s["properties"].(map[string]any)
	required, _ := s["required"].([]any)
	text := query
	numbers := numberRE.FindAllString(text, -1)
	for _, r := range required {
		name, _ := r.(string)
		p, _ := props[name].(map[string]any)
		if name == "" {
			continue
		}
		if d, ok := p["default"]; ok {
			args[name] = d
			continue
		}
		if enum, ok := p["enum"].([]any); ok && len(enum) > 0 {
			args[name] = enum[0]
			continue
		}
		switch typeOf(p) {
		case "number", "integer":
			v := 0.0
			if len(numbers) > 0 {
				v, _ = strconv.ParseFloat(numbers[0], 64)
				numbers = numbers[1:]
			}
			if typeOf(p) == "integer" {
				v = math.Trunc(v)
			}
			args[name] = v
		case "boolean":
			args[name] = false
		case "array":
			args[name] = []any{}
		case "object":
			args[name] = arguments(p, query)
		default:
			args[name] = strings.TrimSpace(text)
		}
	}
	return args
}

var numberRE = regexp.MustCompile(`-?\d+(\.\d+)?`)

// typeOf is a schema's type; the first of a list that is not "null".
func typeOf(p map[string]any) string {
	switch t := p["type"].(type) {
	case string:
		return t
	case []any:
		for _, x := range t {
			if s, _ := x.(string); s != "" && s != "null" {
				return s
			}
		}
	}
	return "string"
}

// toolResults are the tool messages of the conversation, each as
// "<tool> returned: <text>", named from the assistant's calls.
func toolResults(msgs []openai.ChatCompletionMessage) []string {
	names := map[string]string{}
	var out []string
	for _, m := range msgs {
		for _, c := range m.ToolCalls {
			names[c.ID] = c.Function.Name
		}
		if m.Role != openai.ChatMessageRoleTool {
			continue
		}
		name := names[m.ToolCallID]
		if name == "" {
			name = cmp.Or(m.Name, "a tool")
		}
		out = append(out, name+" returned: "+oneLine(msgText(m), maxResult))
	}
	return out
}

// lastUser is the text of the last user message: the query. Of the
// connector agent's "Context: … Query: …", the query alone.
func lastUser(msgs []openai.ChatCompletionMessage) string {
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == openai.ChatMessageRoleUser {
			text := msgText(msgs[i])
			if j := strings.LastIndex(text, "\n\nQuery:\n"); strings.HasPrefix(text, "Context:\n") && j >= 0 {
				text = text[j+len("\n\nQuery:\n"):]
			}
			return strings.TrimSpace(text)
		}
	}
	return ""
}

// msgText is a message's text: its content, or its text parts.
func msgText(m openai.ChatCompletionMessage) string {
	if m.Content != "" || len(m.MultiContent) == 0 {
		return m.Content
	}
	var parts []string
	for _, p := range m.MultiContent {
		if p.Type == openai.ChatMessagePartTypeText {
			parts = append(parts, p.Text)
		}
	}
	return strings.Join(parts, "\n")
}

func firstSystem(msgs []openai.ChatCompletionMessage) string {
	for _, m := range msgs {
		if m.Role == openai.ChatMessageRoleSystem {
			return m.Content
		}
	}
	return ""
}

// choice is a tool_choice given as a string ("auto", "none", "required");
// "" for none or an object.
func choice(c any) string {
	s, _ := c.(string)
	return s
}

// forcedTool is the function a tool_choice object names, "" if none.
func forcedTool(c any) string {
	m, _ := c.(map[string]any)
	f, _ := m["function"].(map[string]any)
	name, _ := f["name"].(string)
	return name
}

func answer(text string) openai.ChatCompletionMessage {
	return openai.ChatCompletionMessage{Role: openai.ChatMessageRoleAssistant, Content: text}
}

// words splits s into lower-case words of letters and digits.
func words(s string) []string {
	return strings.FieldsFunc(strings.ToLower(s), func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) })
}

// contains reports whether seq occurs in ws, word for word, in order.
func contains(ws, seq []string) bool {
	for i := 0; i+len(seq) <= len(ws); i++ {
		if slices.Equal(ws[i:i+len(seq)], seq) {
			return true
		}
	}
	return false
}

func uniq(ws []string) []string {
	out := slices.Clone(ws)
	slices.Sort(out)
	return slices.Compact(out)
}

// oneLine is s on one line, cut at max bytes (on a rune boundary).
func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8Start(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func utf8Start(b byte) bool { return b&0xC0 != 0x80 }

// tokens is a rough token count: a token is about 4 bytes of English.
func tokens(s string) int { return (len(s) + 3) / 4 }

// Embed is the development model's embedding of text: each word adds to
// the dimension its hash picks, normalized to length 1.
func Embed(text string) []float32 {
	v := make([]float32, embeddingDims)
	for _, w := range words(text) {
		h := fnv.New32a()
		_, _ = h.Write([]byte(w))
		v[h.Sum32()%embeddingDims]++
	}
	var norm float64
	for _, x := range v {
		norm += float64(x * x)
	}
	if norm == 0 {
		v[0] = 1
		return v
	}
	for i := range v {
		v[i] = float32(float64(v[i]) / math.Sqrt(norm))
	}
	return v
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func apiError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": msg, "type": "invalid_request_error"}})
}
