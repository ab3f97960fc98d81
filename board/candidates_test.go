package board_test

import (
	"context"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
)

func TestListCandidates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("PagesReachEveryCandidateAndRowsInsideTheThresholdTakeNoSlot", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		threshold := base.Add(-3 * time.Minute)
		// 250 attempts queued before the threshold and 50 inside it. A
		// listing that applied the threshold after the limit would fill the
		// third page with the fresh ones and hand back a cursor.
		b.exec(t, `INSERT INTO runs (run_id, dag_id, state, started_at, updated_at) VALUES ('run', 'dag', 'running', $1, $1)`,
			base.Add(-time.Hour))
		b.exec(t, `INSERT INTO task_instances (run_id, task_id, executor, state, queued_at, updated_at)
            SELECT 'run', 'fresh' || lpad(i::text, 3, '0'), 'lite', 'queued', $1::timestamptz - i * interval '1 second', $1
            FROM generate_series(1, 50) i`, base)
		b.exec(t, `INSERT INTO task_instances (run_id, task_id, executor, state, queued_at, updated_at)
            SELECT 'run', 'old' || lpad(i::text, 3, '0'), 'lite', 'queued',
                $1::timestamptz - (i % 50) * interval '1 second', $1
            FROM generate_series(1, 250) i`, threshold.Add(-time.Second))

		q := sdk.CandidateQuery{States: []string{sdk.StateQueued}, OrderBy: sdk.FieldQueuedAt, OlderThan: threshold}
		seen := map[string]bool{}
		var last time.Time
		for page := 1; ; page++ {
			p, err := b.store.ListCandidates(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range p.Candidates {
				if !c.QueuedAt.Before(threshold) {
					t.Fatalf("page %d lists %s queued at %v, inside the threshold", page, c.TaskID, c.QueuedAt)
				}
				if c.QueuedAt.Before(last) {
					t.Fatalf("page %d is not oldest first: %v after %v", page, c.QueuedAt, last)
				}
				if seen[c.TaskID] {
					t.Fatalf("page %d lists %s again", page, c.TaskID)
				}
				last, seen[c.TaskID] = c.QueuedAt, true
			}
			wantLen := map[int]int{1: 100, 2: 100, 3: 50}[page]
			if len(p.Candidates) != wantLen {
				t.Fatalf("page %d has %d candidates, want %d", page, len(p.Candidates), wantLen)
			}
			if page < 3 && p.Next == nil {
				t.Fatalf("page %d is full but has no cursor", page)
			}
			if page == 3 {
				if p.Next != nil {
					t.Fatalf("the short page returned a cursor %+v: the next pass would not start over", p.Next)
				}
				break
			}
			q.After = p.Next
		}
		if len(seen) != 250 {
			t.Fatalf("three pages reached %d candidates, want 250", len(seen))
		}
		// Back at the start, the oldest row comes first again.
		q.After = nil
		p, err := b.store.ListCandidates(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Candidates) != 100 || !p.Candidates[0].QueuedAt.Equal(threshold.Add(-time.Second).Add(-49*time.Second)) {
			t.Fatalf("starting over did not begin with the oldest: %d rows, first %+v", len(p.Candidates), p.Candidates[0])
		}
	})

	t.Run("TiesAreBrokenByRunAndTask", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.run(t, "run", "a", "b", "c")
		for _, id := range []string{"c", "a", "b"} {
			b.queued(t, first("run", id), base.Add(-time.Hour))
		}
		q := sdk.CandidateQuery{States: []string{sdk.StateQueued}, OrderBy: sdk.FieldQueuedAt, OlderThan: base, Limit: 2}
		p1, err := b.store.ListCandidates(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		q.After = p1.Next
		p2, err := b.store.ListCandidates(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		got := []string{}
		for _, c := range append(p1.Candidates, p2.Candidates...) {
			got = append(got, c.TaskID)
		}
		if len(got) != 3 || got[0] != "a" || got[1] != "b" || got[2] != "c" {
			t.Fatalf("equal timestamps paged as %v, want [a b c]", got)
		}
		if p2.Next != nil {
			t.Fatal("a short page has a cursor")
		}
	})

	t.Run("SeveralStatesMergeOldestFirst", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.run(t, "run", "q1", "r1", "q2", "r2", "done")
		b.queued(t, first("run", "q1"), base.Add(-40*time.Minute))
		b.running(t, first("run", "r1"), base.Add(-29*time.Minute), time.Time{}) // queued at -30m
		b.queued(t, first("run", "q2"), base.Add(-20*time.Minute))
		b.running(t, first("run", "r2"), base.Add(-9*time.Minute), time.Time{}) // queued at -10m
		b.running(t, first("run", "done"), base.Add(-50*time.Minute), time.Time{})
		if stop, err := b.w.Report(ctx, first("run", "done"), lifecycleSuccess, base); err != nil || stop {
			t.Fatal(stop, err)
		}
		p, err := b.store.ListCandidates(ctx, sdk.CandidateQuery{
			States: []string{sdk.StateRunning, sdk.StateQueued}, OrderBy: sdk.FieldQueuedAt, OlderThan: base})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, c := range p.Candidates {
			got = append(got, c.TaskID)
		}
		if len(got) != 4 || got[0] != "q1" || got[1] != "r1" || got[2] != "q2" || got[3] != "r2" {
			t.Fatalf("merged listing %v, want [q1 r1 q2 r2]", got)
		}
	})

	t.Run("HeartbeatFilterSeparatesSeenFromNever", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.run(t, "run", "silent", "seen")
		b.running(t, first("run", "silent"), base.Add(-10*time.Minute), time.Time{})
		b.running(t, first("run", "seen"), base.Add(-10*time.Minute), base.Add(-5*time.Minute))
		for filter, want := range map[sdk.HeartbeatFilter]string{sdk.HeartbeatNever: "silent", sdk.HeartbeatSeen: "seen"} {
			p, err := b.store.ListCandidates(ctx, sdk.CandidateQuery{States: []string{sdk.StateRunning},
				OrderBy: sdk.FieldRunningAt, OlderThan: base, Heartbeat: filter})
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Candidates) != 1 || p.Candidates[0].TaskID != want {
				t.Fatalf("heartbeat %q lists %+v, want only %s", filter, p.Candidates, want)
			}
		}
		// Ordered by the heartbeat itself, a never-heartbeated attempt has
		// no timestamp and is never a candidate.
		p, err := b.store.ListCandidates(ctx, sdk.CandidateQuery{States: []string{sdk.StateRunning},
			OrderBy: sdk.FieldHeartbeatAt, OlderThan: base})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Candidates) != 1 || p.Candidates[0].TaskID != "seen" {
			t.Fatalf("by last_heartbeat_at: %+v, want only seen", p.Candidates)
		}
	})

	t.Run("ExecutorFilterKeepsOnlyThoseNamed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.runWith(t, "lite-run", sdk.ExecutorLite, "t")
		b.runWith(t, "kube-run", sdk.ExecutorKube, "t")
		b.queued(t, first("lite-run", "t"), base.Add(-time.Hour))
		b.queued(t, first("kube-run", "t"), base.Add(-time.Hour))
		p, err := b.store.ListCandidates(ctx, sdk.CandidateQuery{States: []string{sdk.StateQueued},
			Executors: []string{sdk.ExecutorKube}, OrderBy: sdk.FieldQueuedAt, OlderThan: base})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Candidates) != 1 || p.Candidates[0].RunID != "kube-run" || p.Candidates[0].Executor != sdk.ExecutorKube {
			t.Fatalf("kube listing: %+v", p.Candidates)
		}
	})

	t.Run("ListsInfraMarksByMarkTime", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.run(t, "run", "t")
		a := first("run", "t")
		b.running(t, a, base.Add(-10*time.Minute), base.Add(-5*time.Minute))
		if _, err := b.store.Mark(ctx, []sdk.Mark{{Attempt: a, FromStates: []string{sdk.StateRunning},
			Kind: sdk.MarkInfra, Reason: sdk.LabelAgentLost, Term: b.term, At: base.Add(-3 * time.Minute)}}); err != nil {
			t.Fatal(err)
		}
		p, err := b.store.ListCandidates(ctx, sdk.CandidateQuery{States: []string{sdk.StateFailed},
			OrderBy: sdk.FieldMarkedAt, OlderThan: base.Add(-2 * time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Candidates) != 1 || p.Candidates[0].LastFailureKind != sdk.FailureInfra ||
			!p.Candidates[0].InfraMarkedAt.Equal(base.Add(-3*time.Minute)) || !p.Candidates[0].InfraConfirmedAt.IsZero() {
			t.Fatalf("infra mark listing: %+v", p.Candidates)
		}
	})

	t.Run("ListsParkedAttemptsByWhenTheyParked", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.run(t, "run", "poke", "trigger", "fresh")
		poke := first("run", "poke")
		b.sensor(t, poke)
		b.running(t, poke, base.Add(-3*time.Hour), time.Time{})
		if stop, err := b.w.Report(ctx, poke, lifecycle.TerminalReport{State: sdk.StateUpForReschedule}, base.Add(-2*time.Hour)); err != nil || stop {
			t.Fatal(stop, err)
		}
		// Nothing writes deferred on this board yet: the row is placed.
		b.exec(t, `UPDATE task_instances SET state = 'deferred', ended_at = $1 WHERE task_id = 'trigger'`, base.Add(-time.Hour))
		b.exec(t, `UPDATE task_instances SET state = 'deferred', ended_at = $1 WHERE task_id = 'fresh'`, base.Add(-time.Minute))

		q := sdk.CandidateQuery{States: []string{sdk.StateUpForReschedule, sdk.StateDeferred},
			OrderBy: sdk.FieldEndedAt, OlderThan: base.Add(-30 * time.Minute), Limit: 1}
		var got []string
		for {
			p, err := b.store.ListCandidates(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range p.Candidates {
				got = append(got, c.TaskID+"@"+base.Sub(c.EndedAt).String())
			}
			if p.Next == nil {
				break
			}
			q.After = p.Next
		}
		if len(got) != 2 || got[0] != "poke@2h0m0s" || got[1] != "trigger@1h0m0s" {
			t.Fatalf("parked listing %v, want [poke@2h0m0s trigger@1h0m0s]", got)
		}
	})

	t.Run("LimitIsAtMostADrainPage", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.exec(t, `INSERT INTO runs (run_id, dag_id, state, started_at, updated_at) VALUES ('run', 'dag', 'running', $1, $1)`, base)
		b.exec(t, `INSERT INTO task_instances (run_id, task_id, executor, state, queued_at, updated_at)
            SELECT 'run', 't' || i, 'lite', 'queued', $1, $1 FROM generate_series(1, 1050) i`, base.Add(-time.Hour))
		q := sdk.CandidateQuery{States: []string{sdk.StateQueued}, OrderBy: sdk.FieldQueuedAt, OlderThan: base}
		p, err := b.store.ListCandidates(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Candidates) != ladder.PageSize || p.Next == nil {
			t.Fatalf("no limit returned %d rows (next %v), want a page of %d", len(p.Candidates), p.Next, ladder.PageSize)
		}
		q.Limit = 5000
		if p, err = b.store.ListCandidates(ctx, q); err != nil {
			t.Fatal(err)
		}
		if len(p.Candidates) != ladder.DrainPage || p.Next == nil {
			t.Fatalf("a limit of 5000 returned %d rows (next %v), want a drain page of %d", len(p.Candidates), p.Next, ladder.DrainPage)
		}
	})

	t.Run("MalformedQueryIsAnError", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for name, q := range map[string]sdk.CandidateQuery{
			"NoStates":        {OrderBy: sdk.FieldQueuedAt, OlderThan: base},
			"UnknownState":    {States: []string{"queued'; DROP TABLE runs; --"}, OrderBy: sdk.FieldQueuedAt, OlderThan: base},
			"UnknownExecutor": {States: []string{sdk.StateQueued}, Executors: []string{"k8s"}, OrderBy: sdk.FieldQueuedAt, OlderThan: base},
			"UnknownColumn":   {States: []string{sdk.StateQueued}, OrderBy: "updated_at", OlderThan: base},
			"NoThreshold":     {States: []string{sdk.StateQueued}, OrderBy: sdk.FieldQueuedAt},
			"UnknownFilter":   {States: []string{sdk.StateQueued}, OrderBy: sdk.FieldQueuedAt, OlderThan: base, Heartbeat: "maybe"},
		} {
			if _, err := b.store.ListCandidates(ctx, q); err == nil {
				t.Errorf("%s: no error", name)
			}
		}
	})
}
