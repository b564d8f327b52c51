// Package llmtest is a fake OpenAI-compatible chat completions server over
// real HTTP, scripted per test, that records what it was sent.
package llmtest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"

	openai "github.com/sashabaranov/go-openai"
)

// Reply is one scripted answer.
type Reply struct {
	Status int         // default 200
	Header http.Header // e.g. Retry-After
	// Body is sent as JSON; a ChatCompletionResponse for a success.
	Body any
}

// Step answers one request; it may look at what was sent.
type Step func(req openai.ChatCompletionRequest) Reply

// Server is the fake endpoint. Requests beyond the script get a 500 and
// fail the test.
type Server struct {
	t    testing.TB
	http *httptest.Server

	mu       sync.Mutex
	embed    func(text string) []float32
	embedded []string // every text embedded, in order
	script   []Step
	requests []openai.ChatCompletionRequest
	headers  []http.Header
}

// New starts a server that answers with steps in order.
func New(t testing.TB, steps ...Step) *Server {
	s := &Server{t: t, script: steps}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", s.handle)
	mux.HandleFunc("POST /v1/embeddings", s.handleEmbeddings)
	s.http = httptest.NewServer(mux)
	t.Cleanup(s.http.Close)
	return s
}

// URL is the base URL to configure (ends in /v1).
func (s *Server) URL() string { return s.http.URL + "/v1" }

// Then appends steps to the script.
func (s *Server) Then(steps ...Step) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.script = append(s.script, steps...)
}

// Requests returns what the server was sent, in order.
func (s *Server) Requests() []openai.ChatCompletionRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]openai.ChatCompletionRequest(nil), s.requests...)
}

// Authorizations returns the Authorization headers received.
func (s *Server) Authorizations() []string {
	var auth []string
	for _, h := range s.Headers() {
		auth = append(auth, h.Get("Authorization"))
	}
	return auth
}

// Headers returns the headers of each request received, in order.
func (s *Server) Headers() []http.Header {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]http.Header(nil), s.headers...)
}

func (s *Server) handle(w http.ResponseWriter, r *http.Request) {
	var req openai.ChatCompletionRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	n := len(s.requests)
	s.requests = append(s.requests, req)
	s.headers = append(s.headers, r.Header.Clone())
	var step Step
	if n < len(s.script) {
		step = s.script[n]
	}
	s.mu.Unlock()
	if step == nil {
		s.t.Errorf("llmtest: unscripted request %d", n+1)
		http.Error(w, `{"error":{"message":"unscripted"}}`, http.StatusInternalServerError)
		return
	}
	reply := step(req)
	for k, vs := range reply.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	if reply.Status == 0 {
		reply.Status = http.StatusOK
	}
	w.WriteHeader(reply.Status)
	_ = json.NewEncoder(w).Encode(reply.Body)
}

// Answer replies with a final answer.
func Answer(text string) Step {
	return func(openai.ChatCompletionRequest) Reply {
		return Reply{Body: response(openai.ChatCompletionMessage{Role: "assistant", Content: text})}
	}
}

// Call is a tool call the fake model asks for.
type Call struct {
	Tool string
	Args string // JSON
}

// CallTools replies with tool calls, ids call_1, call_2, … in this reply.
func CallTools(calls ...Call) Step { return CallToolsSaying("", calls...) }

// CallToolsSaying replies with tool calls and text: what a model says of
// why it makes them.
func CallToolsSaying(text string, calls ...Call) Step {
	return func(openai.ChatCompletionRequest) Reply {
		msg := openai.ChatCompletionMessage{Role: "assistant", Content: text}
		for i, c := range calls {
			msg.ToolCalls = append(msg.ToolCalls, openai.ToolCall{
				ID: fmt.Sprintf("call_%d", i+1), Type: openai.ToolTypeFunction,
				Function: openai.FunctionCall{Name: c.Tool, Arguments: c.Args},
			})
		}
		return Reply{Body: response(msg)}
	}
}

// Fail replies with an OpenAI-style error.
func Fail(status int, msg string, header http.Header) Step {
	return func(openai.ChatCompletionRequest) Reply {
		return Reply{Status: status, Header: header, Body: map[string]any{"error": map[string]any{"message": msg, "type": "test"}}}
	}
}

func response(msg openai.ChatCompletionMessage) openai.ChatCompletionResponse {
	return openai.ChatCompletionResponse{
		ID: "chatcmpl-test", Object: "chat.completion", Model: "fake",
		Choices: []openai.ChatCompletionChoice{{Index: 0, Message: msg, FinishReason: "stop"}},
		Usage:   openai.Usage{PromptTokens: 100, CompletionTokens: 20, TotalTokens: 120},
	}
}

// Embeddings makes the server answer /v1/embeddings with embed's vector
// for each input text; without it, embeddings requests get a 404.
func (s *Server) Embeddings(embed func(text string) []float32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.embed = embed
}

// Embedded returns every text the server embedded, in order.
func (s *Server) Embedded() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.embedded)
}

func (s *Server) handleEmbeddings(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Input []string `json:"input"`
	}
	s.mu.Lock()
	embed := s.embed
	s.mu.Unlock()
	if embed == nil {
		http.Error(w, "no embeddings here", http.StatusNotFound)
		return
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	resp := openai.EmbeddingResponse{Object: "list"}
	for i, text := range req.Input {
		resp.Data = append(resp.Data, openai.Embedding{Object: "embedding", Index: i, Embedding: embed(text)})
	}
	s.mu.Lock()
	s.embedded = append(s.embedded, req.Input...)
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}
