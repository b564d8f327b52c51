// Package watches is the use case of watching a connector's resources:
// callers name the resources they want to hear of, and hear of their
// updates and of the server's list changes until they go away. However
// many callers watch a resource, the connector's connection holds one
// subscription at the server: the first watcher takes it out, the last
// one to go away ends it.
//
// A Hub serves the watchers on its replica. Front doors place a watch on
// the connector's owner (live.Placer, OwnerOnly) and relay the owner's
// events to callers on other replicas, so across a replica set every
// connector's subscriptions are held once, by its owner. When the owner
// stops, or ownership moves, its watches end (ErrMoved, ErrStopping) and
// callers watch again, on the new owner.
package watches

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/connector-svc/connector-svc/internal/registry"
)

// Event is a server's notification a watcher hears of.
type Event struct {
	// URI is the resource updated; empty for a list change.
	URI string
	// ResourcesChanged and PromptsChanged say which of the server's lists
	// changed.
	ResourcesChanged, PromptsChanged bool
	At                               time.Time
}

// ErrStopping ends the watches of a replica that stops: watch again,
// through another replica.
var ErrStopping = errors.New("this replica is stopping; watch again")

// MaxURIs bounds the resources of one watch.
const MaxURIs = 100

// queueLen is how many events wait for a slow watcher; beyond, the
// oldest are dropped and the watcher is told how many (Watch.Dropped).
const queueLen = 256

// Subscriber holds subscriptions at connectors' servers: the registry.
type Subscriber interface {
	Subscribe(ctx context.Context, id int64, uri string) error
	Unsubscribe(ctx context.Context, id int64, uri string) error
}

// Hub is this replica's watchers of connectors' resources. Safe for
// concurrent use.
type Hub struct {
	sub    Subscriber
	logger *slog.Logger

	mu      sync.Mutex
	byURI   map[key]map[*Watch]struct{}
	byConn  map[int64]map[*Watch]struct{}
	stopped bool
	// stop is closed by Stop.
	stop chan struct{}
	// pending serializes the subscribe and unsubscribe of one key.
	locks map[key]*sync.Mutex
}

type key struct {
	id  int64
	uri string
}

// New returns a Hub whose subscriptions sub holds. Hook Notify to the
// registry's resource events.
func New(sub Subscriber, logger *slog.Logger) *Hub {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Hub{sub: sub, logger: logger, byURI: map[key]map[*Watch]struct{}{}, byConn: map[int64]map[*Watch]struct{}{},
		locks: map[key]*sync.Mutex{}, stop: make(chan struct{})}
}

// Stopping is closed once Stop was called: a front door that relays a
// watch from another replica ends it then too.
func (h *Hub) Stopping() <-chan struct{} { return h.stop }

// Watch is one watcher's watch of some resources of a connector.
type Watch struct {
	hub  *Hub
	id   int64
	uris []string
	// Events delivers the watch's events; it is closed when the watch
	// ends (Close, or the hub stopping: Err says why).
	Events <-chan Event

	events chan Event
	mu     sync.Mutex
	queue  []Event
	wake   chan struct{}
	done   chan struct{}
	err    error
	closed bool
	drops  int
}

// Watch starts watching uris of connector id (its registry id): it
// returns once each is subscribed to at the server, or with the first
// error (then nothing is left subscribed for it). The watch lasts until
// Close, or until ctx ends.
func (h *Hub) Watch(ctx context.Context, id int64, uris []string) (*Watch, error) {
	uris = slices.Compact(slices.Sorted(slices.Values(uris)))
	if len(uris) == 0 || len(uris) > MaxURIs {
		return nil, fmt.Errorf("a watch names 1 to %d resources, not %d", MaxURIs, len(uris))
	}
	w := &Watch{hub: h, id: id, uris: uris, events: make(chan Event), wake: make(chan struct{}, 1), done: make(chan struct{})}
	w.Events = w.events
	h.mu.Lock()
	if h.stopped {
		h.mu.Unlock()
		return nil, ErrStopping
	}
	h.mu.Unlock()
	var held []string
	for _, uri := range uris {
		if err := h.join(ctx, w, uri); err != nil {
			for _, u := range held {
				h.leave(w, u)
			}
			return nil, err
		}
		held = append(held, uri)
	}
	h.mu.Lock()
	if h.byConn[id] == nil {
		h.byConn[id] = map[*Watch]struct{}{}
	}
	h.byConn[id][w] = struct{}{}
	h.mu.Unlock()
	go w.deliver()
	go func() {
		select {
		case <-ctx.Done():
			w.Close()
		case <-w.done:
		}
	}()
	return w, nil
}

// lock serializes the changes of one key's subscription.
func (h *Hub) lock(k key) *sync.Mutex {
	h.mu.Lock()
	defer h.mu.Unlock()
	l := h.locks[k]
	if l == nil {
		l = &sync.Mutex{}
		h.locks[k] = l
	}
	return l
}

// join adds w to uri's watchers, the first one subscribing.
func (h *Hub) join(ctx context.Context, w *Watch, uri string) error {
	k := key{w.id, uri}
	l := h.lock(k)
	l.Lock()
	defer l.Unlock()
	h.mu.Lock()
	first := len(h.byURI[k]) == 0
	h.mu.Unlock()
	if first {
		if err := h.sub.Subscribe(ctx, w.id, uri); err != nil {
			return err
		}
	}
	h.mu.Lock()
	if h.byURI[k] == nil {
		h.byURI[k] = map[*Watch]struct{}{}
	}
	h.byURI[k][w] = struct{}{}
	h.mu.Unlock()
	return nil
}

// leave removes w from uri's watchers, the last one unsubscribing.
func (h *Hub) leave(w *Watch, uri string) {
	k := key{w.id, uri}
	l := h.lock(k)
	l.Lock()
	defer l.Unlock()
	h.mu.Lock()
	delete(h.byURI[k], w)
	last := len(h.byURI[k]) == 0
	if last {
		delete(h.byURI, k)
	}
	h.mu.Unlock()
	if !last {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.sub.Unsubscribe(ctx, w.id, uri); err != nil && !errors.Is(err, registry.ErrNotLoaded) &&
		!errors.Is(err, registry.ErrDeleted) && !errors.Is(err, registry.ErrClosed) {
		h.logger.Warn("unsubscribe from a resource", slog.Int64("connector", w.id), slog.String("uri", uri),
			slog.String("error", err.Error()))
	}
}

// Notify hands a server's notification to the watchers it concerns: an
// update to those of its resource, a list change to every watcher of the
// connector. Hook it to the registry's resource events; it never blocks.
func (h *Hub) Notify(id int64, ev registry.ResourceEvent) {
	e := Event{URI: ev.URI, ResourcesChanged: ev.ResourcesChanged, PromptsChanged: ev.PromptsChanged, At: time.Now()}
	h.mu.Lock()
	var to []*Watch
	if ev.URI != "" {
		for w := range h.byURI[key{id, ev.URI}] {
			to = append(to, w)
		}
	} else {
		for w := range h.byConn[id] {
			to = append(to, w)
		}
	}
	h.mu.Unlock()
	for _, w := range to {
		w.push(e)
	}
}

// Watchers returns how many watches this replica holds of connector id.
func (h *Hub) Watchers(id int64) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.byConn[id])
}

// Stop ends every watch with ErrStopping, and refuses new ones: the
// replica is stopping. Subscriptions at the servers end with their
// connections.
func (h *Hub) Stop() {
	h.mu.Lock()
	if !h.stopped {
		close(h.stop)
	}
	h.stopped = true
	var all []*Watch
	for _, ws := range h.byConn {
		for w := range ws {
			all = append(all, w)
		}
	}
	h.mu.Unlock()
	for _, w := range all {
		w.end(ErrStopping)
	}
}

// End ends the watches of connector id with err (its connection moved to
// another replica, or went away); their watchers watch again.
func (h *Hub) End(id int64, err error) {
	h.mu.Lock()
	var ws []*Watch
	for w := range h.byConn[id] {
		ws = append(ws, w)
	}
	h.mu.Unlock()
	for _, w := range ws {
		w.end(err)
	}
}

// push queues e for w, dropping the oldest beyond queueLen.
func (w *Watch) push(e Event) {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	if len(w.queue) >= queueLen {
		w.queue = w.queue[1:]
		w.drops++
	}
	w.queue = append(w.queue, e)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// deliver hands queued events to Events until the watch ends.
func (w *Watch) deliver() {
	defer close(w.events)
	for {
		w.mu.Lock()
		var next *Event
		if len(w.queue) > 0 {
			e := w.queue[0]
			w.queue = w.queue[1:]
			next = &e
		}
		w.mu.Unlock()
		if next == nil {
			select {
			case <-w.wake:
				continue
			case <-w.done:
				return
			}
		}
		select {
		case w.events <- *next:
		case <-w.done:
			return
		}
	}
}

// Dropped is how many events were dropped because the watcher read too
// slowly.
func (w *Watch) Dropped() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.drops
}

// URIs are the resources watched, sorted.
func (w *Watch) URIs() []string { return w.uris }

// Err is why the watch ended, once Events is closed: nil after Close.
func (w *Watch) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Close ends the watch: the watcher went away. The last watcher of a
// resource ends its subscription at the server.
func (w *Watch) Close() { w.end(nil) }

func (w *Watch) end(err error) {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.closed, w.err = true, err
	w.mu.Unlock()
	close(w.done)
	h := w.hub
	h.mu.Lock()
	delete(h.byConn[w.id], w)
	if len(h.byConn[w.id]) == 0 {
		delete(h.byConn, w.id)
	}
	h.mu.Unlock()
	for _, uri := range w.uris {
		h.leave(w, uri)
	}
}
