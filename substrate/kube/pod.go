package kube

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// pod is what reaping needs of a task pod, and all the presence cache
// keeps of one: its identity, the attempt its labels and annotation name,
// its phase and start, the disruption condition and the containers'
// states. A live read is reduced to the same shape, so every judgment reads
// one type.
type pod struct {
	podMeta

	labels    podLabels
	phase     corev1.PodPhase
	reason    string // status.reason: Evicted, Shutdown, DeadlineExceeded, ...
	message   string // status.message (the kubelet's eviction message); finished pods only
	started   time.Time
	deadline  *int64 // spec.activeDeadlineSeconds
	disrupted string // reason of the DisruptionTarget=True condition; "" when none
	// disruptedAt is when that condition turned true.
	disruptedAt time.Time
	// node is spec.nodeName: the node the pod is bound to ("" until it is
	// scheduled).
	node string
	// ready: the pod's Ready condition is True. The node lifecycle
	// controller turns it False on every pod of a node that stops
	// reporting.
	ready      bool
	containers []container
}

// container is one container's state.
type container struct {
	name       string
	running    bool
	terminated bool
	exitCode   int32
	reason     string // OOMKilled, Error, Completed, ...
	message    string // the termination message: the durable outcome record
	finishedAt time.Time
}

// podMeta is the part of a pod's metadata a pod keeps: the name,
// namespace, UID and resource version, the creation and deletion
// timestamps, the deletion's grace and the finalizers. The informer keys
// and versions objects through them, and the sweep releases the outcome
// record finalizer pinned to them. It is not the whole metav1.ObjectMeta,
// whose other fields (empty here) would cost the cache a hundred bytes a
// pod; the informer reads it through GetObjectMeta.
type podMeta struct {
	Name                       string
	Namespace                  string
	UID                        types.UID
	ResourceVersion            string
	CreationTimestamp          metav1.Time
	DeletionTimestamp          *metav1.Time
	DeletionGracePeriodSeconds *int64
	Finalizers                 []string
}

var (
	_ runtime.Object            = (*pod)(nil)
	_ metav1.ObjectMetaAccessor = (*pod)(nil)
)

// GetObjectMeta is the pod's metadata as the informer's key and version
// functions read it (meta.Accessor): a copy, so nothing set on it reaches
// the cached pod.
func (p *pod) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
		CreationTimestamp: p.CreationTimestamp, DeletionTimestamp: p.DeletionTimestamp,
		DeletionGracePeriodSeconds: p.DeletionGracePeriodSeconds, Finalizers: p.Finalizers}
}

// GetObjectKind makes pod a runtime.Object, as cache code expects.
func (p *pod) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject copies p.
func (p *pod) DeepCopyObject() runtime.Object {
	c := *p
	c.Finalizers = append([]string(nil), p.Finalizers...)
	c.DeletionTimestamp = p.DeletionTimestamp.DeepCopy()
	if p.DeletionGracePeriodSeconds != nil {
		g := *p.DeletionGracePeriodSeconds
		c.DeletionGracePeriodSeconds = &g
	}
	c.containers = append([]container(nil), p.containers...)
	if p.deadline != nil {
		d := *p.deadline
		c.deadline = &d
	}
	return &c
}

// reduce keeps of a pod only what reaping needs.
func reduce(in *corev1.Pod) *pod {
	p := &pod{
		podMeta: podMeta{Name: in.Name, Namespace: in.Namespace, UID: in.UID,
			ResourceVersion: in.ResourceVersion, DeletionTimestamp: in.DeletionTimestamp,
			DeletionGracePeriodSeconds: in.DeletionGracePeriodSeconds, Finalizers: in.Finalizers,
			CreationTimestamp: in.CreationTimestamp},
		labels:   labelsOf(in.Labels, in.Annotations),
		phase:    in.Status.Phase,
		reason:   in.Status.Reason,
		deadline: in.Spec.ActiveDeadlineSeconds,
		node:     in.Spec.NodeName,
	}
	if in.Status.StartTime != nil {
		p.started = in.Status.StartTime.Time
	}
	if finished(in.Status.Phase) {
		p.message = in.Status.Message
	}
	for _, c := range in.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
			p.disrupted, p.disruptedAt = c.Reason, c.LastTransitionTime.Time
		}
		if c.Type == corev1.PodReady {
			p.ready = c.Status == corev1.ConditionTrue
		}
	}
	if n := len(in.Status.ContainerStatuses); n > 0 {
		p.containers = make([]container, 0, n)
	}
	for _, cs := range in.Status.ContainerStatuses {
		c := container{name: cs.Name, running: cs.State.Running != nil}
		if t := cs.State.Terminated; t != nil {
			c.terminated, c.exitCode, c.reason, c.message, c.finishedAt = true, t.ExitCode, t.Reason, t.Message, t.FinishedAt.Time
		}
		p.containers = append(p.containers, c)
	}
	return p
}

// reduceObject is the informer's transform: every pod it receives is
// reduced before it is stored. Anything else (a tombstone) passes as is.
func reduceObject(obj any) (any, error) {
	if in, ok := obj.(*corev1.Pod); ok {
		return reduce(in), nil
	}
	return obj, nil
}

// finished reports whether phase is terminal. Unknown is not: its node
// stopped reporting, and a container may still run there.
func finished(phase corev1.PodPhase) bool {
	return phase == corev1.PodSucceeded || phase == corev1.PodFailed
}

// task is the pod's task container: the one named TaskContainer, else the
// first one. ok is false while the pod reports no container at all.
func (p *pod) task() (container, bool) {
	for _, c := range p.containers {
		if c.name == TaskContainer {
			return c, true
		}
	}
	if len(p.containers) > 0 {
		return p.containers[0], true
	}
	return container{}, false
}

// record is the durable outcome record the pod's task container left, if
// it left one that names the attempt of the pod's labels. A record naming
// another attempt (another epoch above all: a superseded execution wrote
// it) counts as no record.
func (p *pod) record() (Record, bool) {
	c, ok := p.task()
	if !ok || !c.terminated {
		return Record{}, false
	}
	r, ok := ParseRecord(c.message)
	if !ok || !p.labels.matches(r.Attempt()) {
		return Record{}, false
	}
	return r, true
}

// endedAt is when the attempt this pod ran really ended, as far as the pod
// says: its containers' last termination, else its disruption; zero when
// it says nothing (the sweep's own time is used then). Never after now.
func (p *pod) endedAt(now time.Time) time.Time {
	var at time.Time
	for _, c := range p.containers {
		if c.terminated && c.finishedAt.After(at) {
			at = c.finishedAt
		}
	}
	if at.IsZero() {
		at = p.disruptedAt
	}
	if at.After(now) {
		return time.Time{}
	}
	return at
}

// finishedAt is when the pod finished: its containers' last termination,
// else its disruption, else its start, else its creation.
func (p *pod) finishedAt() time.Time {
	var at time.Time
	for _, c := range p.containers {
		if c.finishedAt.After(at) {
			at = c.finishedAt
		}
	}
	switch {
	case !at.IsZero():
		return at
	case !p.disruptedAt.IsZero():
		return p.disruptedAt
	case !p.started.IsZero():
		return p.started
	}
	return p.CreationTimestamp.Time
}

// ref names the pod for outcomes and logs.
func (p *pod) ref() string { return "pod/" + p.Namespace + "/" + p.Name }

// recordFinalizer is the index of FinalizerOutcomeRecord among the pod's
// finalizers; ok is false when the pod does not carry it.
func (p *pod) recordFinalizer() (i int, ok bool) {
	for i, f := range p.Finalizers {
		if f == FinalizerOutcomeRecord {
			return i, true
		}
	}
	return 0, false
}

// deletionRequested is the earliest the pod's deletion can have been asked
// for, as its object now says. The API server sets the deletion timestamp
// to the request's time plus the grace it gives the pod (when the kill is
// due); while that grace is recorded, the request is the timestamp less
// the grace. A later delete that shortens the grace moves the timestamp
// back by the difference but never into the past: the kubelet's own
// grace-0 delete, once the pod has ended, sets it to that delete's time and
// the grace to 0, and the request's time is gone from the object. So with
// no grace left the request was at the timestamp (a delete with grace 0, or
// of a pod that had already ended) or before it, by as much as the kubelet
// took between the kill and its last delete: finalDeleteSlack is read off.
func (p *pod) deletionRequested() time.Time {
	if p.DeletionTimestamp == nil {
		return time.Time{}
	}
	at := p.DeletionTimestamp.Time
	switch g := p.DeletionGracePeriodSeconds; {
	case g != nil && *g > 0:
		return at.Add(-time.Duration(*g) * time.Second)
	case g != nil:
		return at.Add(-finalDeleteSlack)
	}
	return at
}

// finalDeleteSlack bounds how long after a container it killed for a
// graceful deletion the kubelet makes its last (grace-0) delete: the pod's
// volumes torn down and its status written first. A task with no record
// that ended within it before a deletion with no grace left is read as
// ended by that deletion (re-run on the infra budget, not charged a retry),
// which a task whose agent died on its own just before an unrelated delete
// also is.
const finalDeleteSlack = 30 * time.Second

// letGo reports whether the cluster has let the pod go: it is deleted
// with no grace left (a kubelet's last word, Pod GC, a forced delete, or a
// pod never placed), so only finalizers keep its object.
func (p *pod) letGo() bool {
	return p.DeletionTimestamp != nil && p.DeletionGracePeriodSeconds != nil && *p.DeletionGracePeriodSeconds == 0
}
