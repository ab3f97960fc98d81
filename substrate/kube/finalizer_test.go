package kube

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
)

func held() func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Finalizers = append(p.Finalizers, "other.example/keep", FinalizerOutcomeRecord) }
}

// deletedAt plays a deletion at at with grace seconds left (0: the
// kubelet's last word, Pod GC, a forced delete).
func deletedAt(at time.Time, grace int64) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.DeletionTimestamp, p.DeletionGracePeriodSeconds = &metav1.Time{Time: at}, &grace
	}
}

// The release rules of the outcome record finalizer, one by one (pure:
// the pod, what the sweep learned of its attempt, now).
func TestJudgeRelease(t *testing.T) {
	l := ladder.Defaults()
	maxAge := FinalizerMaxAgeDefault
	success := taskTerminated(0, "Completed", "", t0)
	cases := []struct {
		name string
		pod  *pod
		f    releaseFacts
		now  time.Time
		want releaseAction
		why  string
	}{
		{name: "SettledFinishedPodReleased", pod: podOf(attempt, corev1.PodSucceeded, held(), started(t0), success),
			f: releaseFacts{settled: true}, now: t0.Add(time.Minute), want: releaseDone},
		{name: "SettledDeletedPodReleased", pod: podOf(attempt, corev1.PodSucceeded, held(), started(t0), success, deletedAt(t0, 0)),
			f: releaseFacts{settled: true}, now: t0.Add(time.Second), want: releaseDone},
		{name: "FinishedUnsettledPodHeld", pod: podOf(attempt, corev1.PodSucceeded, held(), started(t0), success, deletedAt(t0, 0)),
			now: t0.Add(time.Hour), want: releaseHold},
		{name: "ProvisionalMarkWithTheContainerStillRunningHolds",
			pod: podOf(attempt, corev1.PodFailed, held(), started(t0), taskRunning(), podReason("DeadlineExceeded", "")),
			f:   releaseFacts{settled: true, provisional: true}, now: t0.Add(time.Minute), want: releaseHold},
		{name: "ProvisionalMarkWithTheContainerTerminatedReleases",
			pod: podOf(attempt, corev1.PodFailed, held(), started(t0), taskTerminated(137, "Error", "", t0)),
			f:   releaseFacts{settled: true, provisional: true}, now: t0.Add(time.Minute), want: releaseDone},
		{name: "ProvisionalMarkOnAPodTheClusterLetGoReleases",
			pod: podOf(attempt, corev1.PodFailed, held(), started(t0), taskRunning(), disrupted("DeletionByPodGC"), deletedAt(t0, 0)),
			f:   releaseFacts{settled: true, provisional: true}, now: t0.Add(time.Minute), want: releaseDone},
		{name: "SettledLongAfterTheFinishIsALeak", pod: podOf(attempt, corev1.PodSucceeded, held(), started(t0), success),
			f: releaseFacts{settled: true}, now: t0.Add(CollectAfter), want: releaseLeak, why: LeakAttemptSettled},
		{name: "NeverStartedBeingDeletedReleased", pod: podOf(attempt, corev1.PodPending, held(), deletedAt(t0, 30)),
			now: t0.Add(time.Second), want: releaseDone},
		{name: "NeverStartedNotDeletedHeld", pod: podOf(attempt, corev1.PodPending, held()),
			now: t0.Add(48 * time.Hour), want: releaseHold},
		{name: "LetGoWhileRunningHeldWithinTheGraceRung",
			pod: podOf(attempt, corev1.PodRunning, held(), started(t0), taskRunning(), deletedAt(t0, 0)),
			now: t0.Add(l.TaskTerminationGrace + 2*l.MaintenanceInterval - time.Second), want: releaseHold},
		{name: "LetGoWhileRunningPastTheGraceRungIsALeak",
			pod: podOf(attempt, corev1.PodRunning, held(), started(t0), taskRunning(), deletedAt(t0, 0)),
			now: t0.Add(l.TaskTerminationGrace + 2*l.MaintenanceInterval), want: releaseLeak, why: LeakEndNeverWritten},
		{name: "GracefulDeletionWaitingForItsKubeletHeld",
			pod: podOf(attempt, corev1.PodRunning, held(), started(t0), taskRunning(), deletedAt(t0.Add(30*time.Second), 30)),
			now: t0.Add(time.Hour), want: releaseHold},
		{name: "GracefulDeletionPastTheAgeLimitIsALeak",
			pod: podOf(attempt, corev1.PodRunning, held(), started(t0), taskRunning(), deletedAt(t0, 30)),
			now: t0.Add(maxAge), want: releaseLeak, why: LeakAgeLimit},
		{name: "FinishedUnrecordedPastTheAgeLimitIsALeak", pod: podOf(attempt, corev1.PodSucceeded, held(), started(t0), success),
			now: t0.Add(maxAge), want: releaseLeak, why: LeakAgeLimit},
		{name: "FinishedUnrecordedInsideTheAgeLimitHeld", pod: podOf(attempt, corev1.PodSucceeded, held(), started(t0), success),
			now: t0.Add(maxAge - time.Second), want: releaseHold},
		{name: "LivePodHeldWhateverItsAge", pod: podOf(attempt, corev1.PodRunning, held(), started(t0), taskRunning()),
			now: t0.Add(10 * maxAge), want: releaseHold},
		{name: "UnknownPodHeldWhateverItsAge", pod: podOf(attempt, corev1.PodUnknown, held(), started(t0), taskRunning()),
			now: t0.Add(10 * maxAge), want: releaseHold},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, why, detail := judgeRelease(c.pod, c.f, c.now, l, maxAge)
			if got != c.want || why != c.why {
				t.Fatalf("judgeRelease: %d %q (%s), want %d %q", got, why, detail, c.want, c.why)
			}
		})
	}
}

// The finalizer's place among the pod's finalizers is found, and a pod
// without it is not the sweep's to release.
func TestRecordFinalizer(t *testing.T) {
	if i, ok := podOf(attempt, corev1.PodRunning, held()).recordFinalizer(); !ok || i != 1 {
		t.Fatalf("recordFinalizer = %d, %v; want 1, true", i, ok)
	}
	other := func(p *corev1.Pod) { p.Finalizers = []string{"other.example/keep"} }
	if _, ok := podOf(attempt, corev1.PodRunning, other).recordFinalizer(); ok {
		t.Fatal("a pod without the outcome record finalizer read as carrying it")
	}
}

// A finished pod deleted with no grace left counts as gone for a mark:
// only a finalizer keeps it, as Pod GC leaves a pod of a deleted node.
func TestJudgeMark_FinishedPodLetGoCountsAsGone(t *testing.T) {
	c := candidateMarked(t0.Add(-time.Minute))
	p := podOf(attempt, corev1.PodFailed, held(), started(t0), taskRunning(), disrupted("DeletionByPodGC"), deletedAt(t0, 0))
	if act, detail := judgeMark(c, []*pod{p}, t0, ladder.Defaults()); act != markConfirm {
		t.Fatalf("judgeMark: %d (%s), want confirm", act, detail)
	}
	running := podOf(attempt, corev1.PodRunning, held(), started(t0), taskRunning(), deletedAt(t0, 0))
	if act, detail := judgeMark(c, []*pod{running}, t0, ladder.Defaults()); act != markHold {
		t.Fatalf("judgeMark of a Running pod let go: %d (%s), want hold (nothing says it stopped)", act, detail)
	}
}

func candidateMarked(at time.Time) sdk.Candidate {
	return sdk.Candidate{Attempt: attempt, State: sdk.StateFailed, LastFailureKind: sdk.FailureInfra,
		FailureReason: sdk.LabelAgentLost, InfraMarkedAt: at}
}
