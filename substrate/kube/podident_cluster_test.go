package kube

// A pod is the attempt's only when its UID is the one the kube runner
// recorded on the attempt. These tests forge pods as a tenant with
// pods/create would (another UID, a live attempt's labels and annotation,
// a SUCCESS termination message the kubelet player writes), against the
// real API server and the Postgres board.

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dexaflow/reaper/sdk"
)

// foreignDecisions are the foreign_task_pod decisions of res.
func foreignDecisions(res sdk.SweepResult) []sdk.Decision {
	var out []sdk.Decision
	for _, d := range res.Decisions {
		if d.Label == sdk.LabelForeignTaskPod {
			out = append(out, d)
		}
	}
	return out
}

// wantForeign checks that ds is exactly one unapplied foreign_task_pod
// decision for a naming pod uid.
func wantForeign(t *testing.T, ds []sdk.Decision, a sdk.Attempt, uid types.UID) {
	t.Helper()
	if len(ds) != 1 || ds[0].Applied || ds[0].Attempt != a || ds[0].Evidence["pod_uid"] != string(uid) {
		t.Fatalf("foreign pod decisions %+v, want one not applied for %s naming pod %s", ds, a, uid)
	}
}

func TestForeignTaskPod(t *testing.T) {
	t.Parallel()
	a := sdk.Attempt{RunID: "run-forged", TaskID: "load_a", Try: 1, Epoch: 1}
	succeeded := func(t *testing.T) func(*corev1.PodStatus) {
		return finish(corev1.PodSucceeded, 0, "Completed", rec(t, a, RecordSuccess, code(0), ""))
	}

	// The forged pod carries the live attempt's labels, its exact task id
	// and the outcome record finalizer, and the kubelet player writes a
	// SUCCESS record into its termination message: the board refuses it,
	// the attempt runs on, the refusal is one decision however many sweeps
	// see the pod, and the pod is neither released nor collected.
	t.Run("AForgedPodWithASuccessRecordSettlesNothingAndIsMetered", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		s.runningOnBoard(a)
		s.recordPod(a, s.running(a))
		forged := s.running(a, recordHeld)
		s.playStatus(forged.Name, succeeded(t))
		s.cachedPhase(s.sub, a, forged.Name, corev1.PodSucceeded)

		res := s.sweep(time.Now())
		if ti := s.row(a); ti.State != sdk.StateRunning || ti.LastFailureKind != "" {
			t.Fatalf("a forged pod's SUCCESS record settled the attempt: %s/%s", ti.State, ti.LastFailureKind)
		}
		for _, d := range res.Decisions {
			if d.Label == sdk.LabelReconcileSettled && d.Applied {
				t.Fatalf("settled from a forged pod: %+v", d)
			}
		}
		wantForeign(t, foreignDecisions(res), a, forged.UID)
		if !strings.Contains(s.logs.String(), "ignored a task pod the attempt never recorded") {
			t.Fatalf("the foreign pod was not logged:\n%s", s.logs)
		}

		// Later sweeps, past the collection grace, change nothing and
		// report it no more.
		res = s.sweep(time.Now().Add(CollectAfter + time.Minute))
		if ds := foreignDecisions(res); len(ds) != 0 {
			t.Fatalf("the same foreign pod was reported again: %+v", ds)
		}
		if n := strings.Count(s.logs.String(), "ignored a task pod the attempt never recorded"); n != 1 {
			t.Fatalf("the foreign pod was logged %d times, want once", n)
		}
		p := s.get(forged.Name)
		if p == nil || p.UID != forged.UID {
			t.Fatal("the forged pod was collected")
		}
		if len(p.Finalizers) != 1 || p.Finalizers[0] != FinalizerOutcomeRecord {
			t.Fatalf("the forged pod's finalizers %v: reaperd touched a pod it did not make", p.Finalizers)
		}
		if ti := s.row(a); ti.State != sdk.StateRunning {
			t.Fatalf("row %s after the later sweep", ti.State)
		}
	})

	// A lost attempt (its own pod gone, a provisional mark) is not kept
	// alive by a forged pod: a forged SUCCESS record overrides nothing, a
	// forged running pod holds no confirmation back.
	t.Run("AForgedPodOverridesNoMarkAndHoldsNoConfirmation", func(t *testing.T) {
		t.Parallel()
		for _, forgedFinished := range []bool{true, false} {
			s := newSweepEnv(t)
			s.runningOnBoard(a)
			own := s.running(a)
			s.recordPod(a, own)
			now := time.Now()
			s.mark(a, sdk.LabelAgentLost, now.Add(-30*time.Second))
			if err := s.cs.CoreV1().Pods(s.ns).Delete(context.Background(), own.Name, metav1.DeleteOptions{
				GracePeriodSeconds: new(int64)}); err != nil {
				t.Fatal(err)
			}
			s.waitFor("the attempt's own pod to go", func() bool { return s.get(own.Name) == nil })
			forged := s.running(a)
			phase := corev1.PodRunning
			if forgedFinished {
				s.playStatus(forged.Name, succeeded(t))
				phase = corev1.PodSucceeded
			}
			s.cachedPhase(s.sub, a, forged.Name, phase)

			res := s.sweep(now)
			ti := s.row(a)
			if ti.State != sdk.StateFailed || ti.LastFailureKind != sdk.FailureInfra || len(res.Overrides) != 0 {
				t.Fatalf("forged finished=%v: row %s/%s, overrides %v: want the mark kept", forgedFinished,
					ti.State, ti.LastFailureKind, res.Overrides)
			}
			if ti.InfraConfirmedAt.IsZero() {
				t.Fatalf("forged finished=%v: the mark was held back by a pod the attempt never recorded", forgedFinished)
			}
			wantForeign(t, foreignDecisions(res), a, forged.UID)
		}
	})

	// The presence check (cached and live) counts only the recorded pod:
	// with the attempt's own pod gone, a forged Running pod leaves it dead.
	// An attempt that records no UID keeps the label rule.
	t.Run("AForgedPodDoesNotKeepALostAttemptAlive", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		ownUID := "00000000-0000-0000-0000-000000000001" // the recorded pod, gone
		forged := e.running(a)
		e.cachedPhase(e.sub, a, forged.Name, corev1.PodRunning)
		for _, live := range []bool{false, true} {
			got, err := e.sub.Liveness(context.Background(), sdk.LivenessRequest{Attempts: []sdk.Attempt{a}, Live: live,
				Now: time.Now(), PodUIDs: map[sdk.Attempt]string{a: ownUID}})
			if err != nil {
				t.Fatal(err)
			}
			if got[0].State != sdk.Dead {
				t.Fatalf("live=%v: %+v: a forged pod kept the attempt alive", live, got[0])
			}
		}
		if got := liveness(t, e.sub, false, a); got[0].State != sdk.Alive {
			t.Fatalf("no recorded UID: %+v, want the label rule (alive)", got[0])
		}
		got, err := e.sub.Liveness(context.Background(), sdk.LivenessRequest{Attempts: []sdk.Attempt{a}, Now: time.Now(),
			PodUIDs: map[sdk.Attempt]string{a: string(forged.UID)}})
		if err != nil || got[0].State != sdk.Alive {
			t.Fatalf("the recorded pod itself: %+v, %v: want alive", got, err)
		}
		// The sighting reaches the next sweep as a decision.
		r, _ := e.sub.current()
		wantForeign(t, r.foreign.take(), a, forged.UID)
	})

	// The teardown pinned to the recorded UID stops that pod and leaves a
	// forged one alone.
	t.Run("TeardownLeavesAForgedPodAlone", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		own, forged := e.running(a), e.running(a)
		out := teardown(t, e.sub, sdk.TeardownRequest{Attempt: &a, PodUID: string(own.UID), Reason: sdk.LabelAgentLost})
		if len(out) != 1 || out[0].Action != sdk.TeardownStoppedInPlace || !strings.HasSuffix(out[0].Object, own.Name) {
			t.Fatalf("teardown %+v, want only the recorded pod stopped in place", out)
		}
		if p := e.get(forged.Name); p == nil || p.Spec.ActiveDeadlineSeconds != nil {
			t.Fatalf("the forged pod was touched: %+v", p)
		}
		if p := e.get(own.Name); p == nil || p.Spec.ActiveDeadlineSeconds == nil || *p.Spec.ActiveDeadlineSeconds != 1 {
			t.Fatalf("the recorded pod was not stopped in place: %+v", p)
		}
		// Only the forged pod left under the labels: nothing is done.
		out = teardown(t, e.sub, sdk.TeardownRequest{Attempt: &a, PodUID: "00000000-0000-0000-0000-000000000002"})
		if len(out) != 1 || out[0].Action != sdk.TeardownNothing {
			t.Fatalf("teardown with a recorded pod gone: %+v, want nothing done", out)
		}
		if p := e.get(forged.Name); p == nil || p.Spec.ActiveDeadlineSeconds != nil || p.DeletionTimestamp != nil {
			t.Fatalf("the forged pod was torn down: %+v", p)
		}
	})

	// The stop in place is a JSON patch testing /metadata/uid: the API
	// server itself refuses it for the pod now under the name, and the
	// teardown reports nothing done rather than deleting.
	t.Run("TheStopInPlaceWithAStaleUIDIsRefusedByTheAPIServer", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		r, err := e.sub.current()
		if err != nil {
			t.Fatal(err)
		}
		old := e.running(a)
		var read *pod
		if err := r.list(context.Background(), taskPodSelector(), func(p *pod) {
			if p.Name == old.Name {
				read = p
			}
		}); err != nil || read == nil {
			t.Fatalf("reading the pod: %v", err)
		}
		if err := e.cs.CoreV1().Pods(e.ns).Delete(context.Background(), old.Name, metav1.DeleteOptions{
			GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
		e.waitFor("the pod to go", func() bool { return e.get(old.Name) == nil })
		replaced := e.running(a, func(p *corev1.Pod) { p.Name = old.Name })
		if replaced.UID == old.UID {
			t.Fatal("the replacement has the old UID")
		}
		_, err = e.cs.CoreV1().Pods(e.ns).Patch(context.Background(), old.Name, types.JSONPatchType, deadlinePatch(old.UID),
			metav1.PatchOptions{})
		if !apierrors.IsInvalid(err) {
			t.Fatalf("the stale-UID patch: %v, want refused by the API server (its test of /metadata/uid failed)", err)
		}
		if !r.replaced(context.Background(), read) {
			t.Fatal("the replaced pod reads as the one listed")
		}
		out := e.sub.stop(context.Background(), r, read, sdk.TeardownRequest{Attempt: &a, Reason: sdk.LabelAgentLost}, attemptNote(a))
		if out.Action != sdk.TeardownNothing || !strings.HasPrefix(out.Error, sdk.TeardownGone) {
			t.Fatalf("stop of the replaced pod: %+v, want nothing done (gone)", out)
		}
		if p := e.get(old.Name); p == nil || p.UID != replaced.UID || p.Spec.ActiveDeadlineSeconds != nil || p.DeletionTimestamp != nil {
			t.Fatalf("the replacement was touched: %+v", p)
		}
	})
}
