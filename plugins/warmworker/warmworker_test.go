package warmworker

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/sdk/reap"
	"github.com/dexaflow/reaper/sdk/sdktest"
)

// bundle is the plugin on its own harness (sdktest.Rig), with this
// file's helpers.
type bundle struct{ *sdktest.Rig[*Reaper] }

func setup(t testing.TB, values sdk.Values) *bundle {
	return &bundle{sdktest.NewRig(t, ladder.EditionKube, New(nil), values)}
}

// bound puts a warm attempt in state, bound to worker.
func (b *bundle) bound(task, state, worker string) sdk.Attempt {
	now := b.H.Now()
	ti := sdktest.TaskInstance{RunID: "r", TaskID: task, State: state, Executor: sdk.ExecutorWarm,
		QueuedAt: now.Add(-time.Minute), WarmWorker: worker}
	if state == sdk.StateRunning {
		ti.RunningAt, ti.LastHeartbeatAt = now.Add(-50*time.Second), now.Add(-5*time.Second)
	}
	return b.H.Board.Put(ti)
}

func (b *bundle) pool(names ...string) {
	ws := make([]sdk.WarmWorker, len(names))
	for i, n := range names {
		ws[i] = sdk.WarmWorker{Name: n, Phase: "Running"}
	}
	b.H.Exec.ScriptWarmWorkers(ws, nil)
}

func TestRules(t *testing.T) {
	t.Parallel()
	// Provisional: the sweep confirms it (its worker's pod gone from a
	// live list), never the reaper.
	t.Run("WorkerGoneFromLiveList_WarmWorkerLostProvisionalNoTeardown", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		b.pool("warm-1")
		a := b.bound("t", sdk.StateRunning, "warm-0")
		ds := b.Reap(t)
		if ds.Label(a) != sdk.LabelWarmWorkerLost || !ds[0].Applied {
			t.Fatalf("decisions %+v", ds)
		}
		row := b.H.Board.Row(a)
		if row.State != sdk.StateFailed || row.LastFailureKind != sdk.FailureInfra || row.MarkReason != sdk.LabelWarmWorkerLost ||
			!row.InfraConfirmedAt.IsZero() {
			t.Fatalf("row %+v", row)
		}
		if ev := ds[0].Evidence; ev[EvWarmWorker] != "warm-0" || ev[reap.EvSignal] != reap.SignalPositive || ev[EvPoolSize] != "1" {
			t.Fatalf("evidence %v", ev)
		}
		if n := b.H.Exec.Actions(); n != 0 {
			t.Fatalf("%d teardowns: a warm worker is never deleted", n)
		}
	})
	t.Run("QueuedOnGoneWorker_WarmWorkerLost", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		b.pool()
		a := b.bound("t", sdk.StateQueued, "warm-0")
		if ds := b.Reap(t); ds.Label(a) != sdk.LabelWarmWorkerLost || b.H.Board.Row(a).State != sdk.StateFailed {
			t.Fatalf("decisions %+v", ds)
		}
	})
	t.Run("WorkerPresentInAnyPhase_NoDecision", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		b.H.Exec.ScriptWarmWorkers([]sdk.WarmWorker{{Name: "warm-0", Phase: "Running"}, {Name: "warm-1", Phase: "Failed"}}, nil)
		a0 := b.bound("t0", sdk.StateRunning, "warm-0")
		a1 := b.bound("t1", sdk.StateRunning, "warm-1")
		if ds := b.Reap(t); len(ds) != 0 || b.H.Board.Row(a0).State != sdk.StateRunning || b.H.Board.Row(a1).State != sdk.StateRunning {
			t.Fatalf("decisions %+v", ds)
		}
	})
	t.Run("ListError_AbortsPassWithZeroMarks", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		b.H.Exec.ScriptWarmWorkers(nil, errors.New("pods is forbidden"))
		var as []sdk.Attempt
		for i := range 3 {
			as = append(as, b.bound(fmt.Sprintf("t%d", i), sdk.StateRunning, "warm-0"))
		}
		ds := b.Reap(t)
		if len(ds) != 1 || ds[0].Label != sdk.LabelWarmWorkerListErr || ds[0].Applied || !strings.Contains(ds[0].Detail, "forbidden") {
			t.Fatalf("decisions %+v", ds)
		}
		if n := len(b.H.Board.Marks()); n != 0 {
			t.Fatalf("%d marks after a list error", n)
		}
		for _, a := range as {
			if b.H.Board.Row(a).State != sdk.StateRunning {
				t.Fatalf("row %+v", b.H.Board.Row(a))
			}
		}
	})
	t.Run("NoBoundAttempts_NoList", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		b.H.Exec.ScriptWarmWorkers(nil, errors.New("must not be called"))
		b.H.Running("r", "kube-task", 10*time.Minute, 5*time.Minute)
		if ds := b.Reap(t); len(ds) != 0 {
			t.Fatalf("decisions %+v", ds)
		}
	})
	t.Run("KubeAttemptsNotListed", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		b.pool()
		a := b.H.Running("r", "kube-task", 10*time.Minute, 5*time.Minute)
		if ds := b.Reap(t); len(ds) != 0 || b.H.Board.Row(a).State != sdk.StateRunning {
			t.Fatalf("decisions %+v", ds)
		}
	})
	t.Run("PolicyHold_MarkHeld", func(t *testing.T) {
		t.Parallel()
		b := setup(t, sdk.Values{"policy": "hold"})
		b.pool()
		a := b.bound("t", sdk.StateRunning, "warm-0")
		b.Reap(t)
		if !b.H.Board.Row(a).Held {
			t.Fatalf("row %+v", b.H.Board.Row(a))
		}
	})
	t.Run("RequeuedBetweenListAndMark_NewAttemptUntouched", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		b.pool()
		a := b.bound("t", sdk.StateRunning, "warm-0")
		b.H.Board.OnMark(func(m sdk.Mark) { b.H.Board.Replace(m.RunID, m.TaskID, false, sdk.StateQueued, b.H.Now()) })
		if ds := b.Reap(t); ds.Label(a) != sdk.LabelMarkNoop {
			t.Fatalf("decisions %+v", ds)
		}
	})
	t.Run("ManyLost_NeverBraked", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		b.pool("warm-9")
		for i := range 250 {
			b.bound(fmt.Sprintf("t%03d", i), sdk.StateRunning, fmt.Sprintf("warm-%d", i%5))
		}
		ds := b.Reap(t)
		if n := ds.Applied().Count(sdk.LabelWarmWorkerLost); n != 250 {
			t.Fatalf("%d marked", n)
		}
	})
	t.Run("DryRun_WritesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		b.H.DryRun = true
		b.pool()
		a := b.bound("t", sdk.StateRunning, "warm-0")
		ds := b.Reap(t)
		if ds.Label(a) != sdk.LabelWarmWorkerLost || ds[0].Applied || b.H.Board.Writes() != 0 {
			t.Fatalf("decisions %+v", ds)
		}
	})
}

// A pass whose LIST failed keeps its cursor: the next pass judges the same
// pages.
func TestListError_CursorKept(t *testing.T) {
	t.Parallel()
	b := setup(t, sdk.Values{"drain_max_pages": float64(1)})
	for i := range 150 {
		b.bound(fmt.Sprintf("t%03d", i), sdk.StateRunning, "warm-0")
	}
	var afters []*sdk.Cursor
	b.H.Board.OnList(func(q sdk.CandidateQuery) { afters = append(afters, q.After) })
	b.pool("warm-0")
	b.Reap(t) // first page judged: everything present
	b.H.Exec.ScriptWarmWorkers(nil, errors.New("timeout"))
	b.Reap(t) // second page: the list fails
	b.pool()
	ds := b.Reap(t) // the second page again
	if len(afters) != 3 || afters[0] != nil || afters[1] == nil || afters[2] == nil || *afters[1] != *afters[2] {
		t.Fatalf("cursors %+v", afters)
	}
	if n := ds.Applied().Count(sdk.LabelWarmWorkerLost); n != 50 {
		t.Fatalf("%d marked on the re-read page", n)
	}
}

func TestWatchdogIsTheCredentialCeiling(t *testing.T) {
	t.Parallel()
	l := ladder.Defaults()
	if l.WarmAttemptWatchdog() != l.CredentialCeiling {
		t.Fatalf("watchdog %s", l.WarmAttemptWatchdog())
	}
	l.CredentialCeiling = 0
	if l.WarmAttemptWatchdog() != 0 {
		t.Fatalf("a disabled ceiling leaves the watchdog at %s", l.WarmAttemptWatchdog())
	}
}
