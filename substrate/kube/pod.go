package kube

import (
	"time"
	"unique"

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
//
// The cache holds one per task pod, 150,000 of them on a large fleet, so
// its size is counted (TestCachedPodSize): what most pods leave empty (the
// status's reason and message, the disruption condition, a container's
// termination) sits behind a pointer, nil on a pod that is simply running,
// and the strings most pods share (the namespace, the node, the phase, the
// task and container names, the outcome record finalizer) are shared
// (reducer). It keeps nothing a judgment, the sweep, the events or the
// informer's own key and version functions do not read.
type pod struct {
	podMeta

	labels  podLabels
	phase   corev1.PodPhase
	started time.Time
	// node is spec.nodeName: the node the pod is bound to ("" until it is
	// scheduled).
	node string
	// ready: the pod's Ready condition is True. The node lifecycle
	// controller turns it False on every pod of a node that stops
	// reporting.
	ready      bool
	containers []container
	// ended: what a pod's status says of its end or of the cluster
	// stopping it; nil when it says nothing (every pod that simply runs).
	ended *podEnded
}

// podEnded is the part of a pod's status that only a stopped, evicted or
// finished pod fills.
type podEnded struct {
	reason    string // status.reason: Evicted, Shutdown, DeadlineExceeded, ...
	message   string // status.message (the kubelet's eviction message); finished pods only
	disrupted string // reason of the DisruptionTarget=True condition; "" when none
	// disruptedAt is when that condition turned true.
	disruptedAt time.Time
}

// statusReason is status.reason ("" when none).
func (p *pod) statusReason() string {
	if p.ended == nil {
		return ""
	}
	return p.ended.reason
}

// statusMessage is status.message, kept for a finished pod only.
func (p *pod) statusMessage() string {
	if p.ended == nil {
		return ""
	}
	return p.ended.message
}

// disruption is the reason of the pod's DisruptionTarget=True condition
// and when it turned true ("" and zero when none).
func (p *pod) disruptionTarget() (string, time.Time) {
	if p.ended == nil {
		return "", time.Time{}
	}
	return p.ended.disrupted, p.ended.disruptedAt
}

// container is one container's state.
type container struct {
	name    string
	running bool
	// term is the container's termination; nil while it has not
	// terminated.
	term *termination
}

// termination is how a container ended.
type termination struct {
	exitCode   int32
	reason     string // OOMKilled, Error, Completed, ...
	message    string // the termination message: the durable outcome record
	finishedAt time.Time
}

// terminated reports whether the container has terminated.
func (c container) terminated() bool { return c.term != nil }

// terminatedWith reports whether the container terminated with reason.
func (c container) terminatedWith(reason string) bool {
	return c.term != nil && c.term.reason == reason
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
	for i, ct := range c.containers {
		if ct.term != nil {
			t := *ct.term
			c.containers[i].term = &t
		}
	}
	if p.ended != nil {
		e := *p.ended
		c.ended = &e
	}
	return &c
}

// reduce keeps of a pod only what reaping needs (a live read's pods: no
// string shared).
func reduce(in *corev1.Pod) *pod { return reducer{}.reduce(in) }

// reducer reduces pods. The cache's shares what repeats from pod to pod
// (share); a live read's does not (its pods live for one call).
type reducer struct {
	share bool
	// recordOnly is the finalizer list every task pod carries until the
	// sweep releases it, held once for the whole cache. It is never
	// written to: a release patches the pod on the server, DeepCopyObject
	// copies, and its capacity is its length, so an append copies too.
	recordOnly []string
}

// cacheReducer is the presence cache's reducer.
func cacheReducer() reducer {
	return reducer{share: true, recordOnly: []string{FinalizerOutcomeRecord}[:1:1]}
}

// str is s, or with share the one copy of s every pod of the cache
// shares (unique.Make: weak, so a value no pod holds any more is dropped,
// and a made-up node name costs the cache nothing once its pod is gone).
func (r reducer) str(s string) string {
	if !r.share || s == "" {
		return s
	}
	return unique.Make(s).Value()
}

// phase is the phase's constant when it is one of the five.
func phase(ph corev1.PodPhase) corev1.PodPhase {
	switch ph {
	case corev1.PodPending:
		return corev1.PodPending
	case corev1.PodRunning:
		return corev1.PodRunning
	case corev1.PodSucceeded:
		return corev1.PodSucceeded
	case corev1.PodFailed:
		return corev1.PodFailed
	case corev1.PodUnknown:
		return corev1.PodUnknown
	}
	return ph
}

func (r reducer) reduce(in *corev1.Pod) *pod {
	p := &pod{
		podMeta: podMeta{Name: in.Name, Namespace: r.str(in.Namespace), UID: in.UID,
			ResourceVersion: in.ResourceVersion, DeletionTimestamp: in.DeletionTimestamp,
			DeletionGracePeriodSeconds: in.DeletionGracePeriodSeconds, Finalizers: r.finalizers(in.Finalizers),
			CreationTimestamp: in.CreationTimestamp},
		labels: r.labels(labelsOf(in.Labels, in.Annotations)),
		phase:  phase(in.Status.Phase),
		node:   r.str(in.Spec.NodeName),
	}
	if in.Status.StartTime != nil {
		p.started = in.Status.StartTime.Time
	}
	var ended podEnded
	ended.reason = in.Status.Reason
	if finished(in.Status.Phase) {
		ended.message = in.Status.Message
	}
	for _, c := range in.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
			ended.disrupted, ended.disruptedAt = c.Reason, c.LastTransitionTime.Time
		}
		if c.Type == corev1.PodReady {
			p.ready = c.Status == corev1.ConditionTrue
		}
	}
	if ended != (podEnded{}) {
		p.ended = &ended
	}
	if n := len(in.Status.ContainerStatuses); n > 0 {
		p.containers = make([]container, 0, n)
	}
	for _, cs := range in.Status.ContainerStatuses {
		c := container{name: r.str(cs.Name), running: cs.State.Running != nil}
		if t := cs.State.Terminated; t != nil {
			c.term = &termination{exitCode: t.ExitCode, reason: t.Reason, message: t.Message, finishedAt: t.FinishedAt.Time}
		}
		p.containers = append(p.containers, c)
	}
	return p
}

// labels shares the task label (task ids repeat from run to run) and
// the raw task id where it spells the label.
func (r reducer) labels(l podLabels) podLabels {
	if !r.share {
		return l
	}
	l.task = r.str(l.task)
	if l.raw == l.task {
		l.raw = l.task
	} else {
		l.raw = r.str(l.raw)
	}
	return l
}

// finalizers is fs, or the shared list when fs names exactly the outcome
// record finalizer.
func (r reducer) finalizers(fs []string) []string {
	if r.recordOnly != nil && len(fs) == 1 && fs[0] == FinalizerOutcomeRecord {
		return r.recordOnly
	}
	return fs
}

// object is the informer's transform: every pod it receives is reduced
// before it is stored. Anything else (a tombstone) passes as is.
func (r reducer) object(obj any) (any, error) {
	if in, ok := obj.(*corev1.Pod); ok {
		return r.reduce(in), nil
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
	if !ok || !c.terminated() {
		return Record{}, false
	}
	r, ok := ParseRecord(c.term.message)
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
		if c.terminated() && c.term.finishedAt.After(at) {
			at = c.term.finishedAt
		}
	}
	if at.IsZero() {
		_, at = p.disruptionTarget()
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
		if c.terminated() && c.term.finishedAt.After(at) {
			at = c.term.finishedAt
		}
	}
	_, disruptedAt := p.disruptionTarget()
	switch {
	case !at.IsZero():
		return at
	case !disruptedAt.IsZero():
		return disruptedAt
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
