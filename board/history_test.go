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
		"pod_lost_floor": b.store.ReplayPodLostFloor,
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

// pod_lost_floor's values: a closed window is its end minus running_at
// (proved by the pod coming back); an open one ends at the attempt's last
// heartbeat or its own outcome after it, and with neither proves nothing;
// a pod_lost mark is lost at its time running.
func TestReplayPodLostFloorWindows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := base.Add(-time.Hour)
	at := func(s int) time.Time { return r.Add(time.Duration(s) * time.Second) }
	b.exec(t, `INSERT INTO runs (run_id, dag_id, state, started_at, updated_at) VALUES ('p', 'dag', 'running', $1, $1)`, r)
	b.exec(t, `INSERT INTO task_instances (run_id, task_id, try_number, executor, state, queued_at, running_at,
            last_heartbeat_at, ended_at, last_failure_kind, failure_reason, infra_marked_at, pod_missing_max,
            pod_missing_since, released_at, updated_at) VALUES
        ('p', 'beat', 1, 'kube', 'running', $1, $1, $2, NULL, NULL, NULL, NULL, NULL, $3, $1, $2),
        ('p', 'ok', 1, 'kube', 'success', $1, $1, $4, $5, NULL, NULL, NULL, NULL, $4, $1, $5),
        ('p', 'gone', 1, 'kube', 'running', $1, $1, $6, NULL, NULL, NULL, NULL, NULL, $7, $1, $7),
        ('p', 'both', 1, 'kube', 'running', $1, $1, $8, NULL, NULL, NULL, NULL, interval '30 seconds', $9, $1, $8),
        ('p', 'lost', 1, 'kube', 'failed', $1, $1, NULL, $10, 'infra', 'pod_lost', $10, NULL, NULL, $1, $10)`,
		at(0), at(300), at(120), at(60), at(180), at(120), at(240), at(40), at(20), at(70))
	b.exec(t, `INSERT INTO attempt_history (run_id, task_id, try_number, attempt_epoch, executor, state, queued_at,
            running_at, ended_at, pod_missing_max, released_at) VALUES
        ('p', 'beat', 0, 0, 'kube', 'success', $1, $1, $2, interval '90 seconds', $2)`, at(-600), at(-300))
	rep, err := b.store.ReplayPodLostFloor(context.Background(), board.ReplayQuery{
		Thresholds: []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute}, Quantiles: []float64{0, 1}})
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		task  string
		try   int32
		value time.Duration
		proof string
	}{
		{"beat", 1, 5 * time.Minute, board.ProofHeartbeat},
		{"ok", 1, 3 * time.Minute, board.ProofSuccess},
		{"beat", 0, 90 * time.Second, board.ProofPodSeen},
		{"both", 1, 40 * time.Second, board.ProofHeartbeat},
	}
	if rep.Count != len(want) || len(rep.Largest) != len(want) {
		t.Fatalf("replay %+v, want %d values", rep, len(want))
	}
	for i, w := range want {
		o := rep.Largest[i]
		if o.Attempt != (sdk.Attempt{RunID: "p", TaskID: w.task, Try: w.try}) || o.Value != w.value || o.Proof != w.proof {
			t.Fatalf("value %d: %+v, want %+v", i, o, w)
		}
	}
	if got := rep.Largest[0]; !got.From.Equal(at(0)) || !got.To.Equal(at(300)) {
		t.Fatalf("the largest measured from %v to %v, want running_at to the heartbeat", got.From, got.To)
	}
	if want := []int{3, 2, 1}; len(rep.Exceeding) != 3 || rep.Exceeding[0] != want[0] || rep.Exceeding[1] != want[1] ||
		rep.Exceeding[2] != want[2] {
		t.Fatalf("exceeding %v, want %v", rep.Exceeding, want)
	}
	if len(rep.Quantiles) != 2 || rep.Quantiles[0] != 40*time.Second || rep.Quantiles[1] != 5*time.Minute {
		t.Fatalf("quantiles %v", rep.Quantiles)
	}
	if len(rep.Lost) != 1 || rep.Lost[0].Attempt.TaskID != "lost" || rep.Lost[0].Value != 70*time.Second ||
		!rep.Lost[0].Own || rep.Lost[0].Reason != sdk.LabelPodLost {
		t.Fatalf("lost %+v", rep.Lost)
	}
}
