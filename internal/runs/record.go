package runs

import (
	"bytes"
	"context"
	"encoding/json"
	"time"

	"github.com/google/uuid"

	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/store"
)

// Every query run is kept as a row of query_runs (store.Run). A run whose
// id its caller gets is written before the caller hears of it: GetQueryRun
// on that id must find it at once, on any replica, and resuming a paused
// run needs the row, after a restart too.

// NewID returns a run id; ids sort by creation time (UUIDv7), which
// listing runs in order and paging rely on.
func NewID() string { return uuid.Must(uuid.NewV7()).String() }

// Trace is what a run row's trace holds: the result without its contexts
// (the structured content of tool results, which can be large: the steps'
// excerpts stay) and without the resume state, which has its own column.
type Trace struct {
	ConnectorName string
	Result        orchestrator.Result
}

var statuses = map[orchestrator.Status]string{
	orchestrator.StatusCompleted:             store.RunCompleted,
	orchestrator.StatusBudgetExhausted:       store.RunBudgetExhausted,
	orchestrator.StatusPlanned:               store.RunPlanned,
	orchestrator.StatusAwaitingApproval:      store.RunAwaitingApproval,
	orchestrator.StatusAwaitingAuthorization: store.RunAwaitingAuthorization,
	orchestrator.StatusAwaitingInput:         store.RunAwaitingInput,
}

// Record is the row of a run of the connector named name that ended with
// res, or failed with runErr (res may then be nil), whose caller was told
// errMsg. A paused run carries its state and expires after
// approvalTimeout.
func Record(base *store.Run, name string, res *orchestrator.Result, runErr error, errMsg string, approvalTimeout time.Duration) (*store.Run, error) {
	rec := *base
	now := time.Now()
	rec.ExpiresAt, rec.FinishedAt, rec.State = nil, nil, nil
	if res == nil {
		res = &orchestrator.Result{}
	}
	b, err := TraceJSON(name, res)
	if err != nil {
		return nil, err
	}
	rec.Trace = b
	rec.Answer, rec.Duration = res.Answer, res.Duration
	rec.PromptTokens, rec.CompletionTokens = res.Usage.PromptTokens, res.Usage.CompletionTokens
	switch {
	case runErr != nil:
		rec.Status, rec.Error, rec.FinishedAt = store.RunFailed, errMsg, &now
	case res.Status == orchestrator.StatusAwaitingApproval, res.Status == orchestrator.StatusAwaitingAuthorization,
		res.Status == orchestrator.StatusAwaitingInput:
		rec.Status = statuses[res.Status]
		if rec.State, err = orchestrator.EncodeState(res.State); err != nil {
			return nil, err
		}
		exp := now.Add(approvalTimeout)
		rec.ExpiresAt = &exp
	default:
		rec.Status, rec.FinishedAt = statuses[res.Status], &now
	}
	return &rec, nil
}

// RecordLive is the row of a run of the connector named name paused live
// for input: its tool call is open on replica, which holds the run (its
// heartbeat goes on), until expires, the input's deadline. snapshot is
// the run so far; it has no state: only that replica can go on with it.
func RecordLive(base *store.Run, name string, snapshot *orchestrator.Result, expires time.Time, replica string) (*store.Run, error) {
	rec := *base
	b, err := TraceJSON(name, snapshot)
	if err != nil {
		return nil, err
	}
	rec.Trace, rec.State, rec.FinishedAt = b, nil, nil
	rec.Status, rec.Answer, rec.Duration = store.RunAwaitingInput, "", snapshot.Duration
	rec.PromptTokens, rec.CompletionTokens = snapshot.Usage.PromptTokens, snapshot.Usage.CompletionTokens
	rec.ExpiresAt, rec.HeldBy = &expires, replica
	return &rec, nil
}

// Keep records a run. A run whose id its caller gets is readable at once,
// on every replica: a paused run and every resumed one is written before
// the caller hears of it; a new run that finished is queued, written at
// once by Run, and read from memory by this replica's GetRun (and waited
// for by the others') until then. A paused
// run (for approval or authorization) that cannot be written fails (it
// could never be resumed); a finished
// one is queued for the background writer instead, and its caller still
// gets the answer. A new run that failed gives its caller no id: it is
// queued.
func (l *Log) Keep(ctx context.Context, rec *store.Run, resumed bool) error {
	wasPaused := l.finishPause(rec)
	if rec.Status == store.RunFailed && !resumed {
		l.Add(rec)
		return nil
	}
	if !wasPaused && l.queueFinished(rec, resumed) {
		return nil
	}
	err := l.Save(ctx, rec)
	if err == nil && rec.Status == store.RunAwaitingInput && rec.HeldBy != "" && l.db != nil {
		l.mu.Lock()
		l.paused[rec.ID] = struct{}{}
		l.mu.Unlock()
	}
	if err != nil && rec.Status != store.RunAwaitingApproval && rec.Status != store.RunAwaitingAuthorization &&
		rec.Status != store.RunAwaitingInput {
		l.Add(rec)
	}
	return err
}

// finishPause forgets a live pause of rec's run (paused for input, held
// here) once rec ends it, and says whether there was one.
func (l *Log) finishPause(rec *store.Run) bool {
	if rec.FinishedAt == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.paused[rec.ID]
	delete(l.paused, rec.ID)
	return ok
}

// queueFinished queues a new run that finished and whose row was never
// written as paused: its caller gets the answer without waiting for the
// write, GetRun reads it from memory here until Run has written it (at
// once), and other replicas wait for the row.
func (l *Log) queueFinished(rec *store.Run, resumed bool) bool {
	if rec.FinishedAt == nil || resumed || l.db == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending = append(l.pending, rec)
	l.unwritten[rec.ID] = rec
	select {
	case l.kick <- struct{}{}:
	default:
	}
	return true
}

// TraceJSON is the trace of a run of the connector named name.
func TraceJSON(name string, res *orchestrator.Result) (json.RawMessage, error) {
	tr := Trace{ConnectorName: name, Result: *res}
	tr.Result.Contexts, tr.Result.State = nil, nil
	return json.Marshal(tr)
}

// ReadTrace reads a run row's trace; numbers in arguments stay as written.
func ReadTrace(b []byte) (Trace, error) {
	var tr Trace
	if len(b) == 0 {
		return tr, nil
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	err := d.Decode(&tr)
	return tr, err
}
