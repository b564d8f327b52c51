package main

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// BenchmarkReplicasStatementsAtRest runs three idle replicas with the
// default settings and 10 HTTP connectors, and reports the transactions
// (statements, but for the few sent as one transaction) their database
// commits per second per replica, counted by Postgres (pg_stat_database)
// over a minute after a settling half minute. Run it alone:
//
//	go test -run '^$' -bench ReplicasStatementsAtRest -benchtime 1x ./cmd/connector-svc/
func BenchmarkReplicasStatementsAtRest(b *testing.B) {
	up := newUpstream(b)
	c := newCluster(b, defaultSettings, "a", "b", "c")
	c.waitMembers("a", "b", "c")
	for i := range 10 {
		create(b, c.client("a"), httpConnector(fmt.Sprint("h", i), up.url(fmt.Sprint("/h", i))))
	}
	db := c.db()
	count := func() int64 {
		// The counters reach the statistics within a second or so.
		_, _ = db.Exec(context.Background(), `SELECT pg_stat_force_next_flush()`)
		var n int64
		if err := db.QueryRow(context.Background(),
			`SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()`).Scan(&n); err != nil {
			b.Fatal(err)
		}
		return n
	}
	time.Sleep(30 * time.Second)
	b.ResetTimer()
	for range b.N {
		const window = time.Minute
		n0 := count()
		time.Sleep(window)
		n := count() - n0 - 2 // the two reads of the counter
		b.ReportMetric(float64(n)/window.Seconds()/3, "xacts/s/replica")
	}
}
