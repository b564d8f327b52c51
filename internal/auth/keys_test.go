package auth

import (
	"context"
	"errors"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

func TestMain(m *testing.M) { os.Exit(storetest.Main(m)) }

// countingStore is a real store that counts key lookups and can hold them
// after they read.
type countingStore struct {
	*store.DB
	lookups atomic.Int64
	hold    chan chan struct{} // when set, a lookup that has read waits for its channel to close
}

func (s *countingStore) APIKeyByHash(ctx context.Context, h []byte) (*store.APIKey, error) {
	s.lookups.Add(1)
	k, err := s.DB.APIKeyByHash(ctx, h)
	if s.hold != nil {
		release := make(chan struct{})
		s.hold <- release
		<-release
	}
	return k, err
}

// newKeys returns Keys on a new database, running (Run), with its cache
// trusted; Revoke waits 100ms unless cfg says otherwise.
func newKeys(t testing.TB, cfg Config) (*Keys, *countingStore) {
	t.Helper()
	db := &countingStore{DB: storetest.NewDB(t)}
	if cfg.Confirm == 0 {
		cfg.Confirm = 100 * time.Millisecond
	}
	keys := NewKeys(db, cfg, nil)
	run(t, keys)
	return keys, db
}

// run runs keys until the test ends, and waits for its cache to be
// trusted.
func run(t testing.TB, keys *Keys) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- keys.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	})
	testsupport.WaitFor(t, "Run to confirm", keys.trusted)
}

func TestTokens(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		id, token := newToken()
		if !strings.HasPrefix(token, "csk_"+id+"_") || len(id) != 8 || !wellFormed(token) || seen[token] {
			t.Fatalf("token %q (id %q) is not fresh and well formed", token, id)
		}
		seen[token] = true
	}
	for _, bad := range []string{"", "csk_", "Bearer x", strings.Repeat("x", tokenLen)} {
		if wellFormed(bad) {
			t.Errorf("wellFormed(%q) = true", bad)
		}
	}
}

func TestParseScopes(t *testing.T) {
	for _, tt := range []struct {
		in   []string
		want []Scope
		err  bool
	}{
		{in: []string{"admin"}, want: []Scope{ScopeAdmin}},
		{in: []string{"query", " admin", "query"}, want: []Scope{ScopeAdmin, ScopeQuery}},
		{in: nil, err: true},
		{in: []string{"root"}, err: true},
		{in: []string{""}, err: true},
	} {
		got, err := ParseScopes(tt.in)
		if (err != nil) != tt.err || !cmp.Equal(got, tt.want) {
			t.Errorf("ParseScopes(%q) = %v, %v; want %v (error %v)", tt.in, got, err, tt.want, tt.err)
		}
	}
}

func TestAdminImpliesQuery(t *testing.T) {
	admin := Key{Scopes: []Scope{ScopeAdmin}}
	query := Key{Scopes: []Scope{ScopeQuery}}
	if !admin.Allows(ScopeAdmin) || !admin.Allows(ScopeQuery) {
		t.Error("an admin key does not allow admin and query")
	}
	if query.Allows(ScopeAdmin) || !query.Allows(ScopeQuery) {
		t.Error("a query key allows admin, or not query")
	}
}

func TestCreateVerifyRevoke(t *testing.T) {
	keys, db := newKeys(t, Config{})
	ctx := context.Background()
	if err := keys.Load(ctx); err != nil || keys.Exist() {
		t.Fatalf("Load on a new database: Exist = %v, %v", keys.Exist(), err)
	}
	created, token, err := keys.Create(ctx, "acme", []Scope{ScopeQuery}, "backend")
	if err != nil {
		t.Fatal(err)
	}
	if !keys.Exist() || created.WorkspaceID != "acme" || created.Hint != token[len(token)-4:] ||
		created.Masked() != "csk_"+created.ID+"_…"+created.Hint {
		t.Errorf("created %+v with token %q", created, token)
	}
	rows, err := db.ListAPIKeys(ctx, "acme", "", 10)
	if err != nil || len(rows) != 1 || strings.Contains(string(rows[0].TokenSHA256), token) || rows[0].TokenHint != created.Hint {
		t.Fatalf("stored rows %+v, %v", rows, err)
	}

	for range 100 {
		got, err := keys.Verify(ctx, token)
		if err != nil || got.ID != created.ID {
			t.Fatalf("Verify = %+v, %v", got, err)
		}
	}

	for name, tok := range map[string]string{"unknown": token[:len(token)-1] + "x", "malformed": "hunter2", "empty": ""} {
		want := ErrUnknownKey
		if tok == "" {
			want = ErrNoKey
		}
		if _, err := keys.Verify(ctx, tok); !errors.Is(err, want) {
			t.Errorf("Verify(%s) = %v, want %v", name, err, want)
		}
	}

	if _, err := keys.Revoke(ctx, "other", created.ID); !errors.Is(err, store.ErrAPIKeyNotFound) {
		t.Errorf("Revoke from another workspace = %v, want not found", err)
	}
	if _, err := keys.Revoke(ctx, "acme", created.ID); err != nil {
		t.Fatal(err)
	}
	if got, err := keys.Verify(ctx, token); !errors.Is(err, ErrRevoked) || got.ID != created.ID {
		t.Errorf("Verify right after Revoke = %+v, %v; want ErrRevoked", got, err)
	}
}

// TestVerifyCaches counts the store lookups of many verifications of one
// key. Its confirmation window is long (8 s), so that a busy machine cannot let
// the cache's trust lapse between two verifications (a lapse rightly reads
// the row again: with the 100 ms window of the other tests, two CPU hogs
// made that happen).
func TestVerifyCaches(t *testing.T) {
	keys, db := newKeys(t, Config{Confirm: 8 * time.Second})
	ctx := context.Background()
	created, token, err := keys.Create(ctx, "acme", []Scope{ScopeQuery}, "backend")
	if err != nil {
		t.Fatal(err)
	}
	waitHeard(t, keys, time.Now())
	for range 100 {
		got, err := keys.Verify(ctx, token)
		if err != nil || got.ID != created.ID {
			t.Fatalf("Verify = %+v, %v", got, err)
		}
	}
	if n := db.lookups.Load(); n != 1 {
		t.Errorf("100 verifications of one key made %d store lookups, want 1", n)
	}
}

func TestCacheExpires(t *testing.T) {
	// Confirmations count for 8 s: see TestVerifyCaches.
	keys, db := newKeys(t, Config{CacheTTL: time.Minute, Confirm: 8 * time.Second})
	var mu sync.Mutex
	now := time.Now()
	keys.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	_, token, err := keys.Create(context.Background(), "acme", []Scope{ScopeAdmin}, "")
	if err != nil {
		t.Fatal(err)
	}
	waitHeard(t, keys, time.Now())
	for _, step := range []time.Duration{0, 59 * time.Second, 2 * time.Second, time.Second} {
		mu.Lock()
		now = now.Add(step)
		mu.Unlock()
		if _, err := keys.Verify(context.Background(), token); err != nil {
			t.Fatal(err)
		}
	}
	if n := db.lookups.Load(); n != 2 { // at 0, and once the minute is over
		t.Errorf("%d lookups over 62s with a 1m TTL, want 2", n)
	}
}

// TestConcurrentVerifyLooksUpOnce: many callers with a key not cached yet
// cost one store lookup. Confirmations count for 4 s here: under load
// the test's usual 100 ms can lapse between two, and an untrusted cache
// reads per call on purpose. The callers start once the key's own
// notification has been handled: handling it starts a new generation of
// lookups, and callers on both sides of it would look up twice.
// waitHeard waits until Run confirmed that keys heard every change committed
// before created: a key's own notification starts a new generation of
// lookups, so a count of lookups must start after it.
func waitHeard(t *testing.T, keys *Keys, created time.Time) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if c := keys.confirmed.Load(); c != nil && c.After(created) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no confirmation of the key's creation within 20 s")
		}
	}
}

func TestConcurrentVerifyLooksUpOnce(t *testing.T) {
	keys, db := newKeys(t, Config{Confirm: 4 * time.Second})
	_, token, err := keys.Create(context.Background(), "acme", []Scope{ScopeAdmin}, "")
	if err != nil {
		t.Fatal(err)
	}
	waitHeard(t, keys, time.Now())
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			if _, err := keys.Verify(context.Background(), token); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := db.lookups.Load(); n != 1 {
		t.Errorf("50 concurrent verifications made %d lookups, want 1", n)
	}
}

// TestRevokeDuringLookup: a lookup that read the key just before a
// revocation must not leave it cached as valid.
func TestRevokeDuringLookup(t *testing.T) {
	keys, db := newKeys(t, Config{})
	ctx := context.Background()
	created, token, err := keys.Create(ctx, "acme", []Scope{ScopeAdmin}, "")
	if err != nil {
		t.Fatal(err)
	}
	db.hold = make(chan chan struct{})
	done := make(chan error, 1)
	go func() { _, err := keys.Verify(ctx, token); done <- err }()
	release := <-db.hold // the lookup has read the key, still valid
	if _, err := keys.Revoke(ctx, "acme", created.ID); err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("the Verify that started before Revoke = %v", err)
	}
	db.hold = nil
	if _, err := keys.Verify(ctx, token); !errors.Is(err, ErrRevoked) {
		t.Errorf("Verify after Revoke = %v, want ErrRevoked", err)
	}
}

// TestRunHearsOtherProcesses: a key revoked or created by another process
// (the keys CLI) takes effect at once, not after the cache TTL.
func TestRunHearsOtherProcesses(t *testing.T) {
	open := opener(t)
	service := NewKeys(open(), Config{CacheTTL: time.Hour}, nil)
	cli := NewKeys(open(), Config{Confirm: time.Millisecond}, nil)
	run(t, service)
	ctx := context.Background()
	created, token, err := cli.Create(ctx, "acme", []Scope{ScopeAdmin}, "")
	if err != nil {
		t.Fatal(err)
	}
	testsupport.WaitFor(t, "the service to hear that a key exists", service.Exist)
	if _, err := service.Verify(ctx, token); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Revoke(ctx, "", created.ID); err != nil {
		t.Fatal(err)
	}
	testsupport.WaitFor(t, "the revocation to reach the service", func() bool {
		_, err := service.Verify(ctx, token)
		return errors.Is(err, ErrRevoked)
	})
}

// TestVerifyWithoutRunReadsTheStore: a process that does not follow key
// changes (Run not running, or its connection lost) trusts no cache: each
// call reads its key, and a revocation made elsewhere holds at once.
func TestVerifyWithoutRunReadsTheStore(t *testing.T) {
	db := &countingStore{DB: storetest.NewDB(t)}
	keys := NewKeys(db, Config{}, nil)
	ctx := context.Background()
	created, token, err := keys.Create(ctx, "acme", []Scope{ScopeQuery}, "")
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := keys.Verify(ctx, token); err != nil {
			t.Fatal(err)
		}
	}
	if n := db.lookups.Load(); n != 3 {
		t.Errorf("3 verifications without Run made %d lookups, want 3", n)
	}
	if _, err := db.RevokeAPIKey(ctx, created.ID, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := keys.Verify(ctx, token); !errors.Is(err, ErrRevoked) {
		t.Errorf("Verify after a revocation elsewhere = %v, want ErrRevoked", err)
	}
}

// TestRevocationHoldsEverywhereAtOnce: two services on one database, each
// with its guard, its key cache and its change listener, on a machine
// whose every CPU is busy. A key both services have just let in is
// revoked, through one service (RevokeApiKey) or by another process (the
// keys CLI); from the moment the revocation returns, neither service lets
// the key in, not even once.
func TestRevocationHoldsEverywhereAtOnce(t *testing.T) {
	open := opener(t)
	cfg := Config{CacheTTL: time.Hour, Confirm: 200 * time.Millisecond}
	var services []*Keys
	var guards []*Guard
	for range 2 {
		keys := NewKeys(open(), cfg, nil)
		run(t, keys)
		services = append(services, keys)
		guards = append(guards, NewGuard(keys, ModeKeys, testRules, nil))
	}
	cli := NewKeys(open(), cfg, nil) // connector-svc keys: no Run
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	t.Cleanup(cancel)
	for range runtime.NumCPU() { // load: every CPU spins
		wg.Go(func() {
			for ctx.Err() == nil {
			}
		})
	}

	const rounds = 20
	var accepted int
	for i := range rounds {
		key, token, err := services[i%2].Create(ctx, "acme", []Scope{ScopeQuery}, "")
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range guards {
			if _, err := unary(g, "/svc.S/Query", "Bearer "+token, &request{"acme"}); err != nil {
				t.Fatalf("a new key was refused: %v", err)
			}
		}
		revoker := services[0] // RevokeApiKey on the first service
		if i%2 == 1 {
			revoker = cli
		}
		if _, err := revoker.Revoke(ctx, "acme", key.ID); err != nil {
			t.Fatal(err)
		}
		for j, g := range []*Guard{guards[1], guards[0]} {
			if _, err := unary(g, "/svc.S/Query", "Bearer "+token, &request{"acme"}); err == nil {
				accepted++
				t.Errorf("round %d: service %d let a revoked key in after the revocation returned", i, 1-j)
			} else if r, _ := reason(err); r != ReasonKeyRevoked {
				t.Errorf("round %d: refused with %v, want API_KEY_REVOKED", i, err)
			}
		}
	}
	if accepted > 0 {
		t.Errorf("%d of %d checks let a revoked key in", accepted, 2*rounds)
	}
}

// opener returns a function that opens a new store on one fresh
// database each time it is called: the stores of several processes.
func opener(t *testing.T) func() *store.DB {
	url := storetest.NewURL(t)
	return func() *store.DB {
		db, err := store.Open(context.Background(), url, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(db.Close)
		return db
	}
}

// BenchmarkVerifyCached is what checking a known key costs a call while
// the listener confirms: a hash, a map lookup and a clock reading, no store
// round trip. Should the busy machine delay a confirmation past
// Config.Confirm, calls read the store meanwhile: lookups/op counts them.
func BenchmarkVerifyCached(b *testing.B) {
	keys, db := newKeys(b, Config{Confirm: time.Second})
	_, token, err := keys.Create(context.Background(), "acme", []Scope{ScopeAdmin}, "")
	if err != nil {
		b.Fatal(err)
	}
	if _, err := keys.Verify(context.Background(), token); err != nil {
		b.Fatal(err)
	}
	db.lookups.Store(0)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := keys.Verify(context.Background(), token); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.ReportMetric(float64(db.lookups.Load())/float64(b.N), "lookups/op")
}
