package registry

import (
	"context"
	"errors"
	"fmt"
	"testing"

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
