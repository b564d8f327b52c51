package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ConnectorChangesChannel is the channel migration 006's triggers notify
// with a ConnectorChange for every change of a connector's config_version,
// and its insert and delete.
const ConnectorChangesChannel = "connector_changes"

// ConnectorChange is the payload of a ConnectorChangesChannel notification:
// ids and versions only, never a secret.
type ConnectorChange struct {
	ID      int64 `json:"id"`
	Version int64 `json:"version"`
	Deleted bool  `json:"deleted"`
}

// ParseConnectorChange reads a ConnectorChangesChannel payload.
func ParseConnectorChange(payload string) (ConnectorChange, error) {
	var c ConnectorChange
	if err := json.Unmarshal([]byte(payload), &c); err != nil || c.ID == 0 {
		return ConnectorChange{}, fmt.Errorf("connector change %q: not an id and a version", payload)
	}
	return c, nil
}

// ConnectorByID returns connector id whatever its workspace. Returns
// ErrConnectorNotFound if it does not exist (any more).
func (db *DB) ConnectorByID(ctx context.Context, id int64) (*Connector, error) {
	c, err := scanConnector(db.pool.QueryRow(ctx, `SELECT `+connectorColumns+` FROM connectors c WHERE c.id = $1`, id))
	if err != nil {
		return nil, fmt.Errorf("get connector %d: %w", id, translate(err, ErrConnectorNotFound))
	}
	return c, nil
}

// ConnectorVersions returns the config_version of every connector, active
// or not, by id: what a full reconcile compares its live copies with.
func (db *DB) ConnectorVersions(ctx context.Context) (map[int64]int64, error) {
	rows, err := db.pool.Query(ctx, `SELECT id, config_version FROM connectors`)
	if err != nil {
		return nil, fmt.Errorf("connector versions: %w", err)
	}
	out := map[int64]int64{}
	var id, v int64
	_, err = pgx.ForEachRow(rows, []any{&id, &v}, func() error {
		out[id] = v
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("connector versions: %w", err)
	}
	return out, nil
}

// ListenerApplicationName is the application_name of the listener's
// connection, followed by ":" and the replica's id when it has one
// (Listener.Named), so that operators (and tests) can find it in
// pg_stat_activity.
const ListenerApplicationName = "connector-svc-listener"

// Listener holds the process's one LISTEN connection and passes each
// notification to the handler of its channel. Register handlers before Run.
type Listener struct {
	db       *DB
	interval time.Duration
	logger   *slog.Logger
	appName  string
	replica  string // "" unnamed
	handlers map[string]func(payload string)
	listened []func()
	confirms []func(since time.Time)
	downs    []func(err error)
}

// NewListener returns a Listener on db that makes a round trip on its
// connection every interval (see OnConfirm).
func (db *DB) NewListener(interval time.Duration, logger *slog.Logger) *Listener {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Listener{db: db, interval: interval, logger: logger, appName: ListenerApplicationName, handlers: map[string]func(string){}}
}

// Named names the listening connection after replica in pg_stat_activity:
// ListenerApplicationName + ":" + replica, and records in replica's row,
// over that connection, each time it starts listening (listening_since):
// when the connection closes, the others see the replica gone
// (ExpireVanishedReplicas). It returns l.
func (l *Listener) Named(replica string) *Listener {
	l.appName, l.replica = listenerName(replica), replica
	return l
}

// Handle calls fn with the payload of every notification on channel. fn
// runs on the listener's goroutine: it must not block for long.
func (l *Listener) Handle(channel string, fn func(payload string)) { l.handlers[channel] = fn }

// OnListen calls fn each time the listener has (re)started listening:
// what changed while it was not listening was not heard, so fn re-reads
// what it follows. A notification may also be heard twice around it;
// handlers must take repeats.
func (l *Listener) OnListen(fn func()) { l.listened = append(l.listened, fn) }

// OnConfirm calls fn every interval with the time a round trip on the
// listening connection started: every change committed before that time
// has reached its handler by then (Postgres sends a listening session its
// notifications before it answers a later query).
func (l *Listener) OnConfirm(fn func(since time.Time)) { l.confirms = append(l.confirms, fn) }

// OnDown calls fn when the connection fails; nothing is heard until the
// next OnListen.
func (l *Listener) OnDown(fn func(err error)) { l.downs = append(l.downs, fn) }

// Run listens until ctx is done and returns nil then. When the connection
// fails it tells OnDown, and listens again with backoff (1 s doubling to
// 30 s).
func (l *Listener) Run(ctx context.Context) error {
	wait := time.Second
	for {
		err := l.listen(ctx, func() { wait = time.Second })
		if ctx.Err() != nil {
			return nil
		}
		for _, fn := range l.downs {
			fn(err)
		}
		l.logger.WarnContext(ctx, "not listening for changes; retrying", slog.String("error", err.Error()),
			slog.Duration("retry_in", wait))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, 30*time.Second)
	}
}

func (l *Listener) listen(ctx context.Context, listening func()) error {
	cfg := l.db.pool.Config().ConnConfig.Copy()
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["application_name"] = l.appName
	cfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) {
		if fn := l.handlers[n.Channel]; fn != nil {
			fn(n.Payload)
		}
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("listen for changes: %w", err)
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	for ch := range l.handlers {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			return fmt.Errorf("listen on %s: %w", ch, err)
		}
	}
	if l.replica != "" {
		// Over this connection, so that it is known to be up: from now on,
		// its closing tells the others this replica died
		// (ExpireVanishedReplicas).
		if _, err := conn.Exec(ctx, `UPDATE replicas SET listening_since = now() WHERE id = $1`, l.replica); err != nil {
			return fmt.Errorf("listen for changes: %w", err)
		}
	}
	listening()
	for _, fn := range l.listened {
		fn()
	}
	for {
		start := time.Now()
		if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("listen for changes: %w", err)
		}
		for _, fn := range l.confirms {
			fn(start)
		}
		// Notifications that come meanwhile reach their handlers at once.
		wait, cancel := context.WithTimeout(ctx, l.interval)
		err := conn.PgConn().WaitForNotification(wait)
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil && !pgconn.Timeout(err) && !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("listen for changes: %w", err)
		}
	}
}

// ActiveConnectorIDs returns the ids of the active connectors, in order:
// the keys the replicas share ownership of.
func (db *DB) ActiveConnectorIDs(ctx context.Context) ([]int64, error) {
	rows, err := db.pool.Query(ctx, `SELECT id FROM connectors WHERE active ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("active connector ids: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("active connector ids: %w", err)
	}
	return ids, nil
}
