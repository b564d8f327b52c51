package registry

// Server requests: what a connection's MCP server asks of the service in
// the middle of a tool call (an elicitation for the user, a completion of
// the connector's model), and how each finds the caller of that call.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/ask"
	"github.com/connector-svc/connector-svc/internal/registry/elicit"
	"github.com/connector-svc/connector-svc/internal/registry/sessionless"
)

// answerMargin is how long before the end of the time a server request
// has (the call's deadline, the transport's limit on its handler) its
// answer is given: a "cancel" sent at the last moment would not arrive.
const answerMargin = 2 * time.Second

// httpHandlerLimit is how long mcp-go gives the handler of a server
// request over streamable HTTP.
const httpHandlerLimit = 30 * time.Second

// asks serves the server requests of one session: it declares the
// capabilities, holds the handlers mcp-go calls, and keeps the calls in
// flight on the session, for transports whose server requests do not
// carry the call's context. Nil when the session declares nothing.
type asks struct {
	c *conn
	// elicit says elicitation (form and URL) is declared: the connector
	// asks for it and the connection belongs to one user. sample says
	// sampling (with tools) is.
	elicit, sample bool
	// byContext says a server request's context carries its call's
	// (streamable HTTP, where requests come on the call's own response
	// stream): a request without an Asker there belongs to a call without
	// one.
	byContext bool

	mu    sync.Mutex
	calls []*inflight // oldest first
	next  uint64      // numbers the calls' own tokens (newToken)
}

// inflight is a call running on the session.
type inflight struct {
	ctx  context.Context // the call's
	a    ask.Asker       // nil: the call has nobody to ask
	call ask.Call
	task string // the id of the task the call runs as, once known
	// token is the progress token the call's request carries: a server
	// request whose _meta names it belongs to the call.
	token string
	// asking counts the server requests put to the call and not yet
	// answered (guarded by asks.mu).
	asking int
}

// newAsks returns what a session of spec declares and serves, or nil.
// Elicitation is declared only on connections that belong to one user
// (per-session and per-user ones, and the connection that lists their
// connector's tools, which serves no calls), never on a shared one: a
// shared connection has nobody in particular to ask. Nothing is declared
// over legacy SSE, which cannot carry a server's requests (see
// package ssereq).
func (c *conn) newAsks(spec Spec) *asks {
	if spec.Transport == TransportSSE {
		return nil
	}
	a := &asks{c: c, elicit: spec.Elicitation && c.spec.ownConnections(), sample: spec.Sampling,
		byContext: spec.Transport == TransportStreamableHTTP}
	if !a.elicit && !a.sample {
		return nil
	}
	return a
}

// capabilities are what the session declares: at the classic handshake,
// and in every sessionless request's _meta.
func (a *asks) capabilities() mcp.ClientCapabilities {
	var caps mcp.ClientCapabilities
	if a == nil {
		return caps
	}
	if a.elicit {
		// A handler alone would declare {}: form mode only.
		caps.Elicitation = &mcp.ElicitationCapability{Form: &struct{}{}, URL: &struct{}{}}
	}
	if a.sample {
		caps.Sampling = &mcp.SamplingCapability{Tools: &struct{}{}}
	}
	return caps
}

// options are the mcp-go client options that declare and serve a's
// capabilities.
func (a *asks) options() []client.ClientOption {
	if a == nil {
		return nil
	}
	opts := []client.ClientOption{client.WithClientCapabilities(a.capabilities())}
	if a.elicit {
		opts = append(opts, client.WithElicitationHandler(elicitHandler{a}))
	}
	if a.sample {
		opts = append(opts, client.WithSamplingHandler(samplingHandler{a}))
	}
	return opts
}

// track counts a call in flight on the session, with the Asker its
// context carries (if any), until the returned func is called.
func (a *asks) track(ctx context.Context) func() {
	if a == nil {
		return func() {}
	}
	in := &inflight{ctx: ctx}
	in.a, in.call, _ = ask.From(ctx)
	a.mu.Lock()
	a.calls = append(a.calls, in)
	a.mu.Unlock()
	return func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		if i := slices.Index(a.calls, in); i >= 0 {
			a.calls = slices.Delete(a.calls, i, i+1)
		}
	}
}

// relateTask records that the call made under ctx (the context callTool
// got) runs as task taskID: a server request that names the task (its
// _meta's related-task) goes to that call.
func (s *session) relateTask(ctx context.Context, taskID string) {
	s.asks.relate(ctx, func(in *inflight) { in.task = taskID })
}

// relateToken records that the request of the call made under ctx
// carries progress token token: a server request whose _meta names that
// token goes to that call.
func (s *session) relateToken(ctx context.Context, token string) {
	s.asks.relate(ctx, func(in *inflight) { in.token = token })
}

// newToken is a progress token for a call that asked for no progress,
// by which a server may name the call in its requests.
func (a *asks) newToken() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.next++
	return "connector-svc-call-" + strconv.FormatUint(a.next, 10)
}

func (a *asks) relate(ctx context.Context, set func(*inflight)) {
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, in := range a.calls {
		if in.ctx == ctx {
			set(in)
		}
	}
}

// related is what a server request names of the call it belongs to: the
// task the call runs as, the progress token of its request.
type related struct{ task, token string }

// relatedOf reads it from a request's _meta.
func relatedOf(meta *mcp.Meta) related {
	if meta == nil {
		return related{}
	}
	r := related{task: relatedTask(meta)}
	switch t := meta.ProgressToken.(type) {
	case string:
		r.token = t
	case nil:
	default:
		r.token = fmt.Sprint(t)
	}
	return r
}

// route finds who answers a server request that came with ctx: the Asker
// ctx carries, or, where server requests do not carry their call's
// context (stdio, the GET stream), that of a call in flight on the
// session: the one running as the task the request's _meta names, or
// whose request carries the progress token it names, if any. Else, over
// stdio, the one that started first and is not asking already (see
// routeAsking); on the GET stream
// the session's only call, or none: a request that names no call while
// several run is refused (errUnroutable) rather than given to the wrong
// user's call. callCtx is the call's context, nil if no call was found; a
// nil Asker means nobody can answer.
func (a *asks) route(ctx context.Context, rel related) (asker ask.Asker, call ask.Call, callCtx context.Context, err error) {
	asker, call, callCtx, release, err := a.routeAsking(ctx, rel)
	release()
	return asker, call, callCtx, err
}

// routeAsking is route, for a request about to be put to the call found:
// until release, that call counts as asking, and a request that names no
// call goes to the oldest call not asking already (a server's call waits
// on one question at a time: the second question is another call's).
func (a *asks) routeAsking(ctx context.Context, rel related) (asker ask.Asker, call ask.Call, callCtx context.Context, release func(), err error) {
	release = func() {}
	if asker, call, ok := ask.From(ctx); ok {
		return asker, call, ctx, release, nil
	}
	onGET := ctx.Value(onGETStream{}) != nil
	if a.byContext && !onGET {
		return nil, ask.Call{}, nil, release, nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var in *inflight
	for _, c := range a.calls {
		if (rel.task != "" && c.task == rel.task) || (rel.token != "" && c.token == rel.token) {
			in = c
			break
		}
	}
	switch {
	case in != nil:
	case onGET && len(a.calls) != 1:
		return nil, ask.Call{}, nil, release, errUnroutable(len(a.calls))
	case len(a.calls) == 0:
		return nil, ask.Call{}, nil, release, nil
	default:
		in = a.calls[0]
		for _, c := range a.calls {
			if c.asking == 0 {
				in = c
				break
			}
		}
	}
	in.asking++
	release = func() {
		a.mu.Lock()
		in.asking--
		a.mu.Unlock()
	}
	return in.a, in.call, in.ctx, release, nil
}

// errUnroutable is the error a server sees for a request on the GET
// stream that names no call while n calls run on its session.
func errUnroutable(n int) error {
	msg := "the client has no call open on this session to route the request to"
	if n > 1 {
		msg = fmt.Sprintf("the request names no call (no related task) and %d calls are open on this session; refused", n)
	}
	return &requestError{code: mcp.INVALID_REQUEST, msg: msg}
}

// relatedTask is the task a server request's _meta names, if any.
func relatedTask(meta *mcp.Meta) string {
	if meta == nil {
		return ""
	}
	m, _ := meta.AdditionalFields[mcp.RelatedTaskMetaKey].(map[string]any)
	id, _ := m["taskId"].(string)
	return id
}

// elicitHandler answers elicitation/create on the classic protocol: it
// puts the request to the call's Asker and waits for the answer until
// ElicitationTimeout, the limit mcp-go puts on the handler (30s over
// streamable HTTP, none over stdio) or the deadline of whoever made the
// call, whichever comes first, less answerMargin; then it answers
// "cancel". The call's own timeout stops meanwhile (see callClock).
type elicitHandler struct{ a *asks }

func (h elicitHandler) Elicit(ctx context.Context, req mcp.ElicitationRequest) (*mcp.ElicitationResult, error) {
	a := h.a
	in, err := elicit.InputOf(req.Params)
	if err != nil {
		return nil, err
	}
	asker, call, callCtx, release, err := a.routeAsking(ctx, relatedOf(req.Params.Meta))
	defer release()
	if err != nil {
		a.refuse(string(mcp.MethodElicitationCreate), err)
		return nil, err
	}
	if asker == nil {
		a.c.reg.logger.Debug("server asked for the user's input on a call that has nobody to ask; answering cancel",
			append(a.c.logAttrs(), slog.String("mode", in.Mode))...)
		return elicit.Result(ask.Answer{Action: ask.Cancel}), nil
	}
	resume, callerDeadline := pauseCall(callCtx)
	defer resume()
	deadline := a.answerDeadline(callerDeadline)
	in.ID, in.Deadline = elicit.NewInputID(), deadline
	ectx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	if callCtx != ctx {
		// Over stdio the handler's context is the connection's: the
		// wait also ends with the call.
		defer context.AfterFunc(callCtx, cancel)()
	}
	ans, err := asker.Elicit(ectx, call, in)
	if err != nil {
		return nil, err
	}
	return elicit.Result(ans), nil
}

// answerDeadline is when a server's request on an open call must be
// answered: within ELICITATION_TIMEOUT, before the transport gives up on
// the handler (streamable HTTP), and before the caller's own deadline, each
// with a margin for the answer to reach the server.
func (a *asks) answerDeadline(callerDeadline time.Time) time.Time {
	now := time.Now()
	deadline := now.Add(a.c.reg.cfg.ElicitationTimeout)
	if a.byContext {
		deadline = earliest(deadline, now.Add(httpHandlerLimit-answerMargin))
	}
	if !callerDeadline.IsZero() {
		deadline = earliest(deadline, callerDeadline.Add(-answerMargin))
	}
	return deadline
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// samplingHandler answers sampling/createMessage on the classic protocol
// through Config.Sample, for the call the request belongs to.
type samplingHandler struct{ a *asks }

func (h samplingHandler) CreateMessage(ctx context.Context, req mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
	// mcp-go drops a sampling request's _meta: no related task here, but
	// the GET stream's reader keeps it (see asks.serve).
	return h.a.createMessage(ctx, req, related{})
}

func (a *asks) createMessage(ctx context.Context, req mcp.CreateMessageRequest, rel related) (*mcp.CreateMessageResult, error) {
	asker, call, callCtx, release, err := a.routeAsking(ctx, rel)
	defer release()
	if err != nil {
		a.refuse(string(mcp.MethodSamplingCreateMessage), err)
		return nil, err
	}
	resume, callerDeadline := pauseCall(callCtx)
	defer resume()
	// A request put to the user for approval, and the model's answer,
	// must come while the server (and the transport) still wait.
	ctx, cancelWait := context.WithDeadline(ctx, a.answerDeadline(callerDeadline))
	defer cancelWait()
	if callCtx != nil && callCtx != ctx {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(callCtx, cancel)()
	}
	return a.c.sample(ctx, asker, call, req)
}

// errNoSampling is what a sampling request gets when the service has no
// way to serve it.
var errNoSampling = sessionless.ErrNoSampling

// sample serves one sampling request of c's server through Config.Sample.
func (c *conn) sample(ctx context.Context, asker ask.Asker, call ask.Call, req mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
	fn := c.reg.cfg.Sample
	if fn == nil || !c.spec.Sampling {
		return nil, errNoSampling
	}
	return fn(ctx, c.spec.ID, asker, call, req)
}

// awaitsInput reports whether a call ended for want of the user's input
// (sessionless input_required, classic -32042): it did not fail, and is
// sent again once the user answers.
func awaitsInput(err error) bool {
	var ir *ask.InputRequiredError
	var ur *ask.URLRequiredError
	return errors.As(err, &ir) || errors.As(err, &ur)
}

// refuse logs and counts a server request refused because it could not
// be routed to a call.
func (a *asks) refuse(method string, err error) {
	a.c.reg.logger.Warn("the server asked for "+method+" on the GET stream, and no call could take it; answered with an error",
		append(a.c.logAttrs(), slog.String("method", method), slog.String("reason", err.Error()))...)
	a.c.reg.metrics.refused(a.c, method)
}

// serve answers a server request that came outside mcp-go's client (the
// GET stream): elicitation and sampling through the same handlers, a
// ping with nothing; anything else is -32601.
func (a *asks) serve(ctx context.Context, method string, params json.RawMessage) (any, error) {
	var meta struct {
		Meta *mcp.Meta `json:"_meta,omitempty"`
	}
	_ = json.Unmarshal(params, &meta)
	rel := relatedOf(meta.Meta)
	switch method {
	case string(mcp.MethodPing):
		return map[string]any{}, nil
	case string(mcp.MethodElicitationCreate):
		if !a.elicit {
			break
		}
		var req mcp.ElicitationRequest
		if err := json.Unmarshal(params, &req.Params); err != nil {
			return nil, &requestError{code: mcp.INVALID_PARAMS, msg: "invalid elicitation params: " + err.Error()}
		}
		if req.Params.Meta == nil {
			req.Params.Meta = meta.Meta
		}
		return elicitHandler{a}.Elicit(ctx, req)
	case string(mcp.MethodSamplingCreateMessage):
		if !a.sample {
			break
		}
		var req mcp.CreateMessageRequest
		if err := json.Unmarshal(params, &req.CreateMessageParams); err != nil {
			return nil, &requestError{code: mcp.INVALID_PARAMS, msg: "invalid sampling params: " + err.Error()}
		}
		for i := range req.Messages {
			content, err := mcp.ParseSamplingContent(req.Messages[i].Content)
			if err != nil {
				return nil, &requestError{code: mcp.INVALID_PARAMS, msg: fmt.Sprintf("invalid sampling params: message %d: %v", i, err)}
			}
			req.Messages[i].Content = content
		}
		return a.createMessage(ctx, req, rel)
	}
	return nil, &requestError{code: mcp.METHOD_NOT_FOUND, msg: "method not supported by the client: " + method}
}
