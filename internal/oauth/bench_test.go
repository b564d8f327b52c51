package oauth

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/oauthtest"
	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

// benchEnv is a benchmark's database and key, shared by the Managers it
// makes.
type benchEnv struct {
	b   *testing.B
	db  *store.DB
	box *secret.Box
}

func newBenchEnv(b *testing.B) *benchEnv {
	box, err := secret.NewBox(bytes.Repeat([]byte{5}, 32))
	if err != nil {
		b.Fatal(err)
	}
	return &benchEnv{b: b, db: storetest.NewDB(b), box: box}
}

// manager is a new Manager on e's database, with nothing cached: a
// replica that just started.
func (e *benchEnv) manager() *Manager {
	m, err := New(Config{DB: e.db, Box: e.box, RedirectURL: redirectURL, ReturnToAllowed: []string{"https://app.example/"}})
	if err != nil {
		e.b.Fatal(err)
	}
	return m
}

// connector stores an oauth_user connector of mcpURL.
func (e *benchEnv) connector(id, mcpURL string) Connector {
	row, err := e.db.CreateConnector(context.Background(), &store.Connector{WorkspaceID: "ws", ExternalID: id, Name: id,
		Transport: store.TransportStreamableHTTP, Config: store.Config{URL: mcpURL}, Active: true})
	if err != nil {
		e.b.Fatal(err)
	}
	return Connector{ID: row.ID, WorkspaceID: "ws", ExternalID: id, URL: mcpURL, Mode: ModeUser}
}

// authorize runs user's whole authorization of c through m.
func (e *benchEnv) authorize(m *Manager, as *oauthtest.Server, c Connector, user string) {
	ctx := context.Background()
	st, err := m.Start(ctx, c, user, "", nil)
	if err != nil {
		e.b.Fatal(err)
	}
	loc, err := as.Authorize(ctx, st.URL, user)
	if err != nil {
		e.b.Fatal(err)
	}
	q := loc.Query()
	if _, err := m.Complete(ctx, q.Get("state"), q.Get("code"), q.Get("iss"), q.Get("error")); err != nil {
		e.b.Fatal(err)
	}
}

// p50 is the median of d, sorted in place, in µs.
func p50(d []time.Duration) float64 {
	slices.Sort(d)
	return float64(d[len(d)/2].Nanoseconds()) / 1e3
}

// BenchmarkTokenTransport measures what a user's token transport adds to
// each request of their connection once the token is cached: the origin
// check, the cache look-up and the request copied with the Authorization
// header, over a base transport that answers at once (no network), against
// that base transport alone. Each iteration sends a block of 1,000
// requests through each, in turn; it reports the median of the blocks'
// ns per request, and the allocations each adds.
func BenchmarkTokenTransport(b *testing.B) {
	const block = 1000
	e := newBenchEnv(b)
	as := oauthtest.Start(b, oauthtest.Options{})
	m := e.manager()
	c := e.connector("c", as.MCPURL)
	e.authorize(m, as, c, "alice")

	// Each base checks the header its requests carry, the same work.
	baseWant := func(want *string) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if *want != "-" && req.Header.Get("Authorization") != *want {
				return nil, fmt.Errorf("the request went with another Authorization header")
			}
			return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Header: http.Header{}, Request: req}, nil
		})
	}
	none, want := "", "-"
	base := baseWant(&none)
	user := m.Transport(baseWant(&want), c, "alice")
	req, err := http.NewRequest(http.MethodPost, as.MCPURL, nil)
	if err != nil {
		b.Fatal(err)
	}
	send := func(rt http.RoundTripper) func() {
		return func() {
			resp, err := rt.RoundTrip(req)
			if err != nil {
				b.Fatal(err)
			}
			_ = resp.Body.Close()
		}
	}
	sides := []func(){send(base), send(user)}
	sides[1]() // the token read from Postgres, then cached
	tok, err := m.current(context.Background(), c, "alice", false)
	if err != nil {
		b.Fatal(err)
	}
	want = "Bearer " + tok.access
	allocs := []float64{testing.AllocsPerRun(100, sides[0]), testing.AllocsPerRun(100, sides[1])}

	var perCall [2][]time.Duration
	for i := 0; b.Loop(); i++ {
		for j := range sides {
			k := (i + j) % len(sides)
			start := time.Now()
			for range block {
				sides[k]()
			}
			perCall[k] = append(perCall[k], time.Since(start)/block)
		}
	}
	b.StopTimer()
	baseNs, userNs := p50(perCall[0])*1e3, p50(perCall[1])*1e3
	b.ReportMetric(baseNs, "base-ns/req")
	b.ReportMetric(userNs, "token-ns/req")
	b.ReportMetric(userNs-baseNs, "added-ns/req")
	b.ReportMetric(allocs[1]-allocs[0], "added-allocs/req")
	b.Logf("per request: base %.0f ns, %.0f allocs; through the token transport %.0f ns, %.0f allocs (+%.0f ns, +%.0f allocs)",
		baseNs, allocs[0], userNs, allocs[1], userNs-baseNs, allocs[1]-allocs[0])
}

// BenchmarkStartAuthorization measures Start in three states, in turn,
// for a new user each time: cold, the first authorization at a server
// the service never met (discovery: the 401 probe, the protected resource
// metadata and the server's metadata; then dynamic client registration;
// a new oauthtest server and connector each time, made untimed);
// rediscover, a server whose registration is stored but whose discovery
// is not cached (a Manager that just started, as a replica does after a
// restart, or any Manager once discovery's 5 minutes are over); and warm,
// both known. Then Complete of the warm one (the state consumed, the code
// exchanged, the tokens sealed and stored), the consent untimed. Reports
// each one's p50.
func BenchmarkStartAuthorization(b *testing.B) {
	ctx := context.Background()
	e := newBenchEnv(b)
	as := oauthtest.Start(b, oauthtest.Options{})
	m := e.manager()
	c := e.connector("warm", as.MCPURL)
	e.authorize(m, as, c, "first")

	names := []string{"cold", "rediscover", "warm"}
	lat := make([][]time.Duration, len(names)+1)
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		cold := oauthtest.Start(b, oauthtest.Options{})
		cc := e.connector(fmt.Sprintf("cold-%d", i), cold.MCPURL)
		fresh := e.manager()
		b.StartTimer()
		user := fmt.Sprintf("u%d", i)
		var warmURL string
		sides := []func() error{
			func() error { _, err := m.Start(ctx, cc, user, "", nil); return err },
			func() error { _, err := fresh.Start(ctx, c, user+"-r", "", nil); return err },
			func() error {
				st, err := m.Start(ctx, c, user, "", nil)
				if err == nil {
					warmURL = st.URL
				}
				return err
			},
		}
		for j := range sides {
			k := (i + j) % len(sides)
			start := time.Now()
			if err := sides[k](); err != nil {
				b.Fatalf("%s: %v", names[k], err)
			}
			lat[k] = append(lat[k], time.Since(start))
		}
		b.StopTimer()
		loc, err := as.Authorize(ctx, warmURL, user)
		if err != nil {
			b.Fatal(err)
		}
		q := loc.Query()
		b.StartTimer()
		start := time.Now()
		if _, err := m.Complete(ctx, q.Get("state"), q.Get("code"), q.Get("iss"), q.Get("error")); err != nil {
			b.Fatal(err)
		}
		lat[3] = append(lat[3], time.Since(start))
		b.StopTimer()
		if got := cold.Counts().Registrations; got != 1 {
			b.Fatalf("the cold server saw %d registrations, want 1", got)
		}
		b.StartTimer()
	}
	b.StopTimer()
	var line []string
	for k, name := range append(names, "complete") {
		v := p50(lat[k])
		b.ReportMetric(v, "p50-"+name+"-µs")
		line = append(line, fmt.Sprintf("%s %.0f µs", name, v))
	}
	b.Logf("p50 (%d each): %s", len(lat[0]), strings.Join(line, ", "))
	if got := as.Counts().Registrations; got != 1 {
		b.Errorf("the warm server saw %d registrations, want 1 (stored once, reused by every Manager)", got)
	}
}
