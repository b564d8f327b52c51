package registry

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client/transport"
)

func TestErrorClassification(t *testing.T) {
	tests := []struct {
		name         string
		err          error
		lost, broken bool
	}{
		{"nil", nil, false, false},
		{"mcp-go 404", fmt.Errorf("call: %w", transport.NewError(transport.ErrSessionTerminated)), true, true},
		// The reference TypeScript server's 400 answer, as mcp-go reports it.
		{"typescript 400", errors.New("Bad Request: No valid session ID provided"), true, false},
		{"session not found", errors.New("Session not found"), true, false},
		{"invalid session id", errors.New("invalid session ID"), true, false},
		{"connection refused", transport.NewError(errors.New("dial tcp 127.0.0.1:9: connect: connection refused")), false, true},
		{"tool error answer", errors.New("invalid params: missing text"), false, false},
		// The caller's own context is ruled out first: one that remains
		// belongs to the session.
		{"deadline", transport.NewError(context.DeadlineExceeded), false, true},
		{"canceled", context.Canceled, false, true},
		{"closed", ErrClosed, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := isSessionLost(tt.err); got != tt.lost {
				t.Errorf("isSessionLost(%v) = %t, want %t", tt.err, got, tt.lost)
			}
			if got := isConnectionBroken(tt.err); got != tt.broken {
				t.Errorf("isConnectionBroken(%v) = %t, want %t", tt.err, got, tt.broken)
			}
		})
	}
}

func TestSayOnce(t *testing.T) {
	for in, want := range map[string]string{
		"transport error: failed to send request: failed to send request: Post x: connection refused": "transport error: failed to send request: Post x: connection refused",
		"failed to send request: failed to send request: failed to send request: x":                   "failed to send request: x",
		"failed to send request: x": "failed to send request: x",
		"":                          "",
	} {
		if got := sayOnce(in); got != want {
			t.Errorf("sayOnce(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestTransportHint matches mcp-go's texts as v1.2.1 words them.
func TestTransportHint(t *testing.T) {
	for _, tt := range []struct {
		name, transport string
		err             error
		streamed        bool
		hint            string
	}{
		{"sse refused with 400", TransportSSE, fmt.Errorf("start: %w", errors.New("unexpected status code: 400")), false, hintStreamable},
		{"sse refused with 405", TransportSSE, errors.New("unexpected status code: 405"), false, hintStreamable},
		{"sse unauthorized", TransportSSE, errors.New("unexpected status code: 401"), false, ""},
		{"sse rate limited", TransportSSE, errors.New("unexpected status code: 429"), false, ""},
		{"sse server error", TransportSSE, errors.New("unexpected status code: 502"), false, ""},
		{"sse stream without endpoint", TransportSSE, errors.New("start: no answer within 5s"), true, hintStreamable},
		{"sse silent", TransportSSE, errors.New("start: no answer within 5s"), false, ""},
		{"streamable at sse", TransportStreamableHTTP, fmt.Errorf("initialize: %w", transport.ErrLegacySSEServer), false, hintSSE},
		{"streamable refused", TransportStreamableHTTP, errors.New("request failed with status 500"), false, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := transportHint(tt.transport, tt.err, tt.streamed)
			if !errors.Is(got, tt.err) {
				t.Errorf("the hinted error no longer wraps %v", tt.err)
			}
			switch {
			case tt.hint == "" && got.Error() != tt.err.Error():
				t.Errorf("transportHint = %q, want no hint", got)
			case tt.hint != "" && got.Error() != tt.err.Error()+" — "+tt.hint:
				t.Errorf("transportHint = %q, want %q", got, tt.hint)
			}
		})
	}
}

func TestEndedByDeadline(t *testing.T) {
	atDeadline, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	cancel()
	early, cancel := context.WithTimeout(context.Background(), time.Hour)
	cancel()
	expired, cancel := context.WithTimeout(context.Background(), 0)
	defer cancel()
	noDeadline, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tt := range []struct {
		name string
		ctx  context.Context
		want bool
	}{
		{"past its deadline", expired, true},
		{"cancelled at its deadline", atDeadline, true},
		{"cancelled long before its deadline", early, false},
		{"cancelled, no deadline", noDeadline, false},
		{"live", context.Background(), false},
	} {
		if got := EndedByDeadline(tt.ctx); got != tt.want {
			t.Errorf("%s: EndedByDeadline = %t, want %t", tt.name, got, tt.want)
		}
	}
}
