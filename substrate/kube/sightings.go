package kube

import (
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
)

// The pod cache's misses, for the history of pod_lost_floor (see
// sdk.PodSighting). The presence informer notes two events of a task pod:
//
//   - seen: the cache received the pod already Running, so it held no pod
//     of the attempt while the pod started and ran up to now (a watch that
//     broke and relisted, a lagging watch). The cache's first list after
//     the substrate starts is not counted: its pods were missing from the
//     cache because the substrate was not running, not because the cache
//     missed them, as a heartbeat gap is not counted from before the
//     answering replica began serving.
//   - missing: the cache saw the pod deleted while it had not finished: a
//     window opened that only the attempt's own later signs of life (a
//     heartbeat, its own outcome) can end. A finished pod's deletion is not
//     one: its attempt is the reconciler's to settle.
//
// The events wait here, per attempt and pod UID, folded to what the board
// keeps (the last sighting, the first deletion after it), and the sweep
// writes them in one board call. Which pod is the attempt's is the
// board's to say (the UID it recorded): a pod someone else made with the
// attempt's labels is refused there and changes nothing.

// maxPendingSightings bounds the attempts whose sightings wait for a sweep
// (a replica that is not the leader sweeps nothing): past it the oldest is
// dropped and counted.
const maxPendingSightings = 4 * sdk.MaxPodSightings

type sightingKey struct {
	attempt sdk.Attempt
	uid     types.UID
}

// sightings holds the pod cache's events until a sweep writes them.
type sightings struct {
	clock clock.Clock

	mu      sync.Mutex
	pending map[sightingKey]*pending
	order   []sightingKey // oldest first; a key taken or dropped is gone from pending; a key put back may be listed twice
	dropped int           // sightings dropped by the bound since the last take
}

// pending is one attempt's pod's sightings, and the pod they are of (to
// name it if the board refuses it as not the attempt's).
type pending struct {
	sdk.PodSighting
	pod *pod
}

func newSightings(c clock.Clock) *sightings {
	return &sightings{clock: c, pending: map[sightingKey]*pending{}}
}

// added is the informer's add handler: a Running task pod the cache did
// not hold, outside its first list, is seen now.
func (s *sightings) added(obj any, inInitialList bool) {
	p, ok := obj.(*pod)
	if !ok || inInitialList || p.phase != corev1.PodRunning {
		return
	}
	s.note(p, func(ps *sdk.PodSighting, now time.Time) {
		ps.SeenAt, ps.MissingAt = now, time.Time{}
	})
}

// deleted is the informer's delete handler: an unfinished task pod's
// deletion opens a window now (the first deletion after the last
// sighting is kept).
func (s *sightings) deleted(obj any) {
	p, ok := deletedPod(obj)
	if !ok || finished(p.phase) {
		return
	}
	s.note(p, func(ps *sdk.PodSighting, now time.Time) {
		if ps.MissingAt.IsZero() {
			ps.MissingAt = now
		}
	})
}

func (s *sightings) note(p *pod, update func(*sdk.PodSighting, time.Time)) {
	a, ok := p.labels.attempt()
	if !ok || p.UID == "" {
		return
	}
	now := s.clock.Now()
	key := sightingKey{attempt: a, uid: p.UID}
	s.mu.Lock()
	defer s.mu.Unlock()
	ps, ok := s.pending[key]
	if !ok {
		for len(s.pending) >= maxPendingSightings && len(s.order) > 0 {
			if _, held := s.pending[s.order[0]]; held {
				delete(s.pending, s.order[0])
				s.dropped++
			}
			s.order = s.order[1:]
		}
		ps = &pending{PodSighting: sdk.PodSighting{Attempt: a, PodUID: string(p.UID)},
			pod: &pod{podMeta: podMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID}}}
		s.pending[key] = ps
		s.order = append(s.order, key)
	}
	update(&ps.PodSighting, now)
}

// take hands over, oldest first, at most sdk.MaxPodSightings sightings, each
// task instance at most once (a second pod of one task instance waits for
// the next sweep), fenced on term at the sweep's time, with the pod of
// each; and how many were dropped by the bound since the last take.
func (s *sightings) take(term int64, at time.Time) ([]sdk.PodSighting, []*pod, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var (
		out    []sdk.PodSighting
		pods   []*pod
		kept   []sightingKey
		in     = map[[2]string]bool{}
		listed = map[sightingKey]bool{}
	)
	for _, k := range s.order {
		ps, held := s.pending[k]
		if !held || listed[k] {
			continue
		}
		listed[k] = true
		task := [2]string{k.attempt.RunID, k.attempt.TaskID}
		if len(out) == sdk.MaxPodSightings || in[task] {
			kept = append(kept, k)
			continue
		}
		in[task] = true
		ps.Term, ps.At = term, at
		out, pods = append(out, ps.PodSighting), append(pods, ps.pod)
		delete(s.pending, k)
	}
	s.order = kept
	dropped := s.dropped
	s.dropped = 0
	return out, pods, dropped
}

// putBack keeps again sightings a sweep took but could not write, ahead
// of the newer ones. When the cache saw the pod again since, the two are
// folded: the newer sighting wins, else the older one stands with the
// first deletion after it.
func (s *sightings) putBack(ps []sdk.PodSighting, pods []*pod) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var keys []sightingKey
	for i, p := range ps {
		key := sightingKey{attempt: p.Attempt, uid: types.UID(p.PodUID)}
		p.Term, p.At = 0, time.Time{}
		if cur, ok := s.pending[key]; ok {
			if cur.SeenAt.IsZero() {
				cur.SeenAt = p.SeenAt
				if !p.MissingAt.IsZero() {
					cur.MissingAt = p.MissingAt
				}
			}
			keys = append(keys, key)
			continue
		}
		if len(s.pending) >= maxPendingSightings {
			s.dropped++
			continue
		}
		s.pending[key] = &pending{PodSighting: p, pod: pods[i]}
		keys = append(keys, key)
	}
	s.order = append(keys, s.order...)
}
