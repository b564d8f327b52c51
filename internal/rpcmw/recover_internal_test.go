package rpcmw

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestPanicBecomesInternal(t *testing.T) {
	var logs bytes.Buffer
	m := newMiddleware(Config{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	info := &grpc.UnaryServerInfo{FullMethod: "/connector.v1.ConnectorService/GetConnector"}
	resp, err := m.recoverUnary(context.Background(), nil, info, func(context.Context, any) (any, error) {
		panic("handler bug")
	})
	if resp != nil || status.Code(err) != codes.Internal {
		t.Fatalf("recoverUnary(panicking handler) = %v, %v; want INTERNAL", resp, err)
	}
	if msg := status.Convert(err).Message(); strings.Contains(msg, "handler bug") {
		t.Errorf("status message %q leaks the panic value", msg)
	}
	if !strings.Contains(logs.String(), "handler bug") || !strings.Contains(logs.String(), "GetConnector") {
		t.Errorf("the panic was not logged with its method: %s", logs.String())
	}
}
