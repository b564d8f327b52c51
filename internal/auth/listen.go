package auth

import (
	"context"
	"log/slog"
	"time"
)

// Run follows key changes made by any process (the keys CLI, another
// replica) until ctx is done, and returns nil then. Each change empties the
// cache entry of its key at once, and every Config.Confirm/4 Run confirms
// that it has heard every change committed before: the cache is trusted
// only for Config.Confirm after that. While it cannot listen it retries
// with backoff, and every call reads its key's row meanwhile.
func (k *Keys) Run(ctx context.Context) error {
	wait := time.Second
	for {
		err := k.db.ListenAPIKeys(ctx, k.cfg.Confirm/4, func() {
			wait = time.Second
			k.resync(ctx)
		}, k.changed, k.confirm)
		if ctx.Err() != nil {
			return nil
		}
		k.logger.WarnContext(ctx, "cannot follow API key changes; retrying (every call reads its key from the database meanwhile)",
			slog.String("error", err.Error()), slog.Duration("retry_in", wait))
		k.forgetAll()
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, k.cfg.RetryMax)
	}
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
