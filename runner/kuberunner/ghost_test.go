package kuberunner_test

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/kuberunner"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/kube"
)

// ghostPod creates a pod of a, as a dispatch the board lost made it: the
// attempt's labels, bound to a node (so that a delete waits for its
// kubelet, which never comes), in phase phase.
func (e *env) ghostPod(t *testing.T, name string, a sdk.Attempt, phase corev1.PodPhase) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	lbls, anns := kube.AttemptLabels(a)
	p, err := e.cs.CoreV1().Pods(e.ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls, Annotations: anns},
		Spec: corev1.PodSpec{NodeName: "ghost-node", RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "task", Image: "registry.invalid/reaper-task:test"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.Phase = phase
	if p, err = e.cs.CoreV1().Pods(e.ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return p
}

func (e *env) recorded(t *testing.T, a sdk.Attempt) lifecycle.CreatedPod {
	t.Helper()
	p, err := e.w.RecordedPod(context.Background(), a)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// A pod of the attempt that the board does not know (its dispatch lost
// with the board's last writes) holds the attempt's dispatch: it is
// deleted, and the attempt stays scheduled until the pod is gone. Then the
// attempt gets its pod.
func TestAGhostPodHoldsTheDispatchUntilItIsGone(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.mkRun(t, "run-1", lifecycle.NewTask{TaskID: "t"}, lifecycle.NewTask{TaskID: "u"})
	a := sdk.Attempt{RunID: "run-1", TaskID: "t", Try: 1}
	ghost := e.ghostPod(t, "ghost-of-t", a, corev1.PodRunning)
	// An ended pod of the other task's attempt holds nothing.
	e.ghostPod(t, "ended-u", sdk.Attempt{RunID: "run-1", TaskID: "u", Try: 1}, corev1.PodSucceeded)
	r := e.runner(t, e.config(e.cs))

	for i := range 2 {
		res := cycle(t, r, e.clk.Now())
		if want := 1 - i; res.Dispatched != want {
			t.Fatalf("cycle %d: dispatched %d, want %d (the other task's only)", i, res.Dispatched, want)
		}
		if ti := e.ti(t, "run-1", "t"); ti.State != sdk.StateScheduled || e.recorded(t, a).Name != "" {
			t.Fatalf("cycle %d: the held attempt is %s with pod %q, want scheduled with none", i, ti.State, e.recorded(t, a).Name)
		}
		got, err := e.cs.CoreV1().Pods(e.ns).Get(ctx, ghost.Name, metav1.GetOptions{})
		if err != nil || got.DeletionTimestamp == nil || got.UID != ghost.UID {
			t.Fatalf("cycle %d: the ghost %+v (err %v), want it being deleted", i, got.ObjectMeta, err)
		}
		if e.ti(t, "run-1", "u").State != sdk.StateQueued {
			t.Fatalf("cycle %d: the other task is not queued", i)
		}
	}
	// Its kubelet confirms the end: the pod goes.
	zero := int64(0)
	if err := e.cs.CoreV1().Pods(e.ns).Delete(ctx, ghost.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cs.CoreV1().Pods(e.ns).Get(ctx, ghost.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the ghost is still there: %v", err)
	}
	res := cycle(t, r, e.clk.Now())
	ti, rec := e.ti(t, "run-1", "t"), e.recorded(t, a)
	if res.Dispatched != 1 || ti.State != sdk.StateQueued || rec.UID == "" || rec.UID == string(ghost.UID) || ti.Attempt != a {
		t.Fatalf("dispatched %d, row %s pod %+v: want the attempt dispatched as it was, in a pod of its own", res.Dispatched,
			ti.State, rec)
	}
}

// Dispatches look for ghosts only while one can be alive: for the window
// after the runner first reads the board's timeline (and after it moves).
// Past it, on the same timeline, a dispatch makes no LIST: a pod carrying
// the attempt's labels then is no dispatch the board lost, and is left to
// the substrate as any pod it does not know.
func TestNoLookForGhostsPastTheWindowOnOneTimeline(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	cfg := e.config(e.cs)
	r := e.runner(t, cfg)
	if res := cycle(t, r, e.clk.Now()); res.Dispatched != 0 {
		t.Fatalf("dispatched %d with nothing submitted", res.Dispatched)
	}
	l := cfg.Ladder
	e.clk.Advance(l.AgentLost + l.Heartbeat + l.TaskTerminationGrace)
	e.mkRun(t, "run-1", lifecycle.NewTask{TaskID: "t"})
	a := sdk.Attempt{RunID: "run-1", TaskID: "t", Try: 1}
	pod := e.ghostPod(t, "labelled-as-t", a, corev1.PodRunning)
	if res := cycle(t, r, e.clk.Now()); res.Dispatched != 1 {
		t.Fatalf("dispatched %d past the window, want 1 (no look)", res.Dispatched)
	}
	got, err := e.cs.CoreV1().Pods(e.ns).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil || got.DeletionTimestamp != nil {
		t.Fatalf("the labelled pod %+v (err %v): want it left alone past the window", got.ObjectMeta, err)
	}
}

// A dispatch whose listing went stale (its runner deposed while the cycle
// waited on the board, or the attempt dispatched meanwhile) finds the
// attempt's own pod, which the board knows: it deletes nothing. Nor does a
// runner whose term no longer leads, whatever it finds.
func TestAGhostIsDeletedOnlyOnAFreshBoardUnderTheTerm(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.mkRun(t, "run-1", lifecycle.NewTask{TaskID: "t"})
	a := sdk.Attempt{RunID: "run-1", TaskID: "t", Try: 1}
	r := e.runner(t, e.config(e.cs))
	if res := cycle(t, r, e.clk.Now()); res.Dispatched != 1 {
		t.Fatalf("dispatched %d, want 1", res.Dispatched)
	}
	own := e.recorded(t, a)
	if own.Name == "" {
		t.Fatal("the attempt's pod is not recorded")
	}
	untouched := func(what string) {
		t.Helper()
		p, err := e.cs.CoreV1().Pods(e.ns).Get(ctx, own.Name, metav1.GetOptions{})
		if err != nil || p.DeletionTimestamp != nil {
			t.Fatalf("%s: the attempt's own pod %+v (err %v), want it left alone", what, p.ObjectMeta, err)
		}
	}
	// The stale dispatch, inside the window the first cycle opened.
	held, err := kuberunner.HeldForGhost(r, ctx, e.w, a, e.clk.Now())
	if err != nil || held {
		t.Fatalf("stale dispatch: held %v, err %v; want neither", held, err)
	}
	untouched("a stale dispatch")
	// A term that does not lead: refused before anything is deleted.
	if _, err := kuberunner.HeldForGhost(r, ctx, e.w.Fenced(99), a, e.clk.Now()); err == nil {
		t.Fatal("a deposed term's look deleted or held without a refusal")
	}
	untouched("a deposed term's dispatch")
}
