package board_test

import (
	"context"
	"regexp"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/board/migrations"
	"github.com/dexaflow/reaper/sdk"
)

// PruneDecisions deletes only the decisions made before its time, the
// oldest first, at most its limit a call; PruneWarmClaims the claims made
// before it.
func TestPruneDecisionsDeletesTheOldestPastTheTimeInBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	a := sdk.Attempt{RunID: "r", TaskID: "t", Try: 1}
	for _, age := range []time.Duration{4 * time.Hour, 3 * time.Hour, 2 * time.Hour, time.Hour} {
		if err := b.store.RecordDecisions(ctx, b.term, base.Add(-age), []sdk.Decision{
			{Reaper: "agentlost", Label: sdk.LabelAgentLostProcessAlive, Attempt: a, Detail: age.String()}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, step := range []struct {
		limit   int
		deleted int64
		kept    []string
	}{{2, 2, []string{"2h0m0s", "1h0m0s"}}, {2, 1, []string{"1h0m0s"}}, {0, 0, []string{"1h0m0s"}}} {
		n, err := b.store.PruneDecisions(ctx, b.term, base, base.Add(-90*time.Minute), step.limit)
		if err != nil || n != step.deleted {
			t.Fatalf("pruned %d (%v), want %d", n, err, step.deleted)
		}
		recs, err := b.store.DecisionsFor(ctx, "r", "t", 0)
		if err != nil || len(recs) != len(step.kept) {
			t.Fatalf("kept %+v (%v), want %v", recs, err, step.kept)
		}
		for i, r := range recs {
			if r.Detail != step.kept[i] {
				t.Fatalf("kept %q at %d, want %v", r.Detail, i, step.kept)
			}
		}
	}

	lw := lifecycle.New(b.pool, lifecycle.Options{})
	for _, c := range []lifecycle.WarmClaim{{Worker: "gone", At: base.Add(-3 * time.Hour)}, {Worker: "live", At: base}} {
		if err := lw.RecordClaim(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := b.store.PruneWarmClaims(ctx, b.term, base, base.Add(-time.Hour), 0); err != nil || n != 1 {
		t.Fatalf("pruned %d claims (%v), want the one before the time", n, err)
	}
	var left string
	if err := b.pool.QueryRow(ctx, "SELECT string_agg(worker, ',') FROM warm_worker_claims").Scan(&left); err != nil || left != "live" {
		t.Fatalf("claims kept %q (%v), want live", left, err)
	}
}

// A decision written before migration 014 (its evidence jsonb, none
// packed) is read as it was, and the migration's backfill scores it as the
// board's rule does: an applied kube mark is pending, a Lite one is not.
func TestADecisionFromBeforeThePackedEvidenceIsReadAndScored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	for _, ev := range []string{`{"edition": "kube", "heartbeat_age": "3m"}`, `{"edition": "lite", "heartbeat_age": "4m"}`} {
		b.exec(t, `INSERT INTO reap_decisions (at, term, reaper, label, run_id, task_id, try_number, attempt_epoch,
                applied, dry_run, evidence) VALUES ($1, 1, 'agentlost', 'agent_lost', 'r', 't', 1, 0, true, false, $2::jsonb)`,
			base, ev)
	}
	sql, err := migrations.FS.ReadFile("014_audit_packed.sql")
	if err != nil {
		t.Fatal(err)
	}
	backfill := regexp.MustCompile(`(?s)UPDATE reap_decisions SET scored = true.*?;`).Find(sql)
	if backfill == nil {
		t.Fatal("migration 014 has no backfill of scored")
	}
	b.exec(t, string(backfill))
	recs, err := b.store.DecisionsFor(ctx, "r", "t", 0)
	if err != nil || len(recs) != 2 {
		t.Fatalf("read %+v (%v)", recs, err)
	}
	if recs[0].Evidence["heartbeat_age"] != "3m" || recs[1].Evidence["edition"] != "lite" {
		t.Fatalf("older evidence read as %v and %v", recs[0].Evidence, recs[1].Evidence)
	}
	pending := b.unscored(t)
	if len(pending) != 1 || pending[0].ID != recs[0].ID || pending[0].Evidence["edition"] != "kube" {
		t.Fatalf("pending %+v, want the kube mark only", pending)
	}
}
