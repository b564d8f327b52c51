package registry_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/registry/testdata/asktools"
)

// getStreamServer is a real mcp-go server over streamable HTTP whose
// tools ask back on the standalone GET stream (mcp-go's
// RequestSampling always uses it, RequestElicitation outside a POST's
// context), beside asktools' tools, which ask on the call's own stream:
//   - getask: elicits asktools.Schema on the GET stream, says the answer;
//   - getsample: samples, says the completion;
//   - gettask: a task tool that elicits as getask does, from its task;
//   - getsample2: like getsample, while two calls of it are open.
func getStreamServer(t testing.TB) string {
	t.Helper()
	m := server.NewMCPServer("getstream", "1.0", server.WithToolCapabilities(true), server.WithElicitation(),
		server.WithTaskCapabilities(true, true, true))
	asktools.Add(m)
	say := func(v any, err error) (*mcp.CallToolResult, error) {
		if err != nil {
			return mcp.NewToolResultText("error: " + err.Error()), nil
		}
		b, _ := json.Marshal(v)
		return mcp.NewToolResultText(string(b)), nil
	}
	m.AddTool(mcp.NewTool("getask"), func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		// Outside the POST's own context, mcp-go sends the request on the
		// GET stream (inside it, on the call's stream).
		gctx, cancel := context.WithTimeout(m.WithContext(context.Background(), server.ClientSessionFromContext(ctx)), 10*time.Second)
		defer cancel()
		res, err := m.RequestElicitation(gctx, mcp.ElicitationRequest{Params: mcp.ElicitationParams{
			Message: "Who are you?", RequestedSchema: asktools.Schema}})
		if err != nil {
			return say(nil, err)
		}
		return say(map[string]any{"action": res.Action, "content": res.Content}, nil)
	})
	sample := func(ctx context.Context) (*mcp.CallToolResult, error) {
		var req mcp.CreateMessageRequest
		req.Messages = []mcp.SamplingMessage{{Role: mcp.RoleUser, Content: mcp.NewTextContent("hello")}}
		req.MaxTokens = 50
		res, err := m.RequestSampling(ctx, req)
		if err != nil {
			return say(nil, err)
		}
		return say(res.Content, nil)
	}
	m.AddTool(mcp.NewTool("getsample"), func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return sample(ctx)
	})
	m.AddTaskTool(mcp.NewTool("gettask", mcp.WithTaskSupport(mcp.TaskSupportRequired)),
		func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CreateTaskResult, error) {
			// Its question goes on the GET stream (the context of the
			// request that created the task could still hold that request's
			// stream, ending as the task is created).
			gctx, cancel := context.WithTimeout(m.WithContext(context.Background(), server.ClientSessionFromContext(ctx)), 10*time.Second)
			defer cancel()
			res, err := m.RequestElicitation(gctx, mcp.ElicitationRequest{Params: mcp.ElicitationParams{
				Message: "Who confirms?", RequestedSchema: asktools.Schema}})
			if err != nil {
				return nil, err
			}
			b, _ := json.Marshal(map[string]any{"action": res.Action, "content": res.Content})
			return &mcp.CreateTaskResult{Content: []mcp.Content{mcp.NewTextContent(string(b))}}, nil
		})
	// getsample2's two calls meet before they sample, and again before
	// they answer, so that both stay open while either asks.
	var open, sampled atomic.Int32
	both, bothSampled := make(chan struct{}), make(chan struct{})
	meet := func(n *atomic.Int32, ch chan struct{}) bool {
		if n.Add(1) == 2 {
			close(ch)
		}
		select {
		case <-ch:
			return true
		case <-time.After(10 * time.Second):
			return false
		}
	}
	m.AddTool(mcp.NewTool("getsample2"), func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if !meet(&open, both) {
			return mcp.NewToolResultText("error: the other call never came"), nil
		}
		res, err := sample(ctx)
		meet(&sampled, bothSampled)
		return res, err
	})
	hs := httptest.NewServer(server.NewStreamableHTTPServer(m))
	t.Cleanup(hs.Close)
	return hs.URL + "/mcp"
}

// callWithin calls tool as call id, with a (nil: no Asker), and fails the
// test if the call takes more than 10s: a request lost on the GET stream
// leaves the call waiting for its deadline.
func callWithin(t *testing.T, reg *registry.Registry, a ask.Asker, tool string, opts registry.CallOptions) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if a != nil {
		ctx = ask.With(ctx, a, ask.Call{ID: "call-" + tool, Tool: tool})
	}
	res, err := reg.CallTool(ctx, 1, tool, nil, opts)
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	return text(t, res)
}

// TestAsksOnTheGETStream: a server's elicitation, sampling and task requests
// reach the call's Asker whether they come on the standalone GET stream or
// on the call's own stream, on 2025-11-25 sessions, per-session (one
// user's connection: elicitation and sampling) and shared (sampling).
func TestAsksOnTheGETStream(t *testing.T) {
	url := getStreamServer(t)
	for _, tc := range []struct {
		name   string
		mode   string
		elicit bool
		opts   registry.CallOptions
	}{
		{"per-session", registry.SessionPerSession, true, registry.CallOptions{Session: "s1"}},
		{"shared", registry.SessionShared, false, registry.CallOptions{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s fakeSampler
			cfg := testConfig()
			cfg.Sample = s.sample
			spec := askSpec(1, url, tc.mode, tc.elicit, true)
			spec.Protocol = registry.ProtocolClassic
			reg := run(t, newSource(spec), cfg)
			answer := func(context.Context, ask.Input) (ask.Answer, error) {
				return ask.Answer{Action: ask.Accept, Content: map[string]any{"name": "Ada"}}, nil
			}
			if tc.elicit {
				for tool, want := range map[string]string{
					"getask":  `{"action":"accept","content":{"name":"Ada"}}`, // GET stream
					"gettask": `{"action":"accept","content":{"name":"Ada"}}`, // GET stream, from a task
					"ask":     `action=accept content={"name":"Ada"}`,         // the call's stream
				} {
					a := &fakeAsker{answer: answer}
					if got := callWithin(t, reg, a, tool, tc.opts); got != want {
						t.Errorf("%s = %s, want %s", tool, got, want)
					}
					if ins, calls := a.asked(); len(ins) != 1 || calls[0].ID != "call-"+tool {
						t.Errorf("%s: the caller's Asker saw %+v for %+v, want one input for its call", tool, ins, calls)
					}
				}
			}
			a := &fakeAsker{}
			if got, want := callWithin(t, reg, a, "getsample", tc.opts), `{"type":"text","text":"hi there"}`; got != want {
				t.Errorf("getsample = %s, want %s", got, want)
			}
			askers, calls, _ := s.served()
			if len(askers) != 1 || askers[0] != ask.Asker(a) || calls[0].ID != "call-getsample" {
				t.Errorf("sampler served askers %v calls %+v, want the caller's", askers, calls)
			}
		})
	}
}

// TestAsksGETStreamUnroutableRefusedAtOnce: a request on the GET stream
// that names no call while two calls are open on the session is refused at
// once with an error the server sees, never given to one of them or left
// unanswered.
func TestAsksGETStreamUnroutableRefusedAtOnce(t *testing.T) {
	var s fakeSampler
	cfg := testConfig()
	cfg.Sample = s.sample
	spec := askSpec(1, getStreamServer(t), registry.SessionShared, false, true)
	spec.Protocol = registry.ProtocolClassic
	reg := run(t, newSource(spec), cfg)
	out := make(chan string, 2)
	for i := range 2 {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			ctx = ask.With(ctx, &fakeAsker{}, ask.Call{ID: fmt.Sprint("c", i), Tool: "getsample2"})
			res, err := reg.CallTool(ctx, 1, "getsample2", nil, registry.CallOptions{})
			if err != nil {
				out <- err.Error()
				return
			}
			out <- res.Content[0].(mcp.TextContent).Text
		}()
	}
	for range 2 {
		if got := <-out; !strings.HasPrefix(got, "error: ") || !strings.Contains(got, "2 calls are open") {
			t.Errorf("getsample2 = %q, want the server to see the refusal", got)
		}
	}
	if askers, _, _ := s.served(); len(askers) != 0 {
		t.Errorf("sampler served %d requests, want none", len(askers))
	}
}
