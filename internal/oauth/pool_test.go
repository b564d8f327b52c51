package oauth

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/oauthtest"
)

// As many users as the database pool has connections refresh at once:
// each refresh must finish, not wait for a connection its siblings hold.
func TestConcurrentRefreshesDoNotExhaustThePool(t *testing.T) {
	e := newEnv(t)
	as := oauthtest.Start(t, oauthtest.Options{})
	m := e.manager(nil)
	c := e.connector("ws", "c", as.MCPURL, ModeUser)
	n := 2 * max(4, runtime.NumCPU()) // pgxpool's default MaxConns is max(4, NumCPU)
	for k := range n {
		e.authorize(context.Background(), m, as, c, fmt.Sprintf("u%d", k))
	}
	as.ExpireTokens()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	start := time.Now()
	for k := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := callTool(ctx, m.Transport(http.DefaultTransport, c, fmt.Sprintf("u%d", k)), c.URL, "whoami")
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a call that refreshed: %v", err)
		}
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("%d concurrent refreshes took %s", n, d)
	}
	if got := as.Counts().Refreshes; got != int64(n) {
		t.Errorf("%d refreshes, want %d", got, n)
	}
}
