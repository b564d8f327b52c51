package server

import (
	"google.golang.org/protobuf/proto"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/calls"
	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/queries"
)

// The limits of calls and queries are the use cases' (internal/calls:
// arguments, results, rate limits; internal/queries: cutting contexts);
// what is left here is the gRPC messages': the size of a message as sent,
// and MaxSendBytes.

// queryResponseSlack is the room a query response keeps outside its
// contexts for the wrapping of a stream message and the markers of cut
// contexts.
const queryResponseSlack = 64 << 10

func orDefaultSize(n, def int) int {
	if n <= 0 {
		return def
	}
	return n
}

// fitResult converts a tool result, or refuses it when the response would
// carry more than MaxToolResultBytes (calls.Service.Call checked the raw
// content already): a client must receive it.
func (s *Server) fitResult(res *calls.Result) (*connectorv1.CallToolResponse, error) {
	resp := callResultToProto(res.CallToolResult)
	if err := s.calls.CheckResultBytes(proto.Size(resp)); err != nil {
		return nil, err
	}
	return resp, nil
}

// contextBudget is how many bytes of contexts a query response may carry
// when the rest of it takes rest bytes: MaxToolResultBytes, less if the
// response would otherwise pass MaxSendBytes.
func (s *Server) contextBudget(rest int) int {
	return max(0, min(s.cfg.MaxToolResultBytes, s.cfg.MaxSendBytes-rest-queryResponseSlack))
}

// contextsToProto converts a run's contexts, in order, within budget
// bytes, cutting those that do not fit (queries.FitContexts).
func contextsToProto(contexts []orchestrator.Context, budget int) []*connectorv1.QueryContext {
	return queries.FitContexts(contexts, budget, contextToProto, func(pc *connectorv1.QueryContext) int { return proto.Size(pc) })
}

func contextToProto(qc orchestrator.Context) *connectorv1.QueryContext {
	pc := &connectorv1.QueryContext{Tool: qc.Tool, StructuredContent: toStruct(qc.StructuredContent)}
	for _, l := range qc.ResourceLinks {
		pc.ResourceLinks = append(pc.ResourceLinks, &connectorv1.ResourceLink{Uri: l.URI, Name: l.Name, Description: l.Description, MimeType: l.MIMEType})
	}
	return pc
}
