package board_test

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/migrations"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// dryRun is a dry-run agentlost decision about a, at at.
func dryRun(a sdk.Attempt) sdk.Decision {
	return sdk.Decision{Reaper: "agentlost", Label: sdk.LabelAgentLost, Attempt: a, DryRun: true,
		Evidence: map[string]string{"edition": "lite"}}
}

func (b *bundle) unscored(t *testing.T) []board.ShadowDecision {
	t.Helper()
	ds, err := b.store.UnscoredDecisions(context.Background(), 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	return ds
}

func (b *bundle) verdictOf(t *testing.T, runID, taskID string) []board.Verdict {
	t.Helper()
	recs, err := b.store.DecisionsFor(context.Background(), runID, taskID, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]board.Verdict, len(recs))
	for i, r := range recs {
		out[i] = r.Verdict
	}
	return out
}

func TestShadowDecisions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("IndexPredicateIsTheBoards", func(t *testing.T) {
		sql, err := migrations.FS.ReadFile("014_audit_packed.sql")
		if err != nil {
			t.Fatal(err)
		}
		norm := func(s string) string {
			s = regexp.MustCompile(`\s+`).ReplaceAllString(s, " ")
			return strings.NewReplacer("( ", "(", " )", ")").Replace(s)
		}
		if !strings.Contains(norm(string(sql)), "WHERE "+norm(board.UnscoredPredicate())+";") {
			t.Fatalf("reap_decisions_unscored_idx's predicate is not the board's:\n%s", board.UnscoredPredicate())
		}
	})

	t.Run("OnlyShadowDecisionsAreScored", func(t *testing.T) {
		b := setup(t)
		b.run(t, "r", "t")
		a := first("r", "t")
		kube := map[string]string{"edition": "kube", "policy": "replace"}
		lite := map[string]string{"edition": "lite", "policy": "replace"}
		hold := map[string]string{"edition": "lite", "policy": "hold"}
		if err := b.store.RecordDecisions(ctx, b.term, base, []sdk.Decision{
			dryRun(a), // 1: scored
			{Reaper: "agentlost", Label: sdk.LabelAgentLostProcessAlive, Attempt: a, DryRun: true},              // a deferral
			{Reaper: "agentlost", Label: sdk.LabelAgentLost, Attempt: a, Applied: true, Evidence: kube},         // 3: provisional
			{Reaper: "agentlost", Label: sdk.LabelAgentLost, Attempt: a, Applied: true, Evidence: lite},         // confirmed as made
			{Reaper: "agentlost", Label: sdk.LabelAgentLost, Attempt: a, Applied: true, Evidence: hold},         // 5: held
			{Reaper: "agentlost", Label: sdk.LabelCredentialCeiling, Attempt: a, Applied: true, Evidence: kube}, // a task failure
			{Reaper: "agentlost", Label: sdk.LabelCredentialCeiling, Attempt: a, DryRun: true},                  // 7: scored
			{Reaper: "orphanrun", Label: sdk.LabelOrphanRun, Attempt: sdk.Attempt{RunID: "r"}, DryRun: true},    // run-level
			{Reaper: "agentlost", Label: sdk.LabelMarkNoop, Attempt: a, Evidence: kube},
		}); err != nil {
			t.Fatal(err)
		}
		var ids []int64
		for _, d := range b.unscored(t) {
			ids = append(ids, d.ID)
		}
		recs, _ := b.store.DecisionsFor(ctx, "r", "t", 0)
		run, _ := b.store.DecisionsFor(ctx, "r", "", 0)
		for _, r := range append(recs, run...) {
			if want := slices.Contains(ids, r.ID); board.Scored(r.Decision) != want {
				t.Errorf("decision %d (%s, dry %v, applied %v, %v): board.Scored says %v, the board's SQL %v",
					r.ID, r.Label, r.DryRun, r.Applied, r.Evidence, !want, want)
			}
		}
		first := recs[0].ID
		want := []int64{first, first + 2, first + 4, first + 6}
		if len(ids) != len(want) || ids[0] != want[0] || ids[1] != want[1] || ids[2] != want[2] || ids[3] != want[3] {
			t.Fatalf("unscored %v, want %v", ids, want)
		}
	})

	t.Run("PendingDecisionsAreAnIndexScan", func(t *testing.T) {
		b := setup(t)
		b.run(t, "r", "t")
		a := first("r", "t")
		// Many decisions that are no shadow's, a few that are.
		ds := make([]sdk.Decision, 20_000)
		for i := range ds {
			ds[i] = sdk.Decision{Reaper: "agentlost", Label: sdk.LabelAgentLostProcessAlive, Attempt: a}
		}
		ds = append(ds, dryRun(a), dryRun(a))
		if err := b.store.RecordDecisions(ctx, b.term, base, ds); err != nil {
			t.Fatal(err)
		}
		b.exec(t, "ANALYZE reap_decisions")
		plan := explain(t, b.pool, "EXPLAIN (FORMAT JSON) "+board.UnscoredQuery(), int64(0), 500)
		used := false
		for _, n := range planNodes(plan) {
			if n["Relation Name"] == "reap_decisions" {
				if n["Node Type"] != "Index Scan" || n["Index Name"] != "reap_decisions_unscored_idx" {
					t.Fatalf("reap_decisions is read by a %v (%v):\n%s", n["Node Type"], n["Index Name"], plan)
				}
				used = true
			}
		}
		if !used {
			t.Fatalf("reap_decisions not in the plan:\n%s", plan)
		}
	})

	t.Run("TruthOfTheExactAttempt_HistoryOnceReleased", func(t *testing.T) {
		b := setup(t)
		b.run(t, "r", "t")
		a := first("r", "t")
		b.running(t, a, base.Add(-20*time.Minute), base.Add(-10*time.Minute))
		if err := b.store.RecordDecisions(ctx, b.term, base, []sdk.Decision{dryRun(a)}); err != nil {
			t.Fatal(err)
		}
		res, err := b.store.Mark(ctx, []sdk.Mark{{Attempt: a, FromStates: []string{sdk.StateRunning}, Kind: sdk.MarkInfra,
			Reason: sdk.LabelAgentLost, Confirm: true, Term: b.term, At: base.Add(time.Minute)}})
		if err != nil || !res[0].Applied {
			t.Fatalf("mark: %+v %v", res, err)
		}
		if rel, err := b.w.Replace(ctx, a, base.Add(2*time.Minute)); err != nil || !rel.Applied {
			t.Fatalf("re-place: %+v %v", rel, err)
		}
		// The next epoch runs and heartbeats: not the decision's attempt.
		next := sdk.Attempt{RunID: "r", TaskID: "t", Try: 1, Epoch: 1}
		b.running(t, next, base.Add(4*time.Minute), base.Add(5*time.Minute))
		ds := b.unscored(t)
		if len(ds) != 1 {
			t.Fatalf("unscored %+v", ds)
		}
		tr := ds[0].Truth
		if !tr.Found || !tr.Released || tr.State != sdk.StateFailed || tr.LastFailureKind != sdk.FailureInfra ||
			tr.FailureReason != sdk.LabelAgentLost || !tr.LastHeartbeatAt.Equal(base.Add(-10*time.Minute)) ||
			!tr.ReleasedAt.Equal(base.Add(2*time.Minute)) || tr.RunState != sdk.RunRunning {
			t.Fatalf("truth %+v", tr)
		}
	})

	t.Run("WriteVerdicts", func(t *testing.T) {
		b := setup(t)
		b.run(t, "r", "t")
		a := first("r", "t")
		if err := b.store.RecordDecisions(ctx, b.term, base, []sdk.Decision{dryRun(a), dryRun(a)}); err != nil {
			t.Fatal(err)
		}
		ds := b.unscored(t)
		one, two := ds[0].ID, ds[1].ID
		written, err := b.store.WriteVerdicts(ctx, b.term, base.Add(time.Minute), []board.ScoredVerdict{
			{ID: one, Word: sdk.VerdictRight, Evidence: map[string]string{"by": "mark"}}})
		if err != nil || len(written) != 1 || written[0] != one {
			t.Fatalf("written %v, %v", written, err)
		}
		got := b.verdictOf(t, "r", "t")
		if got[0].Word != sdk.VerdictRight || !got[0].At.Equal(base.Add(time.Minute)) || got[0].Term != b.term ||
			got[0].Evidence["by"] != "mark" || got[1].Word != "" {
			t.Fatalf("verdicts %+v", got)
		}
		if ds := b.unscored(t); len(ds) != 1 || ds[0].ID != two {
			t.Fatalf("a scored decision is still pending: %+v", ds)
		}

		t.Run("AlreadyScored_Refused", func(t *testing.T) {
			written, err := b.store.WriteVerdicts(ctx, b.term, base.Add(2*time.Minute), []board.ScoredVerdict{
				{ID: one, Word: sdk.VerdictWouldHaveKilledLiveWork}})
			if err != nil || len(written) != 0 {
				t.Fatalf("written %v, %v", written, err)
			}
			if after := b.verdictOf(t, "r", "t"); after[0].Word != sdk.VerdictRight || !after[0].At.Equal(got[0].At) {
				t.Fatalf("a verdict was rewritten: %+v", after)
			}
		})
		t.Run("StaleTerm_Refused", func(t *testing.T) {
			written, err := b.store.WriteVerdicts(ctx, b.term+1, base.Add(2*time.Minute), []board.ScoredVerdict{
				{ID: two, Word: sdk.VerdictRight}})
			if !errors.Is(err, board.ErrDeposed) || len(written) != 0 {
				t.Fatalf("written %v, %v", written, err)
			}
			// An expired lease is no better.
			written, err = b.store.WriteVerdicts(ctx, b.term, base.Add(2*leaseTTL), []board.ScoredVerdict{
				{ID: two, Word: sdk.VerdictRight}})
			if !errors.Is(err, board.ErrDeposed) || len(written) != 0 {
				t.Fatalf("written %v, %v", written, err)
			}
			if after := b.verdictOf(t, "r", "t"); after[1].Word != "" {
				t.Fatalf("a deposed term wrote a verdict: %+v", after)
			}
		})
		t.Run("UnknownWord_Refused", func(t *testing.T) {
			if _, err := b.store.WriteVerdicts(ctx, b.term, base, []board.ScoredVerdict{{ID: two, Word: "maybe"}}); err == nil {
				t.Fatal("an unknown verdict was accepted")
			}
			if _, err := b.pool.Exec(ctx, "UPDATE reap_decisions SET verdict = 'maybe', verdict_at = now(), verdict_term = 1 WHERE id = $1", two); !isCheckViolation(err) {
				t.Fatalf("the CHECK let an unknown verdict in: %v", err)
			}
			if after := b.verdictOf(t, "r", "t"); after[1].Word != "" {
				t.Fatalf("verdict %+v", after[1])
			}
		})
	})
}

// BenchmarkUnscoredPage reads one page of 500 pending shadow decisions, with
// the truth of each attempt, from an audit of 1,000,000 decisions of which
// 100,000 are pending (one per attempt of a board of 100,000 running
// attempts) and the rest scored or never scored: the scorer's read each
// cycle. The pages walk the index from the start as the scorer's cursor
// does.
func BenchmarkUnscoredPage(b *testing.B) {
	ctx := context.Background()
	pool := pgtest.NewDB(b)
	seedRunning(b, pool)
	if _, err := pool.Exec(ctx, `INSERT INTO reap_decisions (at, term, reaper, label, run_id, task_id, try_number,
            attempt_epoch, applied, dry_run, evidence, verdict, verdict_at, verdict_term)
        SELECT $1, 1, 'agentlost', CASE WHEN i % 10 < 5 THEN 'agent_lost_process_alive' ELSE 'agent_lost' END,
            'run' || lpad(((i / 10) % $2 / 100)::text, 6, '0'), 'task' || lpad(((i / 10) % $2 % 100)::text, 3, '0'), 1, 0,
            false, true, '{"edition": "lite"}',
            CASE WHEN i % 10 BETWEEN 5 AND 8 THEN 'right' END,
            CASE WHEN i % 10 BETWEEN 5 AND 8 THEN $1::timestamptz END,
            CASE WHEN i % 10 BETWEEN 5 AND 8 THEN 1 END
        FROM generate_series(0, 10 * $2::int - 1) i`, base, benchRows); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE reap_decisions"); err != nil {
		b.Fatal(err)
	}
	store := board.New(pool, board.Options{})
	b.ResetTimer()
	var after int64
	for i := 0; i < b.N; i++ {
		ds, err := store.UnscoredDecisions(ctx, after, 500)
		if err != nil || len(ds) == 0 {
			b.Fatalf("%d decisions, %v", len(ds), err)
		}
		after = ds[len(ds)-1].ID
		if len(ds) < 500 {
			after = 0
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/500, "µs/decision")
}
