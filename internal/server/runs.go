package server

import (
	"bytes"
	"context"
	"encoding/json"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc/status"

	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/store"
)

// Every query run is kept as a row of query_runs (store.Run), written
// through runs.Log. A run whose id its caller gets is written before the
// caller hears of it: GetQueryRun on that id must find it at once, on any
// replica, and resuming a paused run needs the row, after a restart too.

// Run record defaults (Config.ApprovalTimeout, and the sweeper's
// retention).
const (
	DefaultApprovalTimeout = 24 * time.Hour
	DefaultRunRetention    = 30 * 24 * time.Hour
)

// newRunID returns a run id; ids sort by creation time (UUIDv7), which
// ListQueryRuns' order and paging rely on.
func newRunID() string {
	return uuid.Must(uuid.NewV7()).String()
}

// runTrace is what a run row's trace holds: the result without its
// contexts (the structured content of tool results, which can be large:
// the steps' excerpts stay) and without the resume state, which has its
// own column.
type runTrace struct {
	ConnectorName string
	Result        orchestrator.Result
}

var runStatuses = map[orchestrator.Status]string{
	orchestrator.StatusCompleted:        store.RunCompleted,
	orchestrator.StatusBudgetExhausted:  store.RunBudgetExhausted,
	orchestrator.StatusPlanned:          store.RunPlanned,
	orchestrator.StatusAwaitingApproval: store.RunAwaitingApproval,
}

// runRecord is the row of a run that ended with res and err (res may be
// nil when err is set). A paused run carries its state and expiry.
func (s *Server) runRecord(ctx context.Context, base *store.Run, name string, res *orchestrator.Result, runErr error) (*store.Run, error) {
	rec := *base
	now := time.Now()
	rec.ExpiresAt, rec.FinishedAt, rec.State = nil, nil, nil
	if res == nil {
		res = &orchestrator.Result{}
	}
	b, err := traceJSON(name, res)
	if err != nil {
		return nil, err
	}
	rec.Trace = b
	rec.Answer, rec.Duration = res.Answer, res.Duration
	rec.PromptTokens, rec.CompletionTokens = res.Usage.PromptTokens, res.Usage.CompletionTokens
	switch {
	case runErr != nil:
		rec.Status, rec.Error, rec.FinishedAt = store.RunFailed, status.Convert(s.toStatus(ctx, runErr)).Message(), &now
	case res.Status == orchestrator.StatusAwaitingApproval:
		rec.Status = store.RunAwaitingApproval
		if rec.State, err = orchestrator.EncodeState(res.State); err != nil {
			return nil, err
		}
		exp := now.Add(s.cfg.ApprovalTimeout)
		rec.ExpiresAt = &exp
	default:
		rec.Status, rec.FinishedAt = runStatuses[res.Status], &now
	}
	return &rec, nil
}

// keepRun records a run. A run whose id its caller gets (one that ended
// with a result or paused, and every resumed one) is written before the
// caller hears of it, so GetQueryRun finds it at once, on every replica.
// A paused run that cannot be written fails (it could never be resumed);
// a finished one is queued for the background writer instead, and its
// caller still gets the answer. A new run that failed gives its caller no
// id: it is queued.
func (s *Server) keepRun(ctx context.Context, rec *store.Run, resumed bool) error {
	if rec.Status == store.RunFailed && !resumed {
		s.runs.Add(rec)
		return nil
	}
	err := s.runs.Save(ctx, rec)
	if err != nil && rec.Status != store.RunAwaitingApproval {
		s.runs.Add(rec)
	}
	return err
}

// traceJSON is the trace of a run of the connector named name.
func traceJSON(name string, res *orchestrator.Result) (json.RawMessage, error) {
	tr := runTrace{ConnectorName: name, Result: *res}
	tr.Result.Contexts, tr.Result.State = nil, nil
	return json.Marshal(tr)
}

// readTrace reads a run row's trace; numbers in arguments stay as written.
func readTrace(b []byte) (runTrace, error) {
	var tr runTrace
	if len(b) == 0 {
		return tr, nil
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	err := d.Decode(&tr)
	return tr, err
}
