package kube

import (
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/dexaflow/reaper/sdk/clock"
)

// Bounds of the tombstones. A tombstone only has to live until the next
// sweep that reaches the board (the reconcile cadence is seconds); the age
// bound leaves room for many failed sweeps (the board down) and still
// frees the memory of a pod nobody settles. The count bound caps the
// memory at a few MiB of reduced pods, and is far above the pods a node
// loss deletes between two sweeps; past it the oldest is dropped and its
// attempt is left to the pod-lost reaper (provisional, never wrong).
const (
	maxTombstones = 4096
	tombstoneTTL  = 15 * time.Minute
)

// tomb is the final state of a deleted task pod, kept for the sweep.
type tomb struct {
	pod *pod
	at  time.Time // when the deletion was seen, by the substrate's clock
}

// tombstones hold the final state of finished task pods the informer saw
// deleted, so that a pod a controller deleted before a sweep read it is
// still settled from what it said. They are never a pod's presence:
// Liveness and the marks' live reads do not see them.
type tombstones struct {
	clock clock.Clock
	log   hclog.Logger

	mu    sync.Mutex
	byUID map[types.UID]tomb
	// ours: pods the sweep itself collected (settled already): their
	// deletion keeps no tombstone.
	ours map[types.UID]bool
	// dropped counts the tombstones (and non-terminal deletions) given up
	// without a settlement, by why.
	dropped map[string]int64
}

// Why a deleted pod was given up without a settlement.
const (
	dropNotTerminal = "not_terminal" // its last state was not finished: the pod-lost reaper's
	dropOverflow    = "overflow"     // over maxTombstones: the oldest went
	dropStale       = "stale"        // older than tombstoneTTL: no sweep settled it
	dropUnsettled   = "unsettled"    // a sweep offered it and the board took nothing
)

func newTombstones(c clock.Clock, log hclog.Logger) *tombstones {
	return &tombstones{clock: c, log: log, byUID: map[types.UID]tomb{}, ours: map[types.UID]bool{}, dropped: map[string]int64{}}
}

// deletedPod is the pod a delete notification carries: the reduced pod, a
// whole one (no transform), or either wrapped in DeletedFinalStateUnknown.
func deletedPod(obj any) (*pod, bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	switch o := obj.(type) {
	case *pod:
		return o, true
	case *corev1.Pod:
		return reduce(o), true
	}
	return nil, false
}

// deleted is the informer's delete handler: it keeps the last state of a
// finished task pod. The object is the reduced pod, a whole one (no
// transform), or either wrapped in DeletedFinalStateUnknown (a deletion
// the watch missed: the last state the cache had).
func (t *tombstones) deleted(obj any) {
	p, ok := deletedPod(obj)
	if !ok {
		return
	}
	if _, ok := p.labels.attempt(); !ok {
		return
	}
	t.mu.Lock()
	mine := t.ours[p.UID]
	delete(t.ours, p.UID)
	t.mu.Unlock()
	if mine {
		return
	}
	if !finished(p.phase) {
		// Nothing says how it ended: a container may still run where the
		// pod was. Only a reaper's ladder may act on it.
		t.drop(dropNotTerminal, p)
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.byUID) >= maxTombstones {
		var oldest types.UID
		var at time.Time
		for uid, tb := range t.byUID {
			if oldest == "" || tb.at.Before(at) {
				oldest, at = uid, tb.at
			}
		}
		t.dropLocked(dropOverflow, t.byUID[oldest].pod)
		delete(t.byUID, oldest)
	}
	t.byUID[p.UID] = tomb{pod: p, at: t.clock.Now()}
}

// collected notes a pod the sweep deleted itself. The set is bounded: past
// maxTombstones it is cleared, and a pod then tombstoned anyway costs one
// settlement the board refuses as moved on.
func (t *tombstones) collected(uid types.UID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.ours) >= maxTombstones {
		t.ours = map[types.UID]bool{}
	}
	t.ours[uid] = true
}

// take returns the live tombstones, in name order, after dropping the
// stale ones.
func (t *tombstones) take() []*pod {
	now := t.clock.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*pod, 0, len(t.byUID))
	for uid, tb := range t.byUID {
		if now.Sub(tb.at) >= tombstoneTTL {
			t.dropLocked(dropStale, tb.pod)
			delete(t.byUID, uid)
			continue
		}
		out = append(out, tb.pod)
	}
	sortPods(out)
	return out
}

// forget removes the tombstones a sweep offered to the board: each is
// offered once. Those it did not settle are counted dropped.
func (t *tombstones) forget(offered []*pod, settled map[*pod]bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range offered {
		if _, ok := t.byUID[p.UID]; !ok {
			continue
		}
		delete(t.byUID, p.UID)
		if !settled[p] {
			t.dropLocked(dropUnsettled, p)
		}
	}
}

func (t *tombstones) drop(why string, p *pod) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.dropLocked(why, p)
}

// dropLocked counts and logs a deleted pod given up: at warn, except a
// non-terminal one (a teardown's own deletion is one), at info.
func (t *tombstones) dropLocked(why string, p *pod) {
	t.dropped[why]++
	logf := t.log.Warn
	if why == dropNotTerminal {
		logf = t.log.Info
	}
	logf("kube: a deleted task pod is left unsettled by the sweep", "why", why, "pod", p.ref(),
		"phase", p.phase, "dropped", t.dropped[why])
}

// len is the number of tombstones held.
func (t *tombstones) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byUID)
}

// droppedBy returns how many deleted pods were given up for why.
func (t *tombstones) droppedBy(why string) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.dropped[why]
}
