package registry_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/registry"
)

// The reference server lists the tools that ask back only to a client
// that declares what they need, and they work end to end: elicitation
// (form, URL, and URL through -32042) put to the caller's Asker, sampling
// served through Config.Sample. Over stdio and streamable HTTP.
func TestInteropTypeScriptAsks(t *testing.T) {
	js := everythingJS(t)
	asking := []string{"trigger-elicitation-request", "trigger-sampling-request", "trigger-url-elicitation"}
	for _, tr := range []string{registry.TransportStdio, registry.TransportStreamableHTTP} {
		t.Run(tr, func(t *testing.T) {
			spec := func(id int64, mode string, elicit, sample bool) registry.Spec {
				s := registry.Spec{ID: id, WorkspaceID: "ws", ConnectorID: fmt.Sprint("everything", id), Transport: tr,
					SessionMode: mode, Elicitation: elicit, Sampling: sample, ConnectTimeout: 30 * time.Second, CallTimeout: 30 * time.Second}
				if tr == registry.TransportStdio {
					s.Command, s.Args = "node", []string{js, "stdio"}
				} else {
					s.URL = startTSServer(t, "streamableHttp").url("/mcp")
				}
				return s
			}
			var sampler fakeSampler
			cfg := testConfig()
			cfg.Sample = sampler.sample
			reg := run(t, newSource(
				spec(1, registry.SessionPerSession, true, true),
				spec(2, registry.SessionShared, true, false),
				spec(3, registry.SessionPerSession, false, false),
			), cfg)
			for id, want := range map[int64][]string{1: asking, 2: nil, 3: nil} {
				if err := reg.Ready(ctxT(t), id); err != nil {
					t.Fatal(err)
				}
				tools, _ := reg.Tools(id)
				var got []string
				for _, tool := range tools {
					if slices.Contains(asking, tool.Name) {
						got = append(got, tool.Name)
					}
				}
				if !slices.Equal(got, want) {
					t.Errorf("connector %d lists %v of the tools that ask back, want %v", id, got, want)
				}
			}

			opts := registry.CallOptions{Session: "alice"}
			a := &fakeAsker{answer: func(_ context.Context, in ask.Input) (ask.Answer, error) {
				if in.Mode == ask.ModeURL {
					return ask.Answer{Action: ask.Accept}, nil
				}
				return ask.Answer{Action: ask.Accept, Content: map[string]any{"name": "Ada", "check": true, "integer": 7}}, nil
			}}
			call := func(tool string, args map[string]any) (string, error) {
				ctx := ask.With(ctxT(t), a, ask.Call{ID: "c-" + tool, Tool: tool})
				res, err := reg.CallTool(ctx, 1, tool, args, opts)
				if err != nil {
					return "", err
				}
				var b strings.Builder
				for _, c := range res.Content {
					if tc, ok := c.(mcp.TextContent); ok {
						b.WriteString(tc.Text)
					}
				}
				return b.String(), nil
			}

			got, err := call("trigger-elicitation-request", map[string]any{})
			if err != nil || !strings.Contains(got, "- Name: Ada") || !strings.Contains(got, "- Favorite Integer: 7") {
				t.Errorf("form elicitation = %q, %v", got, err)
			}
			ins, _ := a.asked()
			if len(ins) != 1 || ins[0].Mode != ask.ModeForm || len(ins[0].Schema["properties"].(map[string]any)) < 10 {
				t.Errorf("inputs = %+v, want the server's form", ins)
			}

			got, err = call("trigger-url-elicitation", map[string]any{"url": "https://example.com/consent"})
			if err != nil || !strings.Contains(got, "User completed the URL elicitation flow") {
				t.Errorf("URL elicitation = %q, %v", got, err)
			}

			args := map[string]any{"url": "https://example.com/login", "errorPath": true}
			_, err = call("trigger-url-elicitation", args)
			var ue *ask.URLRequiredError
			if !errors.As(err, &ue) || len(ue.Inputs) != 1 || ue.Inputs[0].URL != "https://modelcontextprotocol.io" || ue.Inputs[0].ElicitationID == "" {
				t.Fatalf("URL elicitation through -32042: %v, want an *ask.URLRequiredError", err)
			}
			got, err = call("trigger-url-elicitation", args) // the user opened it: retried as it was
			if err != nil || !strings.Contains(got, "User completed the URL elicitation flow") {
				t.Errorf("retried URL elicitation = %q, %v", got, err)
			}

			got, err = call("trigger-sampling-request", map[string]any{"prompt": "say hi"})
			if err != nil || !strings.Contains(got, "hi there") {
				t.Errorf("sampling = %q, %v", got, err)
			}
			askers, calls, reqs := sampler.served()
			if len(reqs) != 1 || askers[0] != ask.Asker(a) || calls[0].Tool != "trigger-sampling-request" ||
				reqs[0].SystemPrompt != "You are a helpful test server." {
				t.Errorf("sampler served %d request(s): %+v", len(reqs), calls)
			}
		})
	}
}
