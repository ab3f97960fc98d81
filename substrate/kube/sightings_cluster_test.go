package kube

// The pod cache's misses (sightings.go) against the real API server and
// the Postgres board. A pod the cache never held while it ran is made by
// creating it without the run-id label the informer selects on, letting
// KWOK run it, then labelling it: the watch delivers it as added, already
// Running, as after a relist that found a pod the broken watch missed.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/sdk/sdktest"
	"github.com/dexaflow/reaper/testkit/kubetest"
)

// clocked is a substrate on the namespace whose clock the test moves.
func (s *sweepEnv) clocked(start time.Time) (*Substrate, *clock.Fake, *sdktest.LogBuffer) {
	s.t.Helper()
	fake := clock.NewFake(start)
	logs := &sdktest.LogBuffer{}
	sub := NewWithOptions(hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Info}),
		Options{RestConfig: s.c.ConfigFor(kubetest.Admin), Clock: fake})
	if err := sub.Configure(context.Background(), sdk.ConfigureRequest{Edition: "kube",
		Values: sdk.Values{"namespace": s.ns}}); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(sub.Close)
	s.synced(sub)
	return sub, fake, logs
}

// unlabelled creates a placed pod of a without the run-id label (the
// informer does not see it) and waits until KWOK runs it.
func (s *sweepEnv) unlabelled(a sdk.Attempt) *corev1.Pod {
	s.t.Helper()
	return s.running(a, func(p *corev1.Pod) { delete(p.Labels, LabelRunID) })
}

// labelIn gives pod p the run-id label of a: the informer receives it.
func (s *sweepEnv) labelIn(a sdk.Attempt, p *corev1.Pod) {
	s.t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, LabelRunID, a.RunID)
	if _, err := s.cs.CoreV1().Pods(s.ns).Patch(context.Background(), p.Name, types.MergePatchType, []byte(patch),
		metav1.PatchOptions{}); err != nil {
		s.t.Fatalf("labelling %s: %v", p.Name, err)
	}
}

func (s *sweepEnv) remove(p *corev1.Pod) {
	s.t.Helper()
	zero := int64(0)
	if err := s.cs.CoreV1().Pods(s.ns).Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		s.t.Fatalf("deleting %s: %v", p.Name, err)
	}
}

// pendingFor waits until sub holds a sighting of pod uid of a that cond
// accepts.
func (s *sweepEnv) pendingFor(sub *Substrate, a sdk.Attempt, uid types.UID, what string, cond func(sdk.PodSighting) bool) {
	s.t.Helper()
	r, err := sub.current()
	if err != nil {
		s.t.Fatal(err)
	}
	s.waitFor("the cache to note "+what+" of "+string(uid), func() bool {
		r.presence.seen.mu.Lock()
		defer r.presence.seen.mu.Unlock()
		p, ok := r.presence.seen.pending[sightingKey{attempt: a, uid: uid}]
		return ok && cond(p.PodSighting)
	})
}

func (s *sweepEnv) pendingCount(sub *Substrate) int {
	s.t.Helper()
	r, err := sub.current()
	if err != nil {
		s.t.Fatal(err)
	}
	r.presence.seen.mu.Lock()
	defer r.presence.seen.mu.Unlock()
	return len(r.presence.seen.pending)
}

// podMissing reads a's pod cache history: pod_missing_max (0: NULL) and
// pod_missing_since (zero: NULL).
func (s *sweepEnv) podMissing(a sdk.Attempt) (time.Duration, time.Time) {
	s.t.Helper()
	var (
		us    *int64
		since *time.Time
	)
	if err := s.store.Pool().QueryRow(context.Background(), `SELECT
            (extract(epoch FROM pod_missing_max) * 1000000)::bigint, pod_missing_since
        FROM task_instances WHERE run_id = $1 AND task_id = $2`, a.RunID, a.TaskID).Scan(&us, &since); err != nil {
		s.t.Fatal(err)
	}
	var d time.Duration
	if us != nil {
		d = time.Duration(*us) * time.Microsecond
	}
	if since == nil {
		return d, time.Time{}
	}
	return d, *since
}

func (s *sweepEnv) sweepWith(sub *Substrate, now time.Time) sdk.SweepResult {
	s.t.Helper()
	res, err := sub.Sweep(context.Background(), sdk.SweepRequest{Now: now, Term: s.term, Ladder: ladder.Defaults()}, s.store)
	if err != nil {
		s.t.Fatal(err)
	}
	return res
}

func TestPodCacheMisses(t *testing.T) {
	t.Parallel()

	// A pod the cache received already Running after it synced had been
	// missing from it while it ran: the sweep records the window's end
	// minus running_at; the cache's first list records nothing.
	t.Run("ARunningPodTheCacheNeverHeldIsSeenAndTheSweepRecordsTheWindow", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		a := sdk.Attempt{RunID: "run-seen", TaskID: "t", Try: 1}
		s.runningOnBoard(a)
		runningAt := s.row(a).RunningAt
		p := s.unlabelled(a)
		s.recordPod(a, p)
		sub, fake, _ := s.clocked(runningAt.Add(90 * time.Second))
		s.labelIn(a, p)
		s.pendingFor(sub, a, p.UID, "a sighting", func(ps sdk.PodSighting) bool { return !ps.SeenAt.IsZero() })
		fake.Advance(time.Minute)
		s.sweepWith(sub, fake.Now())
		if longest, since := s.podMissing(a); longest != 90*time.Second || !since.IsZero() {
			t.Fatalf("pod_missing_max %s, pod_missing_since %v: want 1m30s and none", longest, since)
		}
		if n := s.pendingCount(sub); n != 0 {
			t.Fatalf("%d sightings still pending after the sweep", n)
		}
	})

	t.Run("TheCachesFirstListRecordsNothing", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		a := sdk.Attempt{RunID: "run-listed", TaskID: "t", Try: 1}
		s.runningOnBoard(a)
		p := s.running(a)
		s.recordPod(a, p)
		sub, fake, _ := s.clocked(s.row(a).RunningAt.Add(5 * time.Minute))
		s.cachedPhase(sub, a, p.Name, corev1.PodRunning)
		if n := s.pendingCount(sub); n != 0 {
			t.Fatalf("the first list noted %d sightings", n)
		}
		s.sweepWith(sub, fake.Now())
		if longest, since := s.podMissing(a); longest != 0 || !since.IsZero() {
			t.Fatalf("pod_missing_max %s, pod_missing_since %v after the first list: want none", longest, since)
		}
	})

	// The cache saw the attempt's running pod deleted: a window opens at
	// that time and stays open (only the attempt's own signs of life end
	// it, in replay); a later deletion keeps its start.
	t.Run("ADeletionOpensAWindow", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		a := sdk.Attempt{RunID: "run-deleted", TaskID: "t", Try: 1}
		s.runningOnBoard(a)
		runningAt := s.row(a).RunningAt
		sub, fake, _ := s.clocked(runningAt.Add(time.Minute))
		p := s.running(a)
		s.recordPod(a, p)
		s.cachedPhase(sub, a, p.Name, corev1.PodRunning)
		fake.Advance(2 * time.Minute)
		deletedAt := fake.Now()
		s.remove(p)
		s.pendingFor(sub, a, p.UID, "a deletion", func(ps sdk.PodSighting) bool { return ps.MissingAt.Equal(deletedAt) })
		fake.Advance(time.Minute)
		s.sweepWith(sub, fake.Now())
		if longest, since := s.podMissing(a); longest != 0 || !since.Equal(deletedAt) {
			t.Fatalf("pod_missing_max %s, pod_missing_since %v: want none and %v", longest, since, deletedAt)
		}
	})

	// A tenant's pod with the attempt's labels, not the pod the attempt
	// records: its arrival Running does not close the attempt's open
	// window, its deletion opens none; each refusal reports the pod as
	// foreign (a decision, metered and audited by the host), and nothing
	// is written.
	t.Run("AForgedPodNeitherOpensNorClosesAWindow", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		quiet := sdk.Attempt{RunID: "run-forged", TaskID: "quiet", Try: 1}
		open := sdk.Attempt{RunID: "run-forged", TaskID: "open", Try: 1}
		s.runningOnBoard(quiet)
		s.runningOnBoard(open)
		runningAt := s.row(open).RunningAt
		sub, fake, logs := s.clocked(runningAt.Add(time.Minute))
		mine := map[sdk.Attempt]*corev1.Pod{}
		for _, a := range []sdk.Attempt{quiet, open} {
			mine[a] = s.running(a)
			s.recordPod(a, mine[a])
			s.cachedPhase(sub, a, mine[a].Name, corev1.PodRunning)
		}
		// The open window: the attempt's own pod deleted.
		openedAt := fake.Now()
		s.remove(mine[open])
		s.pendingFor(sub, open, mine[open].UID, "a deletion", func(ps sdk.PodSighting) bool { return !ps.MissingAt.IsZero() })
		s.sweepWith(sub, fake.Now())

		// The forgeries: one for each attempt, received Running after the
		// cache synced, then deleted.
		fake.Advance(3 * time.Minute)
		var forged []types.UID
		for _, a := range []sdk.Attempt{quiet, open} {
			f := s.unlabelled(a)
			s.labelIn(a, f)
			s.pendingFor(sub, a, f.UID, "a sighting", func(ps sdk.PodSighting) bool { return !ps.SeenAt.IsZero() })
			forged = append(forged, f.UID)
			if a == quiet {
				s.remove(f)
				s.pendingFor(sub, a, f.UID, "a deletion", func(ps sdk.PodSighting) bool { return !ps.MissingAt.IsZero() })
			}
		}
		fake.Advance(time.Minute)
		res := s.sweepWith(sub, fake.Now())
		if longest, since := s.podMissing(quiet); longest != 0 || !since.IsZero() {
			t.Fatalf("the forged pod changed the quiet attempt: pod_missing_max %s, pod_missing_since %v", longest, since)
		}
		if longest, since := s.podMissing(open); longest != 0 || !since.Equal(openedAt) {
			t.Fatalf("the forged pod closed the open window: pod_missing_max %s, pod_missing_since %v (want none, %v)",
				longest, since, openedAt)
		}
		got := map[types.UID]bool{}
		for _, d := range foreignDecisions(res) {
			got[types.UID(d.Evidence["pod_uid"])] = !d.Applied
		}
		for _, uid := range forged {
			if !got[uid] {
				t.Fatalf("no unapplied foreign_task_pod decision for the forged pod %s: %+v", uid, foreignDecisions(res))
			}
		}
		if !strings.Contains(logs.String(), "ignored a task pod the attempt never recorded") {
			t.Fatalf("the refusal was not logged:\n%s", logs)
		}
	})
}
