package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"google.golang.org/protobuf/types/known/timestamppb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/forward"
	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/resources"
	"github.com/connector-svc/connector-svc/internal/watches"
)

// errWatchMoved ends a watch whose connector this replica no longer owns:
// the caller watches again, and reaches the new owner.
var errWatchMoved = fmt.Errorf("%w: the connector's subscriptions moved to another replica; watch again", registry.ErrUnavailable)

// watchRecheck is how often a watch checks that this replica still owns
// its connector.
const watchRecheck = 2 * time.Second

// watchRetryWait is the pause before a watch whose owner went away is
// taken out again; watchRetryFor is how long it is retried before the
// watch ends with the last error, unless it was taken out again.
const (
	watchRetryWait = 500 * time.Millisecond
	watchRetryFor  = time.Minute
)

// WatchResources implements connector.v1.ConnectorService. A watch runs
// on the connector's owner, which alone holds its subscriptions; through
// another replica it is relayed from there. When the owner goes away or
// ownership moves, the watch is taken out again on the new owner and the
// caller's stream goes on (events sent in between are not heard).
func (s *Server) WatchResources(req *connectorv1.WatchResourcesRequest, stream connectorv1.ConnectorService_WatchResourcesServer) error {
	ctx := stream.Context()
	var c checker
	c.ref(req.GetWorkspaceId(), req.GetConnectorId())
	switch n := len(req.GetUris()); {
	case n == 0:
		c.add("uris", "name 1 to %d resources to watch", watches.MaxURIs)
	case n > watches.MaxURIs:
		c.add("uris", "%d resources; a watch names at most %d", n, watches.MaxURIs)
	}
	for i, uri := range req.GetUris() {
		var inv *resources.InvalidError
		if errors.As(resources.CheckURI(fmt.Sprintf("uris[%d]", i), uri), &inv) {
			c.add(inv.Field, "%s", inv.Reason)
		}
	}
	if err := c.err(); err != nil {
		return s.toStatus(ctx, err)
	}
	// The caller's stream outlives the owner: a watch relayed from the
	// owner, or held here until ownership moved, is taken out again on the
	// new owner, and the caller hears one started message and then the
	// events of whichever owner holds the subscription.
	started, resumed := false, false
	send := func(m *connectorv1.WatchResourcesResponse) error {
		if m.GetStarted() != nil {
			if started {
				resumed = true
				return nil
			}
			started = true
		}
		return stream.Send(m)
	}
	var failingSince time.Time
	for {
		err := s.watchOnce(ctx, req, send)
		if !started || forward.Forwarded(ctx) || ctx.Err() != nil || status.Code(err) != codes.Unavailable {
			return err
		}
		select {
		case <-s.watches.Stopping():
			return s.toStatus(ctx, watches.ErrStopping)
		default:
		}
		if resumed {
			failingSince, resumed = time.Time{}, false
		}
		if failingSince.IsZero() {
			failingSince = time.Now()
		} else if time.Since(failingSince) > watchRetryFor {
			return err
		}
		s.logger.InfoContext(ctx, "a watch's owner went away; watching again", slog.String("error", status.Convert(err).Message()))
		select {
		case <-ctx.Done():
			return s.toStatus(ctx, ctx.Err())
		case <-s.watches.Stopping():
			return s.toStatus(ctx, watches.ErrStopping)
		case <-time.After(watchRetryWait):
		}
	}
}

// watchOnce serves one watch on the connector's current owner: here, or
// relayed from there. It returns when the caller goes away, or with the
// error that ended the watch (UNAVAILABLE when the owner went away or
// ownership moved: WatchResources watches again).
func (s *Server) watchOnce(ctx context.Context, req *connectorv1.WatchResourcesRequest, send func(*connectorv1.WatchResourcesResponse) error) error {
	// A relayed watch ends when this replica stops, like the ones held here.
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.watches.Stopping():
			cancel()
		case <-fctx.Done():
		}
	}()
	if done, err := forwardStream(fctx, s, s.toOwner(req.GetWorkspaceId(), req.GetConnectorId()), req,
		connectorv1.ConnectorServiceClient.WatchResources, send); done {
		if ctx.Err() == nil && fctx.Err() != nil {
			return s.toStatus(ctx, watches.ErrStopping)
		}
		return err
	}
	id, err := s.calls.Callable(ctx, req.GetWorkspaceId(), req.GetConnectorId())
	if err != nil {
		return s.toStatus(ctx, err)
	}
	w, err := s.watches.Watch(ctx, id, req.GetUris())
	if err != nil {
		return s.toStatus(ctx, err)
	}
	defer w.Close()
	if err := send(&connectorv1.WatchResourcesResponse{Event: &connectorv1.WatchResourcesResponse_Started{
		Started: &connectorv1.WatchStarted{Uris: w.URIs()}}}); err != nil {
		return err
	}
	tick := time.NewTicker(watchRecheck)
	defer tick.Stop()
	for {
		select {
		case ev, ok := <-w.Events:
			if !ok {
				if err := w.Err(); err != nil {
					return s.toStatus(ctx, err)
				}
				return s.toStatus(ctx, ctx.Err())
			}
			if err := send(watchEventToProto(ev)); err != nil {
				return err
			}
		case <-tick.C:
			if s.watchMoved(req, id) {
				return s.toStatus(ctx, errWatchMoved)
			}
		}
	}
}

// watchMoved reports whether this replica no longer serves connector
// id's subscriptions: it lost the connector, or its ownership.
func (s *Server) watchMoved(req *connectorv1.WatchResourcesRequest, id int64) bool {
	if !s.reg.Has(id) {
		return true
	}
	// Not the watch's context: a forwarded one is always placed here.
	ctx, cancel := context.WithTimeout(context.Background(), watchRecheck)
	defer cancel()
	conn, err := s.place.Place(ctx, live.Target{WorkspaceID: req.GetWorkspaceId(), ConnectorID: req.GetConnectorId(), OwnerOnly: true})
	return err == nil && conn != nil
}

func watchEventToProto(ev watches.Event) *connectorv1.WatchResourcesResponse {
	if ev.URI != "" {
		return &connectorv1.WatchResourcesResponse{Event: &connectorv1.WatchResourcesResponse_Updated{
			Updated: &connectorv1.ResourceUpdated{Uri: ev.URI, At: timestamppb.New(ev.At)}}}
	}
	return &connectorv1.WatchResourcesResponse{Event: &connectorv1.WatchResourcesResponse_ListChanged{
		ListChanged: &connectorv1.ListChanged{Resources: ev.ResourcesChanged, Prompts: ev.PromptsChanged}}}
}

// StopWatches ends every watch this replica serves (their callers watch
// again, through another replica): call it before the gRPC servers
// drain, whose streams would otherwise hold the drain for its grace.
func (s *Server) StopWatches() { s.watches.Stop() }
