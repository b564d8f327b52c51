package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"

	"github.com/mark3labs/mcp-go/mcp"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/calls"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/ratelimit"
	"github.com/connector-svc/connector-svc/internal/store"
)

// Room a query response keeps outside its contexts for the wrapping of a
// stream message and the markers of cut contexts, and the size of the JSON
// excerpt a cut context keeps.
const (
	queryResponseSlack  = 64 << 10
	contextExcerptBytes = 8 << 10
)

func orDefaultSize(n, def int) int {
	if n <= 0 {
		return def
	}
	return n
}

// checkArguments refuses CallTool arguments over MaxToolArgumentsBytes.
func (s *Server) checkArguments(args *structpb.Struct) error {
	if n := proto.Size(args); n > s.cfg.MaxToolArgumentsBytes {
		return newStatus(codes.ResourceExhausted, ReasonArgumentsTooLarge, fmt.Sprintf(
			"the arguments are %d bytes, over the limit of %d bytes (MAX_TOOL_ARGUMENTS_BYTES)", n, s.cfg.MaxToolArgumentsBytes))
	}
	return nil
}

// fitResult converts a tool result, or refuses it when the response would
// carry more than MaxToolResultBytes. The sizes of the raw content are
// looked at first, so a huge result is refused without being converted;
// then the size of the response itself, which a client must receive.
func (s *Server) fitResult(res *mcp.CallToolResult) (*connectorv1.CallToolResponse, error) {
	if n := rawResultSize(res); n > s.cfg.MaxToolResultBytes {
		return nil, s.resultTooLarge(n)
	}
	resp := callResultToProto(res)
	if n := proto.Size(resp); n > s.cfg.MaxToolResultBytes {
		return nil, s.resultTooLarge(n)
	}
	return resp, nil
}

// resultTooLarge names the size and the limit, never the content.
func (s *Server) resultTooLarge(n int) error {
	return newStatus(codes.ResourceExhausted, ReasonToolResultTooLarge, fmt.Sprintf(
		"the tool result is %d bytes, over the limit of %d bytes (MAX_TOOL_RESULT_BYTES); ask the tool for less, or raise "+
			"MAX_TOOL_RESULT_BYTES with GRPC_MAX_SEND_BYTES and the client's receive limit", n, s.cfg.MaxToolResultBytes))
}

// resultOverLimit refuses a result the registry stopped reading at its
// limit: its size is not known, only that it is over.
func (s *Server) resultOverLimit() error {
	return newStatus(codes.ResourceExhausted, ReasonToolResultTooLarge, fmt.Sprintf(
		"the tool result is over the limit of %d bytes (MAX_TOOL_RESULT_BYTES) and was not read; ask the tool for less, or raise "+
			"MAX_TOOL_RESULT_BYTES with GRPC_MAX_SEND_BYTES and the client's receive limit", s.cfg.MaxToolResultBytes))
}

// rawResultSize is the size of a result's text, binary data (decoded) and
// structured content (as JSON), before any conversion.
func rawResultSize(res *mcp.CallToolResult) int {
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

// contextBudget is how many bytes of contexts a query response may carry
// when the rest of it takes rest bytes: MaxToolResultBytes, less if the
// response would otherwise pass MaxSendBytes.
func (s *Server) contextBudget(rest int) int {
	return max(0, min(s.cfg.MaxToolResultBytes, s.cfg.MaxSendBytes-rest-queryResponseSlack))
}

// contextsToProto converts a run's contexts, in order, within budget
// bytes. A context that does not fit what is left is cut: its structured
// content becomes a "truncated" note and an "excerpt" of its JSON, and its
// resource links are left out.
func contextsToProto(contexts []orchestrator.Context, budget int) []*connectorv1.QueryContext {
	var out []*connectorv1.QueryContext
	left := budget
	for _, qc := range contexts {
		// The JSON size is looked at first, so a huge context is cut
		// without being converted.
		var js []byte
		if qc.StructuredContent != nil {
			js, _ = json.Marshal(qc.StructuredContent)
		}
		var pc *connectorv1.QueryContext
		if len(js) <= left {
			pc = contextToProto(qc)
		}
		if pc == nil || proto.Size(pc) > left {
			pc = cutContext(qc, js, left)
		}
		left -= proto.Size(pc)
		out = append(out, pc)
	}
	return out
}

func contextToProto(qc orchestrator.Context) *connectorv1.QueryContext {
	pc := &connectorv1.QueryContext{Tool: qc.Tool, StructuredContent: toStruct(qc.StructuredContent)}
	for _, l := range qc.ResourceLinks {
		pc.ResourceLinks = append(pc.ResourceLinks, &connectorv1.ResourceLink{Uri: l.URI, Name: l.Name, Description: l.Description, MimeType: l.MIMEType})
	}
	return pc
}

// cutContext is the visible stand-in of a context over the left bytes.
func cutContext(qc orchestrator.Context, js []byte, left int) *connectorv1.QueryContext {
	note := fmt.Sprintf("this context (%d bytes of structured content as JSON, %d resource links) is over the %d bytes "+
		"left for contexts in this response (MAX_TOOL_RESULT_BYTES); its resource links are left out",
		len(js), len(qc.ResourceLinks), max(left, 0))
	fields := map[string]*structpb.Value{"truncated": structpb.NewStringValue(note)}
	if qc.StructuredContent != nil {
		fields["excerpt"] = structpb.NewStringValue(orchestrator.Truncate(string(js), min(contextExcerptBytes, max(left, 0))))
	}
	return &connectorv1.QueryContext{Tool: qc.Tool, StructuredContent: &structpb.Struct{Fields: fields}}
}

// rateLimits are the connectors' rate limits, enforced across replicas by
// ratelimit.Limiter (which says what takes a token and what waits), read
// from the store's RateLimit of each connector.
type rateLimits struct{ *ratelimit.Limiter }

// limitOf is cfg as a ratelimit.Limit; nil is no limit.
func limitOf(cfg *store.RateLimit) ratelimit.Limit {
	if cfg == nil {
		return ratelimit.Limit{}
	}
	return ratelimit.Limit{PerSecond: cfg.RequestsPerSecond, Burst: cfg.Burst}
}

// Admit implements queries.Limits: a query or a resume takes a token
// from the connector's bucket to start; no limit always admits.
func (l rateLimits) Admit(ctx context.Context, row *store.Connector) error {
	if cfg := row.Config.RateLimit; !l.Allow(ctx, row.ID, limitOf(cfg)) {
		return &calls.RateLimitedError{Limit: *cfg}
	}
	return nil
}

// Throttle implements queries.Limits: the gate of a run's tool calls, nil
// without a limit.
func (l rateLimits) Throttle(row *store.Connector) func(context.Context) error {
	return l.Limiter.Throttle(row.ID, limitOf(row.Config.RateLimit))
}
