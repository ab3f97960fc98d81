package kube

import (
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
)

func newTestTombs() (*tombstones, *clock.Fake) {
	c := clock.NewFake(t0)
	return newTombstones(c, hclog.NewNullLogger()), c
}

// podGCFinal is the last state Pod GC leaves of a pod of a deleted node:
// it patches phase Failed and DisruptionTarget DeletionByPodGC, then
// deletes with no grace.
func podGCFinal(uid types.UID) *pod {
	return podOf(attempt, corev1.PodFailed, taskRunning(), disrupted("DeletionByPodGC"),
		func(p *corev1.Pod) { p.UID = uid; p.Name = "p-" + string(uid) })
}

// The final state of a disrupted pod deleted before any sweep read it is
// judged by the same rules as a present one: pod_disrupted, infra.
func TestTombstone_DeletedDisruptedPodIsJudgedInfra(t *testing.T) {
	tb, _ := newTestTombs()
	tb.deleted(podGCFinal("a"))
	got := tb.take()
	if len(got) != 1 {
		t.Fatalf("take %d tombstones, want 1", len(got))
	}
	v, ok := judgeFinished(got[0])
	if !ok || v.outcome != sdk.OutcomeInfra || v.reason != sdk.ReasonPodDisrupted || v.rule != "DisruptedPodIsInfra" {
		t.Fatalf("verdict %+v %v, want infra %s by DisruptedPodIsInfra", v, ok, sdk.ReasonPodDisrupted)
	}
}

// A SUCCESS record on a deleted pod still wins over its disruption.
func TestTombstone_DeletedPodSuccessRecordWins(t *testing.T) {
	tb, _ := newTestTombs()
	tb.deleted(podOf(attempt, corev1.PodFailed, disrupted("DeletionByPodGC"),
		taskTerminated(0, "Completed", rec(t, attempt, RecordSuccess, code(0), ""), t0)))
	got := tb.take()
	if len(got) != 1 {
		t.Fatalf("take %d tombstones, want 1", len(got))
	}
	if v, ok := judgeFinished(got[0]); !ok || v.outcome != sdk.OutcomeSuccess || v.rule != "DurableSuccessRecord" {
		t.Fatalf("verdict %+v %v, want success by DurableSuccessRecord", v, ok)
	}
}

// A deletion the watch missed arrives as DeletedFinalStateUnknown with the
// cache's last state: kept the same way.
func TestTombstone_DeletedFinalStateUnknownIsKept(t *testing.T) {
	tb, _ := newTestTombs()
	tb.deleted(cache.DeletedFinalStateUnknown{Key: "ns/p-a", Obj: podGCFinal("a")})
	if tb.len() != 1 {
		t.Fatalf("%d tombstones, want 1", tb.len())
	}
}

// A pod deleted while not finished (its last state Running: a container
// may still run where it was) keeps no tombstone: it is the pod-lost
// reaper's, and the drop is counted.
func TestTombstone_NonTerminalDeletionIsLeftToPodLost(t *testing.T) {
	tb, _ := newTestTombs()
	tb.deleted(podOf(attempt, corev1.PodRunning, taskRunning(), disrupted("DeletionByTaintManager")))
	tb.deleted(cache.DeletedFinalStateUnknown{Key: "ns/p", Obj: podOf(attempt, corev1.PodUnknown)})
	if tb.len() != 0 || tb.droppedBy(dropNotTerminal) != 2 {
		t.Fatalf("%d tombstones, %d dropped not terminal; want 0, 2", tb.len(), tb.droppedBy(dropNotTerminal))
	}
}

// A tombstone is offered to one sweep, then dropped; one the board did not
// settle is counted.
func TestTombstone_OfferedOnceThenDropped(t *testing.T) {
	tb, _ := newTestTombs()
	a, b := podGCFinal("a"), podGCFinal("b")
	tb.deleted(a)
	tb.deleted(b)
	offered := tb.take()
	tb.forget(offered, map[*pod]bool{offered[0]: true})
	if tb.len() != 0 || len(tb.take()) != 0 || tb.droppedBy(dropUnsettled) != 1 {
		t.Fatalf("%d tombstones, %d dropped unsettled; want 0, 1", tb.len(), tb.droppedBy(dropUnsettled))
	}
}

// Tombstones older than tombstoneTTL (no sweep settled them: the board was
// down) are dropped and counted.
func TestTombstone_BoundedByAge(t *testing.T) {
	tb, c := newTestTombs()
	tb.deleted(podGCFinal("a"))
	c.Advance(tombstoneTTL - time.Second)
	if len(tb.take()) != 1 {
		t.Fatal("a tombstone younger than its bound was dropped")
	}
	c.Advance(time.Second)
	if len(tb.take()) != 0 || tb.droppedBy(dropStale) != 1 {
		t.Fatalf("a tombstone of %s was kept (dropped stale %d)", tombstoneTTL, tb.droppedBy(dropStale))
	}
}

// Past maxTombstones the oldest is dropped and counted.
func TestTombstone_BoundedByCount(t *testing.T) {
	tb, c := newTestTombs()
	for i := 0; i <= maxTombstones; i++ {
		tb.deleted(podGCFinal(types.UID(fmt.Sprintf("%05d", i))))
		c.Advance(time.Millisecond)
	}
	if tb.len() != maxTombstones || tb.droppedBy(dropOverflow) != 1 {
		t.Fatalf("%d tombstones, %d dropped overflow; want %d, 1", tb.len(), tb.droppedBy(dropOverflow), maxTombstones)
	}
	tb.mu.Lock()
	_, first := tb.byUID["00000"]
	tb.mu.Unlock()
	if first {
		t.Fatal("the oldest tombstone was kept past the bound")
	}
}

// A pod the sweep collected itself was settled already: its deletion keeps
// no tombstone.
func TestTombstone_CollectedPodKeepsNone(t *testing.T) {
	tb, _ := newTestTombs()
	tb.collected("a")
	tb.deleted(podGCFinal("a"))
	if tb.len() != 0 {
		t.Fatalf("%d tombstones, want 0", tb.len())
	}
}
