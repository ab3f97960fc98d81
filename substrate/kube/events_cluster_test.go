package kube

// The substrate's Kubernetes Events (events.go), read back from the real
// API server as kubectl reads them: one per stop, delete and settle,
// regarding the right pod, with the decision label; none for a pod that is
// not reaperd's; repeats aggregated into a series; writes that fail
// counted and logged once; the broadcaster stopped with the substrate.

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/eventually"
	"github.com/dexaflow/reaper/testkit/kubetest"
)

// reaperEvents lists the Events reaperd recorded in the env's namespace,
// by the pod they regard.
func (e *env) reaperEvents() map[types.UID][]eventsv1.Event {
	e.t.Helper()
	list, err := e.cs.EventsV1().Events(e.ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		e.t.Fatalf("listing the Events of %s: %v", e.ns, err)
	}
	out := map[types.UID][]eventsv1.Event{}
	for _, ev := range list.Items {
		if ev.ReportingController == EventsController {
			out[ev.Regarding.UID] = append(out[ev.Regarding.UID], ev)
		}
	}
	return out
}

// eventsOn waits until reaperd's Events regard exactly the pods of want,
// each with one Event, and returns them. The broadcaster writes them on
// its own goroutines: polled, never slept on.
func (e *env) eventsOn(want ...*corev1.Pod) map[types.UID]eventsv1.Event {
	e.t.Helper()
	var got map[types.UID][]eventsv1.Event
	e.waitWithin(time.Minute, fmt.Sprintf("one Event on each of %d pods", len(want)), func() bool {
		got = e.reaperEvents()
		for _, p := range want {
			if len(got[p.UID]) == 0 {
				return false
			}
		}
		return true
	})
	out := map[types.UID]eventsv1.Event{}
	for _, p := range want {
		if len(got[p.UID]) != 1 {
			e.t.Fatalf("%d Events on pod %s, want one: %+v", len(got[p.UID]), p.Name, got[p.UID])
		}
		out[p.UID] = got[p.UID][0]
		delete(got, p.UID)
	}
	if len(got) != 0 {
		e.t.Fatalf("Events on other pods than the %d acted on: %+v", len(want), got)
	}
	return out
}

// wantEvent checks an Event regards pod p (its UID), with its type, reason
// and action, and a note holding each of notes.
func wantEvent(t *testing.T, ev eventsv1.Event, p *corev1.Pod, typ, reason, action string, notes ...string) {
	t.Helper()
	r := ev.Regarding
	if r.Kind != "Pod" || r.APIVersion != "v1" || r.Namespace != p.Namespace || r.Name != p.Name || r.UID != p.UID {
		t.Errorf("the Event regards %+v, want pod %s/%s uid %s", r, p.Namespace, p.Name, p.UID)
	}
	if ev.Type != typ || ev.Reason != reason || ev.Action != action || ev.ReportingController != EventsController ||
		ev.ReportingInstance == "" {
		t.Errorf("Event %s %s %s by %s/%s, want %s %s %s by %s", ev.Type, ev.Reason, ev.Action, ev.ReportingController,
			ev.ReportingInstance, typ, reason, action, EventsController)
	}
	for _, n := range notes {
		if !strings.Contains(ev.Note, n) {
			t.Errorf("Event note %q lacks %q", ev.Note, n)
		}
	}
}

// eventer is the substrate's Events recorder.
func (e *env) eventer(s *Substrate) *eventer {
	e.t.Helper()
	r, err := s.current()
	if err != nil {
		e.t.Fatal(err)
	}
	return r.events
}

func TestEvents(t *testing.T) {
	t.Parallel()

	t.Run("StopInPlaceIsOneEventOnThePodWithTheLabel", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		a := att("extract")
		p := e.running(a)
		out := teardown(t, e.sub, sdk.TeardownRequest{Attempt: &a, Reason: sdk.LabelAgentLost})
		if out[0].Action != sdk.TeardownStoppedInPlace {
			t.Fatalf("outcomes %+v", out)
		}
		ev := e.eventsOn(p)[p.UID]
		// agent_lost fails its attempt: a Warning.
		wantEvent(t, ev, p, corev1.EventTypeWarning, sdk.LabelAgentLost, EventActionStop,
			"Stopped in place", "attempt run run-1, task extract, try 1, epoch 1")
	})

	// A run's teardown (orphan_run fails no attempt: Normal): the started
	// pod stopped, the pod that never started deleted, each an Event; the
	// finished pod skipped and another run's pod untouched, none.
	t.Run("RunTeardownIsOneEventPerPodStoppedOrDeleted", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		run, pending, done := att("a"), att("b"), att("c")
		pr, pp, pd := e.running(run), e.create(pending, false), e.running(done)
		e.playStatus(pd.Name, finish(corev1.PodFailed, 1, "Error", ""))
		e.running(sdk.Attempt{RunID: "run-2", TaskID: "a", Try: 1, Epoch: 1})
		before := e.eventer(e.sub).counts().emitted
		teardown(t, e.sub, sdk.TeardownRequest{RunID: "run-1", Reason: sdk.LabelOrphanRun})
		if n := e.eventer(e.sub).counts().emitted - before; n != 2 {
			t.Fatalf("%d Events recorded, want 2", n)
		}
		evs := e.eventsOn(pr, pp)
		wantEvent(t, evs[pr.UID], pr, corev1.EventTypeNormal, sdk.LabelOrphanRun, EventActionStop,
			"attempt run run-1, task a, try 1, epoch 1")
		wantEvent(t, evs[pp.UID], pp, corev1.EventTypeNormal, sdk.LabelOrphanRun, EventActionDelete,
			"Deleted (never started)", "attempt run run-1, task b, try 1, epoch 1")
	})

	t.Run("DeleteOfAPodThatNeverStartedIsOneEvent", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		a := att("extract")
		p := e.create(a, false)
		teardown(t, e.sub, sdk.TeardownRequest{Attempt: &a, Reason: sdk.LabelPodLost, PodUID: string(p.UID)})
		wantEvent(t, e.eventsOn(p)[p.UID], p, corev1.EventTypeWarning, sdk.LabelPodLost, EventActionDelete,
			"Deleted (never started)", "attempt run run-1, task extract, try 1, epoch 1")
	})

	// A stop in place refused (a Role without patch): deleted instead, a
	// Warning naming the fallback.
	t.Run("DeleteFallbackIsAWarningNamingIt", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		bindRole(t, e, kubetest.Carol, withoutVerb(roleRules(t), "patch"))
		s, _, _ := e.substrateAs(kubetest.Carol, nil)
		a := att("extract")
		p := e.running(a)
		if out := teardown(t, s, sdk.TeardownRequest{Attempt: &a, Reason: sdk.LabelOrphanRun}); out[0].Action != sdk.TeardownDeleteFallback {
			t.Fatalf("outcomes %+v, want delete_fallback", out)
		}
		wantEvent(t, e.eventsOn(p)[p.UID], p, corev1.EventTypeWarning, sdk.LabelOrphanRun, EventActionDelete,
			sdk.LabelTeardownDeleteFallback, "attempt run run-1, task extract, try 1, epoch 1")
	})

	t.Run("SettleIsOneEventOnThePodWithTheLabel", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		ok, disrupted := att("load_a"), att("load_b")
		s.runningOnBoard(ok)
		s.runningOnBoard(disrupted)
		po := s.finished(ok, corev1.PodSucceeded, finish(corev1.PodSucceeded, 0, "Completed", rec(t, ok, RecordSuccess, code(0), "")))
		pd := s.finished(disrupted, corev1.PodFailed, both(finish(corev1.PodFailed, 137, "Error", ""),
			disruptedBy("DeletionByTaintManager")))
		s.sweep(time.Now())
		evs := s.eventsOn(po, pd)
		wantEvent(t, evs[po.UID], po, corev1.EventTypeNormal, sdk.LabelReconcileSettled, EventActionSettle,
			"attempt run run-1, task load_a, try 1, epoch 1", "as success", "DurableSuccessRecord")
		wantEvent(t, evs[pd.UID], pd, corev1.EventTypeWarning, sdk.LabelReconcileSettled, EventActionSettle,
			"attempt run run-1, task load_b, try 1, epoch 1", "as infra ("+sdk.ReasonPodDisrupted+")", "DisruptedPodIsInfra")
		// A later sweep settles nothing more (the attempts moved on): no
		// more Events.
		before := s.eventer(s.sub).counts().emitted
		s.sweep(time.Now())
		if n := s.eventer(s.sub).counts().emitted - before; n != 0 {
			t.Fatalf("a sweep that settled nothing recorded %d Events", n)
		}
	})

	t.Run("OverrideIsOneEventOnThePodOfTheRecord", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		a := att("load_a")
		s.runningOnBoard(a)
		now := time.Now()
		s.mark(a, sdk.LabelPodLost, now.Add(-time.Minute))
		p := s.finished(a, corev1.PodFailed, finish(corev1.PodFailed, 0, "Completed", rec(t, a, RecordSuccess, code(0), "")))
		if res := s.sweep(now); res.Overrides[sdk.LabelPodLost] != 1 {
			t.Fatalf("overrides %v", res.Overrides)
		}
		wantEvent(t, s.eventsOn(p)[p.UID], p, corev1.EventTypeNormal, sdk.LabelReconcileInfraOverride, EventActionSettle,
			"attempt run run-1, task load_a, try 1, epoch 1", "as success from its outcome record", sdk.LabelPodLost)
	})

	// A pod someone else made with a live attempt's labels (another UID
	// than the attempt records) and a SUCCESS record: the sweep settles
	// nothing from it and the teardown leaves it alone, so no Event
	// regards it; the attempt's own pod, torn down, has its one.
	t.Run("NoneForAForeignPod", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		a := sdk.Attempt{RunID: "run-forged", TaskID: "load_a", Try: 1, Epoch: 1}
		s.runningOnBoard(a)
		own := s.running(a)
		s.recordPod(a, own)
		forged := s.running(a)
		s.playStatus(forged.Name, finish(corev1.PodSucceeded, 0, "Completed", rec(t, a, RecordSuccess, code(0), "")))
		s.cachedPhase(s.sub, a, forged.Name, corev1.PodSucceeded)
		before := s.eventer(s.sub).counts().emitted
		res := s.sweep(time.Now())
		wantForeign(t, foreignDecisions(res), a, forged.UID)
		if n := s.eventer(s.sub).counts().emitted - before; n != 0 {
			t.Fatalf("a sweep that refused a foreign pod recorded %d Events", n)
		}
		out := teardown(t, s.sub, sdk.TeardownRequest{Attempt: &a, Reason: sdk.LabelAgentLost, PodUID: string(own.UID)})
		if len(out) != 1 || out[0].Action != sdk.TeardownStoppedInPlace {
			t.Fatalf("outcomes %+v, want the own pod alone stopped", out)
		}
		if n := s.eventer(s.sub).counts().emitted - before; n != 1 {
			t.Fatalf("%d Events recorded, want the own pod's one", n)
		}
		wantEvent(t, s.eventsOn(own)[own.UID], own, corev1.EventTypeWarning, sdk.LabelAgentLost, EventActionStop)
	})

	// The same Event on one pod again and again (a teardown retried on a
	// pod its finalizer holds after the first delete) is one Event object
	// whose series counts the repeats, not one object each.
	t.Run("RepeatsOnOnePodAggregateIntoASeries", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		a := att("extract")
		p := e.create(a, false, recordHeld)
		t.Cleanup(func() { e.releaseFinalizer(p.Name) })
		const repeats = 5
		for range repeats {
			if out := teardown(t, e.sub, sdk.TeardownRequest{Attempt: &a, Reason: sdk.LabelPodLost}); out[0].Action != sdk.TeardownDeleted {
				t.Fatalf("outcomes %+v, want deleted (the finalizer keeps the pod)", out)
			}
		}
		if n := e.eventer(e.sub).counts().emitted; n != repeats {
			t.Fatalf("%d Events recorded, want %d", n, repeats)
		}
		e.waitWithin(time.Minute, "the repeats counted in one Event's series", func() bool {
			evs := e.reaperEvents()[p.UID]
			return len(evs) == 1 && evs[0].Series != nil && evs[0].Series.Count >= 2
		})
		if all := e.reaperEvents(); len(all) != 1 || len(all[p.UID]) != 1 {
			t.Fatalf("Events %+v, want one object on the pod", all)
		}
		wantEvent(t, e.reaperEvents()[p.UID][0], p, corev1.EventTypeWarning, sdk.LabelPodLost, EventActionDelete)
	})

	// Tenants' text (the attempt's ids) reaches a note made safe and
	// within the API server's bound, which therefore never refuses it.
	t.Run("NotesAreSafeTextWithinTheBound", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		p := e.create(att("extract"), false)
		r, err := e.sub.current()
		if err != nil {
			t.Fatal(err)
		}
		r.events.record(reduce(p), false, "reason\x00with a NUL", EventActionStop, "bad \xff byte, NUL \x00, "+strings.Repeat("long ", 400))
		ev := e.eventsOn(p)[p.UID]
		if len(ev.Note) > maxEventNoteBytes || !strings.HasSuffix(ev.Note, sdk.TextCutMarker) ||
			!strings.HasPrefix(ev.Note, "bad \uFFFD byte, NUL \uFFFD, long") || ev.Reason != "reason\uFFFDwith a NUL" {
			t.Fatalf("Event reason %q note %q (%d bytes)", ev.Reason, ev.Note, len(ev.Note))
		}
	})

	// Events are best-effort: without the Role's events rule the teardown
	// is done all the same, and the refused writes are counted and logged
	// once.
	t.Run("RefusedWritesNeverFailATeardownAndAreLoggedOnce", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		var pods []rbacv1.PolicyRule
		for _, r := range roleRules(t) {
			if r.Resources[0] == "pods" {
				pods = append(pods, r)
			}
		}
		bindRole(t, e, kubetest.Carol, pods)
		s, _, logs := e.substrateAs(kubetest.Carol, nil)
		for _, task := range []string{"one", "two"} {
			a := att(task)
			e.running(a)
			if out := teardown(t, s, sdk.TeardownRequest{Attempt: &a, Reason: sdk.LabelAgentLost}); out[0].Action != sdk.TeardownStoppedInPlace {
				t.Fatalf("outcomes %+v: the teardown depends on its Event", out)
			}
		}
		e.waitWithin(time.Minute, "both refused writes counted", func() bool { return e.eventer(s).counts().failed >= 2 })
		if n := strings.Count(logs.String(), "recording a Kubernetes Event failed"); n != 1 {
			t.Fatalf("the refused writes were logged %d times, want once:\n%s", n, logs)
		}
		if !strings.Contains(logs.String(), "forbidden") {
			t.Fatalf("the log does not say why:\n%s", logs)
		}
	})

	t.Run("EventsFalseRecordsNone", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		s, _, _ := e.substrateAs(kubetest.Admin, sdk.Values{"events": false})
		if e.eventer(s) != nil {
			t.Fatal("events = false started a broadcaster")
		}
		a := att("extract")
		e.running(a)
		if out := teardown(t, s, sdk.TeardownRequest{Attempt: &a, Reason: sdk.LabelAgentLost}); out[0].Action != sdk.TeardownStoppedInPlace {
			t.Fatalf("outcomes %+v", out)
		}
		// No broadcaster, so nothing in flight: none now is none ever.
		if evs := e.reaperEvents(); len(evs) != 0 {
			t.Fatalf("Events with events = false: %+v", evs)
		}
	})
}

// releaseFinalizer removes every finalizer of pod name, so that it goes.
func (e *env) releaseFinalizer(name string) {
	_, err := e.cs.CoreV1().Pods(e.ns).Patch(context.Background(), name, types.MergePatchType,
		[]byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	if err != nil && e.get(name) != nil {
		e.t.Errorf("releasing the finalizer of %s: %v", name, err)
	}
}

// broadcasterGoroutines counts the goroutines of Events broadcasters.
func broadcasterGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "k8s.io/client-go/tools/events.") || strings.Contains(g, "watch.(*Broadcaster).loop") {
			count++
		}
	}
	return count
}

// TestEventsBroadcasterStopsWithTheSubstrate: the broadcaster's goroutines
// end with Close, and with a Configure that replaces the configuration.
// Not parallel: it counts goroutines of the whole test binary, while the
// parallel tests have not begun.
func TestEventsBroadcasterStopsWithTheSubstrate(t *testing.T) {
	base := broadcasterGoroutines()
	e := newEnv(t)
	a := att("extract")
	p := e.running(a)
	teardown(t, e.sub, sdk.TeardownRequest{Attempt: &a, Reason: sdk.LabelAgentLost})
	e.eventsOn(p)
	if broadcasterGoroutines() <= base {
		t.Fatal("no broadcaster goroutine while the substrate runs: the count proves nothing")
	}
	// A new configuration replaces the broadcaster: the count stays.
	running := broadcasterGoroutines()
	if err := e.sub.Configure(context.Background(), sdk.ConfigureRequest{Edition: "kube",
		Values: sdk.Values{"namespace": e.ns}}); err != nil {
		t.Fatal(err)
	}
	if !eventually.Until(30*time.Second, func() bool { return broadcasterGoroutines() <= running },
		eventually.Every(10*time.Millisecond)) {
		t.Fatalf("%d broadcaster goroutines after a reconfiguration, %d before", broadcasterGoroutines(), running)
	}
	e.sub.Close()
	if !eventually.Until(30*time.Second, func() bool { return broadcasterGoroutines() <= base },
		eventually.Every(10*time.Millisecond)) {
		t.Fatalf("%d broadcaster goroutines after Close, %d before the substrate", broadcasterGoroutines(), base)
	}
}
