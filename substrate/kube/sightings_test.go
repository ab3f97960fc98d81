package kube

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
)

func sightingPod(a sdk.Attempt, uid string, phase corev1.PodPhase) *pod {
	l, ann := AttemptLabels(a)
	return &pod{podMeta: podMeta{Name: "p-" + uid, Namespace: "ns", UID: types.UID(uid)},
		labels: labelsOf(l, ann), phase: phase}
}

func TestSightings(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC)
	a := sdk.Attempt{RunID: "r", TaskID: "t", Try: 1}

	t.Run("FoldedToTheLastSightingAndTheFirstDeletionAfterIt", func(t *testing.T) {
		t.Parallel()
		c := clock.NewFake(t0)
		s := newSightings(c)
		p := sightingPod(a, "u", corev1.PodRunning)
		s.added(p, true) // the first list: nothing
		s.added(sightingPod(a, "u", corev1.PodPending), false)
		if got, _, _ := s.take(1, t0); len(got) != 0 {
			t.Fatalf("the first list or a Pending add noted %+v", got)
		}
		s.added(p, false)
		c.Advance(time.Minute)
		s.deleted(p)
		c.Advance(time.Minute)
		s.added(p, false)
		c.Advance(time.Minute)
		s.deleted(p)
		c.Advance(time.Minute)
		s.deleted(p)
		s.deleted(sightingPod(a, "v", corev1.PodSucceeded)) // a finished pod's deletion: not a miss
		got, pods, dropped := s.take(7, t0.Add(time.Hour))
		want := sdk.PodSighting{Attempt: a, PodUID: "u", SeenAt: t0.Add(2 * time.Minute), MissingAt: t0.Add(3 * time.Minute),
			Term: 7, At: t0.Add(time.Hour)}
		if len(got) != 1 || got[0] != want || pods[0].Name != "p-u" || dropped != 0 {
			t.Fatalf("took %+v (dropped %d), want %+v", got, dropped, want)
		}
	})

	t.Run("ATaskInstanceOnceATakeAndWhatFailedIsKeptAhead", func(t *testing.T) {
		t.Parallel()
		c := clock.NewFake(t0)
		s := newSightings(c)
		s.added(sightingPod(a, "mine", corev1.PodRunning), false)
		s.added(sightingPod(a, "forged", corev1.PodRunning), false)
		first, pods, _ := s.take(1, t0)
		if len(first) != 1 || first[0].PodUID != "mine" {
			t.Fatalf("first take %+v", first)
		}
		// The write failed: back, ahead of the one still waiting; a
		// deletion seen since is folded in after it.
		c.Advance(time.Minute)
		s.deleted(sightingPod(a, "mine", corev1.PodRunning))
		s.putBack(first, pods)
		again, _, _ := s.take(1, t0)
		if len(again) != 1 || again[0].PodUID != "mine" || !again[0].SeenAt.Equal(t0) ||
			!again[0].MissingAt.Equal(t0.Add(time.Minute)) {
			t.Fatalf("after the put back %+v", again)
		}
		if last, _, _ := s.take(1, t0); len(last) != 1 || last[0].PodUID != "forged" {
			t.Fatalf("the second pod of the task instance %+v", last)
		}
	})

	t.Run("BoundedOldestDroppedAndCounted", func(t *testing.T) {
		t.Parallel()
		s := newSightings(clock.NewFake(t0))
		for i := range maxPendingSightings + 3 {
			b := sdk.Attempt{RunID: "r", TaskID: "t" + time.Duration(i).String(), Try: 1}
			s.added(sightingPod(b, "u", corev1.PodRunning), false)
		}
		got, _, dropped := s.take(1, t0)
		if dropped != 3 || len(got) != sdk.MaxPodSightings || got[0].TaskID != "t3ns" {
			t.Fatalf("took %d (first %s), dropped %d", len(got), got[0].TaskID, dropped)
		}
		if _, _, dropped := s.take(1, t0); dropped != 0 {
			t.Fatalf("the drop count was not reset: %d", dropped)
		}
	})
}
