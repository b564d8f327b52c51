package server_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
)

// BenchmarkApproval measures what a pause for approval costs: the same
// query (the model asks for one echo call, then answers; an instant fake
// model) on a connector whose calls need no approval, and, in turn, on one
// whose calls all do — the query that pauses, and the ResumeQuery that
// approves the call and finishes the run. It reports each one's p50 and
// the bytes a paused run and a finished one take in Postgres.
func BenchmarkApproval(b *testing.B) {
	ctx := context.Background()
	model := newInstantModel(b)
	f := setup(b, options{llmURL: model.url()})
	mcpURL := benchMCP(b, 0)
	for id, policy := range map[string]connectorv1.ApprovalPolicy{"free": connectorv1.ApprovalPolicy_APPROVAL_POLICY_NONE,
		"gated": connectorv1.ApprovalPolicy_APPROVAL_POLICY_ALL} {
		c := mcpConnector(id, mcpURL)
		c.ApprovalPolicy = policy
		if _, err := f.client.CreateConnector(ctx, &connectorv1.CreateConnectorRequest{WorkspaceId: "ws", Connector: c}); err != nil {
			b.Fatal(err)
		}
	}
	query := func(id string) (*connectorv1.QueryResult, error) {
		resp, err := f.client.QueryConnector(ctx, &connectorv1.QueryConnectorRequest{WorkspaceId: "ws", ConnectorId: id, Query: "Echo hi."})
		return resp.GetResult(), err
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		a, errA := query("free")
		g, errG := query("gated")
		if errA == nil && errG == nil && len(a.GetToolsUsed()) == 1 && g.GetStatus() == connectorv1.QueryStatus_QUERY_STATUS_AWAITING_APPROVAL {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("the connectors did not answer: %v, %v", errA, errG)
		}
	}
	resume := func(p *connectorv1.QueryResult) error {
		_, err := f.client.ResumeQuery(ctx, &connectorv1.ResumeQueryRequest{WorkspaceId: "ws", RunId: p.GetRunId(), ActorId: "bench",
			Decisions: []*connectorv1.Decision{{CallId: p.GetPendingCalls()[0].GetCallId(), Kind: connectorv1.DecisionKind_DECISION_KIND_APPROVE}}})
		return err
	}
	size := func(id string) (row, state int64) {
		err := f.db.InTx(ctx, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, `SELECT pg_column_size(q.*), coalesce(pg_column_size(state), 0) FROM query_runs q WHERE id = $1`,
				id).Scan(&row, &state)
		})
		if err != nil {
			b.Fatal(err)
		}
		return row, state
	}

	var plain, pause, resumed []time.Duration
	var last *connectorv1.QueryResult
	for b.Loop() {
		start := time.Now()
		if _, err := query("free"); err != nil {
			b.Fatal(err)
		}
		plain = append(plain, time.Since(start))
		start = time.Now()
		p, err := query("gated")
		if err != nil || p.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_AWAITING_APPROVAL {
			b.Fatalf("gated query = %v, %v", p, err)
		}
		pause = append(pause, time.Since(start))
		if last == nil {
			last = p
			continue // kept paused, to be measured
		}
		start = time.Now()
		if err := resume(p); err != nil {
			b.Fatal(err)
		}
		resumed = append(resumed, time.Since(start))
	}
	b.StopTimer()
	pausedRow, state := size(last.GetRunId())
	if err := resume(last); err != nil {
		b.Fatal(err)
	}
	finishedRow, _ := size(last.GetRunId())
	p50 := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds())
	}
	if len(resumed) == 0 {
		return // one iteration only: nothing to compare
	}
	b.ReportMetric(p50(plain), "plain-query-p50-µs")
	b.ReportMetric(p50(pause), "paused-query-p50-µs")
	b.ReportMetric(p50(resumed), "resume-p50-µs")
	b.ReportMetric(p50(pause)+p50(resumed)-p50(plain), "pause-cost-µs")
	b.ReportMetric(float64(pausedRow), "paused-row-bytes")
	b.ReportMetric(float64(state), "state-bytes")
	b.ReportMetric(float64(finishedRow), "finished-row-bytes")
}
