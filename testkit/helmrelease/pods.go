package helmrelease

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/dexaflow/reaper/substrate/kube"
)

// TaskPods lists the task pods of the run ("" for every run's).
func (r *Release) TaskPods(ctx context.Context, runID string) ([]corev1.Pod, error) {
	sel := kube.LabelRunID
	if runID != "" {
		sel += "=" + runID
	}
	list, err := r.Client.CoreV1().Pods(TaskNamespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("helmrelease: list the task pods: %w", err)
	}
	return list.Items, nil
}

// RunningTaskPod waits for a running pod of the run's task (not being
// deleted) and returns it.
func (r *Release) RunningTaskPod(ctx context.Context, runID, task string) (corev1.Pod, error) {
	var pod corev1.Pod
	err := until(ctx, time.Minute, 200*time.Millisecond, "a running pod of run "+runID+" task "+task, func() bool {
		list, err := r.Client.CoreV1().Pods(TaskNamespace).List(ctx, metav1.ListOptions{
			LabelSelector: kube.LabelRunID + "=" + runID + "," + kube.LabelTaskID + "=" + task})
		if err != nil {
			return false
		}
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
				pod = p
				return true
			}
		}
		return false
	})
	return pod, err
}

// HeldTaskPods lists the task pods that carry the outcome record
// finalizer.
func (r *Release) HeldTaskPods(ctx context.Context) ([]string, error) {
	pods, err := r.Client.CoreV1().Pods(TaskNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("helmrelease: list the task pods: %w", err)
	}
	var held []string
	for _, p := range pods.Items {
		if slices.Contains(p.Finalizers, kube.FinalizerOutcomeRecord) {
			held = append(held, p.Name)
		}
	}
	return held, nil
}

// WaitReleased waits for the sweep to release every task pod it held.
func (r *Release) WaitReleased(ctx context.Context) error {
	err := until(ctx, time.Minute, 250*time.Millisecond, "the sweep to release the task pods", func() bool {
		held, err := r.HeldTaskPods(ctx)
		return err == nil && len(held) == 0
	})
	if err != nil {
		held, _ := r.HeldTaskPods(ctx)
		return fmt.Errorf("%w: still held by the outcome record finalizer: %v", err, held)
	}
	return nil
}

// TaskEvents lists the Events (events.k8s.io) in the task namespace, as
// kubectl get events does: in the API's order, by name, which is the
// object's name and the Event's creation time in nanoseconds (pod by pod,
// oldest first).
func (r *Release) TaskEvents(ctx context.Context) ([]eventsv1.Event, error) {
	list, err := r.Client.EventsV1().Events(TaskNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("helmrelease: list the task namespace's Events: %w", err)
	}
	return list.Items, nil
}

// Dump writes what a failed test or demo needs to w: the runs, the
// reapers' decisions, the pods of both namespaces with their containers'
// logs, the Events.
func (r *Release) Dump(ctx context.Context, w io.Writer) {
	if rows, err := r.Board.Query(ctx, `SELECT run_id, state, coalesce(error_message, '') FROM runs ORDER BY run_id`); err == nil {
		for rows.Next() {
			var id, st, msg string
			_ = rows.Scan(&id, &st, &msg)
			fmt.Fprintf(w, "run %s: %s %s\n", id, st, msg)
		}
		rows.Close()
	}
	if rows, err := r.Board.Query(ctx, `SELECT reaper, label, coalesce(run_id, ''), coalesce(task_id, ''), applied, detail FROM reap_decisions ORDER BY id`); err == nil {
		for rows.Next() {
			var reaper, label, run, task, detail string
			var applied bool
			_ = rows.Scan(&reaper, &label, &run, &task, &applied, &detail)
			fmt.Fprintf(w, "decision %s %s %s/%s applied=%v %s\n", reaper, label, run, task, applied, detail)
		}
		rows.Close()
	}
	for _, ns := range []string{Namespace, TaskNamespace} {
		pods, err := r.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			continue
		}
		for _, p := range pods.Items {
			var logs strings.Builder
			for _, c := range p.Spec.Containers {
				b, err := r.Client.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: c.Name, TailLines: ptr.To[int64](60)}).DoRaw(ctx)
				fmt.Fprintf(&logs, "--- %s (%v):\n%s\n", c.Name, err, b)
			}
			fmt.Fprintf(w, "pod %s/%s on %q: %s\n%s\n", ns, p.Name, p.Spec.NodeName, p.Status.Phase, logs.String())
		}
		evs, err := r.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err == nil {
			for _, e := range evs.Items {
				fmt.Fprintf(w, "event %s/%s %s: %s\n", ns, e.InvolvedObject.Name, e.Reason, e.Message)
			}
		}
	}
}
