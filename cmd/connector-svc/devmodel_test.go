package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"flag"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/connector-svc/connector-svc/internal/llm/devmodel"
)

// startDevModel runs `connector-svc dev-model` in-process on a free
// loopback port until the test ends, and returns its base URL (…/v1) and
// what it printed.
func startDevModel(t *testing.T) (baseURL string, out *lockedBuffer) {
	t.Helper()
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	out = &lockedBuffer{}
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"dev-model", "-addr", addr}, getenv(nil), out) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("dev-model: %v", err)
		}
	})
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
			c.Close()
			return "http://" + addr + "/v1", out
		}
		select {
		case err := <-done:
			t.Fatalf("dev-model exited before it listened: %v\n%s", err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("dev-model does not listen on %s after 10s:\n%s", addr, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDevModelCommand runs the dev-model command and asks it, with
// go-openai, to pick a tool: it says at start and in its answers that it is
// a scripted stand-in, logs each request, and stops cleanly.
func TestDevModelCommand(t *testing.T) {
	base, out := startDevModel(t)
	cfg := openai.DefaultConfig("")
	cfg.BaseURL = base
	client := openai.NewClientWithConfig(cfg)
	echo := openai.Tool{Type: openai.ToolTypeFunction, Function: &openai.FunctionDefinition{Name: "echo",
		Parameters: map[string]any{"type": "object", "properties": map[string]any{"message": map[string]any{"type": "string"}}, "required": []string{"message"}}}}
	msgs := []openai.ChatCompletionMessage{{Role: openai.ChatMessageRoleUser, Content: "Say hello through the echo tool"}}
	start := time.Now()
	resp, err := client.CreateChatCompletion(context.Background(), openai.ChatCompletionRequest{Model: "dev-model", Messages: msgs, Tools: []openai.Tool{echo}})
	if err != nil {
		t.Fatal(err)
	}
	first := time.Since(start)
	calls := resp.Choices[0].Message.ToolCalls
	if len(calls) != 1 || calls[0].Function.Name != "echo" || calls[0].Function.Arguments != `{"message":"Say hello through the echo tool"}` {
		t.Fatalf("tool calls %+v; want echo with the query", calls)
	}
	msgs = append(msgs, resp.Choices[0].Message, openai.ChatCompletionMessage{Role: openai.ChatMessageRoleTool, ToolCallID: calls[0].ID, Content: "Echo: hi"})
	start = time.Now()
	resp, err = client.CreateChatCompletion(context.Background(), openai.ChatCompletionRequest{Model: "dev-model", Messages: msgs, Tools: []openai.Tool{echo}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("answer latency over loopback HTTP: tool call %v, answer %v", first, time.Since(start))
	if got, want := resp.Choices[0].Message.Content, devmodel.Label+": echo returned: Echo: hi"; got != want {
		t.Errorf("answer %q; want %q", got, want)
	}
	for _, want := range []string{"dev-model: " + devmodel.Label, "listening on " + base + "; start the service with LLM_BASE_URL=" + base + " LLM_MODEL=dev-model",
		`request 1 (model "dev-model", 1 messages, 1 tools): called echo`, `request 2 (model "dev-model", 3 messages, 1 tools): answered from 1 tool results`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("dev-model printed no %q:\n%s", want, out.String())
		}
	}
}

func TestDevModelCommandLine(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"dev-model", "-addr", "0.0.0.0:11435"}, "a loopback address only"},
		{[]string{"dev-model", "-addr", "nowhere"}, "-addr \"nowhere\""},
		{[]string{"dev-model", "extra"}, "flags only"},
		{[]string{"dev-certs", "-nope"}, "flag provided but not defined"},
	} {
		err := run(context.Background(), tt.args, getenv(nil), &bytes.Buffer{})
		var usage *usageError
		if !errors.As(err, &usage) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: %v; want a usage error saying %q", tt.args, err, tt.want)
		}
	}
	var help bytes.Buffer
	if err := run(context.Background(), []string{"dev-model", "-h"}, getenv(nil), &help); !errors.Is(err, flag.ErrHelp) ||
		!strings.Contains(help.String(), "scripted stand-in") {
		t.Errorf("dev-model -h: %v, printed %q", err, help.String())
	}
}

// TestDevCerts makes the development certificates, checks that they chain
// to their CA for what the README uses them for, that the keys are private,
// that a second run keeps them and -force replaces them.
func TestDevCerts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), ".dev", "tls")
	var out bytes.Buffer
	if err := run(context.Background(), []string{"dev-certs", "-dir", dir}, getenv(nil), &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "TLS_CERT_FILE="+dir+"/server.pem") {
		t.Errorf("dev-certs printed:\n%s", out.String())
	}
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, name := range devCertFiles {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(name, "-key.pem") && fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v; want 0600", name, fi.Mode().Perm())
		}
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(read("ca.pem")) {
		t.Fatal("ca.pem holds no certificate")
	}
	for _, tt := range []struct {
		name  string
		usage x509.ExtKeyUsage
		hosts []string
	}{
		{"server", x509.ExtKeyUsageServerAuth, []string{"localhost", "127.0.0.1", "::1"}},
		{"client", x509.ExtKeyUsageClientAuth, nil},
	} {
		pair, err := tls.X509KeyPair(read(tt.name+".pem"), read(tt.name+"-key.pem"))
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		cert, _ := x509.ParseCertificate(pair.Certificate[0])
		if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{tt.usage}}); err != nil {
			t.Errorf("%s does not chain to ca.pem: %v", tt.name, err)
		}
		for _, h := range tt.hosts {
			if err := cert.VerifyHostname(h); err != nil {
				t.Errorf("%s: %v", tt.name, err)
			}
		}
		if days := time.Until(cert.NotAfter).Hours() / 24; days < 360 {
			t.Errorf("%s is valid for %.0f more days; want a year", tt.name, days)
		}
	}
	if block, _ := pem.Decode(read("ca-key.pem")); block == nil || block.Type != "PRIVATE KEY" {
		t.Error("ca-key.pem is not a PEM private key")
	}

	ca := read("ca.pem")
	out.Reset()
	if err := run(context.Background(), []string{"dev-certs", "-dir", dir}, getenv(nil), &out); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(read("ca.pem"), ca) || !strings.HasPrefix(out.String(), "kept the development certificates in "+dir) {
		t.Errorf("a second run replaced the certificates; it printed:\n%s", out.String())
	}
	if err := run(context.Background(), []string{"dev-certs", "-dir", dir, "-force"}, getenv(nil), &out); err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(read("ca.pem"), ca) {
		t.Error("-force kept the CA")
	}
}
