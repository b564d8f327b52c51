package mcpserve

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"

	"github.com/mark3labs/mcp-go/mcp"
)

// A 2025-11-25 client answers a question (an approval form, a server's
// elicitation) with a POST of its own, which a balancer without affinity
// may send to any replica; only the replica whose open call asked it can
// hand it on (mcp-go keeps the question's wait in memory). So a replica
// that gets an answer for a session none of whose requests are open here
// relays it (Relay: a Postgres NOTIFY every replica hears) and answers 202
// Accepted, as the spec has servers answer a client's response; each
// replica with a request of that session open hands it to its endpoint
// as if it had come in there. An answer is small (at most
// store.MaxMCPAnswerBytes); one nobody holds a request for is dropped,
// and its question ends as unanswered.

// Relay publishes an answer to every replica.
type Relay interface {
	PublishMCPAnswer(ctx context.Context, payload []byte) error
}

// relayed is an answer on its way between replicas.
type relayed struct {
	Path     string          `json:"p"`
	Session  string          `json:"s"`
	Protocol string          `json:"v,omitempty"`
	Body     json.RawMessage `json:"b"`
}

// openRequests counts the requests of each session being served here.
type openRequests struct {
	mu sync.Mutex
	n  map[string]int
}

func (o *openRequests) add(session string) func() {
	o.mu.Lock()
	if o.n == nil {
		o.n = map[string]int{}
	}
	o.n[session]++
	o.mu.Unlock()
	return func() {
		o.mu.Lock()
		defer o.mu.Unlock()
		if o.n[session]--; o.n[session] <= 0 {
			delete(o.n, session)
		}
	}
}

func (o *openRequests) has(session string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n[session] > 0
}

// isResponse reports whether body is a JSON-RPC response (an answer to a
// request of ours), not a request or a notification.
func isResponse(body []byte) bool {
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Result json.RawMessage `json:"result"`
		Error  json.RawMessage `json:"error"`
	}
	if json.Unmarshal(body, &msg) != nil {
		return false
	}
	return msg.Method == "" && len(msg.ID) > 0 && (msg.Result != nil || msg.Error != nil)
}

// serveAnswer serves a client's answer: here, when a request of its
// session is open here and the endpoint takes it; else it relays it to
// every replica and answers 202. It reports whether it answered (else the
// endpoint serves the request as usual).
func (h *Handler) serveAnswer(w http.ResponseWriter, r *http.Request, ep *endpoint, body []byte) bool {
	session := r.Header.Get("Mcp-Session-Id")
	if h.d.Relay == nil || session == "" || mcp.IsModernProtocol(r.Header.Get("Mcp-Protocol-Version")) || !isResponse(body) {
		return false
	}
	if h.open.has(session) {
		rec := httptest.NewRecorder()
		ep.http.ServeHTTP(rec, r)
		if rec.Code < 300 {
			w.WriteHeader(rec.Code)
			return true
		}
	}
	payload, _ := json.Marshal(relayed{Path: ep.path, Session: session, Protocol: r.Header.Get("Mcp-Protocol-Version"), Body: body})
	if err := h.d.Relay.PublishMCPAnswer(r.Context(), payload); err != nil {
		h.logger.WarnContext(r.Context(), "an MCP client's answer could not be relayed to the replica that asked", slog.String("error", err.Error()))
		writeJSONRPCError(w, http.StatusServiceUnavailable, -32603, "the answer could not be handed to the replica that asked: "+err.Error())
		return true
	}
	w.WriteHeader(http.StatusAccepted)
	return true
}

// Deliver hands a relayed answer to this replica's endpoint if one of its
// session's requests is open here: the store's listener calls it with
// each payload on store.MCPAnswersChannel.
func (h *Handler) Deliver(payload string) {
	var a relayed
	if json.Unmarshal([]byte(payload), &a) != nil || !h.open.has(a.Session) {
		return
	}
	h.mu.Lock()
	ep, ok := h.endpoints[a.Path]
	h.mu.Unlock()
	if !ok {
		return
	}
	req := httptest.NewRequest(http.MethodPost, a.Path, bytes.NewReader(a.Body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Mcp-Session-Id", a.Session)
	if a.Protocol != "" {
		req.Header.Set("Mcp-Protocol-Version", a.Protocol)
	}
	rec := httptest.NewRecorder()
	ep.http.ServeHTTP(rec, req)
	if rec.Code >= 300 {
		h.logger.Info("a relayed MCP answer was not taken", slog.String("path", a.Path), slog.Int("status", rec.Code))
	}
}
