package auth

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/connector-svc/connector-svc/internal/store"
)

// KeyStore is the storage Keys needs; *store.DB implements it. An interface
// so that tests can count the lookups the cache saves.
type KeyStore interface {
	CreateAPIKey(ctx context.Context, k *store.APIKey) (*store.APIKey, error)
	APIKeyByHash(ctx context.Context, tokenSHA256 []byte) (*store.APIKey, error)
	ListAPIKeys(ctx context.Context, workspaceID, after string, limit int) ([]*store.APIKey, error)
	RevokeAPIKey(ctx context.Context, id, workspaceID string) (*store.APIKey, error)
	AnyAPIKeys(ctx context.Context) (bool, error)
	NewListener(interval time.Duration, logger *slog.Logger) *store.Listener
}

// Config tunes Keys; zero values take the defaults.
type Config struct {
	// CacheTTL bounds how long a verified key is kept without reading its
	// row again (30s).
	CacheTTL time.Duration
	// Confirm is how long the cache is trusted after Run last confirmed
	// that it has heard every key change committed before (1s); Run
	// confirms every Confirm/4. Revoke waits Confirm before it returns, so
	// that every service has heard of the revocation or stopped trusting
	// its cache by then.
	Confirm time.Duration
	// LookupTimeout bounds one store lookup of a key (5s).
	LookupTimeout time.Duration
	// OnFirstKey, if set, is called once when this process learns that the
	// first key exists after Load found none: created here, or told by Run
	// of one created elsewhere (another replica, the keys CLI).
	OnFirstKey func()
}

// Keys creates, lists, revokes and verifies API keys. Verify answers from a
// cache, so a known key costs no database round trip, while Run confirms
// that this process has heard of every key change: Run drops a changed key
// from the cache as the change commits, whichever process made it, and
// without a recent confirmation (Run not running, its connection down or
// slow) every Verify reads the key's row. Revoke returns once every
// service has either heard of the revocation or stopped trusting its
// cache. Safe for concurrent use.
type Keys struct {
	db     KeyStore
	cfg    Config
	logger *slog.Logger
	now    func() time.Time

	// exist is whether any key was ever created: ModeAuto turns auth on
	// when it becomes true.
	exist   atomic.Bool
	loaded  atomic.Bool // Load has run: a key appearing from now on is news
	lookups singleflight.Group

	// confirmed is when the last round trip of Run that confirmed every
	// change committed before it had been heard started (nil: none yet).
	confirmed atomic.Pointer[time.Time]

	mu    sync.RWMutex
	cache map[[sha256.Size]byte]cached
	// gen counts invalidations: a lookup that started before one must not
	// put what it read into the cache.
	gen uint64
}

type cached struct {
	key   Key
	until time.Time
}

// NewKeys returns Keys over db. It does no I/O: Load reads whether keys
// exist, Run follows changes.
func NewKeys(db KeyStore, cfg Config, logger *slog.Logger) *Keys {
	if cfg.CacheTTL <= 0 {
		cfg.CacheTTL = 30 * time.Second
	}
	if cfg.LookupTimeout <= 0 {
		cfg.LookupTimeout = 5 * time.Second
	}
	if cfg.Confirm <= 0 {
		cfg.Confirm = time.Second
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Keys{db: db, cfg: cfg, logger: logger, now: time.Now, cache: map[[sha256.Size]byte]cached{}}
}

// Load reads whether any key exists. Once true, Exist stays true in this
// process, even if someone deletes every key by hand: auth never turns
// itself off.
func (k *Keys) Load(ctx context.Context) error {
	exist, err := k.db.AnyAPIKeys(ctx)
	if err != nil {
		return err
	}
	if exist {
		k.markExist()
	}
	k.loaded.Store(true)
	return nil
}

// markExist records that a key exists, and calls OnFirstKey if it is the
// first this process hears of after Load.
func (k *Keys) markExist() {
	if !k.exist.Swap(true) && k.loaded.Load() && k.cfg.OnFirstKey != nil {
		k.cfg.OnFirstKey()
	}
}

// Exist reports whether any key was ever created (revoked ones count), as
// far as this process knows: at Load, by Create, or told by Run.
func (k *Keys) Exist() bool { return k.exist.Load() }

// Create makes a key of a workspace with the given scopes (see
// ParseScopes) and returns it with its token. The token is not stored and
// cannot be shown again.
func (k *Keys) Create(ctx context.Context, workspaceID string, scopes []Scope, name string) (Key, string, error) {
	if workspaceID == "" || len(scopes) == 0 {
		return Key{}, "", errors.New("create API key: a workspace and a scope are required")
	}
	names := make([]string, len(scopes))
	for i, s := range scopes {
		names[i] = string(s)
	}
	for attempt := 0; ; attempt++ {
		id, token := newToken()
		h := hashToken(token)
		row, err := k.db.CreateAPIKey(ctx, &store.APIKey{ID: id, WorkspaceID: workspaceID, TokenSHA256: h[:],
			TokenHint: hint(token), Scopes: names, Name: name})
		if errors.Is(err, store.ErrConflict) { // 40 random bits of id: rare
			if attempt < 3 {
				continue
			}
			return Key{}, "", errors.New("create API key: no free key id after 4 attempts")
		}
		if err != nil {
			return Key{}, "", err
		}
		k.markExist()
		return fromStore(row), token, nil
	}
}

// List returns up to limit keys of a workspace, revoked ones included,
// whose ids sort after the id after, in id order.
func (k *Keys) List(ctx context.Context, workspaceID, after string, limit int) ([]Key, error) {
	rows, err := k.db.ListAPIKeys(ctx, workspaceID, after, limit)
	if err != nil {
		return nil, err
	}
	keys := make([]Key, len(rows))
	for i, r := range rows {
		keys[i] = fromStore(r)
	}
	return keys, nil
}

// Revoke revokes a key; calls with it fail in every service on the same
// database from the moment Revoke returns, which takes Config.Confirm
// after the revocation commits: by then each service has heard of it, or
// stopped trusting its cache. workspaceID, when not empty, must be the
// key's. Returns store.ErrAPIKeyNotFound if there is no such key (in that
// workspace), or ctx's error, wrapped, if ctx ends before the wait (the
// key is revoked all the same). Revoking a revoked key returns it
// unchanged, after the same wait.
func (k *Keys) Revoke(ctx context.Context, workspaceID, id string) (Key, error) {
	row, err := k.db.RevokeAPIKey(ctx, id, workspaceID)
	if err != nil {
		return Key{}, err
	}
	k.forget(id)
	t := time.NewTimer(k.cfg.Confirm)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return fromStore(row), fmt.Errorf("API key %s is revoked; other services may still accept it for up to %v: %w", id, k.cfg.Confirm, ctx.Err())
	}
	return fromStore(row), nil
}

// Verify returns the key whose token this is. It returns ErrUnknownKey for
// a token no key has, ErrRevoked (with the key) for a revoked one, and a
// wrapped store error when the store cannot answer. A key seen within
// CacheTTL is answered from memory while Run's confirmations are recent;
// otherwise the key's row is read.
func (k *Keys) Verify(ctx context.Context, token string) (Key, error) {
	if token == "" {
		return Key{}, ErrNoKey
	}
	if !wellFormed(token) {
		return Key{}, ErrUnknownKey
	}
	h := hashToken(token)
	if !k.trusted() {
		// A lookup shared with others may have started before a
		// revocation this process has not heard of: read on our own.
		c, err := k.lookup(ctx, h, 0, false)
		if err != nil {
			return Key{}, err
		}
		return c.key, c.err()
	}
	k.mu.RLock()
	c, ok := k.cache[h]
	gen := k.gen
	k.mu.RUnlock()
	if !ok || !k.now().Before(c.until) {
		// One lookup per token and generation, however many callers wait.
		v, err, _ := k.lookups.Do(strconv.FormatUint(gen, 10)+string(h[:]), func() (any, error) {
			return k.lookup(ctx, h, gen, true)
		})
		if err != nil {
			return Key{}, err
		}
		c = v.(cached)
	}
	return c.key, c.err()
}

// trusted reports whether Run confirmed, within Config.Confirm, that this
// process has heard of every key change committed before.
func (k *Keys) trusted() bool {
	t := k.confirmed.Load()
	return t != nil && time.Since(*t) < k.cfg.Confirm
}

// confirm records a confirmation of Run that started at since.
func (k *Keys) confirm(since time.Time) {
	if t := k.confirmed.Load(); t == nil || since.After(*t) {
		k.confirmed.Store(&since)
	}
}

// err is ErrRevoked for a revoked key.
func (c cached) err() error {
	if c.key.RevokedAt != nil {
		return ErrRevoked
	}
	return nil
}

// lookup reads a key from the store and, with keep, caches it, unless the
// cache was invalidated since generation gen.
func (k *Keys) lookup(ctx context.Context, h [sha256.Size]byte, gen uint64, keep bool) (cached, error) {
	// Shared by every caller waiting on this token: not cancelled by one.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), k.cfg.LookupTimeout)
	defer cancel()
	row, err := k.db.APIKeyByHash(ctx, h[:])
	if errors.Is(err, store.ErrAPIKeyNotFound) {
		return cached{}, ErrUnknownKey
	}
	if err != nil {
		return cached{}, fmt.Errorf("verify API key: %w", err)
	}
	c := cached{key: fromStore(row), until: k.now().Add(k.cfg.CacheTTL)}
	k.markExist()
	if keep {
		k.mu.Lock()
		if k.gen == gen {
			k.cache[h] = c
		}
		k.mu.Unlock()
	}
	return c, nil
}

// forget drops what the cache holds of key id.
func (k *Keys) forget(id string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.gen++
	for h, c := range k.cache {
		if c.key.ID == id {
			delete(k.cache, h)
		}
	}
}

// forgetAll empties the cache.
func (k *Keys) forgetAll() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.gen++
	clear(k.cache)
}

func fromStore(r *store.APIKey) Key {
	k := Key{ID: r.ID, WorkspaceID: r.WorkspaceID, Name: r.Name, Hint: r.TokenHint, CreatedAt: r.CreatedAt, RevokedAt: r.RevokedAt}
	for _, s := range r.Scopes {
		k.Scopes = append(k.Scopes, Scope(s))
	}
	return k
}
