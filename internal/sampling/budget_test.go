package sampling_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/sampling"
	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

// answers is n scripted answers of 100 prompt and 20 completion tokens.
func answers(n int) []llmtest.Step {
	steps := make([]llmtest.Step, n)
	for i := range steps {
		steps[i] = llmtest.Answer("ok")
	}
	return steps
}

func isBudget(err error, want string) bool {
	var e *sampling.Error
	return errors.As(err, &e) && e.Outcome == sampling.OutcomeBudget && errors.Is(err, ask.ErrBudget) &&
		strings.Contains(err.Error(), want)
}

// race runs n requests at once and counts those served and those refused
// by the budget named want; any other error fails the test.
func race(t *testing.T, n int, want string, sample func(i int) error) (served, refused int) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := sample(i)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				served++
			case isBudget(err, want):
				refused++
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	return served, refused
}

// TestDefaults: a connector that sets no limits gets the documented
// defaults; one that sets some keeps the rest.
func TestDefaults(t *testing.T) {
	s := sampling.New(sampling.Config{Connector: connectors(nil)})
	if got := s.Limits(nil); got != sampling.DefaultLimits || got != (sampling.Limits{1024, 10, 16384, 60, 100000}) {
		t.Errorf("defaults %+v", got)
	}
	got := s.Limits(&store.SamplingConfig{MaxRequestsPerRun: 3, MaxTokensPerMinute: 500})
	if want := (sampling.Limits{1024, 3, 16384, 60, 500}); got != want {
		t.Errorf("limits %+v, want %+v", got, want)
	}
	s = sampling.New(sampling.Config{Connector: connectors(nil), Defaults: sampling.Limits{MaxRequestsPerRun: 4}})
	if req, tok := s.Budget(nil).Used(); req != 0 || tok != 0 {
		t.Errorf("a fresh budget has used %d, %d", req, tok)
	}
	b := s.Budget(&store.SamplingConfig{})
	for range 4 {
		if _, err := b.Reserve(1); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.Reserve(1); err == nil || !strings.Contains(err.Error(), "4 sampling requests per run") {
		t.Errorf("the fifth request of a budget of 4: %v", err)
	}
}

// TestRunBudget: maxTokens is capped per request and at what the run has
// left; past the run's requests or tokens the server gets an error naming
// the budget and the model is not asked; a run budget counts the tokens
// used, prompt and completion.
func TestRunBudget(t *testing.T) {
	srv := llmtest.New(t, answers(3)...)
	s := newSampler(t, srv, on(store.SamplingConfig{MaxTokensPerRequest: 200, MaxRequestsPerRun: 2}), nil)
	a := &asker{budget: ask.NewBudget(2, 1000)}
	for range 2 {
		if _, err := s.Sample(context.Background(), 1, a, call, request(500, "hi")); err != nil {
			t.Fatal(err)
		}
	}
	_, err := s.Sample(context.Background(), 1, a, call, request(500, "hi"))
	if !isBudget(err, "sampling budget exhausted: 2 sampling requests per run") {
		t.Errorf("third request: %v, want the per-run request budget", err)
	}
	if req, tok := a.budget.Used(); req != 2 || tok != 240 {
		t.Errorf("budget used %d requests, %d tokens; want 2, 240", req, tok)
	}
	for i, r := range srv.Requests() {
		if r.MaxTokens != 200 {
			t.Errorf("request %d: max_tokens %d, want the per-request cap 200", i, r.MaxTokens)
		}
	}

	// Tokens: 150 per run; the first takes 150 and uses 120, the second
	// gets the 30 left and uses 120, the third finds none.
	srv = llmtest.New(t, answers(2)...)
	s = newSampler(t, srv, on(store.SamplingConfig{}), nil)
	a = &asker{budget: ask.NewBudget(10, 150)}
	for range 2 {
		if _, err := s.Sample(context.Background(), 1, a, call, request(500, "hi")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Sample(context.Background(), 1, a, call, request(500, "hi")); !isBudget(err, "150 sampling tokens per run") {
		t.Errorf("third request: %v, want the per-run token budget", err)
	}
	reqs := srv.Requests()
	if len(reqs) != 2 || reqs[0].MaxTokens != 150 || reqs[1].MaxTokens != 30 {
		t.Errorf("max_tokens of the requests: %v", maxTokens(reqs))
	}
	recs := a.Records()
	if len(recs) != 3 || recs[2].Err == "" || recs[0].PromptTokens != 100 || recs[0].CompletionTokens != 20 {
		t.Errorf("records %+v, want two served and one refused", recs)
	}
}

func maxTokens(reqs []openai.ChatCompletionRequest) []int {
	var out []int
	for _, r := range reqs {
		out = append(out, r.MaxTokens)
	}
	return out
}

// TestRunBudgetConcurrent: concurrent requests of one run never take more
// than its budget.
func TestRunBudgetConcurrent(t *testing.T) {
	srv := llmtest.New(t, answers(5)...)
	s := newSampler(t, srv, on(store.SamplingConfig{}), nil)
	a := &asker{budget: ask.NewBudget(5, 100000)}
	served, refused := race(t, 16, "5 sampling requests per run", func(int) error {
		_, err := s.Sample(context.Background(), 1, a, call, request(100, "hi"))
		return err
	})
	if served != 5 || refused != 11 || len(srv.Requests()) != 5 {
		t.Errorf("served %d, refused %d, model asked %d times; want 5, 11, 5", served, refused, len(srv.Requests()))
	}
	if n := len(a.Records()); n != 16 {
		t.Errorf("%d records, want 16", n)
	}
}

// TestMinuteBudgetAcrossSamplers: two samplers (two replicas) on one
// database share a connector's per-minute budget: concurrent requests
// through both are served up to the limit, the rest refused naming it,
// and the model is asked only for those served.
func TestMinuteBudgetAcrossSamplers(t *testing.T) {
	db := storetest.NewDB(t)
	c, err := db.CreateConnector(context.Background(), &store.Connector{WorkspaceID: "acme", ExternalID: "shop", Name: "Shop",
		Transport: store.TransportStreamableHTTP, Config: store.Config{URL: "http://127.0.0.1:9/mcp"}, Active: true})
	if err != nil {
		t.Fatal(err)
	}
	sc := on(store.SamplingConfig{MaxRequestsPerMinute: 5})
	now := time.Now()
	clock := func() time.Time { return now }
	steps := make([]llmtest.Step, 5)
	for i := range steps {
		steps[i] = llmtest.Answer("ok")
	}
	srv := llmtest.New(t, steps...)
	var replicas [2]*sampling.Sampler
	for i := range replicas {
		replicas[i] = sampling.New(sampling.Config{Chat: model(t, srv).Chat, Minutes: db, Now: clock,
			Connector: connectors(map[int64]sampling.Target{c.ID: {Workspace: "acme", Name: "shop", Sampling: sc}})})
	}
	served, refused := race(t, 14, `5 sampling requests per minute for connector "shop"`, func(i int) error {
		_, err := replicas[i%2].Sample(context.Background(), c.ID, nil, call, request(100, "hi"))
		return err
	})
	if served != 5 || refused != 9 || len(srv.Requests()) != 5 {
		t.Errorf("served %d, refused %d, model asked %d times; want 5, 9, 5", served, refused, len(srv.Requests()))
	}
	m, err := db.SamplingUse(context.Background(), c.ID, now)
	if err != nil || m.Requests != 5 || m.Tokens != 5*120 {
		t.Errorf("the minute's count %+v, %v; want 5 requests and the 600 tokens used", m, err)
	}
	// The next minute starts afresh.
	srv.Then(llmtest.Answer("ok"))
	now = now.Add(time.Minute)
	if _, err := replicas[0].Sample(context.Background(), c.ID, nil, call, request(100, "hi")); err != nil {
		t.Errorf("next minute: %v", err)
	}

	// Tokens per minute: 300; each request reserves its 100 and uses 120.
	srv2 := llmtest.New(t, answers(2)...)
	tok := sampling.New(sampling.Config{Chat: model(t, srv2).Chat, Minutes: db, Now: clock,
		Connector: connectors(map[int64]sampling.Target{c.ID: {Name: "shop", Sampling: on(store.SamplingConfig{MaxTokensPerMinute: 300})}})})
	now = now.Add(time.Minute)
	for range 2 {
		if _, err := tok.Sample(context.Background(), c.ID, nil, call, request(100, "hi")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tok.Sample(context.Background(), c.ID, nil, call, request(100, "hi")); !isBudget(err, "300 sampling tokens per minute") {
		t.Errorf("third request: %v, want the per-minute token budget", err)
	}
	if n := len(srv2.Requests()); n != 2 {
		t.Errorf("the model was asked %d times, want 2", n)
	}
}
