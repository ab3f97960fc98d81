package board_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
)

// A run's quiet is what no attempt covers: an attempt parked for its retry
// (up_for_retry) keeps the run alive until the rail releases it, a task
// failure does not, and the release itself is activity; a current live
// attempt leaves no quiet after it.
func TestReplayOrphanRunQuietIsTheUnionOfTheAttemptsIntervals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	at := func(m int) time.Time { return base.Add(time.Duration(-m) * time.Minute) }
	b.exec(t, `INSERT INTO runs (run_id, dag_id, state, started_at, updated_at) VALUES ('p', 'dag', 'running', $1, $1)`, at(60))
	b.exec(t, `INSERT INTO task_instances (run_id, task_id, try_number, executor, state, queued_at, running_at,
            last_heartbeat_at, ended_at, released_at, updated_at) VALUES
        ('p', 'a', 2, 'lite', 'success', $1, $2, NULL, $3, $4, $3),
        ('p', 'b', 2, 'lite', 'running', $5, $6, $7, NULL, $5, $7)`,
		at(45), at(44), at(30), at(46), at(25), at(24), at(1))
	b.exec(t, `INSERT INTO attempt_history (run_id, task_id, try_number, attempt_epoch, executor, state, queued_at,
            running_at, ended_at, last_failure_kind, failure_reason, released_at) VALUES
        ('p', 'a', 1, 0, 'lite', 'failed', $1, $2, $3, 'task', 'exit_code', $4),
        ('p', 'b', 1, 0, 'lite', 'up_for_retry', $5, $6, $7, 'task', 'exit_code', $8)`,
		at(59), at(58), at(50), at(46), at(40), at(39), at(35), at(25))
	rep, err := b.store.ReplayOrphanRun(context.Background(), board.ReplayQuery{
		Thresholds: []time.Duration{time.Minute, 3 * time.Minute, 4 * time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	// Quiet: 1m from the start to a's first queue, 4m from its failure to
	// its release, 1m from the release to its second queue; b's parked
	// first try covers the 5m after a's success.
	if rep.Count != 1 || len(rep.Largest) != 1 || len(rep.Lost) != 0 {
		t.Fatalf("replay %+v", rep)
	}
	o := rep.Largest[0]
	if o.Value != 4*time.Minute || o.Attempt != (sdk.Attempt{RunID: "p", TaskID: "a", Try: 1}) ||
		o.Proof != board.ProofActivity || !o.From.Equal(at(50)) || !o.To.Equal(at(46)) {
		t.Fatalf("the longest quiet %+v", o)
	}
	if want := []int{1, 1, 0}; len(rep.Exceeding) != 3 || rep.Exceeding[0] != want[0] || rep.Exceeding[1] != want[1] ||
		rep.Exceeding[2] != want[2] {
		t.Fatalf("exceeding %v, want %v", rep.Exceeding, want)
	}
}

// The reads refuse a quantile that is not a fraction, and answer an empty
// board with nothing observed, not with invented values.
func TestReplayOnAnEmptyBoardObservesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for name, read := range map[string]func(context.Context, board.ReplayQuery) (board.Replay, error){
		"agent_lost": b.store.ReplayAgentLost, "dispatch_lost": b.store.ReplayDispatchLost,
		"orphan_run": b.store.ReplayOrphanRun, "credential_ceiling": b.store.ReplayCredentialCeiling,
	} {
		rep, err := read(ctx, board.ReplayQuery{Thresholds: []time.Duration{time.Minute}, Quantiles: []float64{0.5, 1}})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if rep.Count != 0 || len(rep.Exceeding) != 1 || rep.Exceeding[0] != 0 || len(rep.Quantiles) != 0 ||
			len(rep.Largest) != 0 || len(rep.Lost) != 0 {
			t.Fatalf("%s: %+v", name, rep)
		}
		if _, err := read(ctx, board.ReplayQuery{Quantiles: []float64{1.5}}); err == nil {
			t.Fatalf("%s: a quantile of 1.5 accepted", name)
		}
	}
}

// Each rung's read is one scan of the attempts, however many candidates it
// counts: attempt_history and task_instances (and, for orphan_run, runs)
// each appear once in its plan.
func TestReplayReadsScanTheHistoryOncePerRung(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	since := base.Add(-7 * 24 * time.Hour)
	for rung, sql := range board.ReplaySQL(9) {
		args := []any{since, []float64{0, 0.5, 1}}
		for i := 1; i <= 9; i++ {
			args = append(args, int64(i)*int64(time.Minute/time.Microsecond))
		}
		var plan string
		if err := b.pool.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+sql, args...).Scan(&plan); err != nil {
			t.Fatalf("%s: %v", rung, err)
		}
		var doc any
		if err := json.Unmarshal([]byte(plan), &doc); err != nil {
			t.Fatal(err)
		}
		scans := map[string]int{}
		var walk func(any)
		walk = func(v any) {
			switch v := v.(type) {
			case map[string]any:
				if rel, ok := v["Relation Name"].(string); ok {
					scans[rel]++
				}
				for _, c := range v {
					walk(c)
				}
			case []any:
				for _, c := range v {
					walk(c)
				}
			}
		}
		walk(doc)
		want := map[string]int{"attempt_history": 1, "task_instances": 1}
		if rung == "orphan_run" {
			want["runs"] = 1
		}
		if len(scans) != len(want) {
			t.Fatalf("%s scans %v, want %v", rung, scans, want)
		}
		for rel, n := range want {
			if scans[rel] != n {
				t.Fatalf("%s scans %v, want %v", rung, scans, want)
			}
		}
	}
}
