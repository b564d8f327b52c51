package registry

import (
	"testing"
	"time"
)

// TestIdleBackoffCapped: with the default settings no reconnect waits
// more than 30 s, so a connector nobody calls is back within 30 s of its
// server (issue 27: one stayed ERROR 58 s after its server came back).
func TestIdleBackoffCapped(t *testing.T) {
	var cfg Config
	cfg.setDefaults()
	r := &Registry{cfg: cfg}
	for n := 1; n <= 40; n++ {
		for range 50 {
			if d := r.backoff(n); d > 30*time.Second {
				t.Fatalf("backoff(%d) = %v, want at most 30s", n, d)
			}
		}
	}
}
