package kube

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/sdk"
)

// deleteNow deletes pod name with no grace, as Pod GC does.
func (s *sweepEnv) deleteNow(name string) {
	s.t.Helper()
	zero := int64(0)
	if err := s.cs.CoreV1().Pods(s.ns).Delete(context.Background(), name,
		metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		s.t.Fatalf("deleting pod %s: %v", name, err)
	}
}

// On the real API server: the final state of a deleted pod is settled by
// the same rules as a present one, once, and never read as presence.
func TestSweepTombstone(t *testing.T) {
	t.Parallel()
	a := sdk.Attempt{RunID: "run-1", TaskID: "load_a", Try: 1, Epoch: 1}

	t.Run("DeletedPodSuccessRecordStillWins", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		s.runningOnBoard(a)
		p := s.finished(a, corev1.PodFailed, both(disruptedBy("DeletionByPodGC"),
			finish(corev1.PodFailed, 0, "Completed", rec(t, a, RecordSuccess, code(0), ""))))
		s.deleteNow(p.Name)
		if got := s.tombstoned(p.Name, 30*time.Second); got.phase != corev1.PodFailed {
			t.Fatalf("tombstone phase %s, want Failed", got.phase)
		}
		res := s.sweep(time.Now())
		if len(res.Decisions) != 1 || !res.Decisions[0].Applied || res.Decisions[0].Evidence["rule"] != "DurableSuccessRecord" {
			t.Fatalf("decisions %+v, want one applied by DurableSuccessRecord", res.Decisions)
		}
		if ti := s.row(a); ti.State != sdk.StateSuccess {
			t.Fatalf("row %s, want %s", ti.State, sdk.StateSuccess)
		}
		if s.tombs().len() != 0 {
			t.Fatal("the tombstone outlived its sweep")
		}
	})

	// The pod-lost reaper marked the attempt before the sweep saw the
	// deleted pod: the tombstone's settlement finds it moved on, and the
	// mark is confirmed from the live read (no pod left), not from it.
	t.Run("TombstoneNeverHoldsBackAMarkConfirmation", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		s.runningOnBoard(a)
		p := s.finished(a, corev1.PodFailed, both(disruptedBy("DeletionByPodGC"),
			finish(corev1.PodFailed, 137, "Error", "")))
		s.deleteNow(p.Name)
		s.tombstoned(p.Name, 30*time.Second)
		s.mark(a, sdk.LabelPodLost, time.Now().Add(-time.Minute))
		res := s.sweep(time.Now())
		var confirmed bool
		for _, d := range res.Decisions {
			switch d.Label {
			case sdk.LabelReconcileInfraConfirmed:
				confirmed = d.Applied && d.Attempt == a
			case sdk.LabelReconcileSettled:
				t.Fatalf("settled %+v over a provisional mark", d)
			}
		}
		if !confirmed {
			t.Fatalf("decisions %+v, want the mark confirmed", res.Decisions)
		}
		if s.tombs().len() != 0 || s.tombs().droppedBy(dropUnsettled) != 0 {
			t.Fatalf("%d tombstones, %d dropped unsettled; want 0, 0 (moved on is settled)",
				s.tombs().len(), s.tombs().droppedBy(dropUnsettled))
		}
	})
}
