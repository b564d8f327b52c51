package sampling_test

import (
	"context"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/sampling"
	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

// BenchmarkMinuteBudget measures what a per-minute sampling budget costs a
// request: Sample on the fake model with no per-minute limit, and with
// one counted in Postgres (the reservation, then the settling of the
// tokens used), in turn; and the reservation alone (ReserveSampling), per
// request. The limits are high enough never to refuse.
func BenchmarkMinuteBudget(b *testing.B) {
	ctx := context.Background()
	db := storetest.NewDB(b)
	c, err := db.CreateConnector(ctx, &store.Connector{WorkspaceID: "acme", ExternalID: "shop", Name: "Shop",
		Transport: store.TransportStreamableHTTP, Config: store.Config{URL: "http://127.0.0.1:9/mcp"}, Active: true})
	if err != nil {
		b.Fatal(err)
	}
	limited := on(store.SamplingConfig{MaxRequestsPerMinute: 1 << 30, MaxTokensPerMinute: 1 << 30})
	for _, tc := range []struct {
		name    string
		minutes sampling.MinuteStore
		sc      *store.SamplingConfig
	}{{"no-minute-limit", nil, on(store.SamplingConfig{})}, {"minute-limit-postgres", db, limited}} {
		b.Run(tc.name, func(b *testing.B) {
			srv := llmtest.New(b, answers(b.N+1)...)
			s := sampling.New(sampling.Config{Chat: model(b, srv).Chat, Minutes: tc.minutes,
				Connector: connectors(map[int64]sampling.Target{c.ID: {Workspace: "acme", Name: "shop", Sampling: tc.sc}})})
			if _, err := s.Sample(ctx, c.ID, nil, call, request(100, "hi")); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for range b.N {
				if _, err := s.Sample(ctx, c.ID, nil, call, request(100, "hi")); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("reserve-only", func(b *testing.B) {
		for b.Loop() {
			if _, ok, err := db.ReserveSampling(ctx, c.ID, time.Now(), 100, 1<<30, 1<<30); err != nil || !ok {
				b.Fatalf("reserve: %v, %v", ok, err)
			}
		}
	})
}
