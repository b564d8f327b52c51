// Package llm talks to an OpenAI-compatible chat completions endpoint with
// go-openai. Rate-limit (429) and server (5xx) answers are retried with
// backoff, honouring Retry-After, for as long as the request's context
// allows. It knows nothing of connectors or MCP.
package llm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	openai "github.com/sashabaranov/go-openai"
	"go.opentelemetry.io/otel/metric"

	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/telemetry"
)

// ErrNoEmbeddings means no embeddings model is set.
var ErrNoEmbeddings = errors.New("no embeddings model is configured: set EMBEDDINGS_MODEL")

// ErrNotConfigured means no endpoint or model is set.
var ErrNotConfigured = errors.New("no LLM is configured: set LLM_BASE_URL and LLM_MODEL (and LLM_API_KEY if the endpoint needs one)")

// Error is an answer the endpoint gave up with, or a failure to reach it.
// Its message never contains the API key.
type Error struct {
	// Status is the HTTP status, 0 if the endpoint could not be reached.
	Status int
	Msg    string
}

func (e *Error) Error() string {
	if e.Status == 0 {
		return "LLM endpoint unreachable: " + e.Msg
	}
	return fmt.Sprintf("LLM endpoint answered %d: %s", e.Status, e.Msg)
}

// Temporary reports whether trying later may succeed: unreachable, 429, 5xx.
func (e *Error) Temporary() bool { return e.Status == 0 || e.Status == 429 || e.Status >= 500 }

// Config configures a Client.
type Config struct {
	BaseURL string // e.g. http://localhost:11434/v1
	APIKey  string // may be empty for local servers
	Model   string // default model
	// EmbeddingModel is the embeddings model on the same endpoint
	// (/v1/embeddings); empty: none, and Embed refuses.
	EmbeddingModel string
	// MaxRetries bounds retries of one request; default 4.
	MaxRetries int
	// BackoffBase is the first retry delay without Retry-After; default 500ms.
	BackoffBase time.Duration
	// HTTPClient sends the requests, each with the trace context of its
	// context (traceparent); default http.DefaultClient.
	HTTPClient *http.Client
	// MeterProvider records the client's metrics (see metrics.go); nil
	// records none.
	MeterProvider metric.MeterProvider
}

// Client is a chat model. Safe for concurrent use.
type Client struct {
	api            *openai.Client
	model          string
	embeddingModel string
	metrics        *metrics
}

// New returns a Client, or ErrNotConfigured if BaseURL or Model is empty.
func New(cfg Config) (*Client, error) {
	if cfg.BaseURL == "" || cfg.Model == "" {
		return nil, ErrNotConfigured
	}
	if cfg.MaxRetries <= 0 {
		cfg.MaxRetries = 4
	}
	if cfg.BackoffBase <= 0 {
		cfg.BackoffBase = 500 * time.Millisecond
	}
	hc := http.Client{Transport: pooledTransport()}
	if cfg.HTTPClient != nil {
		hc = *cfg.HTTPClient
	}
	hc.Transport = telemetry.Traceparent(hc.Transport)
	oc := openai.DefaultConfig(cfg.APIKey)
	oc.BaseURL = cfg.BaseURL
	m := newMetrics(cfg.MeterProvider, cfg.Model)
	oc.HTTPClient = &retrying{next: &hc, retries: cfg.MaxRetries, base: cfg.BackoffBase, retried: m.retried}
	return &Client{api: openai.NewClientWithConfig(oc), model: cfg.Model, embeddingModel: cfg.EmbeddingModel,
		metrics: m}, nil
}

// idleConnsPerHost is how many idle connections to the endpoint the client
// keeps. Go's default of 2 makes concurrent queries open a new connection
// (and, over TLS, a new handshake) for most model requests.
const idleConnsPerHost = 64

// pooledTransport is Go's default transport with room for concurrent
// queries' connections to the one endpoint.
func pooledTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = idleConnsPerHost
	t.MaxIdleConnsPerHost = idleConnsPerHost
	return t
}

// Model is the default model.
func (c *Client) Model() string { return c.model }

// Chat sends one chat completion request; an empty req.Model uses the
// default. Errors are *Error or the context's error.
func (c *Client) Chat(ctx context.Context, req openai.ChatCompletionRequest) (resp openai.ChatCompletionResponse, err error) {
	if req.Model == "" {
		req.Model = c.model
	}
	defer func(start time.Time) { c.metrics.record(ctx, req.Model, start, resp, err) }(time.Now())
	resp, err = c.api.CreateChatCompletion(withModel(ctx, req.Model), req)
	if err != nil {
		return resp, apiError(ctx, err)
	}
	if len(resp.Choices) == 0 {
		return resp, &Error{Status: http.StatusBadGateway, Msg: "the response has no choices"}
	}
	return resp, nil
}

// Embed returns the embeddings of texts, in order, from the embeddings
// model (Config.EmbeddingModel; ErrNoEmbeddings without one). Errors are
// *Error or the context's error.
func (c *Client) Embed(ctx context.Context, texts []string) ([][]float32, error) {
	if c.embeddingModel == "" {
		return nil, ErrNoEmbeddings
	}
	resp, err := c.api.CreateEmbeddings(withModel(ctx, c.embeddingModel), openai.EmbeddingRequest{Input: texts, Model: openai.EmbeddingModel(c.embeddingModel)})
	if err != nil {
		return nil, apiError(ctx, err)
	}
	out := make([][]float32, len(texts))
	for _, e := range resp.Data {
		if e.Index < 0 || e.Index >= len(out) {
			return nil, &Error{Status: http.StatusBadGateway, Msg: fmt.Sprintf("an embedding for input %d of %d", e.Index, len(texts))}
		}
		out[e.Index] = e.Embedding
	}
	for i, v := range out {
		if len(v) == 0 {
			return nil, &Error{Status: http.StatusBadGateway, Msg: fmt.Sprintf("no embedding for input %d of %d", i, len(texts))}
		}
	}
	return out, nil
}

// apiError is err, from go-openai, as an *Error (or the context's error).
func apiError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var apiErr *openai.APIError
	var reqErr *openai.RequestError
	switch {
	case errors.As(err, &apiErr):
		return &Error{Status: apiErr.HTTPStatusCode, Msg: apiErr.Message}
	case errors.As(err, &reqErr):
		return &Error{Status: reqErr.HTTPStatusCode, Msg: http.StatusText(reqErr.HTTPStatusCode)}
	default:
		// The HTTP client's errors name the URL: its query values stay
		// out of logs and spans.
		return &Error{Msg: secret.RedactText(err.Error())}
	}
}

// retrying is go-openai's HTTP client: it retries 429 and 5xx answers and
// connection failures with backoff, honouring Retry-After, while the
// request's context allows. It calls retried before each retry, with the
// status retried (0: unreachable).
type retrying struct {
	next    *http.Client
	retries int
	base    time.Duration
	retried func(ctx context.Context, status int)
}

func (r *retrying) Do(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		var err error
		if body, err = io.ReadAll(req.Body); err != nil {
			return nil, err
		}
		req.Body.Close()
	}
	for attempt := 0; ; attempt++ {
		if body != nil {
			req.Body = io.NopCloser(bytes.NewReader(body))
		}
		resp, err := r.next.Do(req)
		retryable := err != nil || resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500
		if !retryable || attempt >= r.retries || req.Context().Err() != nil {
			return resp, err
		}
		wait := r.delay(attempt, resp)
		if deadline, ok := req.Context().Deadline(); ok && time.Until(deadline) < wait {
			return resp, err // no time left to wait: give the caller this answer
		}
		status := 0
		if resp != nil {
			status = resp.StatusCode
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
		}
		select {
		case <-time.After(wait):
		case <-req.Context().Done():
			return nil, req.Context().Err()
		}
		r.retried(req.Context(), status)
	}
}

// delay is Retry-After when the answer has one (seconds or an HTTP date),
// else exponential backoff with full jitter.
func (r *retrying) delay(attempt int, resp *http.Response) time.Duration {
	if resp != nil {
		if v := resp.Header.Get("Retry-After"); v != "" {
			if secs, err := strconv.Atoi(v); err == nil && secs >= 0 {
				return time.Duration(secs) * time.Second
			}
			if t, err := http.ParseTime(v); err == nil {
				return max(time.Until(t), 0)
			}
		}
	}
	ceil := r.base << attempt
	return time.Duration(rand.Int64N(int64(ceil) + 1))
}
