package kube

import (
	"strconv"
	"sync"

	"github.com/dexaflow/reaper/sdk"
)

// attemptPods finds the cached pods of an attempt in one map lookup: the
// pods the informer holds, by a 64-bit hash of the attempt their labels
// spell (run, task label, try, epoch). It is kept by the informer's own
// event handler, which the informer calls, in order, after each change to
// its store: it holds what the store held when the handler last ran, a
// moment behind the store at most, and it drops a deleted pod before the
// change feed names it (the same handler, first). Pods of attempts whose
// task ids collide in the label, or whose hashes collide, share an entry;
// the lookup keeps only the pods whose labels name the attempt exactly.
//
// Most hashes hold one pod, kept in one (a map entry of a hash and a
// pointer); a hash that holds several (an attempt with a second pod, a
// collision) moves to more. No hash is in both.
type attemptPods struct {
	mu   sync.RWMutex
	one  map[uint64]*pod
	more map[uint64][]*pod
}

func newAttemptPods() *attemptPods {
	return &attemptPods{one: map[uint64]*pod{}, more: map[uint64][]*pod{}}
}

// fnv64Offset and fnv64Prime are FNV-1a's (hash/fnv's New64a).
const (
	fnv64Offset = 14695981039346656037
	fnv64Prime  = 1099511628211
)

// attemptHash is FNV-1a over the attempt's parts, each followed by a zero
// byte, in place: run id, task label, try and epoch as the labels spell
// them.
func attemptHash(run, task, try, epoch string) uint64 {
	h := uint64(fnv64Offset)
	for _, s := range [...]string{run, task, try, epoch} {
		for i := 0; i < len(s); i++ {
			h ^= uint64(s[i])
			h *= fnv64Prime
		}
		h *= fnv64Prime // the zero byte: h ^= 0, then the multiplication
	}
	return h
}

// hashOf is the hash of the attempt a pod's labels spell (no epoch label
// counts as epoch 0, as matches does).
func hashOf(p *pod) uint64 {
	epoch := p.labels.epoch
	if !p.labels.hasEpoch {
		epoch = "0"
	}
	return attemptHash(p.labels.run, p.labels.task, p.labels.try, epoch)
}

// add holds p under the hash of its labels.
func (ap *attemptPods) add(p *pod) {
	ap.mu.Lock()
	defer ap.mu.Unlock()
	ap.addLocked(p)
}

func (ap *attemptPods) addLocked(p *pod) {
	h := hashOf(p)
	if ps, ok := ap.more[h]; ok {
		ap.more[h] = append(ps, p)
		return
	}
	if q, ok := ap.one[h]; ok {
		delete(ap.one, h)
		ap.more[h] = []*pod{q, p}
		return
	}
	ap.one[h] = p
}

// replace holds now instead of was (an update of the informer's store), in
// one step, so that a lookup meanwhile finds one or the other, never
// neither. Either may be nil (an object that is not a reduced pod).
func (ap *attemptPods) replace(was, now *pod) {
	if was == now {
		return // a resync: the store holds the same object
	}
	ap.mu.Lock()
	defer ap.mu.Unlock()
	if was != nil {
		ap.removeLocked(was)
	}
	if now != nil {
		ap.addLocked(now)
	}
}

// remove drops the pod of p's namespace and name (the informer's key),
// looked for under the hash of p's labels and, should it not be there (its
// labels changed without the handler seeing the change), everywhere.
func (ap *attemptPods) remove(p *pod) {
	ap.mu.Lock()
	defer ap.mu.Unlock()
	ap.removeLocked(p)
}

func (ap *attemptPods) removeLocked(p *pod) {
	if ap.removeAt(hashOf(p), p) {
		return
	}
	for h, q := range ap.one {
		if sameKey(q, p) {
			delete(ap.one, h)
			return
		}
	}
	for h := range ap.more {
		if ap.removeAt(h, p) {
			return
		}
	}
}

// removeAt drops the pod of p's key from hash h; false when h holds none.
func (ap *attemptPods) removeAt(h uint64, p *pod) bool {
	if q, ok := ap.one[h]; ok {
		if !sameKey(q, p) {
			return false
		}
		delete(ap.one, h)
		return true
	}
	ps := ap.more[h]
	for i, q := range ps {
		if !sameKey(q, p) {
			continue
		}
		rest := append(ps[:i:i], ps[i+1:]...)
		switch len(rest) {
		case 0:
			delete(ap.more, h)
		case 1:
			delete(ap.more, h)
			ap.one[h] = rest[0]
		default:
			ap.more[h] = rest
		}
		return true
	}
	return false
}

func sameKey(a, b *pod) bool { return a.Name == b.Name && a.Namespace == b.Namespace }

// of returns the held pods of exactly attempt a.
func (ap *attemptPods) of(a sdk.Attempt) []*pod {
	h := attemptHash(a.RunID, TaskIDLabel(a.TaskID), strconv.Itoa(int(a.Try)), strconv.Itoa(int(a.Epoch)))
	ap.mu.RLock()
	defer ap.mu.RUnlock()
	if q, ok := ap.one[h]; ok {
		if q.labels.matches(a) {
			return []*pod{q}
		}
		return nil
	}
	var out []*pod
	for _, q := range ap.more[h] {
		if q.labels.matches(a) {
			out = append(out, q)
		}
	}
	return out
}

// len is how many pods are held (tests).
func (ap *attemptPods) len() int {
	ap.mu.RLock()
	defer ap.mu.RUnlock()
	n := len(ap.one)
	for _, ps := range ap.more {
		n += len(ps)
	}
	return n
}
