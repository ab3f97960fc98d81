package kube

// The outcome record finalizer on the real API server: a pod the kube
// runner made (the finalizer added here as the runner adds it) keeps its
// record through a deletion until the sweep has read it. KWOK deletes a
// deleted pod at once with no grace (the kubelet's last word), so only the
// finalizers keep it; what a kubelet writes, the test writes.

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/testkit/kubetest"
)

// recordHeld puts the outcome record finalizer on a pod, as the kube
// runner does.
func recordHeld(p *corev1.Pod) { p.Finalizers = append(p.Finalizers, FinalizerOutcomeRecord) }

// userDelete deletes pod name as kubectl delete does (the pod's own grace).
func (s *sweepEnv) userDelete(name string) {
	s.t.Helper()
	if err := s.cs.CoreV1().Pods(s.ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		s.t.Fatalf("deleting pod %s: %v", name, err)
	}
}

// cachedDeleting waits until the substrate's cache holds pod name with its
// deletion begun.
func (s *sweepEnv) cachedDeleting(a sdk.Attempt, name string) {
	s.t.Helper()
	r, err := s.sub.current()
	if err != nil {
		s.t.Fatal(err)
	}
	s.waitFor("the cache to hold "+name+" being deleted", func() bool {
		for _, p := range r.presence.cached(a) {
			if p.Name == name && p.DeletionTimestamp != nil {
				return true
			}
		}
		return false
	})
}

// carries reports whether pod name (present) carries finalizer f.
func (s *sweepEnv) carries(name, f string) bool {
	s.t.Helper()
	p := s.get(name)
	if p == nil {
		s.t.Fatalf("pod %s is gone", name)
	}
	return slices.Contains(p.Finalizers, f)
}

// released waits until the substrate's finalizer is off pod name, and then
// until the pod is gone. The release is the substrate's and is bounded as
// any wait; the removal after it is KWOK's (its delete of a pod being
// deleted), which a loaded machine can hold back longer.
func (s *sweepEnv) released(name string) {
	s.t.Helper()
	// A release the API server refused as stale (the pod changed after
	// the cache's copy: a busy machine) waits for the next sweep, as a
	// cycle's would: sweep again, at most once a second, until it is done.
	last := time.Now()
	s.waitPod(name, "released", func(p *corev1.Pod) bool {
		if p == nil || !slices.Contains(p.Finalizers, FinalizerOutcomeRecord) {
			return true
		}
		if time.Since(last) >= time.Second {
			last = time.Now()
			s.sweep(last)
		}
		return false
	})
	s.waitWithin(2*time.Minute, "pod "+name+" gone once released", func() bool { return s.get(name) == nil })
}

// leaks returns the sweep's finalizer leak decisions.
func leaks(res sdk.SweepResult) []sdk.Decision {
	var out []sdk.Decision
	for _, d := range res.Decisions {
		if d.Label == sdk.LabelReconcileFinalizerLeak {
			out = append(out, d)
		}
	}
	return out
}

func settledBy(res sdk.SweepResult, a sdk.Attempt, rule string) bool {
	for _, d := range res.Decisions {
		if d.Label == sdk.LabelReconcileSettled && d.Applied && d.Attempt == a && d.Evidence["rule"] == rule {
			return true
		}
	}
	return false
}

func TestSweepOutcomeRecordFinalizer(t *testing.T) {
	t.Parallel()
	a := sdk.Attempt{RunID: "run-1", TaskID: "load_a", Try: 1, Epoch: 1}
	success := func(t *testing.T) func(*corev1.PodStatus) {
		return finish(corev1.PodSucceeded, 0, "Completed", rec(t, a, RecordSuccess, code(0), ""))
	}

	// The case: the pod finished with a SUCCESS record and a user
	// deleted it before any sweep read it. The finalizer kept it; the
	// sweep settles success from it, releases it, and it goes.
	t.Run("SucceededPodDeletedByAUserBeforeTheSweepStillSettlesSuccess", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		s.runningOnBoard(a)
		p := s.finished(a, corev1.PodSucceeded, success(t), recordHeld)
		s.userDelete(p.Name)
		s.cachedDeleting(a, p.Name)
		res := s.sweep(time.Now())
		if !settledBy(res, a, "DurableSuccessRecord") || len(leaks(res)) != 0 {
			t.Fatalf("decisions %+v, want the attempt settled by DurableSuccessRecord, no leak", res.Decisions)
		}
		if ti := s.row(a); ti.State != sdk.StateSuccess {
			t.Fatalf("row %s, want success", ti.State)
		}
		s.released(p.Name)
		// Settled already: its deletion keeps no tombstone to settle again.
		if n := s.tombs().len(); n != 0 {
			t.Fatalf("%d tombstones after the release, want 0", n)
		}
	})

	// A running pod deleted by a user: the kubelet stops it and writes its
	// end (here, the task finished inside its grace) while the finalizer
	// holds the object; the sweep settles from that end.
	t.Run("RunningPodDeletedKeepsTheEndItsKubeletWrites", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		s.runningOnBoard(a)
		p := s.running(a, recordHeld)
		s.userDelete(p.Name)
		s.cachedDeleting(a, p.Name)
		if res := s.sweep(time.Now()); len(res.Decisions) != 0 || s.get(p.Name) == nil {
			t.Fatalf("decisions %+v before the kubelet wrote the end, want none and the pod kept", res.Decisions)
		}
		s.playStatus(p.Name, success(t))
		s.cachedPhase(s.sub, a, p.Name, corev1.PodSucceeded)
		if res := s.sweep(time.Now()); !settledBy(res, a, "DurableSuccessRecord") {
			t.Fatalf("decisions %+v, want the attempt settled by DurableSuccessRecord", res.Decisions)
		}
		s.released(p.Name)
	})

	// A pod deleted while its task ran: the kubelet SIGTERMs the agent,
	// which writes its "stopped" record (FAILED, agent_stopped, no exit
	// code) and exits; the kubelet writes the pod Failed and the finalizer
	// keeps it. That record says the task was stopped, not why: the
	// deletion decides, on the infra rail, confirmed at once.
	t.Run("RunningPodDeletedUnderItsTaskIsPodDisruptedOnTheInfraRail", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		s.runningOnBoard(a)
		p := s.running(a, recordHeld)
		s.userDelete(p.Name)
		s.cachedDeleting(a, p.Name)
		s.playStatus(p.Name, func(st *corev1.PodStatus) {
			st.Phase = corev1.PodFailed
			finish(corev1.PodFailed, 1, "Error",
				rec(t, a, RecordFailed, nil, "agent_stopped: the agent was stopped before the task finished"))(st)
		})
		s.cachedPhase(s.sub, a, p.Name, corev1.PodFailed)
		if res := s.sweep(time.Now()); !settledBy(res, a, "DeletedUnderTheTaskIsInfra") {
			t.Fatalf("decisions %+v, want the attempt settled by DeletedUnderTheTaskIsInfra", res.Decisions)
		}
		wantRow(t, s.row(a), sdk.StateFailed, sdk.FailureInfra, "pod_disrupted: pod deleted while its task ran", true)
		s.released(p.Name)
	})

	t.Run("AnotherControllersFinalizerIsLeftUntouched", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		s.runningOnBoard(a)
		p := s.finished(a, corev1.PodSucceeded, success(t), s.kept, recordHeld)
		s.userDelete(p.Name)
		s.cachedDeleting(a, p.Name)
		if res := s.sweep(time.Now()); !settledBy(res, a, "DurableSuccessRecord") {
			t.Fatalf("decisions %+v, want the attempt settled", res.Decisions)
		}
		s.waitPod(p.Name, "released of the outcome record finalizer only", func(p *corev1.Pod) bool {
			return p != nil && slices.Equal(p.Finalizers, []string{keepFinalizer})
		})
	})

	// Settled, then collected ten minutes after its end: the collection
	// still works, the release going first.
	t.Run("CollectionStillCollectsAReleasedPod", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		s.runningOnBoard(a)
		p := s.finished(a, corev1.PodSucceeded, success(t), recordHeld)
		now := time.Now()
		s.sweep(now)
		s.waitPod(p.Name, "released but kept", func(p *corev1.Pod) bool {
			return p != nil && p.DeletionTimestamp == nil && len(p.Finalizers) == 0
		})
		s.cachedReleased(a, p.Name)
		s.sweep(now.Add(CollectAfter + time.Second))
		s.waitPod(p.Name, "collected", func(p *corev1.Pod) bool { return p == nil })
	})

	// The leak bound, first case: the attempt was settled long ago (here
	// by its own report) and the pod still holds the finalizer (an older
	// reaperd, a release that kept failing): released, metered, and
	// collected in the same sweep.
	t.Run("LeakedFinalizerOfAnAttemptSettledLongAgoIsReleasedAndMetered", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		s.runningOnBoard(a)
		p := s.finished(a, corev1.PodSucceeded, success(t), recordHeld)
		ended := time.Now()
		if res, err := s.store.Settle(context.Background(), []sdk.Settlement{{Attempt: a, Outcome: sdk.OutcomeSuccess,
			FromStates: settleFrom, Term: s.term, At: ended}}); err != nil || !res[0].Applied {
			t.Fatalf("the attempt's own success: %+v, %v", res, err)
		}
		res := s.sweep(ended.Add(CollectAfter + time.Minute))
		ls := leaks(res)
		if len(ls) != 1 || !ls[0].Applied || ls[0].Attempt != a || ls[0].Evidence["why"] != LeakAttemptSettled ||
			ls[0].Evidence["pod"] != p.Name {
			t.Fatalf("leak decisions %+v, want one applied for %s, why %s", ls, p.Name, LeakAttemptSettled)
		}
		s.waitPod(p.Name, "released and collected", func(p *corev1.Pod) bool { return p == nil })
	})

	// The leak bound, second case, and the attacker's pod: a pod someone
	// else made, with the finalizer and the labels of an attempt the board
	// never recorded. Its record settles nothing, and the finalizer stays
	// until the age limit, which releases it (metered).
	t.Run("PodOfNoRecordedAttemptIsNotSettledAndIsReleasedOnlyByTheAgeLimit", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		// The bound is the block's (within the board lease this test holds).
		maxAge := 2 * time.Hour
		s.sub, s.calls, s.logs = s.substrateAs(kubetest.Admin, sdk.Values{"finalizer_max_age": maxAge.String()})
		p := s.finished(a, corev1.PodSucceeded, success(t), recordHeld)
		s.userDelete(p.Name)
		s.cachedDeleting(a, p.Name)
		now := time.Now()
		res := s.sweep(now.Add(time.Hour))
		if len(res.Decisions) != 0 || !s.carries(p.Name, FinalizerOutcomeRecord) {
			t.Fatalf("decisions %+v; want none, and the finalizer kept", res.Decisions)
		}
		if _, err := s.store.TaskInstance(context.Background(), a.RunID, a.TaskID); err == nil {
			t.Fatal("a task instance appeared for the forged pod")
		}
		res = s.sweep(now.Add(maxAge + time.Minute))
		ls := leaks(res)
		if len(ls) != 1 || !ls[0].Applied || ls[0].Evidence["why"] != LeakAgeLimit {
			t.Fatalf("decisions %+v, want one applied leak by %s", res.Decisions, LeakAgeLimit)
		}
		s.released(p.Name)
	})

	// A running pod deleted with no grace (a lost node's pods go so, and
	// KWOK writes no end): no kubelet writes how it ended, so after the
	// grace rung the finalizer goes (metered), and the attempt, with no pod
	// object left, is the pod-lost reaper's, as it was before finalizers.
	t.Run("ForcedDeletionWithNoEndWrittenIsReleasedForPodLost", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		s.runningOnBoard(a)
		p := s.running(a, recordHeld)
		s.deleteNow(p.Name)
		s.cachedDeleting(a, p.Name)
		deleted := s.get(p.Name).DeletionTimestamp.Time
		l := ladder.Defaults()
		if res := s.sweep(deleted.Add(l.TaskTerminationGrace)); len(res.Decisions) != 0 {
			t.Fatalf("decisions %+v inside the grace rung, want none", res.Decisions)
		}
		if got := liveness(t, s.sub, true, a)[0]; got.State != sdk.Alive {
			t.Fatalf("liveness of the held pod %+v, want present", got)
		}
		res := s.sweep(deleted.Add(l.TaskTerminationGrace + 2*l.MaintenanceInterval + time.Second))
		if ls := leaks(res); len(ls) != 1 || !ls[0].Applied || ls[0].Evidence["why"] != LeakEndNeverWritten {
			t.Fatalf("decisions %+v, want one applied leak by %s", res.Decisions, LeakEndNeverWritten)
		}
		s.released(p.Name)
		if got := liveness(t, s.sub, true, a)[0]; got.State != sdk.Dead {
			t.Fatalf("liveness %+v, want dead (no pod object at all)", got)
		}
		if ti := s.row(a); ti.State != sdk.StateRunning {
			t.Fatalf("row %s, want it left running for the pod-lost reaper", ti.State)
		}
	})

	// The teardown deletes a pod that never started: it has no record, so
	// the sweep lets it go at once.
	t.Run("NeverStartedPodDeletedIsReleased", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		s.runningOnBoard(a)
		p := s.create(a, false, recordHeld)
		if out := teardown(t, s.sub, sdk.TeardownRequest{Attempt: &a}); out[0].Action != sdk.TeardownDeleted {
			t.Fatalf("teardown %+v, want deleted", out)
		}
		s.cachedDeleting(a, p.Name)
		if res := s.sweep(time.Now()); len(res.Decisions) != 0 {
			t.Fatalf("decisions %+v, want none", res.Decisions)
		}
		s.released(p.Name)
	})

	// A provisional mark whose pod is stopped in place: the container is
	// still inside its grace, so its record may still override the mark,
	// and a deletion must not cost it: held.
	t.Run("ProvisionalMarkHoldsThePodWhileItsContainerRuns", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		s.runningOnBoard(a)
		now := time.Now()
		s.mark(a, sdk.LabelAgentLost, now.Add(-30*time.Second))
		p := s.running(a, recordHeld)
		s.playStatus(p.Name, func(st *corev1.PodStatus) { st.Phase, st.Reason = corev1.PodFailed, "DeadlineExceeded" })
		s.cachedPhase(s.sub, a, p.Name, corev1.PodFailed)
		s.sweep(now)
		if !s.carries(p.Name, FinalizerOutcomeRecord) {
			t.Fatal("the finalizer was released while the container could still write a SUCCESS record")
		}
		// Its end comes: SUCCESS, and the override takes it.
		s.playStatus(p.Name, finish(corev1.PodFailed, 0, "Completed", rec(t, a, RecordSuccess, code(0), "")))
		s.userDelete(p.Name)
		s.cachedDeleting(a, p.Name)
		res := s.sweep(now.Add(time.Second))
		if res.Overrides[sdk.LabelAgentLost] != 1 {
			t.Fatalf("decisions %+v, want the SUCCESS record to override agent_lost", res.Decisions)
		}
		s.sweep(now.Add(2 * time.Second))
		s.released(p.Name)
	})

	// The release is pinned to the resourceVersion read: a pod that
	// changed between the sweep's read and its patch keeps the finalizer,
	// and the next sweep, reading it afresh, releases it.
	t.Run("ReleasePinnedToTheResourceVersionRead", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		s.runningOnBoard(a)
		p := s.finished(a, corev1.PodSucceeded, success(t), recordHeld)
		var once sync.Once
		s.calls.mu.Lock()
		s.calls.hook = func(req *http.Request) {
			if req.Method != http.MethodPatch {
				return
			}
			once.Do(func() {
				patch := []byte(`{"metadata":{"annotations":{"reaper.test/touched":"yes"}}}`)
				if _, err := s.cs.CoreV1().Pods(s.ns).Patch(context.Background(), p.Name, types.MergePatchType, patch,
					metav1.PatchOptions{}); err != nil {
					t.Error(err)
				}
			})
		}
		s.calls.mu.Unlock()
		now := time.Now()
		if res := s.sweep(now); !settledBy(res, a, "DurableSuccessRecord") {
			t.Fatalf("decisions %+v, want the attempt settled", res.Decisions)
		}
		if !s.carries(p.Name, FinalizerOutcomeRecord) {
			t.Fatal("a pod changed since the read was released")
		}
		// Refused by the patch's own test, counted as a change, not a failure.
		if logs := s.logs.String(); !strings.Contains(logs, "changed=1 failed=0") {
			t.Fatalf("the refused release is not logged as a changed pod:\n%s", logs)
		}
		s.waitFor("the cache to hold the touched pod", func() bool {
			r, _ := s.sub.current()
			for _, c := range r.presence.cached(a) {
				if c.Name == p.Name && c.ResourceVersion != p.ResourceVersion {
					return true
				}
			}
			return false
		})
		s.sweep(now.Add(time.Second))
		s.cachedReleased(a, p.Name)
	})
}

// cachedReleased waits until the cache holds pod name without the
// outcome record finalizer.
func (s *sweepEnv) cachedReleased(a sdk.Attempt, name string) {
	s.t.Helper()
	r, err := s.sub.current()
	if err != nil {
		s.t.Fatal(err)
	}
	s.waitFor("the cache to hold "+name+" released", func() bool {
		for _, p := range r.presence.cached(a) {
			if _, held := p.recordFinalizer(); p.Name == name && !held {
				return true
			}
		}
		return false
	})
}

// The shipped Role's patch on pods is all a release needs; without it the
// release is refused, the sweep still completes, and the pod is kept.
func TestLeastPrivilegeRoleReleasesTheOutcomeRecordFinalizer(t *testing.T) {
	t.Parallel()
	a := sdk.Attempt{RunID: "run-1", TaskID: "load_a", Try: 1, Epoch: 1}
	for _, c := range []struct {
		name    string
		user    string
		rules   func(testing.TB) []rbacv1.PolicyRule
		release bool
	}{
		{name: "ShippedRolePatchReleases", user: kubetest.Alice, rules: roleRules, release: true},
		{name: "RoleWithoutPatchKeepsThePod", user: kubetest.Carol, release: false,
			rules: func(t testing.TB) []rbacv1.PolicyRule { return withoutVerb(roleRules(t), "patch") }},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := newSweepEnv(t)
			bindRole(t, s.env, c.user, c.rules(t))
			sub, _, _ := s.substrateAs(c.user, nil)
			s.runningOnBoard(a)
			p := s.finished(a, corev1.PodSucceeded, finish(corev1.PodSucceeded, 0, "Completed",
				rec(t, a, RecordSuccess, code(0), "")), recordHeld)
			s.userDelete(p.Name)
			s.synced(sub)
			s.waitFor("the Role user's cache to hold the deletion", func() bool {
				r, _ := sub.current()
				for _, cp := range r.presence.cached(a) {
					if cp.DeletionTimestamp != nil {
						return true
					}
				}
				return false
			})
			res, err := sub.Sweep(context.Background(), sdk.SweepRequest{Now: time.Now(), Term: s.term, Ladder: ladder.Defaults()}, s.store)
			if err != nil {
				t.Fatalf("sweep as the Role's user: %v", err)
			}
			if !settledBy(res, a, "DurableSuccessRecord") {
				t.Fatalf("decisions %+v, want the attempt settled", res.Decisions)
			}
			if c.release {
				s.released(p.Name)
				return
			}
			if !s.carries(p.Name, FinalizerOutcomeRecord) {
				t.Fatal("released without patch")
			}
		})
	}
}
