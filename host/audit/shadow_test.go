package audit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/host/audit"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

func TestJudge(t *testing.T) {
	t.Parallel()
	at := time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC)
	horizon := audit.ShadowHorizonDefault
	running := board.AttemptTruth{Found: true, State: sdk.StateRunning, RunningAt: at.Add(-20 * time.Minute),
		LastHeartbeatAt: at.Add(-10 * time.Minute), RunState: sdk.RunRunning}
	with := func(f func(*board.AttemptTruth)) board.AttemptTruth {
		tr := running
		f(&tr)
		return tr
	}
	dry := func(tr board.AttemptTruth) board.ShadowDecision {
		return board.ShadowDecision{AuditRecord: board.AuditRecord{At: at,
			Decision: sdk.Decision{Reaper: "agentlost", Label: sdk.LabelAgentLost, DryRun: true}}, Truth: tr}
	}
	applied := func(policy string, tr board.AttemptTruth) board.ShadowDecision {
		d := dry(tr)
		d.DryRun, d.Applied, d.Evidence = false, true, map[string]string{"policy": policy, "edition": "kube"}
		return d
	}
	marked := func(tr *board.AttemptTruth) {
		tr.State, tr.LastFailureKind, tr.FailureReason = sdk.StateFailed, sdk.FailureInfra, sdk.LabelAgentLost
		tr.InfraMarkedAt, tr.EndedAt = at.Add(time.Minute), at.Add(time.Minute)
	}
	for name, tc := range map[string]struct {
		d    board.ShadowDecision
		now  time.Time
		want string // "" pending
		by   string
	}{
		"DryRun_HeartbeatAfter_WouldHaveKilledLiveWork": {d: dry(with(func(tr *board.AttemptTruth) {
			tr.LastHeartbeatAt = at.Add(time.Second)
		})), want: sdk.VerdictWouldHaveKilledLiveWork, by: "heartbeat"},
		"DryRun_RunningAfter_WouldHaveKilledLiveWork": {d: dry(with(func(tr *board.AttemptTruth) {
			tr.State, tr.RunningAt, tr.LastHeartbeatAt = sdk.StateRunning, at.Add(time.Minute), time.Time{}
		})), want: sdk.VerdictWouldHaveKilledLiveWork, by: "running"},
		"DryRun_SucceededWhenever_WouldHaveKilledLiveWork": {d: dry(with(func(tr *board.AttemptTruth) {
			tr.State, tr.EndedAt = sdk.StateSuccess, at.Add(-time.Minute)
		})), want: sdk.VerdictWouldHaveKilledLiveWork, by: "success"},
		"DryRun_TaskFailureReportedAfter_WouldHaveKilledLiveWork": {d: dry(with(func(tr *board.AttemptTruth) {
			tr.State, tr.LastFailureKind, tr.EndedAt = sdk.StateUpForRetry, sdk.FailureTask, at.Add(time.Minute)
		})), want: sdk.VerdictWouldHaveKilledLiveWork, by: "outcome"},
		"DryRun_MarkedByAnotherPath_Right": {d: dry(with(marked)), want: sdk.VerdictRight, by: "mark"},
		"DryRun_CredentialCeiling_Right": {d: dry(with(func(tr *board.AttemptTruth) {
			tr.State, tr.LastFailureKind, tr.FailureReason, tr.EndedAt = sdk.StateFailed, sdk.FailureTask,
				sdk.LabelCredentialCeiling, at.Add(time.Hour)
		})), want: sdk.VerdictRight, by: "ceiling"},
		"DryRun_RunFailed_Right": {d: dry(with(func(tr *board.AttemptTruth) {
			tr.RunState, tr.RunEndedAt = sdk.RunFailed, at.Add(time.Hour)
		})), want: sdk.VerdictRight, by: "run_failed"},
		"DryRun_NoTruthInsideTheHorizon_Pending": {d: dry(running), now: at.Add(horizon - time.Second)},
		"DryRun_NoTruthAtTheHorizon_Unresolved": {d: dry(running), now: at.Add(horizon),
			want: sdk.VerdictUnresolved, by: "horizon"},
		"DryRun_ReleasedWithoutTruth_UnresolvedAtOnce": {d: dry(with(func(tr *board.AttemptTruth) {
			tr.Released, tr.State, tr.ReleasedAt = true, sdk.StateQueued, at.Add(time.Minute)
		})), want: sdk.VerdictUnresolved, by: "released"},
		"AttemptGone_Unresolved": {d: dry(board.AttemptTruth{}), want: sdk.VerdictUnresolved, by: "gone"},
		"Provisional_OverriddenByDurableSuccess_WouldHaveKilledLiveWork": {d: applied("replace", with(func(tr *board.AttemptTruth) {
			tr.State, tr.EndedAt = sdk.StateSuccess, at.Add(-30*time.Second) // the container's own end
		})), want: sdk.VerdictWouldHaveKilledLiveWork, by: "override"},
		"Provisional_OwnMarkIsNoEvidence_Pending": {d: applied("replace", with(marked)), now: at.Add(time.Hour)},
		"Provisional_Confirmed_Right": {d: applied("replace", with(func(tr *board.AttemptTruth) {
			marked(tr)
			tr.InfraConfirmedAt = at.Add(time.Minute)
		})), want: sdk.VerdictRight, by: "confirmed"},
		"Held_ReleasedByOperatorUnconfirmed_Unresolved": {d: applied("hold", with(func(tr *board.AttemptTruth) {
			marked(tr)
			tr.Released, tr.ReleasedAt = true, at.Add(time.Hour)
		})), want: sdk.VerdictUnresolved, by: "released"},
	} {
		t.Run(name, func(t *testing.T) {
			now := tc.now
			if now.IsZero() {
				now = at.Add(time.Hour)
			}
			got, ev, ok := audit.Judge(tc.d, now, horizon)
			if tc.want == "" {
				if ok {
					t.Fatalf("scored %s (%v), want pending", got, ev)
				}
				return
			}
			if !ok || got != tc.want || ev[audit.VevBy] != tc.by {
				t.Fatalf("verdict %q by %q (ok=%v, %v), want %q by %q", got, ev[audit.VevBy], ok, ev, tc.want, tc.by)
			}
		})
	}
}

// The scorer reads a page after its cursor; decisions still waiting for a
// truth are read again once it has gone through them all, and a verdict is
// written once.
func TestScorerPages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := board.New(pgtest.NewDB(t), board.Options{})
	lease, ok, err := store.TryAcquire(ctx, "test", 72*time.Hour, t0.Add(-time.Minute))
	if err != nil || !ok {
		t.Fatalf("acquire leadership: ok=%v err=%v", ok, err)
	}
	w := lifecycle.New(store.Pool(), lifecycle.Options{})
	if err := w.CreateRun(ctx, lifecycle.NewRun{RunID: "r", DagID: "dag", State: sdk.RunRunning,
		Tasks: []lifecycle.NewTask{{TaskID: "t", Executor: sdk.ExecutorLite}}}, t0.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	a := sdk.Attempt{RunID: "r", TaskID: "t", Try: 1}
	ds := make([]sdk.Decision, 5)
	for i := range ds {
		ds[i] = sdk.Decision{Reaper: "agentlost", Label: sdk.LabelAgentLost, Attempt: a, DryRun: true}
	}
	if err := store.RecordDecisions(ctx, lease.Term, t0, ds); err != nil {
		t.Fatal(err)
	}
	s := audit.NewScorer(store, audit.ScorerConfig{Page: 2, Horizon: time.Hour})

	pages := []struct {
		at            time.Time
		read, written int
		pending       int
		wrapped       bool
	}{
		// Inside the horizon: 2, 2, then 1 (a short page: back to the start).
		{at: t0.Add(time.Minute), read: 2, pending: 2},
		{at: t0.Add(time.Minute), read: 2, pending: 2},
		{at: t0.Add(time.Minute), read: 1, pending: 1, wrapped: true},
		// Past it: each page scores what it reads, and the next finds the rest.
		{at: t0.Add(2 * time.Hour), read: 2, written: 2},
		{at: t0.Add(2 * time.Hour), read: 2, written: 2},
		{at: t0.Add(2 * time.Hour), read: 1, written: 1, wrapped: true},
		{at: t0.Add(2 * time.Hour), read: 0, wrapped: true},
	}
	for i, p := range pages {
		res, err := s.ScorePage(ctx, lease.Term, p.at)
		if err != nil || res.Read != p.read || len(res.Written) != p.written || res.Pending != p.pending || res.Wrapped != p.wrapped {
			t.Fatalf("page %d: %+v, %v; want read %d, written %d, pending %d, wrapped %v", i, res, err,
				p.read, p.written, p.pending, p.wrapped)
		}
		for _, v := range res.Written {
			if v.Verdict != sdk.VerdictUnresolved || v.Evidence[audit.VevBy] != "horizon" || v.Reaper != "agentlost" {
				t.Fatalf("page %d: verdict %+v", i, v)
			}
		}
	}

	t.Run("DeposedTerm_NothingWrittenCursorKept", func(t *testing.T) {
		if err := store.RecordDecisions(ctx, lease.Term, t0, ds[:1]); err != nil {
			t.Fatal(err)
		}
		if _, err := s.ScorePage(ctx, lease.Term+1, t0.Add(2*time.Hour)); !errors.Is(err, board.ErrDeposed) {
			t.Fatalf("a deposed term scored: %v", err)
		}
		res, err := s.ScorePage(ctx, lease.Term, t0.Add(2*time.Hour))
		if err != nil || len(res.Written) != 1 {
			t.Fatalf("%+v, %v", res, err)
		}
	})
}
