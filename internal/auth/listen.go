package auth

import (
	"context"
	"log/slog"
	"time"

	"github.com/connector-svc/connector-svc/internal/store"
)

// Run follows key changes made by any process (the keys CLI, another
// replica) on a LISTEN connection of its own, until ctx is done, and
// returns nil then; a service follows them on its one listener instead
// (Follow). Each change empties the cache entry of its key at once, and
// every Config.Confirm/4 Run confirms that it has heard every change
// committed before: the cache is trusted only for Config.Confirm after
// that. While it cannot listen it retries with backoff, and every call
// reads its key's row meanwhile.
func (k *Keys) Run(ctx context.Context) error {
	l := k.db.NewListener(k.ConfirmInterval(), k.logger)
	k.Follow(l)
	return l.Run(ctx)
}

// resync runs each time Run starts listening: changes made before then were
// not heard, so the cache is emptied and whether keys exist re-read.
func (k *Keys) resync(ctx context.Context) {
	k.forgetAll()
	if err := k.Load(ctx); err != nil && ctx.Err() == nil {
		k.logger.WarnContext(ctx, "cannot read whether API keys exist", slog.String("error", err.Error()))
	}
}

// changed is told the id of each key created, revoked or deleted.
func (k *Keys) changed(id string) {
	k.forget(id)
	k.markExist()
}

// Follow follows key changes on l, the process's one LISTEN connection,
// as Run does on a connection of its own: give l an interval of at most
// ConfirmInterval, so that the cache stays trusted. Call it before l runs.
func (k *Keys) Follow(l *store.Listener) {
	l.Handle(store.APIKeysChannel, k.changed)
	l.OnListen(func() { k.resync(context.Background()) })
	l.OnConfirm(k.confirm)
	l.OnDown(func(error) { k.forgetAll() })
}

// ConfirmInterval is how often the listener Keys follow must confirm.
func (k *Keys) ConfirmInterval() time.Duration { return k.cfg.Confirm / 4 }
