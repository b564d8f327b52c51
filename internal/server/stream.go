package server

import (
	"context"
	"time"

	"google.golang.org/grpc"
)

// serveStream runs one server-streaming RPC. run gets the stream's context,
// with timeout as its deadline if the caller set none, and a send for its
// events; its result is the last message. A failed send stops the sending,
// not the run (the caller's cancel does that), and is the RPC's error if
// the run had none.
func serveStream[T any](s *Server, stream grpc.ServerStreamingServer[T], timeout time.Duration,
	run func(ctx context.Context, send func(*T)) (*T, error)) error {
	ctx := stream.Context()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	var sendErr error
	send := func(m *T) {
		if sendErr == nil {
			sendErr = stream.Send(m)
		}
	}
	last, err := run(ctx, send)
	if err == nil {
		err = sendErr
	}
	if err == nil {
		err = stream.Send(last)
	}
	return s.toStatus(ctx, err)
}
