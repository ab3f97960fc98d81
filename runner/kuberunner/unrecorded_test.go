package kuberunner_test

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/kuberunner"
	"github.com/dexaflow/reaper/sdk"
)

// TestAPodCreatedButNeverRecordedIsAdoptedByTheNextCycle: a runner whose
// term ends between its pod create and the record of the pod's UID (a
// takeover, a kill, a cut from the board) leaves the attempt queued with
// the pod's name recorded and no UID; its agent is refused its exchange and
// the dispatch-lost reaper, seeing the pod live, defers. The next leader's
// runner reads the pod by the recorded name and records it once the
// dispatch value it carries proves it made for the attempt; a pod under
// that name it did not make stays unrecorded and untouched.
func TestAPodCreatedButNeverRecordedIsAdoptedByTheNextCycle(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.mkRun(t, "run", lifecycle.NewTask{TaskID: "load"})
	cfg := e.config(e.cs)
	var takeover int64
	cfg.Customize = func(p *corev1.Pod) {
		// Another replica takes the lead while this create is under way.
		if ok, err := e.store.Resign(ctx, e.term, "test"); err != nil || !ok {
			t.Errorf("resigning: %v, %v", ok, err)
		}
		lease, ok, err := e.store.TryAcquire(ctx, "other", time.Hour, e.clk.Now())
		if err != nil || !ok {
			t.Errorf("the takeover: %v, %v", ok, err)
		}
		takeover = lease.Term
	}
	r := e.runner(t, cfg)
	if _, err := r.RunOnceFenced(ctx, e.clk.Now(), e.term); !errors.Is(err, lifecycle.ErrDeposed) {
		t.Fatalf("the cycle deposed after its create: %v", err)
	}
	pods := e.pods(t)
	if len(pods) != 1 {
		t.Fatalf("%d pods, want the one created", len(pods))
	}
	var made corev1.Pod
	for _, p := range pods {
		made = p
	}
	ti := e.ti(t, "run", "load")
	rec, err := lifecycle.New(e.store.Pool(), lifecycle.Options{}).RecordedPod(ctx, ti.Attempt)
	if err != nil || ti.State != sdk.StateQueued || rec.Name != made.Name || rec.UID != "" {
		t.Fatalf("after the deposed cycle: %s, recorded %+v (%v); want queued, named %s, no UID", ti.State, rec, err, made.Name)
	}

	// The new leader's runner, once the create's time has passed.
	r2 := e.runner(t, e.config(e.cs))
	e.clk.Advance(time.Minute)
	res, err := r2.RunOnceFenced(ctx, e.clk.Now(), takeover)
	if err != nil || res.Adopted != 1 {
		t.Fatalf("the next cycle: %+v, %v; want the pod adopted", res, err)
	}
	rec, _ = lifecycle.New(e.store.Pool(), lifecycle.Options{}).RecordedPod(ctx, ti.Attempt)
	if rec.UID != string(made.UID) || rec.Name != made.Name {
		t.Fatalf("recorded %+v, want %s %s", rec, made.Name, made.UID)
	}
	if len(e.pods(t)) != 1 {
		t.Fatalf("%d pods after the adoption, want the one", len(e.pods(t)))
	}

	t.Run("APodTheDispatchDidNotMakeIsLeftAlone", func(t *testing.T) {
		// The same state, but the pod under the recorded name is one a
		// tenant made (with the attempt's labels, without the value).
		e.mkRun(t, "squat", lifecycle.NewTask{TaskID: "load"})
		a := sdk.Attempt{RunID: "squat", TaskID: "load", Try: 1}
		w := lifecycle.New(e.store.Pool(), lifecycle.Options{})
		if ok, err := w.Enqueue(ctx, a, e.clk.Now()); err != nil || !ok {
			t.Fatal(ok, err)
		}
		name := kuberunner.PodName(a, kuberunner.NewDispatch())
		if ok, err := w.QueuePod(ctx, a, name, e.clk.Now()); err != nil || !ok {
			t.Fatal(ok, err)
		}
		fake := squat(t, e.cs, e.ns, name, &a)
		e.clk.Advance(time.Minute)
		res, err := r2.RunOnceFenced(ctx, e.clk.Now(), takeover)
		if err != nil || res.Adopted != 0 {
			t.Fatalf("the cycle: %+v, %v; want nothing adopted", res, err)
		}
		if rec, _ := w.RecordedPod(ctx, a); rec.UID != "" {
			t.Fatalf("recorded %+v: the tenant's pod was adopted", rec)
		}
		got, err := e.cs.CoreV1().Pods(e.ns).Get(ctx, fake.Name, metav1.GetOptions{})
		if err != nil || got.ResourceVersion != fake.ResourceVersion {
			t.Fatalf("the tenant's pod: %v (%v), want it untouched", got, err)
		}
	})
}
