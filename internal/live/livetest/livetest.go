// Package livetest runs one replica's live state for tests: a registry
// and the connectors' live copies over a test database, stopped when the
// test ends.
package livetest

import (
	"context"
	"testing"

	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/store"
)

// Run runs a registry and live connectors over db (no secrets box, no
// cluster: a single replica) until t ends.
func Run(t testing.TB, db *store.DB) (*registry.Registry, *live.Connectors) {
	t.Helper()
	src := live.NewSource(db, nil, nil)
	reg := registry.New(src, registry.Config{}, nil)
	lv := live.New(db, src, reg, nil, live.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- reg.Run(ctx) }()
	go func() { done <- lv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				t.Errorf("live state: %v", err)
			}
		}
	})
	return reg, lv
}
