package kube

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
)

// taskPod is a Running task pod as a runner would make it and a kubelet
// would report it: the shape the cache's memory is measured on.
func taskPod(ns string, seq int, a sdk.Attempt, started time.Time) *corev1.Pod {
	l, ann := AttemptLabels(a)
	l["app.kubernetes.io/managed-by"] = "dexaflow"
	l["leoflow.io/dag-id"] = "nightly_load"
	ann["leoflow.io/dispatched-at"] = started.Format(time.RFC3339)
	name := fmt.Sprintf("%s-%s-%d-%d", a.RunID, TaskIDLabel(a.TaskID), a.Try, a.Epoch)
	deadline := int64(4000)
	st := metav1.NewTime(started)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID(fmt.Sprintf("0b7c5e1e-6a7f-4c1e-9d7e-%012d", seq)),
			ResourceVersion: "123456", Labels: l, Annotations: ann, CreationTimestamp: st,
			Finalizers: []string{FinalizerOutcomeRecord}},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, NodeName: "node-a", ActiveDeadlineSeconds: &deadline,
			Containers: []corev1.Container{{
				Name: TaskContainer, Image: "registry.example/dexaflow/agent:1.4.2",
				Command: []string{"/usr/local/bin/reaper-agent", "run"},
				Env: []corev1.EnvVar{{Name: "DEXAFLOW_RUN_ID", Value: a.RunID}, {Name: "DEXAFLOW_TASK_ID", Value: a.TaskID},
					{Name: "DEXAFLOW_TRY", Value: "1"}, {Name: "DEXAFLOW_CONTROL_PLANE", Value: "dexaflow-api.dexaflow.svc:8443"}},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("512Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}},
				TerminationMessagePath: "/dev/termination-log", TerminationMessagePolicy: corev1.TerminationMessageReadFile,
			}},
		},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, StartTime: &st, HostIP: "10.1.0.1", PodIP: "10.244.3.17", QOSClass: corev1.PodQOSBurstable,
			Conditions: []corev1.PodCondition{
				{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: st},
				{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: st},
				{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: st},
				{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: st},
			},
			ContainerStatuses: []corev1.ContainerStatus{{Name: TaskContainer, Ready: true, Image: "registry.example/dexaflow/agent:1.4.2",
				ImageID:     "registry.example/dexaflow/agent@sha256:4f2a0c6b3e1d8e7f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f",
				ContainerID: "containerd://9f1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c",
				State:       corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: st}}}},
		},
	}
}

// heapAfter reports the live heap once f's result is held, less the live
// heap before.
func heapAfter(f func() any) (uint64, any) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	held := f()
	runtime.GC()
	runtime.ReadMemStats(&after)
	return after.HeapAlloc - before.HeapAlloc, held
}

// BenchmarkCacheMemory reports the bytes a synced presence cache holds per
// pod, with the substrate's transform and without one (a plain pod
// informer). The API server is client-go's fake clientset here: the
// measure is of the cache, not of the server.
func BenchmarkCacheMemory(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		for _, transformed := range []bool{true, false} {
			b.Run(fmt.Sprintf("pods=%d/transformed=%v", n, transformed), func(b *testing.B) {
				cs := fake.NewClientset()
				start := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
				for i := range n {
					a := sdk.Attempt{RunID: fmt.Sprintf("run-%05d", i/100), TaskID: fmt.Sprintf("task_%03d", i%100), Try: 1}
					if err := cs.Tracker().Add(taskPod("ns", i, a, start)); err != nil {
						b.Fatal(err)
					}
				}
				for b.Loop() {
					bytes, held := heapAfter(func() any {
						transform := cache.TransformFunc(cacheReducer().object)
						if !transformed {
							transform = nil
						}
						p := startInformer(cs, "ns", 0, clock.Real{}, hclog.NewNullLogger(), transform)
						ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
						defer cancel()
						if !p.waitSynced(ctx) {
							b.Fatal("the cache did not sync")
						}
						return p
					})
					p := held.(*presence)
					if got := len(p.informer.GetIndexer().List()); got != n {
						b.Fatalf("cache holds %d pods, want %d", got, n)
					}
					b.ReportMetric(float64(bytes)/float64(n), "B/pod")
					p.stop()
				}
			})
		}
	}
}
