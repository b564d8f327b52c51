package registry

// What a connector's server offers beside its tools: resources, resource
// templates and prompts, with completions of their arguments. The lists
// are cached per connection as the tool catalog is (listed after connect,
// listed again on a list_changed notification, and on each health check
// when the server sends none); reads, prompts and completions go to the
// server each time, over the same session a tool call of the same caller
// would use. Subscriptions are held on the connector's shared connection
// and taken out again on every new session.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/registry/msglimit"
)

// ContentCaps is what a server declared it offers beside tools.
type ContentCaps struct {
	Resources, Subscribe, ResourcesListChanged bool
	Prompts, PromptsListChanged                bool
	Completions                                bool
}

func contentCaps(c mcp.ServerCapabilities) ContentCaps {
	var k ContentCaps
	if c.Resources != nil {
		k.Resources, k.Subscribe, k.ResourcesListChanged = true, c.Resources.Subscribe, c.Resources.ListChanged
	}
	if c.Prompts != nil {
		k.Prompts, k.PromptsListChanged = true, c.Prompts.ListChanged
	}
	k.Completions = c.Completions != nil
	return k
}

// Contents is a connector's resources, templates and prompts as its
// server last listed them. It never changes once published; a new listing
// is a new Contents with a higher Version.
type Contents struct {
	Version   uint64
	Caps      ContentCaps
	Resources []mcp.Resource
	Templates []mcp.ResourceTemplate
	Prompts   []mcp.Prompt
	ListedAt  time.Time
	// Err is why the last listing failed, if it did: the lists are then
	// the last ones listed.
	Err error
}

// Prompt returns a listed prompt.
func (k *Contents) Prompt(name string) (mcp.Prompt, bool) {
	for _, p := range k.Prompts {
		if p.Name == name {
			return p, true
		}
	}
	return mcp.Prompt{}, false
}

// ResourceEvent is a server's notification about its resources or
// prompts, on a connector's shared connection.
type ResourceEvent struct {
	// URI is the resource that changed (notifications/resources/updated);
	// empty for a list change.
	URI string
	// ResourcesChanged and PromptsChanged say which list changed.
	ResourcesChanged, PromptsChanged bool
}

// Errors of the contents' use.
var (
	// ErrNoResources means the connector's server offers no resources.
	ErrNoResources = errors.New("the connector's server offers no resources")
	// ErrNoPrompts means the connector's server offers no prompts.
	ErrNoPrompts = errors.New("the connector's server offers no prompts")
	// ErrNoCompletions means the connector's server offers no completions.
	ErrNoCompletions = errors.New("the connector's server offers no completions")
	// ErrNoSubscribe means the connector's server takes no subscriptions.
	ErrNoSubscribe = errors.New("the connector's server takes no resource subscriptions")
	// ErrSubscribeShared means the connector keeps connections per caller
	// session or per user, and subscriptions are held on a shared one.
	ErrSubscribeShared = errors.New("resource subscriptions are held on a connector's shared connection; " +
		"this connector keeps one per caller session or per user")
)

// contentsState is a conn's contents and subscriptions.
type contentsState struct {
	cur atomic.Pointer[Contents]
	// subs holds the URIs subscribed at the server, each with the session
	// it was taken out on (nil: on none yet), under conn.mu.
	subs map[string]*session
	// subsOn is the session whose GET stream is held for them, under
	// conn.mu.
	subsOn *session
	reqs   atomic.Uint64 // ids of our own requests (see rawRequest)
}

// Contents returns connector id's resources, templates and prompts as
// last listed, listing them first if they have not been (or fresh). It
// waits for a connect under way, as a call does. A per_session connector
// lists over a short-lived connection, an oauth_user one over any user's.
func (r *Registry) Contents(ctx context.Context, id int64, fresh bool) (*Contents, error) {
	for {
		c, err := r.get(id)
		if err != nil {
			return nil, err
		}
		if k := c.contents.cur.Load(); k != nil && !fresh {
			return k, nil
		}
		k, err := c.listContentsShared(ctx)
		if errors.Is(err, errReplaced) {
			continue
		}
		return k, err
	}
}

// listContentsShared lists once for every concurrent caller.
func (c *conn) listContentsShared(ctx context.Context) (*Contents, error) {
	ch := c.flight.DoChan("contents", func() (any, error) { return c.listContents(context.WithoutCancel(ctx)) })
	select {
	case r := <-ch:
		if r.Err != nil {
			return nil, r.Err
		}
		return r.Val.(*Contents), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// contentsLater lists c's contents in the background (after a connect,
// on a list_changed notification), and takes its subscriptions out again
// on a new session.
func (r *Registry) contentsLater(c *conn) {
	if !r.enter() {
		return
	}
	go func() {
		defer r.bg.Done()
		ctx, cancel := context.WithTimeout(r.life, r.cfg.HealthTimeout)
		defer cancel()
		if _, err := c.listContentsShared(ctx); err != nil && ctx.Err() == nil {
			r.logger.Debug("list resources and prompts", append(c.logAttrs(), slog.String("error", err.Error()))...)
		}
		c.resubscribe(ctx)
	}()
}

// listContents lists what the server offers beside tools and publishes
// it. A failure keeps the last lists, with the error.
func (c *conn) listContents(ctx context.Context) (*Contents, error) {
	ctx, cancel := context.WithTimeout(ctx, c.reg.cfg.HealthTimeout)
	defer cancel()
	s, done, err := c.listingSession(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	return c.listContentsOn(ctx, s)
}

// listContentsOn lists c's contents over s and publishes them.
func (c *conn) listContentsOn(ctx context.Context, s *session) (*Contents, error) {
	k := &Contents{Caps: contentCaps(s.client.GetServerCapabilities()), ListedAt: time.Now()}
	err := func() error {
		if k.Caps.Resources {
			res, err := s.client.ListResources(ctx, mcp.ListResourcesRequest{})
			if err != nil {
				return fmt.Errorf("resources/list: %w", err)
			}
			k.Resources = res.Resources
			tmpl, err := s.client.ListResourceTemplates(ctx, mcp.ListResourceTemplatesRequest{})
			if err != nil && !isMethodNotFound(err) {
				return fmt.Errorf("resources/templates/list: %w", err)
			}
			if tmpl != nil {
				k.Templates = tmpl.ResourceTemplates
			}
		}
		if k.Caps.Prompts {
			p, err := s.client.ListPrompts(ctx, mcp.ListPromptsRequest{})
			if err != nil {
				return fmt.Errorf("prompts/list: %w", err)
			}
			k.Prompts = p.Prompts
		}
		return nil
	}()
	if err != nil {
		err = c.redact.err(msglimit.AsTooLarge(err))
		prev := c.contents.cur.Load()
		if prev == nil {
			return nil, err
		}
		kept := *prev
		kept.Err = err
		k = &kept
	}
	k.Version = c.reg.catVersions.Add(1)
	c.contents.cur.Store(k)
	return k, err
}

// listingSession is a session to list over: the shared one, any user's
// (oauth_user), or a short-lived one (per_session). done releases it.
func (c *conn) listingSession(ctx context.Context) (*session, func(), error) {
	s, _, _, err := c.ready(ctx)
	if err != nil {
		return nil, nil, err
	}
	switch {
	case c.spec.perUser():
		if s = c.anyUserSession(); s == nil {
			return nil, nil, ErrNoUserConnection
		}
		return s, s.release, nil
	case s == nil:
		s, _, err := c.openBare(ctx, c.spec, c.hc)
		if err != nil {
			return nil, nil, retryNext(c.redact.err(err))
		}
		return s, func() { s.close(c.reg.cfg.CloseGrace) }, nil
	}
	if !s.acquire() {
		return nil, nil, c.unavailable(errors.New("the session closed"))
	}
	return s, s.release, nil
}

// contentNotified handles a server's notification about its resources
// or prompts on the shared session s.
func (c *conn) contentNotified(n mcp.JSONRPCNotification) {
	var ev ResourceEvent
	switch n.Method {
	case mcp.MethodNotificationResourceUpdated:
		uri, _ := n.Params.AdditionalFields["uri"].(string)
		if uri == "" {
			return
		}
		ev.URI = uri
	case mcp.MethodNotificationResourcesListChanged:
		ev.ResourcesChanged = true
		c.reg.contentsLater(c)
	case mcp.MethodNotificationPromptsListChanged:
		ev.PromptsChanged = true
		c.reg.contentsLater(c)
	default:
		return
	}
	if fn := c.reg.resourceEvents.Load(); fn != nil {
		(*fn)(c.spec.ID, ev)
	} else if fn := c.reg.cfg.OnResourceEvent; fn != nil {
		fn(c.spec.ID, ev)
	}
}

// checkContents lists the contents again on a health check when the
// server sends no list_changed for them.
func (c *conn) checkContents(ctx context.Context) {
	k := c.contents.cur.Load()
	if k == nil {
		return
	}
	if (k.Caps.Resources && !k.Caps.ResourcesListChanged) || (k.Caps.Prompts && !k.Caps.PromptsListChanged) {
		_, _ = c.listContents(ctx)
	}
}

// onSession runs fn over the session a call of opts would run on: the
// connector's shared one, the caller session's (per_session) or the
// user's (oauth_user). A session the server lost is renewed and fn run
// again once; so is a connection that broke (fn only reads).
func (r *Registry) onSession(ctx context.Context, id int64, opts CallOptions, fn func(context.Context, *session) error) error {
	for {
		c, err := r.get(id)
		if err != nil {
			return err
		}
		err = c.onSession(ctx, opts, fn)
		if !errors.Is(err, errReplaced) {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

func (c *conn) onSession(ctx context.Context, opts CallOptions, fn func(context.Context, *session) error) (err error) {
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	defer func() { err = c.redact.err(msglimit.AsTooLarge(err)) }()
	switch {
	case c.spec.perUser() && opts.UserID == "":
		return ErrUserRequired
	case c.spec.perUser():
		opts.Session = UserSession(opts.UserID)
	case !c.spec.perSession():
		return c.onShared(ctx, fn)
	case opts.Session == "":
		return ErrSessionRequired
	}
	if _, _, _, err := c.ready(ctx); err != nil {
		return err
	}
	sc, err := c.sessionFor(opts.Session)
	if err != nil {
		return err
	}
	defer func() {
		sc.done()
		if IsAuthError(err) {
			c.forgetUnopened(sc)
		}
	}()
	sc.lastUsed.Store(time.Now().UnixNano())
	for attempt := 0; ; attempt++ {
		s, err := sc.current(ctx)
		if err != nil {
			return err
		}
		if !s.acquire() {
			return sc.closedErr()
		}
		err = fn(ctx, s)
		s.release()
		switch {
		case err == nil || ctx.Err() != nil || IsAuthError(err) || errors.Is(err, ErrResultTooLarge):
			return err
		case (isSessionLost(err) || isConnectionBroken(err)) && attempt == 0:
			sc.dropConn(s, err)
		case isSessionLost(err), isConnectionBroken(err):
			sc.dropConn(s, err)
			return retryNext(err)
		default:
			return err
		}
	}
}

// onShared runs fn on the connector's shared session.
func (c *conn) onShared(ctx context.Context, fn func(context.Context, *session) error) error {
	for attempt := 0; ; attempt++ {
		s, gen, _, err := c.ready(ctx)
		if err != nil {
			return err
		}
		if !s.acquire() {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			continue
		}
		epoch := c.epoch.Load()
		err = fn(ctx, s)
		s.release()
		switch why := c.closedCause(); {
		case err == nil, errors.Is(err, ErrResultTooLarge), IsAuthError(err):
			return err
		case why != nil && why != errReplaced:
			return why
		case ctx.Err() != nil:
			if EndedByDeadline(ctx) {
				c.suspect(s, gen)
			}
			return endedWith(ctx, err)
		case isSessionLost(err) && attempt == 0:
			if _, err := c.renewSession(ctx, s, gen, epoch); err != nil {
				return c.unavailable(err)
			}
		case isConnectionBroken(err) && attempt == 0:
			c.drop(s, err) // fn only reads: run it again on the new connection
		case isConnectionBroken(err), isSessionLost(err):
			c.drop(s, err)
			return c.unavailable(err)
		default:
			return err
		}
	}
}

// caps returns what s's server declared.
func (s *session) caps() ContentCaps { return contentCaps(s.client.GetServerCapabilities()) }

// ReadResource reads a resource of connector id over the session a call
// of opts would use. An answer over the registry's message limit is
// ErrResultTooLarge, refused as it was read.
func (r *Registry) ReadResource(ctx context.Context, id int64, uri string, opts CallOptions) (*mcp.ReadResourceResult, error) {
	var res *mcp.ReadResourceResult
	err := r.onSession(ctx, id, opts, func(ctx context.Context, s *session) error {
		if !s.caps().Resources {
			return ErrNoResources
		}
		var req mcp.ReadResourceRequest
		req.Params.URI = uri
		var err error
		res, err = s.client.ReadResource(ctx, req)
		return err
	})
	return res, err
}

// GetPrompt gets a prompt of connector id with its arguments.
func (r *Registry) GetPrompt(ctx context.Context, id int64, name string, args map[string]string, opts CallOptions) (*mcp.GetPromptResult, error) {
	var res *mcp.GetPromptResult
	err := r.onSession(ctx, id, opts, func(ctx context.Context, s *session) error {
		if !s.caps().Prompts {
			return ErrNoPrompts
		}
		var req mcp.GetPromptRequest
		req.Params.Name, req.Params.Arguments = name, args
		var err error
		res, err = s.client.GetPrompt(ctx, req)
		return err
	})
	return res, err
}

// CompleteRequest is an argument to complete: of a prompt (Prompt) or of
// a resource template (TemplateURI).
type CompleteRequest struct {
	Prompt, TemplateURI string
	Argument, Value     string
	// Context holds the values of the arguments already filled in.
	Context map[string]string
}

// Complete asks connector id's server for completions of an argument.
func (r *Registry) Complete(ctx context.Context, id int64, cr CompleteRequest, opts CallOptions) (*mcp.CompleteResult, error) {
	var res *mcp.CompleteResult
	err := r.onSession(ctx, id, opts, func(ctx context.Context, s *session) error {
		if !s.caps().Completions {
			return ErrNoCompletions
		}
		var req mcp.CompleteRequest
		if cr.Prompt != "" {
			req.Params.Ref = mcp.PromptReference{Type: "ref/prompt", Name: cr.Prompt}
		} else {
			req.Params.Ref = mcp.ResourceReference{Type: "ref/resource", URI: cr.TemplateURI}
		}
		req.Params.Argument = mcp.CompleteArgument{Name: cr.Argument, Value: cr.Value}
		if len(cr.Context) > 0 {
			req.Params.Context = mcp.CompleteContext{Arguments: cr.Context}
		}
		var err error
		res, err = s.client.Complete(ctx, req)
		return err
	})
	return res, err
}

// Subscribe subscribes to uri's updates on connector id's shared
// connection; Config.OnResourceEvent hears of them. The subscription is
// taken out again on every new session, until Unsubscribe.
func (r *Registry) Subscribe(ctx context.Context, id int64, uri string) error {
	return r.subscription(ctx, id, uri, true)
}

// Unsubscribe ends a subscription Subscribe took out.
func (r *Registry) Unsubscribe(ctx context.Context, id int64, uri string) error {
	return r.subscription(ctx, id, uri, false)
}

func (r *Registry) subscription(ctx context.Context, id int64, uri string, on bool) error {
	c, err := r.get(id)
	if err != nil {
		return err
	}
	if c.spec.perUser() || c.spec.perSession() {
		return ErrSubscribeShared
	}
	c.mu.Lock()
	if c.contents.subs == nil {
		c.contents.subs = map[string]*session{}
	}
	_, had := c.contents.subs[uri]
	if on {
		if !had {
			c.contents.subs[uri] = nil
		}
	} else {
		delete(c.contents.subs, uri)
	}
	c.mu.Unlock()
	if had == on {
		return nil
	}
	method := "resources/subscribe"
	if !on {
		method = "resources/unsubscribe"
	}
	err = c.onShared(ctx, func(ctx context.Context, s *session) error {
		if !s.caps().Subscribe {
			return ErrNoSubscribe
		}
		if on {
			// Marked before it is sent, so that resubscribe (after a new
			// session) does not take it out on s a second time.
			c.mu.Lock()
			at, ok := c.contents.subs[uri]
			if ok {
				c.contents.subs[uri] = s
			}
			c.mu.Unlock()
			if !ok || at == s {
				return nil
			}
		}
		if err := c.rawRequest(ctx, s, method, map[string]any{"uri": uri}); err != nil {
			return err
		}
		c.holdStream(s)
		return nil
	})
	if err != nil && on {
		c.mu.Lock()
		delete(c.contents.subs, uri)
		c.mu.Unlock()
	}
	return err
}

// OnResourceEvent has fn hear of the servers' notifications about their
// resources and prompts in place of Config.OnResourceEvent: for a
// collaborator made after the registry.
func (r *Registry) OnResourceEvent(fn func(id int64, ev ResourceEvent)) { r.resourceEvents.Store(&fn) }

// Subscriptions returns the URIs connector id holds subscriptions to.
func (r *Registry) Subscriptions(id int64) []string {
	c, err := r.get(id)
	if err != nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Sorted(maps.Keys(c.contents.subs))
}

// inheritSubscriptions has c, a new connection of a connector, take out
// the subscriptions old held, once it connects.
func (c *conn) inheritSubscriptions(old *conn) {
	if old == nil {
		return
	}
	old.mu.Lock()
	subs := make(map[string]*session, len(old.contents.subs))
	for uri := range old.contents.subs {
		subs[uri] = nil
	}
	old.mu.Unlock()
	c.mu.Lock()
	c.contents.subs = subs
	c.mu.Unlock()
}

// resubscribe takes c's subscriptions out on its current session, if they
// were taken out on another one.
func (c *conn) resubscribe(ctx context.Context) {
	c.mu.Lock()
	s := c.sess
	var uris []string
	if s != nil {
		for uri, at := range c.contents.subs {
			if at != s {
				c.contents.subs[uri] = s // taken out below: Subscribe leaves it
				uris = append(uris, uri)
			}
		}
	}
	c.mu.Unlock()
	if len(uris) == 0 {
		return
	}
	for i, uri := range uris {
		if err := c.rawRequest(ctx, s, "resources/subscribe", map[string]any{"uri": uri}); err != nil {
			c.reg.logger.Warn("resubscribe to a resource", append(c.logAttrs(), slog.String("uri", uri),
				slog.String("error", c.redact.err(err).Error()))...)
			c.mu.Lock()
			for _, u := range uris[i:] {
				if at, ok := c.contents.subs[u]; ok && at == s {
					c.contents.subs[u] = nil // taken out again next time
				}
			}
			c.mu.Unlock()
			return
		}
	}
	c.holdStream(s)
	c.reg.logger.Debug("resource subscriptions taken out on the new session", append(c.logAttrs(), slog.Int("count", len(uris)))...)
}

// holdStream keeps s's GET stream open for good (where the server sends
// its notifications of a streamable-HTTP session), once per session.
func (c *conn) holdStream(s *session) {
	c.mu.Lock()
	first := c.contents.subsOn != s
	c.contents.subsOn = s
	c.mu.Unlock()
	if first {
		s.get.hold(s.life) // never left: the stream stays while the session lives
	}
}

// rawRequest sends a request mcp-go's client has no method for and
// checks that it succeeded.
func (c *conn) rawRequest(ctx context.Context, s *session, method string, params any) error {
	id := mcp.NewRequestId("connector-svc-" + strconv.FormatUint(c.contents.reqs.Add(1), 10))
	resp, err := s.client.GetTransport().SendRequest(ctx, transport.JSONRPCRequest{JSONRPC: mcp.JSONRPC_VERSION, ID: id,
		Method: method, Params: params})
	if err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	if resp != nil && resp.Error != nil {
		return fmt.Errorf("%s: %w", method, resp.Error.AsError())
	}
	return nil
}

// isMethodNotFound reports a JSON-RPC -32601.
func isMethodNotFound(err error) bool { return errors.Is(err, mcp.ErrMethodNotFound) }
