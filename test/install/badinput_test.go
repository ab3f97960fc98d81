package install_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/testkit/eventually"
	"github.com/dexaflow/reaper/testkit/helmrelease"
)

// What a user gets wrong, on the installed release: the DSN Secret wrong
// or missing, and an image tag that does not exist. A replica says what is
// wrong in one line, in its readiness and its log, and is not Ready; it
// does not crash-loop; the other replica serves meanwhile.

// replaceReplica deletes one live replica (one not Ready, if any) and
// returns the pod that replaces it, once its container runs.
func (r *release) replaceReplica(ctx context.Context) corev1.Pod {
	r.t.Helper()
	before := map[string]bool{}
	var victim corev1.Pod
	pods, err := r.Replicas(ctx)
	r.check(err)
	for _, p := range pods {
		before[p.Name] = true
		// A live one, the one not Ready first (the other serves on).
		if p.DeletionTimestamp == nil && (victim.Name == "" || !helmrelease.Ready(p)) {
			victim = p
		}
	}
	if victim.Name == "" {
		r.t.Fatal("no live replica to replace")
	}
	if err := r.Client.CoreV1().Pods(helmrelease.Namespace).Delete(ctx, victim.Name, metav1.DeleteOptions{}); err != nil {
		r.t.Fatal(err)
	}
	var fresh corev1.Pod
	if !eventually.Until(2*time.Minute, func() bool {
		pods, _ := r.Replicas(ctx)
		for _, p := range pods {
			if !before[p.Name] && p.Status.PodIP != "" && len(p.Status.ContainerStatuses) > 0 &&
				p.Status.ContainerStatuses[0].State.Running != nil {
				fresh = p
				return true
			}
		}
		return false
	}, eventually.Every(250*time.Millisecond)) {
		r.t.Fatal("the Deployment did not replace the deleted replica")
	}
	return fresh
}

// expectRefusing waits for the replica's readiness to name want, and
// checks that its log says so too, that it is not Ready and that its
// container has not restarted.
func (r *release) expectRefusing(ctx context.Context, p corev1.Pod, want string, secrets ...string) string {
	r.t.Helper()
	var health string
	if !eventually.Until(time.Minute, func() bool {
		hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		health = helmrelease.Health(hctx, p.Status.PodIP)
		return strings.HasPrefix(health, "503 ") && strings.Contains(health, want)
	}, eventually.Every(250*time.Millisecond)) {
		r.t.Fatalf("replica %s's readiness says %q, want a 503 naming %q", p.Name, health, want)
	}
	logs, err := r.Client.CoreV1().Pods(helmrelease.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil || !strings.Contains(string(logs), want) {
		r.t.Errorf("replica %s's log (%v) does not say %q:\n%s", p.Name, err, want, logs)
	}
	for _, s := range secrets {
		if strings.Contains(health, s) || strings.Contains(string(logs), s) {
			r.t.Errorf("replica %s shows a secret of its DSN (%q)", p.Name, s)
		}
	}
	cur, err := r.Client.CoreV1().Pods(helmrelease.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		r.t.Fatal(err)
	}
	if helmrelease.Ready(*cur) {
		r.t.Errorf("replica %s is Ready while it cannot serve", p.Name)
	}
	if n := cur.Status.ContainerStatuses[0].RestartCount; n != 0 {
		r.t.Errorf("replica %s restarted %d times: it should wait, saying why", p.Name, n)
	}
	return health
}

// phaseBadDSN: the DSN Secret with a wrong password, then missing.
func (r *release) phaseBadDSN(ctx context.Context, t *testing.T, _ *ledger) {
	good := r.PodDSN()
	const wrong = "not-the-password-4f1c"
	u, err := url.Parse(good)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), wrong)
	bad := u.String()
	defer func() { _ = r.SetDSN(context.Background(), good) }()

	r.check(r.SetDSN(ctx, bad))
	p := r.replaceReplica(ctx)
	h := r.expectRefusing(ctx, p, "the database refused the password", wrong)
	t.Logf("wrong password: %s", h)

	r.check(r.SetDSN(ctx, ""))
	p = r.replaceReplica(ctx)
	h = r.expectRefusing(ctx, p, "waiting for its DSN")
	t.Logf("no DSN Secret: %s", h)

	r.check(r.SetDSN(ctx, good))
	r.replaceReplica(ctx)
	r.check(r.WaitReplicasReady(ctx))
}

// phaseBadImageTag: helm upgrade to an image tag the node does not have
// (pull policy Never: the test cluster reaches no registry). The upgrade
// fails and says which image; one replica stays Ready and leading
// throughout (the rollout replaces one at a time); helm rollback mends it.
func (r *release) phaseBadImageTag(ctx context.Context, t *testing.T, _ *ledger) {
	const tag = "0.0.0-no-such-build"
	w := r.watchReplicas(ctx)
	out, err := r.Upgrade(ctx, firstVersion, "--set", "image.tag="+tag, "--set", "image.pullPolicy=Never", "--wait", "--timeout", "30s")
	if err == nil {
		w.stop()
		t.Fatalf("helm upgrade to a missing image succeeded:\n%s", out)
	}
	t.Logf("helm upgrade to %s: %v: %s", tag, err, strings.TrimSpace(out))
	var why string
	pods, err := r.Replicas(ctx)
	r.check(err)
	for _, p := range pods {
		for _, cs := range p.Status.ContainerStatuses {
			if cs.State.Waiting != nil && strings.Contains(cs.State.Waiting.Message, tag) {
				why = fmt.Sprintf("%s: %s", cs.State.Waiting.Reason, cs.State.Waiting.Message)
			}
		}
	}
	if why == "" {
		t.Errorf("no replica says it waits for the image %s", tag)
	}
	t.Logf("the new replica: %s", why)
	if out, err := r.Helm(ctx, "rollback", helmrelease.Name, "--namespace", helmrelease.Namespace, "--wait", "--timeout", "3m"); err != nil {
		w.stop()
		t.Fatalf("helm rollback: %v\n%s", err, out)
	}
	r.check(r.WaitImages(ctx, helmrelease.ImageRepository+":"+firstVersion))
	r.check(r.WaitReplicasReady(ctx))
	w.check(t, "a bad image tag and its rollback")
}
