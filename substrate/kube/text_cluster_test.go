package kube

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dexaflow/reaper/sdk"
)

// TestSweepSettlesAPoisonedTerminationRecordWithTheOthers: a task writes
// its own termination message, and a NUL in the record's reason (JSON
// \u0000) reaches the sweep's settle batch. The batch still settles every
// finished pod of the sweep, the poisoned attempt with its words made safe
// (sdk.SafeText), instead of failing at PostgreSQL for every tenant, every
// cycle. Real API server, real PostgreSQL.
func TestSweepSettlesAPoisonedTerminationRecordWithTheOthers(t *testing.T) {
	t.Parallel()
	s := newSweepEnv(t)
	poisoned := sdk.Attempt{RunID: "run-1", TaskID: "evil", Try: 1, Epoch: 1}
	clean := sdk.Attempt{RunID: "run-1", TaskID: "good", Try: 1, Epoch: 1}
	s.runningOnBoard(poisoned)
	s.runningOnBoard(clean)
	s.finished(poisoned, corev1.PodFailed, finish(corev1.PodFailed, 3, "Error",
		rec(t, poisoned, RecordFailed, code(3), "exit\x00status 3")))
	s.finished(clean, corev1.PodSucceeded, finish(corev1.PodSucceeded, 0, "Completed",
		rec(t, clean, RecordSuccess, code(0), "")))
	res := s.sweep(time.Now())
	applied := 0
	for _, d := range res.Decisions {
		if d.Label == sdk.LabelReconcileSettled && d.Applied {
			applied++
		}
	}
	if applied != 2 {
		t.Fatalf("decisions %+v, want both attempts settled", res.Decisions)
	}
	if ti := s.row(clean); ti.State != sdk.StateSuccess {
		t.Fatalf("the clean attempt is %s", ti.State)
	}
	ti := s.row(poisoned)
	if ti.State != sdk.StateFailed || !strings.Contains(ti.ErrorMessage, "exit\uFFFDstatus 3") ||
		strings.IndexByte(ti.ErrorMessage, 0) >= 0 {
		t.Fatalf("the poisoned attempt: %s %q", ti.State, ti.ErrorMessage)
	}
}
