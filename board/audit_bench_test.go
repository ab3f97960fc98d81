package board_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// massDecisions are n decisions of a Lite mass recovery as agentlost makes
// them: applied agent_lost marks, each with its own attempt and ages.
func massDecisions(n int) []sdk.Decision {
	ds := make([]sdk.Decision, n)
	for i := range ds {
		ds[i] = sdk.Decision{Reaper: "agentlost", Label: sdk.LabelAgentLost, Applied: true,
			Attempt: sdk.Attempt{RunID: fmt.Sprintf("run%06d", i/100), TaskID: fmt.Sprintf("task%03d", i%100), Try: 1},
			Evidence: map[string]string{
				"term": "7", "edition": "lite", "state": "running", "executor": "lite", "threshold": "1m30s",
				"heartbeat_age": fmt.Sprintf("10m%d.%03ds", i%60, i%1000), "running_age": fmt.Sprintf("49m%ds", i%60),
				"queued_age": fmt.Sprintf("50m%ds", i%60), "liveness_live": "true", "liveness": "dead",
				"agent": "dead", "group": "dead",
				"liveness_detail": fmt.Sprintf("agent %d gone (start time 123456789); group %d gone", 4000+i, 5000+i),
				"ceiling":         "24h0m0s", "mark": "agent_lost", "signal": "positive", "policy": "fail",
			}}
	}
	return ds
}

// serverCPU is the CPU time every process of the database server has
// spent (the backends and the background writers), from /proc.
func serverCPU(b *testing.B, pool *pgxpool.Pool) time.Duration {
	b.Helper()
	rows, err := pool.Query(context.Background(), "SELECT pid FROM pg_stat_activity")
	if err != nil {
		b.Fatal(err)
	}
	var pids []int
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			b.Fatal(err)
		}
		pids = append(pids, pid)
	}
	rows.Close()
	var ticks int64
	for _, pid := range pids {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + s
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkRecordDecisions writes a mass recovery's 10,000 decisions to the
// audit, a page of 1,000 a call as the host's sink does, into an audit
// that already holds 100,000; it reports the wall time and the CPU of the
// test's process and of the database server a row.
func BenchmarkRecordDecisions(b *testing.B) {
	const n, page = 10_000, 1_000
	ctx := context.Background()
	pool := pgtest.NewDB(b)
	store := board.New(pool, board.Options{})
	ds := massDecisions(n)
	for range 10 {
		if err := store.RecordDecisions(ctx, 1, base, ds); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE reap_decisions"); err != nil {
		b.Fatal(err)
	}
	var wall, server, self time.Duration
	for b.Loop() {
		s0, p0, t0 := serverCPU(b, pool), selfCPU(), time.Now()
		for start := 0; start < n; start += page {
			if err := store.RecordDecisions(ctx, 1, base, ds[start:start+page]); err != nil {
				b.Fatal(err)
			}
		}
		wall += time.Since(t0)
		self += selfCPU() - p0
		server += serverCPU(b, pool) - s0
	}
	rows := float64(b.N * n)
	b.ReportMetric(float64(wall.Nanoseconds())/1e3/rows, "µs/row")
	b.ReportMetric(float64(server.Nanoseconds())/1e3/rows, "server-µs/row")
	b.ReportMetric(float64(self.Nanoseconds())/1e3/rows, "go-µs/row")
}
