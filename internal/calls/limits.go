package calls

import (
	"context"
	"encoding/base64"
	"encoding/json"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/ratelimit"
	"github.com/connector-svc/connector-svc/internal/store"
)

// The limits of a call: the size of its arguments and of its result
// (Deps.MaxArgumentsBytes, Deps.MaxResultBytes), and its connector's rate
// limit (Limits), which the query runs share.

// Limits hold connectors' calls and runs to their rate_limit (the store's
// RateLimit of each connector), across replicas: ratelimit.Limiter says
// what takes a token and what waits. A direct call and the start of a
// query or a resume are admitted (Admit); a run's tool calls pass its
// gate (Throttle). queries.Limits is what a run needs of it.
type Limits struct{ *ratelimit.Limiter }

// Admit takes a token of row's rate limit for a call, or a run, to start;
// without one it refuses with *RateLimitedError. No limit always admits.
func (l Limits) Admit(ctx context.Context, row *store.Connector) error {
	if cfg := row.Config.RateLimit; !l.Allow(ctx, row.ID, limitOf(cfg)) {
		return &RateLimitedError{Limit: *cfg}
	}
	return nil
}

// Throttle is the gate of a run's tool calls on row's connector; nil
// without a limit.
func (l Limits) Throttle(row *store.Connector) func(context.Context) error {
	return l.Limiter.Throttle(row.ID, limitOf(row.Config.RateLimit))
}

// limitOf is cfg as a ratelimit.Limit; nil is no limit.
func limitOf(cfg *store.RateLimit) ratelimit.Limit {
	if cfg == nil {
		return ratelimit.Limit{}
	}
	return ratelimit.Limit{PerSecond: cfg.RequestsPerSecond, Burst: cfg.Burst}
}

// checkArguments refuses arguments over MaxArgumentsBytes as the front
// door received them.
func (s *Service) checkArguments(size int) error {
	if limit := s.d.MaxArgumentsBytes; limit > 0 && size > limit {
		return &ArgumentsTooLargeError{Size: size, Limit: limit}
	}
	return nil
}

// CheckResultBytes refuses a result that takes n bytes over
// MaxResultBytes. Call checks a result's raw content (ResultSize); a
// front door checks the response it renders the result into, which its
// client must receive.
func (s *Service) CheckResultBytes(n int) error {
	if limit := s.d.MaxResultBytes; limit > 0 && n > limit {
		return &ResultTooLargeError{Size: n, Limit: limit}
	}
	return nil
}

// ResultSize is the size of a result's text, binary data (decoded) and
// structured content (as JSON), before any conversion: a huge result is
// refused without being converted.
func ResultSize(res *mcp.CallToolResult) int {
	n := len(res.RawStructuredContent)
	if n == 0 && res.StructuredContent != nil {
		b, _ := json.Marshal(res.StructuredContent)
		n = len(b)
	}
	for _, c := range res.Content {
		switch c := c.(type) {
		case mcp.TextContent:
			n += len(c.Text)
		case mcp.ImageContent:
			n += base64.StdEncoding.DecodedLen(len(c.Data))
		case mcp.AudioContent:
			n += base64.StdEncoding.DecodedLen(len(c.Data))
		case mcp.ResourceLink:
			n += len(c.URI) + len(c.Name) + len(c.Description) + len(c.MIMEType)
		case mcp.EmbeddedResource:
			switch rc := c.Resource.(type) {
			case mcp.TextResourceContents:
				n += len(rc.Text)
			case mcp.BlobResourceContents:
				n += base64.StdEncoding.DecodedLen(len(rc.Blob))
			}
		}
	}
	return n
}
