package kuberunner

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/runner/internal/steps"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/kube"
)

// The valve on an unreachable node.
//
// The infra confirmation valve acts on a provisional mark nobody confirmed,
// so that a reconciler that cannot read the cluster does not hold a task
// forever. On a node that stopped reporting (partitioned, hung, its kubelet
// gone) the reconciler can read perfectly well: it reads that the pod's
// task container has not terminated, and no teardown can make it so,
// since only that node's kubelet stops containers. Re-placing then would
// run the task a second time beside the first, which carries on the moment
// the node is back (proven on the real node: a partition past the valve
// ran both). So before the valve acts on a kube attempt the runner reads
// its pod and the pod's node, live, and holds the mark while:
//
//   - the pod (the one recorded on the attempt, by name and UID, carrying
//     its labels; see attemptPods) exists,
//     has not finished and was not force-deleted (grace 0: someone asserted
//     it is gone), and its task container has not terminated;
//   - it is bound to a node that exists and carries no out-of-service
//     taint (the operator's word that the machine is off), whose Ready
//     condition is not True, or turned True less than the pods'
//     termination grace plus two maintenance intervals ago: a node just
//     back is ending the pod the teardown stopped in place (its kubelet
//     acts on the lowered deadline, the old agent on should_terminate),
//     and a re-place before that ends would overlap it. Past that window a
//     container still running on a Ready node is what the valve is for.
//
// Anything it cannot read (the pod, the node) does not hold: the valve
// opens as it would without this. A held mark waits for the node to come
// back (the old agent is answered should_terminate and the kubelet ends
// the pod stopped in place; the sweep confirms), the node's deletion (Pod
// GC), an out-of-service taint or an operator's reaperctl mark.

// valveNoteEvery is how often a held mark's decision is recorded again
// (the runner asks every cycle).
const valveNoteEvery = time.Minute

// taintOutOfService is the taint an operator puts on a node whose machine
// is known to be off (non-graceful node shutdown).
const taintOutOfService = "node.kubernetes.io/out-of-service"

// valveHold is the kube runner's steps.Driver.ValveHold.
func (r *Runner) valveHold(ctx context.Context, ti board.TaskInstance, now time.Time) steps.ValveHold {
	a := ti.Attempt
	h := r.readValveHold(ctx, a, now)
	if !h.Hold {
		delete(r.valveNoted, a)
		return h
	}
	if last, ok := r.valveNoted[a]; !ok || now.Sub(last) >= valveNoteEvery {
		r.valveNoted[a] = now
		h.Note = true
	}
	return h
}

func (r *Runner) readValveHold(ctx context.Context, a sdk.Attempt, now time.Time) steps.ValveHold {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CreateTimeout)
	defer cancel()
	pods, err := r.attemptPods(ctx, a)
	if err != nil {
		r.log.Warn("could not read the pod of an unconfirmed mark past the valve: the valve opens", "attempt", a.String(), "error", err)
		return steps.ValveHold{}
	}
	for i := range pods {
		if h := r.podValveHold(ctx, a, &pods[i], now); h.Hold {
			return h
		}
	}
	return steps.ValveHold{}
}

// attemptPods reads, live, the pods that are attempt a's own: the pod
// recorded on it, by its recorded name and only with its recorded UID (a
// pod someone put under the name after the attempt's went is not the
// attempt's). An attempt with no name recorded (its pod recorded before
// names were, or a create whose answer never came) has the pods its labels
// and annotation name, kept to the recorded UID when there is one, all of
// them otherwise (the label rule, as the substrate's).
func (r *Runner) attemptPods(ctx context.Context, a sdk.Attempt) ([]corev1.Pod, error) {
	rec, err := r.w.RecordedPod(ctx, a)
	if err != nil {
		return nil, err
	}
	if rec.Name != "" {
		p, err := r.cfg.Client.CoreV1().Pods(r.cfg.Namespace).Get(ctx, rec.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil, nil
		case err != nil:
			return nil, fmt.Errorf("reading pod %s: %w", rec.Name, err)
		case string(p.UID) != rec.UID:
			return nil, nil
		}
		return []corev1.Pod{*p}, nil
	}
	lbls, _ := kube.AttemptLabels(a)
	list, err := r.cfg.Client.CoreV1().Pods(r.cfg.Namespace).List(ctx,
		metav1.ListOptions{LabelSelector: labels.SelectorFromSet(lbls).String()})
	if err != nil {
		return nil, fmt.Errorf("listing the pods of %s: %w", a, err)
	}
	var own []corev1.Pod
	for _, p := range list.Items {
		if rec.UID != "" && string(p.UID) != rec.UID {
			continue
		}
		own = append(own, p)
	}
	return own, nil
}

// podValveHold is the valve's answer for p, a pod of attempt a.
func (r *Runner) podValveHold(ctx context.Context, a sdk.Attempt, p *corev1.Pod, now time.Time) steps.ValveHold {
	if got, ok := kube.PodAttempt(p.Labels, p.Annotations); !ok || got != a {
		return steps.ValveHold{}
	}
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || p.Spec.NodeName == "" ||
		(p.DeletionGracePeriodSeconds != nil && *p.DeletionGracePeriodSeconds == 0) {
		return steps.ValveHold{}
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == kube.TaskContainer && cs.State.Terminated != nil {
			return steps.ValveHold{}
		}
	}
	node, err := r.cfg.Client.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{})
	if err != nil {
		if !apierrors.IsNotFound(err) {
			r.log.Warn("could not read the node of an unconfirmed mark's pod past the valve: the valve opens",
				"attempt", a.String(), "node", p.Spec.NodeName, "error", err)
		}
		return steps.ValveHold{}
	}
	for _, t := range node.Spec.Taints {
		if t.Key == taintOutOfService {
			return steps.ValveHold{}
		}
	}
	for _, c := range node.Status.Conditions {
		if c.Type != corev1.NodeReady {
			continue
		}
		since := c.LastTransitionTime.UTC().Format(time.RFC3339)
		if c.Status == corev1.ConditionTrue {
			back := r.cfg.TerminationGrace + 2*r.cfg.Ladder.MaintenanceInterval
			if now.Sub(c.LastTransitionTime.Time) >= back {
				return steps.ValveHold{}
			}
			return steps.ValveHold{Hold: true,
				Detail: fmt.Sprintf("node %s of pod %s is Ready again since %s, and its kubelet is ending the pod (for up to %s): a re-place now would overlap it",
					node.Name, p.Name, since, back),
				Evidence: map[string]string{"pod": p.Name, "node": node.Name, "node_ready": string(c.Status), "node_ready_since": since}}
		}
		return steps.ValveHold{Hold: true,
			Detail: fmt.Sprintf("pod %s may still run its task on node %s, Ready %s since %s (%s): no teardown reaches it, and a re-place would run the task beside it once the node is back",
				p.Name, node.Name, c.Status, since, c.Reason),
			Evidence: map[string]string{"pod": p.Name, "node": node.Name, "node_ready": string(c.Status), "node_ready_since": since}}
	}
	return steps.ValveHold{} // no Ready condition yet: no signal
}
