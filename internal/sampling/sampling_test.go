package sampling_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	openai "github.com/sashabaranov/go-openai"

	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/sampling"
	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/telemetry/telemetrytest"
)

// TestApprove: with policy approve the request is put to the user first,
// as a sampling input that shows what would go to the model; only an
// accept lets it through. A decline, a cancel, or nobody to ask refuses
// it (MCP's -1) without asking the model, and gives the budgets back.
func TestApprove(t *testing.T) {
	srv := llmtest.New(t, llmtest.Answer("approved answer"))
	s := newSampler(t, srv, on(store.SamplingConfig{Policy: store.SamplingApprove, MaxTokensPerRequest: 64}), nil)
	req := request(100, "Summarize the report.")
	req.SystemPrompt = "You summarize."
	req.Tools = []mcp.Tool{mcp.NewTool("lookup")}

	yes := &asker{action: ask.Accept, budget: ask.NewBudget(5, 1000)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := s.Sample(ctx, 1, yes, call, req)
	if err != nil {
		t.Fatal(err)
	}
	if tc, ok := res.Content.(mcp.TextContent); !ok || tc.Text != "approved answer" {
		t.Errorf("content %#v", res.Content)
	}
	in := yes.Inputs()
	if len(in) != 1 || in[0].Mode != ask.ModeSampling || in[0].Sampling == nil || !strings.Contains(in[0].Message, `"shop"`) {
		t.Fatalf("inputs %+v, want one sampling input naming the connector", in)
	}
	if d, _ := ctx.Deadline(); !in[0].Deadline.Equal(d) || !strings.HasPrefix(in[0].ID, "sampling_") {
		t.Errorf("input id %q deadline %v, want an id and the call's deadline %v", in[0].ID, in[0].Deadline, d)
	}
	sum := in[0].Sampling
	if sum.SystemPrompt != "You summarize." || sum.MaxTokens != 64 || len(sum.Messages) != 1 ||
		sum.Messages[0] != "user: Summarize the report." || len(sum.Tools) != 1 || sum.Tools[0] != "lookup" {
		t.Errorf("summary %+v", sum)
	}

	for _, a := range []*asker{
		{action: ask.Decline, budget: ask.NewBudget(5, 1000)},
		{action: ask.Cancel, budget: ask.NewBudget(5, 1000)},
	} {
		_, err := s.Sample(context.Background(), 1, a, call, req)
		var e *sampling.Error
		if !errors.As(err, &e) || e.Code != sampling.CodeUserRejected || e.Outcome != sampling.OutcomeDeclined ||
			err.Error() != "the user "+map[string]string{ask.Decline: "declined", ask.Cancel: "cancelled"}[a.action]+" the sampling request" {
			t.Errorf("%s: error %v", a.action, err)
		}
		if _, tok := a.budget.Used(); tok != 0 {
			t.Errorf("%s: the run budget kept %d tokens of a request not sent", a.action, tok)
		}
	}
	for name, a := range map[string]ask.Asker{"nil asker": nil, "nobody": &asker{err: ask.ErrNobodyToAsk}} {
		_, err := s.Sample(context.Background(), 1, a, call, req)
		if err == nil || !strings.Contains(err.Error(), "nobody can approve it") {
			t.Errorf("%s: error %v, want a refusal", name, err)
		}
	}
	if n := len(srv.Requests()); n != 1 {
		t.Errorf("the model was asked %d times, want once", n)
	}
}

// TestRecordsAndMetrics: every request, served or refused, is recorded to
// the caller and the connector's counters, and counted by outcome; the
// tokens used are counted by kind.
func TestRecordsAndMetrics(t *testing.T) {
	srv := llmtest.New(t, llmtest.Answer("A short answer."))
	m := telemetrytest.New(t)
	var usage []ask.SamplingRecord
	s := newSampler(t, srv, on(store.SamplingConfig{MaxRequestsPerRun: 1}), func(c *sampling.Config) {
		c.MeterProvider = m.Provider
		c.OnUsage = func(id int64, rec ask.SamplingRecord) {
			if id != 1 {
				t.Errorf("usage of connector %d", id)
			}
			usage = append(usage, rec)
		}
	})
	a := &asker{budget: s.Budget(on(store.SamplingConfig{MaxRequestsPerRun: 1}))}
	if _, err := s.Sample(context.Background(), 1, a, call, request(50, "one", "two", "three")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sample(context.Background(), 1, a, call, request(50, "again")); err == nil {
		t.Fatal("the second request of a budget of one was served")
	}
	recs := a.Records()
	if len(recs) != 2 || len(usage) != 2 {
		t.Fatalf("%d records to the caller, %d to the counters; want 2 and 2", len(recs), len(usage))
	}
	r := recs[0]
	if r.Model != "fake" || r.Messages != 3 || r.PromptTokens != 100 || r.CompletionTokens != 20 || r.StopReason != "endTurn" ||
		r.Err != "" || r.ResultExcerpt != "A short answer." || r.Duration <= 0 {
		t.Errorf("served record %+v", r)
	}
	if r := recs[1]; !strings.Contains(r.Err, "1 sampling requests per run") || r.PromptTokens != 0 {
		t.Errorf("refused record %+v", r)
	}
	if a.calls[0] != call {
		t.Errorf("recorded for call %+v, want %+v", a.calls[0], call)
	}
	for outcome, want := range map[string]float64{"served": 1, "budget": 1} {
		if got := m.Value(t, "connector.sampling.requests", telemetrytest.Attrs("workspace", "acme", "connector", "shop", "outcome", outcome)...); got != want {
			t.Errorf("requests %s = %v, want %v", outcome, got, want)
		}
	}
	for kind, want := range map[string]float64{"prompt": 100, "completion": 20} {
		if got := m.Value(t, "connector.sampling.tokens", telemetrytest.Attrs("workspace", "acme", "connector", "shop", "kind", kind)...); got != want {
			t.Errorf("tokens %s = %v, want %v", kind, got, want)
		}
	}
}

// TestModelErrors: the model's failure reaches the server as a clear
// error that names the endpoint's answer and never the API key; the
// request's tokens go back to the run's budget; a cancelled call is the
// context's error.
func TestModelErrors(t *testing.T) {
	srv := llmtest.New(t, llmtest.Fail(http.StatusUnauthorized, "Incorrect API key provided", nil))
	s := newSampler(t, srv, on(store.SamplingConfig{}), nil)
	a := &asker{budget: ask.NewBudget(5, 1000)}
	_, err := s.Sample(context.Background(), 1, a, call, request(50, "hi"))
	var e *sampling.Error
	if !errors.As(err, &e) || e.Outcome != sampling.OutcomeFailed || !strings.Contains(err.Error(), "401") ||
		!strings.Contains(err.Error(), "Incorrect API key provided") {
		t.Errorf("error %v, want the model's 401", err)
	}
	if strings.Contains(fmt.Sprint(err), testKey) || strings.Contains(a.Records()[0].Err, testKey) {
		t.Error("the API key is in the error")
	}
	if got := srv.Authorizations(); len(got) != 1 || got[0] != "Bearer "+testKey {
		t.Errorf("the fake saw %v", got)
	}
	if req, tok := a.budget.Used(); req != 1 || tok != 0 {
		t.Errorf("budget used %d requests, %d tokens after a failure; want 1, 0", req, tok)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Sample(ctx, 1, a, call, request(50, "hi")); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}

	// A model that does not answer in time.
	srv.Then(func(req openai.ChatCompletionRequest) llmtest.Reply {
		time.Sleep(300 * time.Millisecond)
		return llmtest.Answer("late")(req)
	})
	slow := newSampler(t, srv, on(store.SamplingConfig{}), func(c *sampling.Config) { c.Timeout = 30 * time.Millisecond })
	if _, err := slow.Sample(context.Background(), 1, nil, call, request(50, "hi")); err == nil ||
		err.Error() != "sampling failed: the connector's model did not answer within 30ms" {
		t.Errorf("slow model: %v", err)
	}

	none := newSampler(t, srv, on(store.SamplingConfig{}), func(c *sampling.Config) { c.Chat = nil })
	if _, err := none.Sample(context.Background(), 1, nil, call, request(50, "hi")); err == nil || !strings.Contains(err.Error(), "no model is configured") {
		t.Errorf("no model: %v", err)
	}
}
