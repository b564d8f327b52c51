package llm_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/connector-svc/connector-svc/internal/llm"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
)

const apiKey = "sk-LLM-LEAKCHECK-93ab"

func newClient(t *testing.T, url string) *llm.Client {
	t.Helper()
	c, err := llm.New(llm.Config{BaseURL: url, APIKey: apiKey, Model: "test-model", BackoffBase: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func chat(t *testing.T, c *llm.Client) (openai.ChatCompletionResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return c.Chat(ctx, openai.ChatCompletionRequest{Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "hi"}}})
}

func TestNotConfigured(t *testing.T) {
	for _, cfg := range []llm.Config{{}, {BaseURL: "http://127.0.0.1:9/v1"}, {Model: "m"}} {
		if _, err := llm.New(cfg); !errors.Is(err, llm.ErrNotConfigured) {
			t.Errorf("New(%+v) = %v, want ErrNotConfigured", cfg, err)
		}
	}
	if !strings.Contains(llm.ErrNotConfigured.Error(), "LLM_BASE_URL") {
		t.Error("ErrNotConfigured does not name the settings")
	}
}

func TestRetriesHonourRetryAfter(t *testing.T) {
	srv := llmtest.New(t,
		llmtest.Fail(http.StatusTooManyRequests, "slow down", http.Header{"Retry-After": {"1"}}),
		llmtest.Fail(http.StatusBadGateway, "upstream", nil),
		llmtest.Answer("done"))
	c := newClient(t, srv.URL())
	start := time.Now()
	resp, err := chat(t, c)
	if err != nil || resp.Choices[0].Message.Content != "done" {
		t.Fatalf("Chat = %v, %v", resp, err)
	}
	if n := len(srv.Requests()); n != 3 {
		t.Errorf("requests = %d, want 3 (429, 502, then success)", n)
	}
	if time.Since(start) < time.Second {
		t.Error("the retry after 429 did not wait for Retry-After: 1")
	}
	if got := srv.Requests()[0].Model; got != "test-model" {
		t.Errorf("model = %q, want the default", got)
	}
	if auth := srv.Authorizations()[0]; auth != "Bearer "+apiKey {
		t.Errorf("Authorization = %q", auth)
	}
}

func TestClientErrorsAreNotRetried(t *testing.T) {
	srv := llmtest.New(t, llmtest.Fail(http.StatusUnauthorized, "invalid api key", nil))
	_, err := chat(t, newClient(t, srv.URL()))
	var lerr *llm.Error
	if !errors.As(err, &lerr) || lerr.Status != http.StatusUnauthorized || lerr.Temporary() {
		t.Fatalf("err = %v, want a non-temporary 401", err)
	}
	if len(srv.Requests()) != 1 {
		t.Errorf("a 401 was retried: %d requests", len(srv.Requests()))
	}
	if strings.Contains(err.Error(), apiKey) {
		t.Error("the error contains the API key")
	}
}

func TestRetriesStopAtTheDeadline(t *testing.T) {
	srv := llmtest.New(t, llmtest.Fail(http.StatusTooManyRequests, "slow down", http.Header{"Retry-After": {"30"}}))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := newClient(t, srv.URL()).Chat(ctx, openai.ChatCompletionRequest{Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "hi"}}})
	var lerr *llm.Error
	if !errors.As(err, &lerr) || lerr.Status != http.StatusTooManyRequests || !lerr.Temporary() {
		t.Fatalf("err = %v, want the 429 back at once: Retry-After is past the deadline", err)
	}
}

func TestUnreachable(t *testing.T) {
	_, err := chat(t, newClient(t, "http://127.0.0.1:9/v1?key=q-LLM-LEAKCHECK-5d20"))
	var lerr *llm.Error
	if !errors.As(err, &lerr) || lerr.Status != 0 || !lerr.Temporary() {
		t.Fatalf("err = %v, want an unreachable *llm.Error", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "127.0.0.1:9") || strings.Contains(msg, "q-LLM-LEAKCHECK-5d20") {
		t.Errorf("err = %v; want the address, without the URL's query values", err)
	}
}
