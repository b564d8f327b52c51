package main

import (
	"bytes"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

// healthcheckCmd runs `connector-svc healthcheck` against addr with env.
func healthcheckCmd(t *testing.T, addr string, env map[string]string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := run(testCtx(t), []string{"-grpc-addr", addr, "healthcheck"}, getenv(env), &out)
	return out.String(), err
}

// TestHealthcheckCommand checks the container's health check against the
// real service: SERVING while it serves, also dialled as the container's
// 0.0.0.0 address, and an error once it has stopped.
func TestHealthcheckCommand(t *testing.T) {
	svc := start(t, storetest.NewURL(t), nil)
	_, port, _ := net.SplitHostPort(svc.addr)
	for _, addr := range []string{svc.addr, "0.0.0.0:" + port, ":" + port} {
		if out, err := healthcheckCmd(t, addr, nil); err != nil || strings.TrimSpace(out) != "SERVING" {
			t.Errorf("healthcheck of %s = %q, %v; want SERVING", addr, out, err)
		}
	}
	if err := svc.stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := healthcheckCmd(t, svc.addr, nil); err == nil {
		t.Error("healthcheck of a stopped service succeeded")
	}
}

// TestHealthcheckNeedsNoDatabase: the check runs without the database and
// SECRET_KEY of the service, here both unusable.
func TestHealthcheckNeedsNoDatabase(t *testing.T) {
	svc := start(t, storetest.NewURL(t), nil)
	env := map[string]string{"DATABASE_URL": "postgres://postgres@127.0.0.1:1/x", "SECRET_KEY": "short"}
	if _, err := healthcheckCmd(t, svc.addr, env); err != nil {
		t.Errorf("healthcheck: %v", err)
	}
	if err := run(testCtx(t), []string{"-grpc-addr", "nonsense", "healthcheck"}, getenv(nil), io.Discard); err == nil ||
		!strings.Contains(err.Error(), "GRPC_ADDR") {
		t.Errorf("healthcheck of a bad address = %v; want an error naming GRPC_ADDR", err)
	}
}
