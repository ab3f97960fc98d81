package kuberunner_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	authv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/kuberunner"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/testkit/eventually"
	"github.com/dexaflow/reaper/testkit/kubetest"
)

// owedBackoff is the host's default backoff of owed teardowns (one
// interval, then doubling up to five minutes).
var owedBackoff = board.TeardownBackoff{Base: ladder.Defaults().MaintenanceInterval, Cap: 5 * time.Minute}

// owedMark is an attempt marked agent_lost whose pod runs on a Ready KWOK
// node, with its teardown owed (patch and delete refused), the valve
// passed.
type owedMark struct {
	a    sdk.Attempt
	pod  corev1.Pod
	node string
	owed board.OwedTeardown
}

// markOwed dispatches a task with r, runs its pod on node, marks the
// attempt agent_lost (its agent silent: it never heartbeats), records its
// teardown as owed, refused by RBAC, and advances the clock past the valve.
// ownAttempt false owes the teardown of another epoch of the task instead.
func markOwed(t *testing.T, e *env, r *kuberunner.Runner, node string, ownAttempt bool) owedMark {
	t.Helper()
	ctx := context.Background()
	run := fmt.Sprintf("owed-%d", time.Now().UnixNano())
	e.mkRun(t, run, lifecycle.NewTask{TaskID: "task", Retries: 1})
	if res := cycle(t, r, e.clk.Now()); res.Dispatched != 1 {
		t.Fatalf("dispatched %d", res.Dispatched)
	}
	a := e.ti(t, run, "task").Attempt
	p := e.pods(t)[a]
	if err := e.cs.CoreV1().Pods(e.ns).Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: p.Name},
		Target: corev1.ObjectReference{Kind: "Node", Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, 30*time.Second, "the pod to run on the KWOK node", func() bool {
		got, err := e.cs.CoreV1().Pods(e.ns).Get(ctx, p.Name, metav1.GetOptions{})
		if err == nil && got.Status.Phase == corev1.PodRunning {
			p = *got
			return true
		}
		return false
	})
	if sd, err := e.w.Running(ctx, a, e.clk.Now()); err != nil || sd {
		t.Fatal(sd, err)
	}
	if ok, err := e.w.Fail(ctx, a, []string{sdk.StateRunning},
		lifecycle.Failure{Kind: sdk.MarkInfra, Reason: sdk.LabelAgentLost}, e.clk.Now()); err != nil || !ok {
		t.Fatal(ok, err)
	}
	owedFor := a
	if !ownAttempt {
		owedFor.Epoch += 5
	}
	o, err := e.store.OweTeardown(ctx, board.TeardownFailure{RunID: a.RunID, Attempt: &owedFor, Reaper: "agentlost",
		Label: sdk.LabelAgentLostPodDeleteErr, Reason: sdk.LabelAgentLost, At: e.clk.Now(), Term: e.term,
		Error: fmt.Sprintf(`pods %q is forbidden: User "reaperd" cannot patch resource "pods" in the namespace %q`, p.Name, e.ns)},
		owedBackoff)
	if err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(ladder.Defaults().InfraConfirmValve)
	return owedMark{a: a, pod: p, node: node, owed: o}
}

// successors counts the pods of a's task on later epochs.
func successors(t *testing.T, e *env, a sdk.Attempt) int {
	t.Helper()
	n := 0
	for got := range e.pods(t) {
		if got.RunID == a.RunID && got.TaskID == a.TaskID && got.Epoch > a.Epoch {
			n++
		}
	}
	return n
}

// wantOwedHeld checks res held m's mark for its owed teardown, noted, and
// started nothing.
func wantOwedHeld(t *testing.T, e *env, res kuberunner.Result, m owedMark) sdk.Decision {
	t.Helper()
	if res.Replaced != 0 || res.Waiting != 1 || !slices.Equal(labels(res), []string{sdk.LabelInfraConfirmValveHeld}) {
		t.Fatalf("replaced %d, waiting %d, decisions %v: want the mark held", res.Replaced, res.Waiting, labels(res))
	}
	d := res.Decisions[0]
	if d.Applied || d.Attempt != m.a || !strings.Contains(d.Detail, "a teardown of the attempt is owed") ||
		d.Evidence["owed_teardown"] != strconv.FormatInt(m.owed.ID, 10) || d.Evidence["owed_tries"] != "1" ||
		d.Evidence["owed_last_error"] != m.owed.LastError ||
		d.Evidence["owed_next_try_at"] != m.owed.NextTryAt.UTC().Format(time.RFC3339) {
		t.Fatalf("held decision %+v", d)
	}
	if n := successors(t, e, m.a); n != 0 {
		t.Fatalf("%d successor pods while the teardown is owed", n)
	}
	if ti := e.ti(t, m.a.RunID, m.a.TaskID); ti.Attempt != m.a || ti.State != sdk.StateFailed {
		t.Fatalf("a held mark moved: %+v", ti)
	}
	return d
}

// TestTheValveHoldsAMarkWhoseTeardownIsOwed: past the infra confirmation
// valve, an unconfirmed mark whose teardown is owed (the stop and the
// delete refused) and whose pod still runs its task on a Ready node is
// held (infra_confirm_valve_held, the owed teardown in its evidence, noted
// once a minute), never re-placed: its agent is silent, so nothing but the
// pod's end stops the old task. Each way the pod ends lets the valve open,
// and exactly one successor starts.
func TestTheValveHoldsAMarkWhoseTeardownIsOwed(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	node := e.c.AddNode(t, "").Name
	for name, then := range map[string]func(t *testing.T, p *corev1.Pod){
		// An admin deletes it (its finalizer too): NotFound.
		"ThePodDeleted": func(t *testing.T, p *corev1.Pod) {
			got, err := e.cs.CoreV1().Pods(e.ns).Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			got.Finalizers = nil
			if _, err := e.cs.CoreV1().Pods(e.ns).Update(ctx, got, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := e.cs.CoreV1().Pods(e.ns).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			eventually.True(t, 30*time.Second, "the pod to go", func() bool {
				_, err := e.cs.CoreV1().Pods(e.ns).Get(ctx, p.Name, metav1.GetOptions{})
				return apierrors.IsNotFound(err)
			})
		},
		// The backstop: the pod's activeDeadlineSeconds passes and the
		// kubelet (KWOK's stage) fails it, DeadlineExceeded. The deadline
		// is brought to now (a second after its start) rather than waited
		// for.
		"ItsOwnDeadlinePasses": func(t *testing.T, p *corev1.Pod) {
			if _, err := e.cs.CoreV1().Pods(e.ns).Patch(ctx, p.Name, types.MergePatchType,
				[]byte(`{"spec":{"activeDeadlineSeconds":1}}`), metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
			eventually.True(t, 30*time.Second, "the kubelet to fail the pod at its deadline", func() bool {
				got, err := e.cs.CoreV1().Pods(e.ns).Get(ctx, p.Name, metav1.GetOptions{})
				return err == nil && got.Status.Phase == corev1.PodFailed && got.Status.Reason == "DeadlineExceeded"
			})
		},
		"ItsTaskContainerTerminated": func(t *testing.T, p *corev1.Pod) {
			got, err := e.cs.CoreV1().Pods(e.ns).Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for i := range got.Status.ContainerStatuses {
				if got.Status.ContainerStatuses[i].Name == "task" {
					got.Status.ContainerStatuses[i].State = corev1.ContainerState{
						Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "Error"}}
				}
			}
			if _, err := e.cs.CoreV1().Pods(e.ns).UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		},
		// An operator's forced delete: grace 0, the object kept by its
		// outcome record finalizer (nothing may patch it away).
		"ForceDeleted": func(t *testing.T, p *corev1.Pod) {
			if err := e.cs.CoreV1().Pods(e.ns).Delete(ctx, p.Name, *metav1.NewDeleteOptions(0)); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			r := e.runner(t, e.config(e.cs))
			m := markOwed(t, e, r, node, true)
			d := wantOwedHeld(t, e, cycle(t, r, e.clk.Now()), m)
			if d.Evidence["pod"] != m.pod.Name || d.Evidence["node"] != node || d.Evidence["pod_phase"] != "Running" ||
				d.Evidence["pod_deadline"] == "" {
				t.Fatalf("held decision's pod %+v", d.Evidence)
			}
			// Held every cycle, noted once a minute; the node is Ready and
			// the valve long passed: only the owed teardown holds it.
			e.clk.Advance(10 * time.Second)
			if res := cycle(t, r, e.clk.Now()); res.Replaced != 0 || res.Waiting != 1 || len(labels(res)) != 0 {
				t.Fatalf("10s later: replaced %d, waiting %d, decisions %v: want held, not noted again", res.Replaced, res.Waiting, labels(res))
			}
			e.clk.Advance(time.Minute)
			wantOwedHeld(t, e, cycle(t, r, e.clk.Now()), m)

			then(t, &m.pod)
			e.clk.Advance(time.Second)
			res := cycle(t, r, e.clk.Now())
			if res.Replaced != 1 || !slices.Equal(labels(res), []string{sdk.LabelInfraConfirmValveOpen, sdk.LabelInfraReplace}) {
				t.Fatalf("once the pod ended: replaced %d, decisions %v: want the valve open, then a re-place", res.Replaced, labels(res))
			}
			e.clk.Advance(time.Second)
			cycle(t, r, e.clk.Now())
			if n := successors(t, e, m.a); n != 1 {
				t.Fatalf("%d successor pods, want exactly one", n)
			}
		})
	}
}

// TestTheOwedHoldHoldsWhatItCannotRead: with a teardown owed, a pod the
// runner cannot read (its Role lacks get on pods) may still run: the mark
// is held, saying why, even once the pod is gone, until a read says so.
// Without one, an unreadable pod holds nothing, as before; nor does a
// teardown owed for another attempt of the task.
func TestTheOwedHoldHoldsWhatItCannotRead(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	node := e.c.AddNode(t, "").Name
	admin := e.runner(t, e.config(e.cs))
	// Bob may create pods in the namespace, and never read one.
	if _, err := e.cs.RbacV1().Roles(e.ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "create-only"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create"}}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cs.RbacV1().RoleBindings(e.ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "create-only"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "create-only"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: kubetest.Bob}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, 30*time.Second, "the authorizer to let bob create pods", func() bool {
		r, err := e.cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authv1.SubjectAccessReview{Spec: authv1.SubjectAccessReviewSpec{
			User: kubetest.Bob, ResourceAttributes: &authv1.ResourceAttributes{Namespace: e.ns, Verb: "create", Resource: "pods"}}},
			metav1.CreateOptions{})
		return err == nil && r.Status.Allowed
	})
	blind := e.runner(t, e.config(e.c.ClientFor(t, kubetest.Bob)))
	opens := func(t *testing.T, res kuberunner.Result) {
		t.Helper()
		if res.Replaced != 1 || !slices.Equal(labels(res), []string{sdk.LabelInfraConfirmValveOpen, sdk.LabelInfraReplace}) {
			t.Fatalf("replaced %d, decisions %v: want the valve open, then a re-place", res.Replaced, labels(res))
		}
	}

	t.Run("NotOwed_TheValveOpensAsBefore", func(t *testing.T) {
		m := markOwed(t, e, admin, node, true)
		if ok, err := e.store.TeardownDone(ctx, m.owed.ID, e.term, e.clk.Now()); err != nil || !ok {
			t.Fatal(ok, err)
		}
		opens(t, cycle(t, blind, e.clk.Now()))
	})
	t.Run("AnotherAttemptsTeardownOwed_TheValveOpens", func(t *testing.T) {
		markOwed(t, e, admin, node, false)
		opens(t, cycle(t, admin, e.clk.Now()))
	})
	t.Run("Owed_Held", func(t *testing.T) {
		m := markOwed(t, e, admin, node, true)
		d := wantOwedHeld(t, e, cycle(t, blind, e.clk.Now()), m)
		if !strings.Contains(d.Evidence["pod_read_error"], "forbidden") || d.Evidence["pod"] != "" {
			t.Fatalf("held decision %+v", d.Evidence)
		}
		// The runner that can read holds it as well: the pod runs.
		wantOwedHeld(t, e, cycle(t, admin, e.clk.Now()), m)
		// The pod goes: the blind runner still cannot say so and holds;
		// the one that reads it gone lets the valve open.
		got, err := e.cs.CoreV1().Pods(e.ns).Get(ctx, m.pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got.Finalizers = nil
		if _, err := e.cs.CoreV1().Pods(e.ns).Update(ctx, got, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := e.cs.CoreV1().Pods(e.ns).Delete(ctx, m.pod.Name, *metav1.NewDeleteOptions(0)); err != nil {
			t.Fatal(err)
		}
		eventually.True(t, 30*time.Second, "the pod to go", func() bool {
			_, err := e.cs.CoreV1().Pods(e.ns).Get(ctx, m.pod.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		})
		e.clk.Advance(time.Minute)
		wantOwedHeld(t, e, cycle(t, blind, e.clk.Now()), m)
		opens(t, cycle(t, admin, e.clk.Now()))
	})
}
