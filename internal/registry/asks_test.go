package registry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/registry/testdata/asktools"
	"github.com/connector-svc/connector-svc/internal/telemetry/telemetrytest"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

// fakeAsker answers elicitations with answer (accept {"name":"Ada"} when
// nil) and records what it was asked.
type fakeAsker struct {
	answer func(ctx context.Context, in ask.Input) (ask.Answer, error)

	mu     sync.Mutex
	inputs []ask.Input
	calls  []ask.Call
}

func (f *fakeAsker) Elicit(ctx context.Context, call ask.Call, in ask.Input) (ask.Answer, error) {
	f.mu.Lock()
	f.inputs = append(f.inputs, in)
	f.calls = append(f.calls, call)
	f.mu.Unlock()
	if f.answer != nil {
		return f.answer(ctx, in)
	}
	return ask.Answer{Action: ask.Accept, Content: map[string]any{"name": "Ada"}}, nil
}

func (f *fakeAsker) Sampling() *ask.Budget                { return nil }
func (f *fakeAsker) Sampled(ask.Call, ask.SamplingRecord) {}
func (f *fakeAsker) asked() ([]ask.Input, []ask.Call) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]ask.Input(nil), f.inputs...), append([]ask.Call(nil), f.calls...)
}

// waitCancel answers "cancel" once ctx ends, as an Asker does when its
// input's deadline passes unanswered.
func waitCancel(ctx context.Context, _ ask.Input) (ask.Answer, error) {
	<-ctx.Done()
	return ask.Answer{Action: ask.Cancel}, nil
}

// fakeSampler is a Config.Sample that answers "hi there" and records who
// it served.
type fakeSampler struct {
	mu     sync.Mutex
	askers []ask.Asker
	calls  []ask.Call
	reqs   []mcp.CreateMessageRequest
	ids    []int64
	// deadlines are the requests' contexts' deadlines (zero: none).
	deadlines []time.Time
}

func (f *fakeSampler) sample(ctx context.Context, id int64, a ask.Asker, call ask.Call, req mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
	f.mu.Lock()
	f.askers, f.calls, f.reqs, f.ids = append(f.askers, a), append(f.calls, call), append(f.reqs, req), append(f.ids, id)
	d, _ := ctx.Deadline()
	f.deadlines = append(f.deadlines, d)
	f.mu.Unlock()
	return &mcp.CreateMessageResult{
		SamplingMessage: mcp.SamplingMessage{Role: mcp.RoleAssistant, Content: mcp.NewTextContent("hi there")},
		Model:           "fake-model", StopReason: "endTurn",
	}, nil
}

func (f *fakeSampler) served() ([]ask.Asker, []ask.Call, []mcp.CreateMessageRequest) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]ask.Asker(nil), f.askers...), append([]ask.Call(nil), f.calls...), append([]mcp.CreateMessageRequest(nil), f.reqs...)
}

// askServer is a real mcp-go server with asktools over streamable HTTP,
// speaking both protocol generations.
func askServer(t testing.TB) string {
	t.Helper()
	m := server.NewMCPServer("asks", "1.0", server.WithToolCapabilities(true), server.WithElicitation())
	asktools.Add(m)
	hs := httptest.NewServer(server.NewStreamableHTTPServer(m))
	t.Cleanup(hs.Close)
	return hs.URL + "/mcp"
}

func askSpec(id int64, url string, mode string, elicit, sample bool) registry.Spec {
	spec := httpSpec(id, url)
	spec.SessionMode, spec.Elicitation, spec.Sampling = mode, elicit, sample
	return spec
}

func askStdioSpec(id int64, mode string, elicit, sample bool) registry.Spec {
	spec := stdioSpec(id, "-asks")
	spec.SessionMode, spec.Elicitation, spec.Sampling = mode, elicit, sample
	return spec
}

// caps calls the caps tool and returns the capabilities the server saw.
func caps(t *testing.T, reg *registry.Registry, id int64, opts registry.CallOptions) mcp.ClientCapabilities {
	t.Helper()
	res, err := reg.CallTool(ctxT(t), id, "caps", nil, opts)
	if err != nil {
		t.Fatalf("caps of %d: %v", id, err)
	}
	var c mcp.ClientCapabilities
	if err := json.Unmarshal([]byte(text(t, res)), &c); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestAsksCapabilitiesByConnection(t *testing.T) {
	url := askServer(t)
	userSpec := askSpec(4, url, "", true, false)
	userSpec.Auth = registry.AuthUser
	modern := askSpec(5, url, "", true, true)
	modern.Protocol = registry.ProtocolSessionless
	cfg := testConfig()
	cfg.Authorize = func(base http.RoundTripper, _ registry.Spec, _ string) http.RoundTripper { return base }
	reg := run(t, newSource(
		askSpec(1, url, registry.SessionShared, true, true),
		askSpec(2, url, registry.SessionPerSession, true, true),
		askSpec(3, url, "", false, false),
		userSpec, modern,
	), cfg)

	shared := caps(t, reg, 1, registry.CallOptions{})
	if shared.Elicitation != nil {
		t.Errorf("a shared connection declared elicitation: %+v", shared.Elicitation)
	}
	if shared.Sampling == nil || shared.Sampling.Tools == nil {
		t.Errorf("shared connection with sampling declared %+v, want sampling with tools", shared.Sampling)
	}
	for _, tc := range []struct {
		name string
		id   int64
		opts registry.CallOptions
	}{
		{"per_session", 2, registry.CallOptions{Session: "s1"}},
		{"per_user", 4, registry.CallOptions{UserID: "u1"}},
	} {
		c := caps(t, reg, tc.id, tc.opts)
		if c.Elicitation == nil || c.Elicitation.Form == nil || c.Elicitation.URL == nil {
			t.Errorf("%s connection declared elicitation %+v, want form and url", tc.name, c.Elicitation)
		}
	}
	if c := caps(t, reg, 2, registry.CallOptions{Session: "s1"}); c.Sampling == nil || c.Sampling.Tools == nil {
		t.Errorf("per_session connection declared sampling %+v, want it with tools", c.Sampling)
	}
	if c := caps(t, reg, 4, registry.CallOptions{UserID: "u1"}); c.Sampling != nil {
		t.Errorf("sampling is off, yet declared: %+v", c.Sampling)
	}
	if c := caps(t, reg, 3, registry.CallOptions{}); c.Elicitation != nil || c.Sampling != nil {
		t.Errorf("a connector with neither declared %+v", c)
	}
	// Sessionless: the capabilities travel in each request's _meta; a
	// shared connection still declares no elicitation.
	if h, _ := reg.Health(5); !strings.HasPrefix(h.ProtocolVersion, "2026") {
		t.Fatalf("connector 5 speaks %q, want the sessionless protocol", h.ProtocolVersion)
	}
	if c := caps(t, reg, 5, registry.CallOptions{}); c.Elicitation != nil || c.Sampling == nil || c.Sampling.Tools == nil {
		t.Errorf("sessionless shared connection declared elicitation %+v, sampling %+v", c.Elicitation, c.Sampling)
	}
}

// elicitCases runs the classic elicitation cases on connector 1 of reg.
func elicitCases(t *testing.T, reg *registry.Registry, opts registry.CallOptions, maxWait time.Duration) {
	call := func(t *testing.T, a ask.Asker, tool string) string {
		t.Helper()
		ctx := ctxT(t)
		if a != nil {
			ctx = ask.With(ctx, a, ask.Call{ID: "call-1", Tool: tool})
		}
		res, err := reg.CallTool(ctx, 1, tool, nil, opts)
		if err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
		return text(t, res)
	}
	t.Run("form", func(t *testing.T) {
		a := &fakeAsker{answer: func(context.Context, ask.Input) (ask.Answer, error) {
			return ask.Answer{Action: ask.Accept, Content: map[string]any{"name": "Ada", "age": 36, "ok": true, "color": "red"}}, nil
		}}
		start := time.Now()
		if got, want := call(t, a, "ask"), `action=accept content={"age":36,"color":"red","name":"Ada","ok":true}`; got != want {
			t.Errorf("ask = %s, want %s", got, want)
		}
		ins, calls := a.asked()
		if len(ins) != 1 || calls[0].ID != "call-1" {
			t.Fatalf("asker saw %+v for %+v, want one input for call-1", ins, calls)
		}
		in := ins[0]
		props, _ := in.Schema["properties"].(map[string]any)
		if in.Mode != ask.ModeForm || in.Message != "Who are you?" || len(props) != 4 || in.ID == "" || in.Durable {
			t.Errorf("input = %+v, want the form with its 4-property schema", in)
		}
		if in.Deadline.Before(start) || in.Deadline.After(time.Now().Add(maxWait)) {
			t.Errorf("deadline %s is not within %s of the request", in.Deadline.Sub(start), maxWait)
		}
	})
	t.Run("url", func(t *testing.T) {
		a := &fakeAsker{answer: func(context.Context, ask.Input) (ask.Answer, error) { return ask.Answer{Action: ask.Accept}, nil }}
		if got, want := call(t, a, "askurl"), "action=accept content=null"; got != want {
			t.Errorf("askurl = %s, want %s", got, want)
		}
		ins, _ := a.asked()
		if len(ins) != 1 || ins[0].Mode != ask.ModeURL || ins[0].URL != asktools.URL || ins[0].ElicitationID != "el-1" || ins[0].Schema != nil {
			t.Errorf("inputs = %+v, want one URL input", ins)
		}
	})
	t.Run("decline", func(t *testing.T) {
		a := &fakeAsker{answer: func(context.Context, ask.Input) (ask.Answer, error) { return ask.Answer{Action: ask.Decline}, nil }}
		if got, want := call(t, a, "ask"), "action=decline content=null"; got != want {
			t.Errorf("ask = %s, want %s", got, want)
		}
	})
	t.Run("nobody to ask", func(t *testing.T) {
		if got, want := call(t, nil, "ask"), "action=cancel content=null"; got != want {
			t.Errorf("ask without an asker = %s, want %s", got, want)
		}
	})
}

func TestAsksElicitStreamableHTTP(t *testing.T) {
	reg := run(t, newSource(askSpec(1, askServer(t), registry.SessionPerSession, true, false)), testConfig())
	// mcp-go gives a server request's handler 30s over streamable HTTP.
	elicitCases(t, reg, registry.CallOptions{Session: "s1"}, 30*time.Second)
}

func TestAsksElicitStdio(t *testing.T) {
	reg := run(t, newSource(askStdioSpec(1, registry.SessionPerSession, true, false)), testConfig())
	// No transport limit on stdio: the caller's deadline (ctxT's 20s)
	// bounds it.
	elicitCases(t, reg, registry.CallOptions{Session: "s1"}, 20*time.Second)
}

// eliciting are per-session connectors that elicit, over stdio and
// streamable HTTP.
func eliciting(t *testing.T) []struct {
	name string
	spec registry.Spec
} {
	return []struct {
		name string
		spec registry.Spec
	}{
		{"stdio", askStdioSpec(1, registry.SessionPerSession, true, false)},
		{"streamable_http", askSpec(1, askServer(t), registry.SessionPerSession, true, false)},
	}
}

// The user's wait does not count against the connector's call timeout:
// ElicitationTimeout (and the transport) bound it instead.
func TestAsksUserWaitStopsTheCallTimeout(t *testing.T) {
	for _, tc := range eliciting(t) {
		t.Run(tc.name, func(t *testing.T) {
			tc.spec.CallTimeout = time.Second
			reg := run(t, newSource(tc.spec), testConfig())
			a := &fakeAsker{answer: func(ctx context.Context, _ ask.Input) (ask.Answer, error) {
				select {
				case <-time.After(1500 * time.Millisecond): // longer than the call timeout
				case <-ctx.Done():
					return ask.Answer{Action: ask.Cancel}, nil
				}
				return ask.Answer{Action: ask.Accept, Content: map[string]any{"name": "Lin"}}, nil
			}}
			res, err := reg.CallTool(ask.With(ctxT(t), a, ask.Call{ID: "c"}), 1, "ask", nil, registry.CallOptions{Session: "s1"})
			if err != nil {
				t.Fatal(err)
			}
			if got, want := text(t, res), `action=accept content={"name":"Lin"}`; got != want {
				t.Errorf("ask = %s, want %s", got, want)
			}
		})
	}
}

func TestAsksElicitTimeoutAnswersCancel(t *testing.T) {
	for _, tc := range eliciting(t) {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.ElicitationTimeout = 300 * time.Millisecond
			reg := run(t, newSource(tc.spec), cfg)
			a := &fakeAsker{answer: waitCancel}
			ctx := ask.With(ctxT(t), a, ask.Call{ID: "c", Tool: "ask"})
			res, err := reg.CallTool(ctx, 1, "ask", nil, registry.CallOptions{Session: "s1"})
			if err != nil {
				t.Fatal(err)
			}
			if got, want := text(t, res), "action=cancel content=null"; got != want {
				t.Errorf("ask = %s, want the server to get %s", got, want)
			}
			if ins, _ := a.asked(); len(ins) != 1 || time.Until(ins[0].Deadline) > 0 {
				t.Errorf("inputs = %+v, want one whose deadline has passed", ins)
			}
		})
	}
}

func TestAsksSharedConnectionNeverElicits(t *testing.T) {
	reg := run(t, newSource(askSpec(1, askServer(t), registry.SessionShared, true, false)), testConfig())
	a := &fakeAsker{}
	// The server asks anyway; the client has no handler for it.
	_, _ = reg.CallTool(ask.With(ctxT(t), a, ask.Call{ID: "c"}), 1, "ask", nil, registry.CallOptions{})
	if ins, _ := a.asked(); len(ins) != 0 {
		t.Errorf("a shared connection put %+v to a user", ins)
	}
}

// Sampling over classic streamable HTTP is not here: mcp-go's server
// (v1.2.1) sends sampling/createMessage only on the standalone GET stream,
// which the service does not open (elicitation it sends on the call's own
// response stream, as the TypeScript SDK sends both). The sessionless
// test serves sampling over HTTP.
func TestAsksSamplingRoutesTheCallersAsker(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec registry.Spec
	}{
		{"stdio", askStdioSpec(1, registry.SessionShared, false, true)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s fakeSampler
			cfg := testConfig()
			cfg.Sample = s.sample
			cfg.ElicitationTimeout = 40 * time.Second
			reg := run(t, newSource(tc.spec), cfg)
			a := &fakeAsker{}
			start := time.Now()
			res, err := reg.CallTool(ask.With(ctxT(t), a, ask.Call{ID: "c7", Tool: "sample"}), 1, "sample", nil, registry.CallOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got, want := text(t, res), `sampled="hi there" model=fake-model`; got != want {
				t.Errorf("sample = %s, want %s", got, want)
			}
			// Without an Asker, sampling still runs, with none.
			if _, err := reg.CallTool(ctxT(t), 1, "sample", nil, registry.CallOptions{}); err != nil {
				t.Fatal(err)
			}
			askers, calls, reqs := s.served()
			if len(askers) != 2 || askers[0] != ask.Asker(a) || calls[0].ID != "c7" || askers[1] != nil {
				t.Fatalf("sampler served askers %v calls %+v, want the caller's, then none", askers, calls)
			}
			if reqs[0].SystemPrompt != "be brief" || reqs[0].MaxTokens != 50 || len(reqs[0].Messages) != 1 {
				t.Errorf("sampling request = %+v", reqs[0].CreateMessageParams)
			}
			// An approval, and the model, must answer while the server
			// waits: the request has the deadline an elicitation has.
			s.mu.Lock()
			d := s.deadlines[0]
			s.mu.Unlock()
			if d.IsZero() || d.After(start.Add(40*time.Second+time.Second)) {
				t.Errorf("sampling request's deadline = %v, want one within ELICITATION_TIMEOUT (40s) of %v", d, start)
			}
		})
	}
}

func TestAsksSamplingWithoutSampleFails(t *testing.T) {
	reg := run(t, newSource(askStdioSpec(1, registry.SessionShared, false, true)), testConfig())
	res, err := reg.CallTool(ctxT(t), 1, "sample", nil, registry.CallOptions{})
	if err == nil && !res.IsError {
		t.Fatalf("sample without Config.Sample = %s, want an error", text(t, res))
	}
}

func TestAsksURLRequired(t *testing.T) {
	m := telemetrytest.New(t)
	cfg := testConfig()
	cfg.MeterProvider = m.Provider
	src := newSource(askSpec(1, askServer(t), registry.SessionPerSession, true, false))
	reg := run(t, src, cfg)
	_, err := reg.CallTool(ctxT(t), 1, "needurl", nil, registry.CallOptions{Session: "s1"})
	var ue *ask.URLRequiredError
	if !errors.As(err, &ue) {
		t.Fatalf("needurl: %v, want an *ask.URLRequiredError", err)
	}
	if len(ue.Inputs) != 1 || ue.Inputs[0].Mode != ask.ModeURL || ue.Inputs[0].URL != asktools.URL ||
		ue.Inputs[0].ElicitationID != "el-9" || ue.Inputs[0].ID != "el-9" {
		t.Errorf("inputs = %+v", ue.Inputs)
	}
	// A call that awaits the user's input has not failed.
	if got := m.Value(t, "connector.tool.calls", with(conn("c1"), "tool", "needurl")...); got != 1 {
		t.Errorf("calls counted %v, want 1", got)
	}
	if _, ok := m.Point(t, "connector.tool.call.errors", with(conn("c1"), "tool", "needurl", "kind", "other")...); ok {
		t.Error("a call awaiting the user's input counted as failed")
	}
	testsupport.WaitFor(t, "usage reported", func() bool {
		src.mu.Lock()
		defer src.mu.Unlock()
		return src.usage[1].Calls == 1
	})
	src.mu.Lock()
	defer src.mu.Unlock()
	if u := src.usage[1]; u.Errors != 0 {
		t.Errorf("usage = %+v, want no error", u)
	}
}

func TestAsksSessionlessInputRequired(t *testing.T) {
	url := askServer(t)
	var s fakeSampler
	cfg := testConfig()
	cfg.Sample = s.sample
	spec := askSpec(1, url, registry.SessionPerSession, true, true)
	spec.Protocol = registry.ProtocolSessionless
	reg := run(t, newSource(spec), cfg)
	if h, _ := reg.Health(1); !strings.HasPrefix(h.ProtocolVersion, "2026") {
		testsupport.WaitFor(t, "the sessionless protocol", func() bool {
			h, _ := reg.Health(1)
			return strings.HasPrefix(h.ProtocolVersion, "2026")
		})
	}
	opts := registry.CallOptions{Session: "s1"}
	a := &fakeAsker{}
	ctx := ask.With(ctxT(t), a, ask.Call{ID: "c1", Tool: "ask"})

	t.Run("elicit then retry", func(t *testing.T) {
		_, err := reg.CallTool(ctx, 1, "ask", nil, opts)
		var ir *ask.InputRequiredError
		if !errors.As(err, &ir) {
			t.Fatalf("ask: %v, want an *ask.InputRequiredError", err)
		}
		if ir.RequestState != "state-ask" || len(ir.Inputs) != 1 || len(ir.Served) != 0 {
			t.Fatalf("input required = %+v", ir)
		}
		in := ir.Inputs[0]
		if in.ID != "who" || !in.Durable || in.Mode != ask.ModeForm || in.Schema == nil || !in.Deadline.IsZero() {
			t.Errorf("input = %+v, want the durable form \"who\"", in)
		}
		if ins, _ := a.asked(); len(ins) != 0 {
			t.Errorf("the asker was asked %+v on a durable pause", ins)
		}
		retry := opts
		retry.Retry = &ask.Retry{RequestState: ir.RequestState,
			Answers: map[string]ask.Answer{"who": {Action: ask.Accept, Content: map[string]any{"name": "Grace"}}}}
		res, err := reg.CallTool(ctx, 1, "ask", nil, retry)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := text(t, res), `action=accept content={"name":"Grace"}`; got != want {
			t.Errorf("retried ask = %s, want %s", got, want)
		}
	})
	t.Run("url", func(t *testing.T) {
		_, err := reg.CallTool(ctx, 1, "askurl", nil, opts)
		var ir *ask.InputRequiredError
		if !errors.As(err, &ir) || len(ir.Inputs) != 1 || ir.Inputs[0].Mode != ask.ModeURL || ir.Inputs[0].URL != asktools.URL {
			t.Fatalf("askurl: %v (%+v), want one URL input", err, ir)
		}
	})
	t.Run("sampling served, elicitation paused", func(t *testing.T) {
		_, err := reg.CallTool(ctx, 1, "both", nil, opts)
		var ir *ask.InputRequiredError
		if !errors.As(err, &ir) {
			t.Fatalf("both: %v, want an *ask.InputRequiredError", err)
		}
		if len(ir.Inputs) != 1 || ir.Inputs[0].ID != "who" || len(ir.Served) != 1 || ir.Served["s"] == nil {
			t.Fatalf("input required = %+v, want \"who\" asked and \"s\" served", ir)
		}
		retry := opts
		retry.Retry = &ask.Retry{RequestState: ir.RequestState, Served: ir.Served,
			Answers: map[string]ask.Answer{"who": {Action: ask.Decline}}}
		res, err := reg.CallTool(ctx, 1, "both", nil, retry)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := text(t, res), `sampled="hi there" model=fake-model action=decline content=null`; got != want {
			t.Errorf("retried both = %s, want %s", got, want)
		}
	})
	t.Run("sampling only", func(t *testing.T) {
		_, _, before := s.served()
		res, err := reg.CallTool(ctx, 1, "sample", nil, opts)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := text(t, res), `sampled="hi there" model=fake-model`; got != want {
			t.Errorf("sample = %s, want %s", got, want)
		}
		askers, calls, after := s.served()
		if len(after) != len(before)+1 || askers[len(askers)-1] != ask.Asker(a) || calls[len(calls)-1].ID != "c1" {
			t.Errorf("sampler served %d request(s), last for %+v; want one more, for the caller", len(after)-len(before), calls)
		}
	})
	t.Run("busy server", func(t *testing.T) {
		res, err := reg.CallTool(ctx, 1, "busy", nil, opts)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := text(t, res), "done after a busy round"; got != want {
			t.Errorf("busy = %s, want %s", got, want)
		}
	})
	t.Run("nobody to ask", func(t *testing.T) {
		res, err := reg.CallTool(ctxT(t), 1, "ask", nil, opts)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := text(t, res), "action=cancel content=null"; got != want {
			t.Errorf("ask without an asker = %s, want %s", got, want)
		}
	})
}

// fakeSSE is a legacy SSE MCP server (mcp-go's SSE server cannot send
// requests) whose one tool, "ask", sends the client a ping and an
// elicitation/create with the id of the tools/call itself (which mcp-go
// would take for the call's answer), waits up to 10s for the answers, and
// says what it got, as JSON by method.
type fakeSSE struct {
	t      *testing.T
	events chan string
	posts  chan map[string]json.RawMessage // what the client POSTs that is not a request
}

func newFakeSSE(t *testing.T) string {
	f := &fakeSSE{t: t, events: make(chan string, 16), posts: make(chan map[string]json.RawMessage, 16)}
	hs := httptest.NewServer(f)
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
	})
	return hs.URL + "/sse"
}

func (f *fakeSSE) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "event: endpoint\ndata: /message?sessionId=1\n\n")
		w.(http.Flusher).Flush()
		for {
			select {
			case ev := <-f.events:
				fmt.Fprintf(w, "event: message\ndata: %s\n\n", ev)
				w.(http.Flusher).Flush()
			case <-r.Context().Done():
				return
			}
		}
	}
	var msg map[string]json.RawMessage
	if err := json.NewDecoder(r.Body).Decode(&msg); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusAccepted)
	var method string
	_ = json.Unmarshal(msg["method"], &method)
	reply := func(result any) {
		b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": msg["id"], "result": result})
		f.events <- string(b)
	}
	switch method {
	case "":
		f.posts <- msg
	case "initialize":
		var p struct {
			ProtocolVersion string `json:"protocolVersion"`
		}
		_ = json.Unmarshal(msg["params"], &p)
		reply(map[string]any{"protocolVersion": p.ProtocolVersion, "capabilities": map[string]any{"tools": map[string]any{}},
			"serverInfo": map[string]any{"name": "fake-sse", "version": "1"}})
	case "tools/list":
		reply(map[string]any{"tools": []any{map[string]any{"name": "ask", "inputSchema": map[string]any{"type": "object"}}}})
	case "ping":
		reply(map[string]any{})
	case "tools/call":
		go func() {
			ping, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": "ping-1", "method": "ping"})
			f.events <- string(ping)
			req, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": msg["id"], "method": "elicitation/create",
				"params": map[string]any{"message": "Who are you?", "requestedSchema": map[string]any{"type": "object"}}})
			f.events <- string(req)
			got := map[string]map[string]json.RawMessage{}
			for len(got) < 2 {
				select {
				case ans := <-f.posts:
					if string(ans["id"]) == `"ping-1"` {
						got["ping"] = ans
					} else {
						got["elicitation"] = ans
					}
				case <-time.After(10 * time.Second):
					got["timeout"] = nil
				}
			}
			b, _ := json.Marshal(got)
			reply(map[string]any{"content": []any{map[string]any{"type": "text", "text": string(b)}}})
		}()
	}
}

func TestAsksSSEServerRequestAnsweredAtOnce(t *testing.T) {
	url := newFakeSSE(t)
	logs := &syncBuffer{}
	m := telemetrytest.New(t)
	cfg := testConfig()
	cfg.MeterProvider = m.Provider
	spec := registry.Spec{ID: 1, WorkspaceID: "ws", ConnectorID: "c1", Transport: registry.TransportSSE, URL: url,
		ConnectTimeout: 5 * time.Second, CallTimeout: 20 * time.Second, Elicitation: true, Sampling: true}
	reg := registry.New(newSource(spec), cfg, slog.New(slog.NewTextHandler(logs, nil)))
	start(t, reg)
	a := &fakeAsker{}
	res, err := reg.CallTool(ask.With(ctxT(t), a, ask.Call{ID: "c"}), 1, "ask", nil, registry.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]struct {
		Result map[string]any
		Error  *struct {
			Code    int
			Message string
		}
	}
	if err := json.Unmarshal([]byte(text(t, res)), &got); err != nil {
		t.Fatalf("the server got %q: %v", text(t, res), err)
	}
	if e := got["elicitation"].Error; e == nil || e.Code != mcp.METHOD_NOT_FOUND || !strings.Contains(e.Message, "legacy SSE") {
		t.Errorf("the server got %s, want -32601 saying SSE cannot carry the elicitation", text(t, res))
	}
	if p := got["ping"]; p.Error != nil || p.Result == nil {
		t.Errorf("the server's ping got %s, want an empty result", text(t, res))
	}
	if ins, _ := a.asked(); len(ins) != 0 {
		t.Errorf("the user was asked %+v over SSE", ins)
	}
	if l := logs.String(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, "elicitation/create, which the SSE transport cannot carry") ||
		!strings.Contains(l, "connector_id=c1") {
		t.Errorf("log lacks the warning naming connector and method:\n%s", l)
	}
	if got := m.Value(t, "connector.server_requests.refused", with(conn("c1"), "method", "elicitation/create")...); got != 1 {
		t.Errorf("refused server requests counted %v, want 1", got)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Calls running at once on one connection each get their own server
// requests over streamable HTTP (the request comes on the call's own
// response stream); over stdio sampling is served for every call.
func TestAsksConcurrentCalls(t *testing.T) {
	const n = 8
	t.Run("streamable_http elicitation", func(t *testing.T) {
		reg := run(t, newSource(askSpec(1, askServer(t), registry.SessionPerSession, true, false)), testConfig())
		var wg sync.WaitGroup
		askers := make([]*fakeAsker, n)
		for i := range n {
			askers[i] = &fakeAsker{answer: func(context.Context, ask.Input) (ask.Answer, error) {
				return ask.Answer{Action: ask.Accept, Content: map[string]any{"name": fmt.Sprint("user", i)}}, nil
			}}
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx := ask.With(ctxT(t), askers[i], ask.Call{ID: fmt.Sprint("c", i), Tool: "ask"})
				res, err := reg.CallTool(ctx, 1, "ask", nil, registry.CallOptions{Session: "s1"})
				if err != nil {
					t.Errorf("call %d: %v", i, err)
					return
				}
				if got, want := text(t, res), fmt.Sprintf(`action=accept content={"name":"user%d"}`, i); got != want {
					t.Errorf("call %d = %s, want %s", i, got, want)
				}
			}()
		}
		wg.Wait()
		for i, a := range askers {
			if ins, calls := a.asked(); len(ins) != 1 || calls[0].ID != fmt.Sprint("c", i) {
				t.Errorf("asker %d saw %d inputs for %+v, want 1 for its own call", i, len(ins), calls)
			}
		}
	})
	t.Run("stdio sampling", func(t *testing.T) {
		var s fakeSampler
		cfg := testConfig()
		cfg.Sample = s.sample
		reg := run(t, newSource(askStdioSpec(1, registry.SessionShared, false, true)), cfg)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx := ask.With(ctxT(t), &fakeAsker{}, ask.Call{ID: fmt.Sprint("c", i), Tool: "sample"})
				res, err := reg.CallTool(ctx, 1, "sample", nil, registry.CallOptions{})
				if err != nil {
					t.Errorf("call %d: %v", i, err)
					return
				}
				if got, want := text(t, res), `sampled="hi there" model=fake-model`; got != want {
					t.Errorf("call %d = %s, want %s", i, got, want)
				}
			}()
		}
		wg.Wait()
		if askers, _, _ := s.served(); len(askers) != n {
			t.Errorf("sampler served %d requests, want %d", len(askers), n)
		} else {
			for i, a := range askers {
				if a == nil {
					t.Errorf("request %d was served with no asker while %d calls were in flight", i, n)
				}
			}
		}
	})
}

// What a server request costs a call: a call that elicits once (answered
// at once) against one that asks nothing, on the same connection.
func BenchmarkAsksElicitRoundTrip(b *testing.B) {
	for _, tc := range []struct {
		name string
		spec func() registry.Spec
	}{
		{"stdio", func() registry.Spec { return askStdioSpec(1, registry.SessionPerSession, true, false) }},
		{"streamable_http", func() registry.Spec { return askSpec(1, askServer(b), registry.SessionPerSession, true, false) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			cfg := testConfig()
			cfg.HealthInterval = time.Hour
			reg := run(b, newSource(tc.spec()), cfg)
			ctx := ask.With(context.Background(), &fakeAsker{answer: func(context.Context, ask.Input) (ask.Answer, error) {
				return ask.Answer{Action: ask.Accept, Content: map[string]any{"name": "Ada"}}, nil
			}}, ask.Call{ID: "c"})
			opts := registry.CallOptions{Session: "s1"}
			if _, err := reg.CallTool(ctx, 1, "caps", nil, opts); err != nil { // opens the session's connection
				b.Fatal(err)
			}
			for _, tool := range []string{"caps", "ask"} {
				b.Run(tool, func(b *testing.B) {
					for b.Loop() {
						if _, err := reg.CallTool(ctx, 1, tool, nil, opts); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		})
	}
}
