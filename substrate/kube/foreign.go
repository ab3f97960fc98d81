package kube

import (
	"sync"

	"github.com/hashicorp/go-hclog"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dexaflow/reaper/sdk"
)

// A pod is an attempt's only when reaperd made it: the kube runner records
// the UID of the pod it created on the attempt (Candidate.PodUID), and a
// pod whose labels name the attempt but whose UID is another one was made
// by someone else (anyone with pods/create in the namespace can copy the
// labels and write a termination message). Such a pod is foreign: it
// settles nothing, overrides no mark, keeps no attempt alive, holds no
// confirmation back, and is never torn down, released or collected. An
// attempt that records no UID (its pod is from before UIDs were recorded,
// or was created but not recorded yet) keeps the label rule.

// maxForeignRemembered bounds the foreign pods remembered (by UID) so that
// each is logged and reported once; past it the oldest is forgotten, and
// reported again if it is seen again.
const maxForeignRemembered = 4096

// foreignPods remembers the foreign pods seen, and holds the decisions
// about them until the next sweep hands them to the host (which meters,
// logs and audits them): presence and teardown answers carry no decisions.
type foreignPods struct {
	log hclog.Logger

	mu      sync.Mutex
	seen    map[types.UID]bool
	order   []types.UID // oldest first, at most maxForeignRemembered
	pending []sdk.Decision
}

func newForeignPods(log hclog.Logger) *foreignPods {
	return &foreignPods{log: log, seen: map[types.UID]bool{}}
}

// saw reports foreign pod p, whose labels name attempt a, found by where
// (presence, teardown, sweep). recorded is the UID the attempt records (""
// when the caller does not know it: the board refused the pod). The first
// sight of a UID is logged at WARN and queued as a decision; later ones
// change nothing.
func (f *foreignPods) saw(p *pod, a sdk.Attempt, recorded, where string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.seen[p.UID] {
		return
	}
	if len(f.order) >= maxForeignRemembered {
		delete(f.seen, f.order[0])
		f.order = f.order[1:]
	}
	f.seen[p.UID] = true
	f.order = append(f.order, p.UID)
	ev := map[string]string{"pod": p.Name, "pod_uid": string(p.UID), "seen_by": where}
	detail := p.ref() + " (uid " + string(p.UID) + ") carries the attempt's labels but is not its pod"
	if recorded != "" {
		ev["recorded_pod_uid"] = recorded
		detail += ": the attempt records pod uid " + recorded
	} else {
		detail += ": the board refused it as not the attempt's recorded pod"
	}
	f.log.Warn("kube: ignored a task pod the attempt never recorded (someone else made it)",
		"attempt", a.String(), "pod", p.Name, "namespace", p.Namespace, "uid", p.UID, "recorded_uid", recorded, "seen_by", where)
	if len(f.pending) < maxForeignRemembered {
		f.pending = append(f.pending, sdk.Decision{Label: sdk.LabelForeignTaskPod, Attempt: a,
			Detail: "ignored for judgment: " + detail, Evidence: ev})
	}
}

// take hands over the decisions queued since the last call.
func (f *foreignPods) take() []sdk.Decision {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.pending
	f.pending = nil
	return out
}

// putBack queues again decisions taken by a sweep that failed (the host
// drops a failed sweep's decisions), ahead of those queued since, within
// the bound.
func (f *foreignPods) putBack(ds []sdk.Decision) {
	if len(ds) == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	all := append(ds, f.pending...)
	f.pending = all[:min(len(all), maxForeignRemembered)]
}

// ownPods keeps, of the pods the labels tie to attempt a, the attempt's
// own: the pod of the UID the attempt records, or all of them when it
// records none (the label rule). The others are reported as foreign. pods
// is not changed.
func (r *running) ownPods(a sdk.Attempt, recorded string, pods []*pod, where string) []*pod {
	if recorded == "" || len(pods) == 0 {
		return pods
	}
	out := make([]*pod, 0, 1)
	for _, p := range pods {
		if string(p.UID) == recorded {
			out = append(out, p)
			continue
		}
		r.foreign.saw(p, a, recorded, where)
	}
	return out
}
