package kubee2e_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/kube"
	"github.com/dexaflow/reaper/testkit/kubetest"
)

// refusePodWrites installs a validating webhook that cannot be called,
// failurePolicy Fail, on the updates and deletions of the pods of task in
// the scenario's namespace: every patch (a stop in place) and every delete
// of them is refused, as a rejecting webhook or a broken admission chain
// refuses them. Their status, which the kubelet writes, is another
// resource and goes through. It returns the removal.
func (s *scenario) refusePodWrites(task string) func() {
	s.t.Helper()
	ctx := context.Background()
	fail := admissionv1.Fail
	none := admissionv1.SideEffectClassNone
	url := "https://127.0.0.1:1/validate"
	hook := &admissionv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: s.ns + "-refuse-" + task},
		Webhooks: []admissionv1.ValidatingWebhook{{
			Name:         "refuse.kubee2e.reaper.test",
			ClientConfig: admissionv1.WebhookClientConfig{URL: &url},
			Rules: []admissionv1.RuleWithOperations{{
				Operations: []admissionv1.OperationType{admissionv1.Update, admissionv1.Delete},
				Rule:       admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
			}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": s.ns}},
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{kube.LabelTaskID: task}},
		}},
	}
	if _, err := s.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, hook, metav1.CreateOptions{}); err != nil {
		s.t.Fatal(err)
	}
	removed := false
	remove := func() {
		if !removed {
			removed = true
			_ = s.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(context.Background(), hook.Name, metav1.DeleteOptions{})
		}
	}
	s.t.Cleanup(remove)
	return remove
}

// On the real node, a running attempt's agent is frozen (SIGSTOP in its
// container: it neither heartbeats nor hears should_terminate) while every
// patch and delete of its pod is refused. agent_lost marks it, its
// teardown is refused and owed, and the infra confirmation valve passes:
// the runner holds the mark (infra_confirm_valve_held, the owed teardown in
// its evidence) and starts no successor while the old container may run.
// Once the refusal ends, the owed teardown's retry stops the pod in place;
// the kubelet ends its container within the pod's grace, and only then
// does the hold let go (a pod stopped and not yet ended holds too): one
// successor runs to success and the task never runs twice at once. On the
// player's tier KWOK writes such a pod Failed at its deadline while the
// player's process still runs its grace, so this runs where a real kubelet
// writes the pod's end.
func realTeardownRefusedPastTheValve(t *testing.T, c *kubetest.Cluster) {
	s := newRealScenario(t, 33, "real node: teardown refused past the valve", c)
	s.pair()
	s.submit(victim("victim"), bystander("bystander"))
	a, _ := s.waitRunning("victim")
	p := s.runningPod(a)
	s.waitRunning("bystander")
	allow := s.refusePodWrites("victim")
	agent := podAgent(t, p)
	if err := syscall.Kill(agent, syscall.SIGSTOP); err != nil {
		t.Fatalf("freeze the agent: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Kill(agent, syscall.SIGCONT) })
	f := s.harm("agent frozen, its pod's patch and delete refused", a, agentLost)

	// Held past the valve, saying a teardown is owed.
	var held *decision
	s.eventually(agentLost+valve+time.Minute, "the runner to hold the mark past the valve", func() bool {
		ds, err := s.decisions()
		if err != nil {
			return false
		}
		for i, d := range ds {
			if d.Attempt == a && d.Label == sdk.LabelInfraConfirmValveHeld && d.Evidence["owed_teardown"] != "" {
				held = &ds[i]
				return true
			}
		}
		return false
	})
	t.Logf("%s: %s: %s", held.At.Format("15:04:05.000"), held.Label, held.Detail)
	if n := s.successors(a); n != 0 {
		t.Fatalf("%d successor pods of %s while its teardown is owed and its pod lives", n, a)
	}
	if ti, err := s.taskRow("victim"); err != nil || ti.Attempt != a {
		t.Fatalf("the held attempt moved: %+v (%v)", ti.Attempt, err)
	}

	allow()
	t.Logf("refusal ended %s after the freeze", time.Since(f.at).Round(time.Millisecond))
	ended := s.waitPodEnded(p, 2*time.Minute)
	s.ledger.reopen(a) // its execution was killed with the container: no end report
	t.Logf("the old pod: %s/%s", ended.Status.Phase, ended.Status.Reason)
	s.eventually(2*time.Minute, "one successor to be placed", func() bool { return s.successors(a) == 1 })
	s.finish()
}

// successors counts the pods of a's task at a later epoch or try.
func (s *scenario) successors(a sdk.Attempt) int {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	list, err := s.cs.CoreV1().Pods(s.ns).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelTaskID + "=" + a.TaskID})
	if err != nil {
		s.t.Fatal(err)
	}
	n := 0
	for _, p := range list.Items {
		if p.Labels[kube.LabelAttemptEpoch] != fmt.Sprint(a.Epoch) || p.Labels[kube.LabelTryNumber] != fmt.Sprint(a.Try) {
			n++
		}
	}
	return n
}
