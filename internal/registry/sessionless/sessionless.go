// Package sessionless runs tool calls on the sessionless protocol
// (2026-07-28) and their input rounds: a server that
// needs something in the middle of a call answers it with "input_required",
// the requests it needs answered and an opaque request state, and the call
// is sent again with the answers. mcp-go's CallTool runs that loop itself,
// answering every request at once through the handlers and dropping the
// request state without them, so a user's answer could only come while
// the call is held open. Here the call is sent as a raw tools/call
// instead: sampling is served at once, and a request for the user ends the
// call with an *ask.InputRequiredError that the caller keeps, as long as
// it likes, and answers with an *ask.Retry. It is given the session's
// transport, version, declared capabilities and a sampling hook (see
// Session).
package sessionless

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/registry/elicit"
)

// maxInputRounds bounds the rounds of one call that the service answers by
// itself (sampling), as mcp-go bounds its own loop.
const maxInputRounds = 10

// A round that asks for nothing is retried after busyWait times its
// number, up to maxBusyRounds in a row (mcp-go gives up after 3).
const (
	maxBusyRounds = 3
	busyWait      = 100 * time.Millisecond
)

// rawIDs numbers the raw requests; their ids are strings, apart from
// mcp-go's numeric ones on the same connection.
var rawIDs atomic.Uint64

// ErrNoSampling is what a sampling request gets when the service has no
// way to serve it.
var ErrNoSampling = errors.New("sampling is not configured on this service")

// Session is the sessionless session a call runs on.
type Session struct {
	Transport transport.Interface
	Version   string // the protocol version agreed
	// Capabilities and ClientInfo go in every request's _meta.
	Capabilities mcp.ClientCapabilities
	ClientInfo   mcp.Implementation
	// Elicit says the session declares elicitation.
	Elicit bool
	// Sample serves a sampling request of the server for the call's
	// asker and call (nil when the call has none); nil fails it with
	// ErrNoSampling.
	Sample func(ctx context.Context, asker ask.Asker, call ask.Call, req mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error)
}

// Call runs name on the sessionless session s. Sampling
// requests are served at once through s.Sample, and the call sent
// again with the results, up to maxInputRounds. Requests for the user end
// the call with an *ask.InputRequiredError (durable inputs, each named by
// the server's key) when the call's context carries an Asker and the
// session declares elicitation; otherwise they are answered "cancel", as
// on the classic protocol. retry, if set, is the first round's answers.
func Call(ctx context.Context, s Session, name string, args map[string]any, meta *mcp.Meta, retry *ask.Retry) (*mcp.CallToolResult, error) {
	var responses map[string]json.RawMessage
	var state string
	if retry != nil {
		responses, state = retryResponses(retry), retry.RequestState
	}
	asker, call, hasAsker := ask.From(ctx)
	canAsk := hasAsker && s.Elicit
	busy := 0
	for round := 1; ; round++ {
		res, err := rawCall(ctx, s, name, args, meta, responses, state)
		if err != nil || !res.NeedsInput() {
			return res, err
		}
		if round >= maxInputRounds {
			return nil, fmt.Errorf("the server asked for input %d times in a row; giving up", maxInputRounds)
		}
		if len(res.InputRequests) == 0 {
			// Asking for nothing is a busy server's "retry later".
			if busy++; busy >= maxBusyRounds {
				return nil, fmt.Errorf("the server asked %d times in a row to retry later", busy)
			}
			select {
			case <-time.After(time.Duration(busy) * busyWait):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			responses, state = nil, res.RequestState
			continue
		}
		busy = 0
		served := make(map[string]json.RawMessage, len(res.InputRequests))
		var inputs []ask.Input
		ids := make([]string, 0, len(res.InputRequests))
		for id := range res.InputRequests {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		for _, id := range ids {
			r := res.InputRequests[id]
			switch {
			case r.Method == mcp.MethodSamplingCreateMessage && r.Sampling != nil:
				out, err := serveSampling(ctx, s, asker, call, *r.Sampling)
				if err != nil {
					return nil, fmt.Errorf("sampling request %q of the server: %w", id, err)
				}
				served[id] = out
			case r.Method == mcp.MethodElicitationCreate && r.Elicitation != nil:
				in, err := elicit.InputOf(*r.Elicitation)
				if err != nil || !canAsk {
					served[id] = mustJSON(elicit.Result(ask.Answer{Action: ask.Cancel}))
					continue
				}
				in.ID, in.Durable = id, true
				inputs = append(inputs, in)
			case r.Method == mcp.MethodListRoots:
				served[id] = json.RawMessage(`{"roots":[]}`)
			default:
				return nil, fmt.Errorf("the server sent input request %q of method %q, which this client does not serve", id, r.Method)
			}
		}
		if len(inputs) > 0 {
			if len(served) == 0 {
				served = nil
			}
			return nil, &ask.InputRequiredError{Inputs: inputs, RequestState: res.RequestState, Served: served}
		}
		responses, state = served, res.RequestState
	}
}

// serveSampling answers one sampling request of a sessionless round, as
// the JSON of its result. An error that names the end of a context the
// call still has is reported as text only: it is not the connection's.
func serveSampling(ctx context.Context, s Session, asker ask.Asker, call ask.Call, p mcp.CreateMessageParams) (json.RawMessage, error) {
	if s.Sample == nil {
		return nil, ErrNoSampling
	}
	for i := range p.Messages {
		content, err := mcp.ParseSamplingContent(p.Messages[i].Content)
		if err != nil {
			return nil, fmt.Errorf("message %d: %w", i, err)
		}
		p.Messages[i].Content = content
	}
	req := mcp.CreateMessageRequest{Request: mcp.Request{Method: string(mcp.MethodSamplingCreateMessage)}, CreateMessageParams: p}
	res, err := s.Sample(ctx, asker, call, req)
	switch {
	case err != nil && ctx.Err() == nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		return nil, errors.New(err.Error())
	case err != nil:
		return nil, err
	case res == nil:
		return nil, errors.New("sampling returned no result")
	}
	return json.Marshal(res)
}

// retryResponses are the inputResponses of a retry: the user's answers as
// elicitation results, and the served ones as they were.
func retryResponses(r *ask.Retry) map[string]json.RawMessage {
	out := make(map[string]json.RawMessage, len(r.Answers)+len(r.Served))
	for id, raw := range r.Served {
		out[id] = raw
	}
	for id, ans := range r.Answers {
		out[id] = mustJSON(elicit.Result(ans))
	}
	return out
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only types of this package's making
	}
	return b
}

// rawCall sends one tools/call over s's transport as mcp-go would on the
// sessionless protocol: the protocol version, client info and
// capabilities in _meta, the standard headers, and a cancellation notice
// on stdio when ctx ends first.
func rawCall(ctx context.Context, s Session, name string, args map[string]any, meta *mcp.Meta, responses map[string]json.RawMessage, state string) (*mcp.CallToolResult, error) {
	params := map[string]any{"name": name}
	if args != nil {
		params["arguments"] = args
	}
	if len(responses) > 0 {
		params["inputResponses"] = responses
	}
	if state != "" {
		params["requestState"] = state
	}
	m := map[string]any{}
	if meta != nil {
		b, err := json.Marshal(meta)
		if err != nil {
			return nil, fmt.Errorf("encode _meta: %w", err)
		}
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("encode _meta: %w", err)
		}
	}
	m[mcp.MetaKeyProtocolVersion] = s.Version
	m[mcp.MetaKeyClientCapabilities] = s.Capabilities
	m[mcp.MetaKeyClientInfo] = s.ClientInfo
	params["_meta"] = m
	encoded, err := json.Marshal(params)
	if err != nil {
		return nil, fmt.Errorf("encode tools/call: %w", err)
	}
	header := http.Header{}
	for k, v := range mcp.StandardHeaders(s.Version, mcp.MethodToolsCall, encoded) {
		header.Set(k, v)
	}
	req := transport.JSONRPCRequest{JSONRPC: mcp.JSONRPC_VERSION, ID: mcp.NewRequestId("call-" + strconv.FormatUint(rawIDs.Add(1), 10)),
		Method: string(mcp.MethodToolsCall), Params: json.RawMessage(encoded), Header: header}
	tr := s.Transport
	resp, err := tr.SendRequest(ctx, req)
	if err != nil {
		if ctx.Err() != nil {
			cancelled(ctx, tr, req)
		}
		return nil, transport.NewError(err)
	}
	if resp.Error != nil {
		return nil, resp.Error.AsError()
	}
	return mcp.ParseCallToolResult(&resp.Result)
}

// cancelled tells a stdio server that req's caller is gone, as mcp-go
// does for its own requests; over HTTP the ended request says it.
func cancelled(ctx context.Context, tr transport.Interface, req transport.JSONRPCRequest) {
	if _, ok := tr.(transport.HTTPConnection); ok {
		return
	}
	n := mcp.JSONRPCNotification{JSONRPC: mcp.JSONRPC_VERSION, Notification: mcp.Notification{
		Method: string(mcp.MethodNotificationCancelled),
		Params: mcp.NotificationParams{AdditionalFields: map[string]any{"requestId": req.ID, "reason": ctx.Err().Error()}},
	}}
	go func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = tr.SendNotification(ctx, n)
	}()
}
