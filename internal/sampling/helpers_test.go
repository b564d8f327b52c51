package sampling_test

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/llm"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/sampling"
	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

func TestMain(m *testing.M) { os.Exit(storetest.Main(m)) }

// testKey is the fake model's API key: it must never show in an error.
const testKey = "sk-test-secret-4711"

// model is a real llm.Client of the fake endpoint.
func model(t testing.TB, srv *llmtest.Server) *llm.Client {
	t.Helper()
	c, err := llm.New(llm.Config{BaseURL: srv.URL(), APIKey: testKey, Model: "default-model", MaxRetries: 1, BackoffBase: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// on is a connector with sampling on, and the given settings.
func on(c store.SamplingConfig) *store.SamplingConfig {
	c.Enabled = true
	return &c
}

// connectors is a Config.Connector of fixed targets.
func connectors(targets map[int64]sampling.Target) func(int64) (sampling.Target, bool) {
	return func(id int64) (sampling.Target, bool) {
		t, ok := targets[id]
		return t, ok
	}
}

// newSampler is a sampler on the fake endpoint for connector 1, named
// "shop", with sampling settings sc and the connector's model "conn-model".
func newSampler(t testing.TB, srv *llmtest.Server, sc *store.SamplingConfig, mod func(*sampling.Config)) *sampling.Sampler {
	cfg := sampling.Config{Chat: model(t, srv).Chat, Model: "default-model",
		Connector: connectors(map[int64]sampling.Target{1: {Workspace: "acme", Name: "shop", Model: "conn-model", Sampling: sc}})}
	if mod != nil {
		mod(&cfg)
	}
	return sampling.New(cfg)
}

// asker is a caller who answers every input with action (after asking,
// if err is set, it fails with err), with a run budget.
type asker struct {
	budget *ask.Budget
	action string
	err    error

	mu      sync.Mutex
	inputs  []ask.Input
	records []ask.SamplingRecord
	calls   []ask.Call
}

func (a *asker) Elicit(_ context.Context, call ask.Call, in ask.Input) (ask.Answer, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.inputs = append(a.inputs, in)
	if a.err != nil {
		return ask.Answer{}, a.err
	}
	return ask.Answer{Action: a.action}, nil
}

func (a *asker) Sampling() *ask.Budget { return a.budget }

func (a *asker) Sampled(call ask.Call, rec ask.SamplingRecord) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.records = append(a.records, rec)
	a.calls = append(a.calls, call)
}

func (a *asker) Records() []ask.SamplingRecord {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]ask.SamplingRecord(nil), a.records...)
}

func (a *asker) Inputs() []ask.Input {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]ask.Input(nil), a.inputs...)
}

// request is a sampling request of text messages, alternately user and
// assistant, for up to maxTokens.
func request(maxTokens int, texts ...string) mcp.CreateMessageRequest {
	var req mcp.CreateMessageRequest
	req.MaxTokens = maxTokens
	for i, text := range texts {
		role := mcp.RoleUser
		if i%2 == 1 {
			role = mcp.RoleAssistant
		}
		req.Messages = append(req.Messages, mcp.SamplingMessage{Role: role, Content: mcp.NewTextContent(text)})
	}
	return req
}

var call = ask.Call{ID: "call_1", Tool: "summarize"}
