package store_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

func newAPIKey(ws, id string) *store.APIKey {
	return &store.APIKey{ID: id, WorkspaceID: ws, TokenSHA256: bytes.Repeat([]byte(id[:1]), 32),
		TokenHint: "ab" + id[:2], Scopes: []string{"query"}, Name: "key " + id}
}

func TestAPIKeyLifecycle(t *testing.T) {
	db := storetest.NewDB(t)
	ctx := context.Background()
	if exists, err := db.AnyAPIKeys(ctx); err != nil || exists {
		t.Fatalf("AnyAPIKeys on a new database = %v, %v; want false", exists, err)
	}
	want := newAPIKey("acme", "a1")
	want.Scopes = []string{"admin", "query"}
	created, err := db.CreateAPIKey(ctx, want)
	if err != nil {
		t.Fatal(err)
	}
	if created.CreatedAt.IsZero() || created.RevokedAt != nil {
		t.Errorf("created key = %+v", created)
	}
	if diff := cmp.Diff(want, created, cmpopts.IgnoreFields(store.APIKey{}, "CreatedAt")); diff != "" {
		t.Errorf("created key (-want +got):\n%s", diff)
	}
	got, err := db.APIKeyByHash(ctx, want.TokenSHA256)
	if err != nil || got.ID != "a1" {
		t.Fatalf("APIKeyByHash = %+v, %v", got, err)
	}
	if _, err := db.APIKeyByHash(ctx, bytes.Repeat([]byte{0}, 32)); !errors.Is(err, store.ErrAPIKeyNotFound) {
		t.Errorf("APIKeyByHash(unknown) = %v, want ErrAPIKeyNotFound", err)
	}
	if exists, err := db.AnyAPIKeys(ctx); err != nil || !exists {
		t.Errorf("AnyAPIKeys = %v, %v; want true", exists, err)
	}

	if _, err := db.RevokeAPIKey(ctx, "a1", "other"); !errors.Is(err, store.ErrAPIKeyNotFound) {
		t.Errorf("RevokeAPIKey in another workspace = %v, want ErrAPIKeyNotFound", err)
	}
	revoked, err := db.RevokeAPIKey(ctx, "a1", "acme")
	if err != nil || revoked.RevokedAt == nil {
		t.Fatalf("RevokeAPIKey = %+v, %v", revoked, err)
	}
	again, err := db.RevokeAPIKey(ctx, "a1", "")
	if err != nil || !again.RevokedAt.Equal(*revoked.RevokedAt) {
		t.Errorf("second RevokeAPIKey = %+v, %v; want the first revocation time %v", again, err, revoked.RevokedAt)
	}
	if got, err := db.APIKeyByHash(ctx, want.TokenSHA256); err != nil || got.RevokedAt == nil {
		t.Errorf("APIKeyByHash(revoked) = %+v, %v; want the key, revoked", got, err)
	}
	if exists, err := db.AnyAPIKeys(ctx); err != nil || !exists {
		t.Errorf("AnyAPIKeys with only a revoked key = %v, %v; want true", exists, err)
	}
}

func TestAPIKeyConstraints(t *testing.T) {
	db := storetest.NewDB(t)
	ctx := context.Background()
	if _, err := db.CreateAPIKey(ctx, newAPIKey("acme", "a1")); err != nil {
		t.Fatal(err)
	}
	sameID := newAPIKey("acme", "a1")
	sameID.TokenSHA256 = bytes.Repeat([]byte{7}, 32)
	sameHash := newAPIKey("acme", "a2")
	sameHash.TokenSHA256 = bytes.Repeat([]byte("a"), 32)
	for name, k := range map[string]*store.APIKey{"same id": sameID, "same token hash": sameHash} {
		if _, err := db.CreateAPIKey(ctx, k); !errors.Is(err, store.ErrConflict) {
			t.Errorf("%s: CreateAPIKey = %v, want ErrConflict", name, err)
		}
	}
	for name, scopes := range map[string][]string{"no scope": {}, "unknown scope": {"root"}} {
		k := newAPIKey("acme", "b1")
		k.Scopes = scopes
		if _, err := db.CreateAPIKey(ctx, k); err == nil {
			t.Errorf("%s: CreateAPIKey succeeded", name)
		}
	}
}

func TestListAPIKeysPagesWithinWorkspace(t *testing.T) {
	db := storetest.NewDB(t)
	ctx := context.Background()
	for _, id := range []string{"c3", "a1", "b2", "d4"} {
		if _, err := db.CreateAPIKey(ctx, newAPIKey("acme", id)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.CreateAPIKey(ctx, newAPIKey("other", "e5")); err != nil {
		t.Fatal(err)
	}
	ids := func(ks []*store.APIKey) (out []string) {
		for _, k := range ks {
			out = append(out, k.ID)
		}
		return out
	}
	first, err := db.ListAPIKeys(ctx, "acme", "", 3)
	if err != nil {
		t.Fatal(err)
	}
	rest, err := db.ListAPIKeys(ctx, "acme", "c3", 3)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"a1", "b2", "c3", "d4"}, append(ids(first), ids(rest)...)); diff != "" {
		t.Errorf("pages (-want +got):\n%s", diff)
	}
}

// TestListenerHearsAPIKeys checks that creations and revocations by another
// process (here another pool) reach a Listener as they commit, and that a
// confirmation whose round trip started after a change committed comes
// after that change was passed on.
func TestListenerHearsAPIKeys(t *testing.T) {
	url := storetest.NewURL(t)
	listener, err := store.Open(context.Background(), url, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(listener.Close)
	writer, err := store.Open(context.Background(), url, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(writer.Close)

	type confirmation struct {
		since   time.Time
		changes int // heard by then
	}
	ctx, cancel := context.WithCancel(context.Background())
	listening := make(chan struct{})
	changed := make(chan string, 10)
	confirmed := make(chan confirmation, 1000)
	var heard int // only the listener's goroutine touches it
	done := make(chan error, 1)
	l := listener.NewListener(10*time.Millisecond, nil)
	l.Handle(store.APIKeysChannel, func(id string) { heard++; changed <- id })
	l.OnListen(func() { close(listening) })
	l.OnConfirm(func(since time.Time) {
		select {
		case confirmed <- confirmation{since, heard}:
		default:
		}
	})
	go func() { done <- l.Run(ctx) }()
	select {
	case <-listening:
	case err := <-done:
		t.Fatalf("the listener returned before listening: %v", err)
	}
	if _, err := writer.CreateAPIKey(ctx, newAPIKey("acme", "a1")); err != nil {
		t.Fatal(err)
	}
	if _, err := writer.RevokeAPIKey(ctx, "a1", ""); err != nil {
		t.Fatal(err)
	}
	committed := time.Now()
	for {
		select {
		case c := <-confirmed:
			if !c.since.After(committed) {
				continue
			}
			if c.changes != 2 {
				t.Errorf("a confirmation started after both changes committed had heard %d of them", c.changes)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no confirmation")
		}
		break
	}
	for _, what := range []string{"creation", "revocation"} {
		select {
		case id := <-changed:
			if id != "a1" {
				t.Errorf("%s: notified %q, want a1", what, id)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no notification of the %s", what)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("the listener's Run after cancel = %v, want nil", err)
	}
}
