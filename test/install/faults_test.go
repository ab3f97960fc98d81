package install_test

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/kube"
	"github.com/dexaflow/reaper/testkit/eventually"
	"github.com/dexaflow/reaper/testkit/helmrelease"
	"github.com/dexaflow/reaper/testkit/kubetest"
)

// The faults against the installed release, each judged as the fault
// suites judge theirs: no attempt that lived is reaped (its try and epoch
// never move), no task runs twice at once (the ledger), no run is wedged.

// settle is how long a new leader is watched after it took over: the
// settling grace and two maintenance intervals of the tier's values.
const settle = helmrelease.SettlingGrace + 2*helmrelease.MaintenanceInterval

// submitLedger submits a run whose tasks report to the ledger and wait
// for its release, and waits for every task's first execution to start.
func (r *release) submitLedger(ctx context.Context, lg *ledger, runID string, tasks ...string) {
	r.t.Helper()
	r.submitLedgerRetries(ctx, lg, runID, 0, tasks...)
}

// submitLedgerRetries is submitLedger with tasks that declare retries.
func (r *release) submitLedgerRetries(ctx context.Context, lg *ledger, runID string, retries int, tasks ...string) {
	r.t.Helper()
	args := []string{"-run", runID, "-retries", fmt.Sprint(retries), "-tasks", strings.Join(tasks, ",")}
	for _, task := range tasks {
		args = append(args, lg.command(runID, task))
	}
	_, err := r.Reaperctl(ctx, "submit", args...)
	r.check(err)
	if !eventually.Until(2*time.Minute, func() bool { return lg.started(runID, tasks) == len(tasks) }, eventually.Every(200*time.Millisecond)) {
		r.t.Fatalf("run %s: %d of %d tasks started", runID, lg.started(runID, tasks), len(tasks))
	}
}

// expectUntouched fails when a task of the run moved from its first
// attempt or left running: a live attempt was reaped.
func (r *release) expectUntouched(ctx context.Context, runID string) {
	r.t.Helper()
	attempts, err := r.Attempts(ctx, runID)
	r.check(err)
	for task, a := range attempts {
		if a != "1.0 running" {
			r.t.Errorf("run %s task %s: %s, want its first attempt still running (a live attempt was reaped)", runID, task, a)
		}
	}
}

// expectOneExecution fails unless each task executed once.
func (r *release) expectOneExecution(lg *ledger, runID string, tasks ...string) {
	r.t.Helper()
	for _, task := range tasks {
		if ex := lg.executions(runID, task); len(ex) != 1 {
			r.t.Errorf("run %s task %s executed %d times (%v), want once", runID, task, len(ex), ex)
		}
	}
}

// phaseLeaderLost takes the leading replica away under running tasks:
// its pod deleted (kubectl delete pod), or its reaperd killed inside its
// container (the container restarts). Another replica takes the Lease,
// waits out the settling grace, and reaps nothing that lived.
func (r *release) phaseLeaderLost(kill bool) func(context.Context, *testing.T, *ledger) {
	return func(ctx context.Context, t *testing.T, lg *ledger) {
		runID := "leader-deleted"
		if kill {
			runID = "leader-killed"
		}
		tasks := []string{"a", "b"}
		r.submitLedger(ctx, lg, runID, tasks...)
		old, held, err := r.Leader(ctx, "")
		r.check(err)
		begin := time.Now()
		if kill {
			killed := 0
			for _, p := range kubetest.PodProcesses(string(old.UID)) {
				if p.Exe == "reaperd" {
					if err := syscall.Kill(p.PID, syscall.SIGKILL); err == nil {
						killed++
					}
				}
			}
			if killed == 0 {
				t.Fatalf("no reaperd process found in the leading pod %s", old.Name)
			}
		} else if err := r.Client.CoreV1().Pods(helmrelease.Namespace).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatalf("delete the leading pod %s: %v", old.Name, err)
		}
		next, _, err := r.Leader(ctx, held)
		if err != nil {
			t.Fatalf("no replica took the Lease over from %s: %v", held, err)
		}
		t.Logf("leader %s lost (%s); %s leads %s later", old.Name, map[bool]string{true: "killed", false: "deleted"}[kill],
			next.Name, time.Since(begin).Round(100*time.Millisecond))
		time.Sleep(settle) // the new leader's grace and cycles, in real time
		r.expectUntouched(ctx, runID)
		lg.release(runID)
		r.expectSuccess(ctx, runID, 2*time.Minute)
		r.expectOneExecution(lg, runID, tasks...)
		r.check(r.WaitReplicasReady(ctx))
	}
}

// waitPodEnded waits until the pod is gone or its containers terminated.
func (r *release) waitPodEnded(ctx context.Context, pod corev1.Pod) {
	r.t.Helper()
	if !eventually.Until(time.Minute, func() bool {
		p, err := r.Client.CoreV1().Pods(helmrelease.TaskNamespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil || p.UID != pod.UID {
			return true
		}
		for _, c := range p.Status.ContainerStatuses {
			if c.State.Terminated == nil {
				return false
			}
		}
		return true
	}, eventually.Every(200*time.Millisecond)) {
		r.t.Fatalf("pod %s did not end", pod.Name)
	}
	// Its processes are gone with its containers.
	if !eventually.Until(30*time.Second, func() bool { return len(kubetest.PodProcesses(string(pod.UID))) <= 1 },
		eventually.Every(200*time.Millisecond)) {
		r.t.Fatalf("pod %s's processes outlived its containers: %v", pod.Name, kubetest.PodProcesses(string(pod.UID)))
	}
}

// replaced runs a task (declaring retries), ends its pod's execution with
// harm, and checks that the task is placed again and succeeds, the two
// executions never overlapping.
func (r *release) replaced(ctx context.Context, lg *ledger, runID string, retries int, harm func(corev1.Pod)) corev1.Pod {
	r.t.Helper()
	r.submitLedgerRetries(ctx, lg, runID, retries, "v")
	pod, err := r.RunningTaskPod(ctx, runID, "v")
	r.check(err)
	harm(pod)
	r.waitPodEnded(ctx, pod)
	lg.forget(runID, "v") // the first execution's end can never come
	if !eventually.Until(2*time.Minute, func() bool { return len(lg.executions(runID, "v")) >= 2 }, eventually.Every(200*time.Millisecond)) {
		attempts, _ := r.Attempts(ctx, runID)
		r.t.Fatalf("run %s: the task was not placed again (attempts %v)", runID, attempts)
	}
	lg.release(runID)
	r.expectSuccess(ctx, runID, 2*time.Minute)
	if ex := lg.executions(runID, "v"); len(ex) != 2 {
		r.t.Errorf("run %s: %d executions (%v), want 2: the lost one and its re-place", runID, len(ex), ex)
	}
	return pod
}

// expectEvent waits for reaperd's Event (events.k8s.io) on the pod, by
// its UID, with the action and reason given, its note naming the run:
// what kubectl describe pod shows a user.
func (r *release) expectEvent(ctx context.Context, pod corev1.Pod, runID, action, reason string) {
	r.t.Helper()
	var seen []string
	if !eventually.Until(time.Minute, func() bool {
		events, err := r.TaskEvents(ctx)
		if err != nil {
			return false
		}
		seen = seen[:0]
		for _, e := range events {
			if e.Regarding.UID != pod.UID {
				continue
			}
			seen = append(seen, e.Action+" "+e.Reason+": "+e.Note)
			if e.Action == action && e.Reason == reason && strings.Contains(e.Note, runID) {
				return true
			}
		}
		return false
	}, eventually.Every(250*time.Millisecond)) {
		r.t.Errorf("pod %s: no Event %s %s naming run %s; its Events: %v", pod.Name, action, reason, runID, seen)
	}
}

// phaseTaskPodDeleted: a running task's pod deleted by someone; the
// cluster stopped it (a disruption), so it settles on the infra rail and
// is placed again without spending a retry (it declares none).
func (r *release) phaseTaskPodDeleted(ctx context.Context, t *testing.T, lg *ledger) {
	pod := r.replaced(ctx, lg, "pod-deleted", 0, func(pod corev1.Pod) {
		if err := r.Client.CoreV1().Pods(helmrelease.TaskNamespace).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatalf("delete the task pod %s: %v", pod.Name, err)
		}
	})
	r.expectEvent(ctx, pod, "pod-deleted", kube.EventActionSettle, sdk.LabelReconcileSettled)
}

// phaseAgentKilled: a running task's agent killed inside its container.
// The container ends (exit 137) with no outcome record and no sign that
// the cluster stopped it, so the pod settles by its phase, a task failure
// that spends a retry: the task declares one, runs again and succeeds.
func (r *release) phaseAgentKilled(ctx context.Context, t *testing.T, lg *ledger) {
	pod := r.replaced(ctx, lg, "agent-killed", 1, func(pod corev1.Pod) {
		killed := 0
		for _, p := range kubetest.PodProcesses(string(pod.UID)) {
			if p.Exe == "reaper-agent" {
				if err := syscall.Kill(p.PID, syscall.SIGKILL); err == nil {
					killed++
				}
			}
		}
		if killed == 0 {
			t.Fatalf("no agent process in the task pod %s: %v", pod.Name, kubetest.PodProcesses(string(pod.UID)))
		}
	})
	r.expectEvent(ctx, pod, "agent-killed", kube.EventActionSettle, sdk.LabelReconcileSettled)
}

// phaseKubeletFrozen: the node's kubelet frozen past the node's grace
// under running tasks (the node goes NotReady); the reapers defer, and
// once it thaws every task ends from its one execution.
func (r *release) phaseKubeletFrozen(ctx context.Context, t *testing.T, lg *ledger) {
	const runID = "kubelet-frozen"
	tasks := []string{"a", "b"}
	r.submitLedger(ctx, lg, runID, tasks...)
	if err := r.Cluster.PauseKubelet(); err != nil {
		t.Fatal(err)
	}
	thawed := false
	defer func() {
		if !thawed {
			_ = r.Cluster.ResumeKubelet()
		}
	}()
	if !eventually.Until(2*time.Minute, func() bool {
		n, err := r.Client.CoreV1().Nodes().Get(ctx, r.Node.Name, metav1.GetOptions{})
		return err == nil && !kubetest.NodeReady(n)
	}, eventually.Every(500*time.Millisecond)) {
		t.Fatal("the node never went NotReady with its kubelet frozen")
	}
	time.Sleep(settle) // the reapers' cycles with the node NotReady, in real time
	r.expectUntouched(ctx, runID)
	if err := r.Cluster.ResumeKubelet(); err != nil {
		t.Fatal(err)
	}
	thawed = true
	lg.release(runID)
	r.expectSuccess(ctx, runID, 2*time.Minute)
	r.expectOneExecution(lg, runID, tasks...)
	r.check(r.WaitReplicasReady(ctx))
}
