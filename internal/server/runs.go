package server

import (
	"context"
	"time"

	"google.golang.org/grpc/status"
)

// Run record defaults (Config.ApprovalTimeout, and the sweeper's
// retention); the records themselves are internal/runs'.
const (
	DefaultApprovalTimeout = 24 * time.Hour
	DefaultRunRetention    = 30 * 24 * time.Hour
)

// runErrorMessage is what a failed run's record says: the message its
// caller got.
func (s *Server) runErrorMessage(ctx context.Context, err error) string {
	if err == nil {
		return ""
	}
	return status.Convert(s.toStatus(ctx, err)).Message()
}
