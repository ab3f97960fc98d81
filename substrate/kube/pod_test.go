package kube

import (
	"fmt"
	"reflect"
	"testing"
	"time"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The presence cache holds one pod per task pod: its size is part of the
// informer's bytes a pod (issue #44). A field added to pod or container
// should sit behind the pointer of the part most pods leave empty unless
// every pod fills it.
func TestCachedPodSize(t *testing.T) {
	t.Parallel()
	if got := unsafe.Sizeof(pod{}); got > 320 {
		t.Errorf("pod is %d bytes, want at most 320 (the allocator's class a running pod fits)", got)
	}
	if got := unsafe.Sizeof(container{}); got > 32 {
		t.Errorf("container is %d bytes, want at most 32", got)
	}
}

// cachedPods are pods of every shape the judgments read: running, pending,
// finished with and without a record, evicted with the kubelet's message,
// disrupted, deleted in and past their grace, with other finalizers, on a
// node, never scheduled.
func cachedPods(t *testing.T) map[string]*corev1.Pod {
	t.Helper()
	build := func(phase corev1.PodPhase, opts ...func(*corev1.Pod)) *corev1.Pod {
		l, ann := AttemptLabels(attempt)
		in := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "uid-1", ResourceVersion: "42",
				CreationTimestamp: metav1.Time{Time: t0.Add(-time.Hour)}, Labels: l, Annotations: ann,
				Finalizers: []string{FinalizerOutcomeRecord}},
			Spec:   corev1.PodSpec{NodeName: "node-a"},
			Status: corev1.PodStatus{Phase: phase},
		}
		for _, o := range opts {
			o(in)
		}
		return in
	}
	ready := func(p *corev1.Pod) {
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue})
	}
	return map[string]*corev1.Pod{
		"Running":  build(corev1.PodRunning, started(t0.Add(-time.Minute)), taskRunning(), ready),
		"Pending":  build(corev1.PodPending, func(p *corev1.Pod) { p.Spec.NodeName = "" }),
		"Recorded": build(corev1.PodSucceeded, taskTerminated(0, "Completed", rec(t, attempt, RecordSuccess, code(0), ""), t0)),
		"Evicted": build(corev1.PodFailed, podReason("Evicted", "The node was low on resource: memory."),
			taskTerminated(137, "Error", "", t0)),
		"Disrupted": build(corev1.PodFailed, disrupted("PreemptionByScheduler"), func(p *corev1.Pod) {
			p.Status.Conditions[0].LastTransitionTime = metav1.Time{Time: t0}
		}),
		"DeletingInGrace":    build(corev1.PodRunning, taskRunning(), deleting),
		"DeletedByKubelet":   build(corev1.PodFailed, taskTerminated(143, "Error", "", t0), deletedByTheKubelet(t0)),
		"OtherFinalizers":    build(corev1.PodRunning, func(p *corev1.Pod) { p.Finalizers = append(p.Finalizers, "example.com/keep") }),
		"NoFinalizer":        build(corev1.PodRunning, func(p *corev1.Pod) { p.Finalizers = nil }),
		"RawTaskIDDiffers":   build(corev1.PodRunning, func(p *corev1.Pod) { p.Annotations[AnnotationRawTaskID] = "Load_A" }),
		"TwoContainers":      build(corev1.PodRunning, taskRunning(), taskTerminated(1, "Error", "sidecar", t0)),
		"OOMKilledDisrupted": build(corev1.PodFailed, disrupted("DeletionByTaintManager"), taskTerminated(137, "OOMKilled", "", t0)),
	}
}

// The cache's pods are the live read's, value for value: sharing strings
// and the finalizer list changes what is held, never what it says. So
// every judgment (podlost's liveness, the sweep's verdicts and releases,
// the node reads, the events) reads the same pod from either.
func TestCachedPodReadsAsTheLiveOne(t *testing.T) {
	t.Parallel()
	r := cacheReducer()
	for name, in := range cachedPods(t) {
		t.Run(name, func(t *testing.T) {
			live, cached := reduce(in), r.reduce(in)
			if !reflect.DeepEqual(live, cached) {
				t.Fatalf("the cache's pod differs from the live read's:\n cached %+v\n live   %+v", cached, live)
			}
			if c := cached.DeepCopyObject(); !reflect.DeepEqual(c, cached) {
				t.Fatalf("a copy of the cache's pod differs from it:\n copy %+v\n pod  %+v", c, cached)
			}
			now := t0.Add(time.Hour)
			read := func(p *pod) []any {
				v, ok := judgeFinished(p)
				r, hasRec := p.record()
				i, held := p.recordFinalizer()
				a, named := p.labels.attempt()
				return []any{v, ok, r, hasRec, p.endedAt(now), p.finishedAt(), p.letGo(), i, held,
					p.deletionRequested(), a, named, p.labels.matches(attempt), presentLive(attempt, []*pod{p})}
			}
			if l, c := read(live), read(cached); !reflect.DeepEqual(l, c) {
				t.Fatalf("the judgments differ:\n cached %+v\n live   %+v", c, l)
			}
		})
	}
}

// What repeats from pod to pod is held once in the cache: the namespace,
// the node, the task label, the container's name and the finalizer list.
func TestCachedPodsShareWhatRepeats(t *testing.T) {
	t.Parallel()
	r := cacheReducer()
	var pods []*pod
	for i := range 2 {
		l, ann := AttemptLabels(attempt)
		in := &corev1.Pod{
			// Each field a string of its own, as a decoder makes them.
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%d", i), Namespace: fmt.Sprint("n", "s"),
				Labels: l, Annotations: ann, Finalizers: []string{fmt.Sprint(FinalizerOutcomeRecord)}},
			Spec: corev1.PodSpec{NodeName: fmt.Sprint("node-", "a")},
			Status: corev1.PodStatus{Phase: corev1.PodPhase(fmt.Sprint(corev1.PodRunning)),
				ContainerStatuses: []corev1.ContainerStatus{{Name: fmt.Sprint(TaskContainer)}}},
		}
		in.Labels[LabelTaskID] = fmt.Sprint(TaskIDLabel(attempt.TaskID))
		pods = append(pods, r.reduce(in))
	}
	a, b := pods[0], pods[1]
	same := func(what, x, y string) {
		if unsafe.StringData(x) != unsafe.StringData(y) {
			t.Errorf("%s is held twice", what)
		}
	}
	same("the namespace", a.Namespace, b.Namespace)
	same("the node", a.node, b.node)
	same("the phase", string(a.phase), string(b.phase))
	same("the task label", a.labels.task, b.labels.task)
	same("the container's name", a.containers[0].name, b.containers[0].name)
	if &a.Finalizers[0] != &b.Finalizers[0] {
		t.Error("the finalizer list is held twice")
	}
	if cap(a.Finalizers) != 1 {
		t.Errorf("the shared finalizer list has room to append into (cap %d)", cap(a.Finalizers))
	}
}
