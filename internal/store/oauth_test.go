package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

func TestOAuthClientRegisteredOnce(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewDB(t)
	if _, err := db.OAuthClient(ctx, "https://as.example", "https://svc/cb"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("OAuthClient before any registration: %v, want ErrNotFound", err)
	}
	const n = 8
	var wg sync.WaitGroup
	got := make([]*store.OAuthClient, n)
	inserted := make([]bool, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			got[i], inserted[i], errs[i] = db.AddOAuthClient(ctx, &store.OAuthClient{
				Issuer: "https://as.example", RedirectURI: "https://svc/cb", ClientID: fmt.Sprintf("client-%d", i),
				SealedSecret: []byte{byte(i)}, AuthMethod: "none", Kind: store.OAuthClientDCR,
			})
		})
	}
	wg.Wait()
	winners := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("AddOAuthClient %d: %v", i, errs[i])
		}
		if inserted[i] {
			winners++
		}
		if got[i].ClientID != got[0].ClientID || !bytes.Equal(got[i].SealedSecret, got[0].SealedSecret) {
			t.Errorf("replica %d uses client %q, replica 0 %q: want one registration used by all", i, got[i].ClientID, got[0].ClientID)
		}
	}
	if winners != 1 {
		t.Errorf("%d registrations inserted, want 1", winners)
	}
	// Another callback URL is another registration.
	other, ins, err := db.AddOAuthClient(ctx, &store.OAuthClient{Issuer: "https://as.example", RedirectURI: "https://svc2/cb",
		ClientID: "other", AuthMethod: "none", Kind: store.OAuthClientDCR})
	if err != nil || !ins || other.ClientID != "other" {
		t.Errorf("registration for another redirect URI: %+v inserted=%t err=%v", other, ins, err)
	}
}

// A registration the authorization server refuses is deleted only while
// it is still the one refused; an operator can delete an issuer's all.
func TestOAuthClientDeleted(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewDB(t)
	add := func(issuer, redirect, id string) {
		t.Helper()
		if _, ins, err := db.AddOAuthClient(ctx, &store.OAuthClient{Issuer: issuer, RedirectURI: redirect, ClientID: id,
			AuthMethod: "none", Kind: store.OAuthClientDCR}); err != nil || !ins {
			t.Fatalf("AddOAuthClient(%s, %s): inserted %t, %v", issuer, id, ins, err)
		}
	}
	add("https://as.example", "https://svc/cb", "first")
	add("https://as.example", "https://svc2/cb", "other-callback")
	add("https://as2.example", "https://svc/cb", "elsewhere")

	// Replaced meanwhile: the refusal of "old" leaves "first" be.
	if ok, err := db.DeleteOAuthClient(ctx, "https://as.example", "https://svc/cb", "old"); ok || err != nil {
		t.Errorf("DeleteOAuthClient of a replaced client = %t, %v; want false", ok, err)
	}
	if ok, err := db.DeleteOAuthClient(ctx, "https://as.example", "https://svc/cb", "first"); !ok || err != nil {
		t.Errorf("DeleteOAuthClient = %t, %v; want true", ok, err)
	}
	if _, err := db.OAuthClient(ctx, "https://as.example", "https://svc/cb"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("after the delete: %v, want ErrNotFound", err)
	}
	if c, err := db.OAuthClient(ctx, "https://as.example", "https://svc2/cb"); err != nil || c.ClientID != "other-callback" {
		t.Errorf("another callback's registration: %+v, %v", c, err)
	}
	add("https://as.example", "https://svc/cb", "second") // registered again

	if n, err := db.DeleteOAuthClients(ctx, "https://as.example"); n != 2 || err != nil {
		t.Errorf("DeleteOAuthClients = %d, %v; want 2", n, err)
	}
	if n, err := db.DeleteOAuthClients(ctx, "https://as.example"); n != 0 || err != nil {
		t.Errorf("DeleteOAuthClients again = %d, %v; want 0", n, err)
	}
	if c, err := db.OAuthClient(ctx, "https://as2.example", "https://svc/cb"); err != nil || c.ClientID != "elsewhere" {
		t.Errorf("another issuer's registration: %+v, %v", c, err)
	}
}

func TestOAuthPendingSingleUse(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewDB(t)
	c := mustCreate(t, db, newConnector("ws", "c1"))
	pending := func(hash string, expires time.Time) *store.OAuthPending {
		return &store.OAuthPending{StateHash: []byte(hash), WorkspaceID: "ws", ConnectorID: c.ID, UserID: "alice",
			SealedVerifier: []byte("sealed"), Issuer: "https://as", ClientID: "cid", AuthMethod: "none",
			Resource: "https://mcp/mcp", Scopes: []string{"read", "write"}, RedirectURI: "https://svc/cb",
			ReturnTo: "https://app/back", ExpiresAt: expires}
	}
	if err := db.CreateOAuthPending(ctx, pending("live", time.Now().Add(time.Minute))); err != nil {
		t.Fatal(err)
	}
	if err := db.CreateOAuthPending(ctx, pending("old", time.Now().Add(-time.Second))); err != nil {
		t.Fatal(err)
	}
	// Its workspace can be read, any number of times, without spending it.
	for range 2 {
		if ws, err := db.OAuthPendingWorkspace(ctx, []byte("live")); ws != "ws" || err != nil {
			t.Fatalf("OAuthPendingWorkspace(live) = %q, %v", ws, err)
		}
	}
	for _, h := range []string{"old", "unknown"} {
		if _, err := db.OAuthPendingWorkspace(ctx, []byte(h)); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("OAuthPendingWorkspace(%s): %v, want ErrNotFound", h, err)
		}
	}
	p, err := db.ConsumeOAuthPending(ctx, []byte("live"))
	if err != nil {
		t.Fatalf("first consume: %v", err)
	}
	if _, err := db.OAuthPendingWorkspace(ctx, []byte("live")); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("OAuthPendingWorkspace of a used state: %v, want ErrNotFound", err)
	}
	if p.UserID != "alice" || p.ConnectorID != c.ID || !slices.Equal(p.Scopes, []string{"read", "write"}) ||
		p.ReturnTo != "https://app/back" || p.UsedAt == nil {
		t.Errorf("consumed %+v", p)
	}
	for _, h := range []string{"live", "old", "unknown"} {
		if _, err := db.ConsumeOAuthPending(ctx, []byte(h)); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("consume %s: %v, want ErrNotFound", h, err)
		}
	}
	// Concurrent consumers of one state: one wins.
	if err := db.CreateOAuthPending(ctx, pending("race", time.Now().Add(time.Minute))); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins := 0
	for range 6 {
		wg.Go(func() {
			if _, err := db.ConsumeOAuthPending(ctx, []byte("race")); err == nil {
				mu.Lock()
				wins++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if wins != 1 {
		t.Errorf("%d consumers of one state succeeded, want 1", wins)
	}
	if n, err := db.DeleteStaleOAuthPending(ctx, 0); err != nil || n != 1 {
		t.Errorf("DeleteStaleOAuthPending = %d, %v; want the expired one", n, err)
	}
	if err := db.CreateOAuthPending(ctx, &store.OAuthPending{StateHash: []byte("x"), ConnectorID: c.ID + 1000,
		SealedVerifier: []byte("s"), ExpiresAt: time.Now().Add(time.Minute)}); !errors.Is(err, store.ErrConnectorNotFound) {
		t.Errorf("pending for a missing connector: %v, want ErrConnectorNotFound", err)
	}
}

func TestOAuthTokens(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewDB(t)
	c1 := mustCreate(t, db, newConnector("ws", "c1"))
	c2 := mustCreate(t, db, newConnector("ws", "c2"))
	c3 := mustCreate(t, db, newConnector("other", "c3"))
	exp := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	put := func(c *store.Connector, user string) *store.OAuthToken {
		t.Helper()
		got, err := db.PutOAuthToken(ctx, &store.OAuthToken{ConnectorID: c.ID, UserID: user, WorkspaceID: c.WorkspaceID,
			Issuer: "https://as", Resource: "https://mcp", ClientID: "cid", SealedAccess: []byte("a-" + user),
			SealedRefresh: []byte("r-" + user), Scopes: []string{"read"}, ExpiresAt: &exp})
		if err != nil {
			t.Fatalf("PutOAuthToken: %v", err)
		}
		return got
	}
	a := put(c1, "alice")
	if a.ConnectorExternalID != "c1" || a.TokenType != "Bearer" || !a.ExpiresAt.Equal(exp) || a.NeedsReauth {
		t.Errorf("stored %+v", a)
	}
	put(c1, "bob")
	put(c2, "alice")
	put(c1, "")
	put(c3, "alice")

	// A refused refresh records needs_reauth and still returns fn's error.
	errRefused := errors.New("refused")
	got, err := db.LockOAuthToken(ctx, c1.ID, "alice", func(cur *store.OAuthToken) (*store.OAuthToken, error) {
		next := *cur
		next.NeedsReauth, next.ReauthReason = true, "invalid_grant"
		return &next, errRefused
	})
	if !errors.Is(err, errRefused) || got == nil || !got.NeedsReauth {
		t.Fatalf("LockOAuthToken(mark) = %+v, %v", got, err)
	}
	if again, _ := db.OAuthToken(ctx, c1.ID, "alice"); !again.NeedsReauth || again.ReauthReason != "invalid_grant" {
		t.Errorf("after marking: %+v", again)
	}
	// A new authorization clears it.
	if a2 := put(c1, "alice"); a2.NeedsReauth {
		t.Errorf("PutOAuthToken kept needs_reauth")
	}

	// Holders of one row run one at a time, including for a row that
	// does not exist yet.
	var wg sync.WaitGroup
	for range 5 {
		wg.Go(func() {
			_, err := db.LockOAuthToken(ctx, c2.ID, "carol", func(cur *store.OAuthToken) (*store.OAuthToken, error) {
				n := 0
				if cur != nil {
					n = len(cur.SealedAccess)
				}
				time.Sleep(5 * time.Millisecond) // widen the window a lost update would need
				return &store.OAuthToken{WorkspaceID: "ws", Issuer: "https://as", Resource: "https://mcp", ClientID: "cid",
					SealedAccess: bytes.Repeat([]byte("x"), n+1)}, nil
			})
			if err != nil {
				t.Errorf("LockOAuthToken: %v", err)
			}
		})
	}
	wg.Wait()
	if carol, err := db.OAuthToken(ctx, c2.ID, "carol"); err != nil || len(carol.SealedAccess) != 5 {
		t.Errorf("after 5 serialized updates: %v (%v), want 5 bytes", carol, err)
	}

	list := func(f store.OAuthTokenFilter) []string {
		t.Helper()
		ts, err := db.ListOAuthTokens(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, tk := range ts {
			out = append(out, tk.ConnectorExternalID+"/"+tk.UserID)
		}
		return out
	}
	want := []string{"c1/", "c1/alice", "c1/bob", "c2/alice", "c2/carol"}
	if got := list(store.OAuthTokenFilter{WorkspaceID: "ws"}); !slices.Equal(got, want) {
		t.Errorf("list ws = %v, want %v", got, want)
	}
	if got := list(store.OAuthTokenFilter{WorkspaceID: "ws", UserID: "alice"}); !slices.Equal(got, []string{"c1/alice", "c2/alice"}) {
		t.Errorf("list alice = %v", got)
	}
	page := list(store.OAuthTokenFilter{WorkspaceID: "ws", AfterConnectorID: c1.ID, AfterUserID: "alice", Limit: 2})
	if !slices.Equal(page, []string{"c1/bob", "c2/alice"}) {
		t.Errorf("page after c1/alice = %v", page)
	}

	if ok, err := db.DeleteOAuthToken(ctx, c1.ID, "bob"); !ok || err != nil {
		t.Errorf("DeleteOAuthToken = %t, %v", ok, err)
	}
	if ok, _ := db.DeleteOAuthToken(ctx, c1.ID, "bob"); ok {
		t.Error("deleted bob twice")
	}
	if _, err := db.DeleteConnector(ctx, "ws", "c2"); err != nil {
		t.Fatal(err)
	}
	if got := list(store.OAuthTokenFilter{WorkspaceID: "ws"}); !slices.Equal(got, []string{"c1/", "c1/alice"}) {
		t.Errorf("after deleting c2: %v (its tokens must go with it)", got)
	}
	if n, err := db.DeleteOAuthTokens(ctx, c1.ID); n != 2 || err != nil {
		t.Errorf("DeleteOAuthTokens = %d, %v", n, err)
	}
	if _, err := db.PutOAuthToken(ctx, &store.OAuthToken{ConnectorID: c2.ID, UserID: "x", SealedAccess: []byte("a")}); !errors.Is(err, store.ErrConnectorNotFound) {
		t.Errorf("token for a deleted connector: %v, want ErrConnectorNotFound", err)
	}
}

func TestResealOAuth(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewDB(t)
	c := mustCreate(t, db, newConnector("ws", "c1"))
	if _, _, err := db.AddOAuthClient(ctx, &store.OAuthClient{Issuer: "https://as", RedirectURI: "https://cb", ClientID: "c",
		SealedSecret: []byte("s1"), AuthMethod: "client_secret_basic", Kind: store.OAuthClientDCR}); err != nil {
		t.Fatal(err)
	}
	if err := db.CreateOAuthPending(ctx, &store.OAuthPending{StateHash: []byte("h"), WorkspaceID: "ws", ConnectorID: c.ID,
		SealedVerifier: []byte("v1"), ExpiresAt: time.Now().Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.PutOAuthToken(ctx, &store.OAuthToken{ConnectorID: c.ID, UserID: "u", WorkspaceID: "ws",
		SealedAccess: []byte("a1"), SealedRefresh: []byte("r1")}); err != nil {
		t.Fatal(err)
	}
	var kinds []string
	n, err := db.ResealOAuth(ctx, func(v store.OAuthSealed) ([]byte, error) {
		kinds = append(kinds, v.Kind)
		return append([]byte("new-"), v.Sealed...), nil
	})
	if err != nil || n != 4 {
		t.Fatalf("ResealOAuth = %d, %v; want 4 values", n, err)
	}
	if !slices.Equal(kinds, []string{store.SealedOAuthClientSecret, store.SealedPendingVerifier, store.SealedAccessToken, store.SealedRefreshToken}) {
		t.Errorf("kinds %v", kinds)
	}
	tok, _ := db.OAuthToken(ctx, c.ID, "u")
	cl, _ := db.OAuthClient(ctx, "https://as", "https://cb")
	if string(tok.SealedAccess) != "new-a1" || string(tok.SealedRefresh) != "new-r1" || string(cl.SealedSecret) != "new-s1" {
		t.Errorf("after reseal: %q %q %q", tok.SealedAccess, tok.SealedRefresh, cl.SealedSecret)
	}
	boom := errors.New("boom")
	if _, err := db.ResealOAuth(ctx, func(store.OAuthSealed) ([]byte, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Errorf("failing reseal: %v", err)
	}
	if tok, _ := db.OAuthToken(ctx, c.ID, "u"); string(tok.SealedAccess) != "new-a1" {
		t.Errorf("a failed reseal changed a value: %q", tok.SealedAccess)
	}
}
