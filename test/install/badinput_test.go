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
	"github.com/dexaflow/reaper/testkit/kubetest"
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
	for _, p := range r.replicas(ctx) {
		before[p.Name] = true
		// A live one, the one not Ready first (the other serves on).
		if p.DeletionTimestamp == nil && (victim.Name == "" || !ready(p)) {
			victim = p
		}
	}
	if victim.Name == "" {
		r.t.Fatal("no live replica to replace")
	}
	if err := r.cs.CoreV1().Pods(releaseNS).Delete(ctx, victim.Name, metav1.DeleteOptions{}); err != nil {
		r.t.Fatal(err)
	}
	var fresh corev1.Pod
	if !eventually.Until(2*time.Minute, func() bool {
		for _, p := range r.replicas(ctx) {
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
		health = r.health(ctx, p.Status.PodIP)
		return strings.HasPrefix(health, "503 ") && strings.Contains(health, want)
	}, eventually.Every(250*time.Millisecond)) {
		r.t.Fatalf("replica %s's readiness says %q, want a 503 naming %q", p.Name, health, want)
	}
	logs, err := r.cs.CoreV1().Pods(releaseNS).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil || !strings.Contains(string(logs), want) {
		r.t.Errorf("replica %s's log (%v) does not say %q:\n%s", p.Name, err, want, logs)
	}
	for _, s := range secrets {
		if strings.Contains(health, s) || strings.Contains(string(logs), s) {
			r.t.Errorf("replica %s shows a secret of its DSN (%q)", p.Name, s)
		}
	}
	cur, err := r.cs.CoreV1().Pods(releaseNS).Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		r.t.Fatal(err)
	}
	if ready(*cur) {
		r.t.Errorf("replica %s is Ready while it cannot serve", p.Name)
	}
	if n := cur.Status.ContainerStatuses[0].RestartCount; n != 0 {
		r.t.Errorf("replica %s restarted %d times: it should wait, saying why", p.Name, n)
	}
	return health
}

// setDSN replaces the DSN Secret's value ("" deletes the Secret).
func (r *release) setDSN(ctx context.Context, dsn string) {
	r.t.Helper()
	secrets := r.cs.CoreV1().Secrets(releaseNS)
	_ = secrets.Delete(ctx, dbSecret, metav1.DeleteOptions{})
	if dsn == "" {
		return
	}
	if _, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: dbSecret},
		StringData: map[string]string{"dsn": dsn}}, metav1.CreateOptions{}); err != nil {
		r.t.Fatal(err)
	}
}

// phaseBadDSN: the DSN Secret with a wrong password, then missing.
func (r *release) phaseBadDSN(ctx context.Context, t *testing.T, _ *ledger) {
	good := db.DSNAt(kubetest.NodeGateway, r.dbName)
	const wrong = "not-the-password-4f1c"
	u, err := url.Parse(good)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), wrong)
	bad := u.String()
	defer r.setDSN(context.Background(), good)

	r.setDSN(ctx, bad)
	p := r.replaceReplica(ctx)
	h := r.expectRefusing(ctx, p, "the database refused the password", wrong)
	t.Logf("wrong password: %s", h)

	r.setDSN(ctx, "")
	p = r.replaceReplica(ctx)
	h = r.expectRefusing(ctx, p, "waiting for its DSN")
	t.Logf("no DSN Secret: %s", h)

	r.setDSN(ctx, good)
	r.replaceReplica(ctx)
	r.waitReplicasReady(ctx)
}

// phaseBadImageTag: helm upgrade to an image tag the node does not have
// (pull policy Never: the test cluster reaches no registry). The upgrade
// fails and says which image; one replica stays Ready and leading
// throughout (the rollout replaces one at a time); helm rollback mends it.
func (r *release) phaseBadImageTag(ctx context.Context, t *testing.T, _ *ledger) {
	const tag = "0.0.0-no-such-build"
	w := r.watchReplicas(ctx)
	out, err := r.helm(ctx, "upgrade", releaseName, r.chart(), "--namespace", releaseNS, "--values", r.values(firstVersion),
		"--set", "image.tag="+tag, "--set", "image.pullPolicy=Never", "--wait", "--timeout", "30s")
	if err == nil {
		w.stop()
		t.Fatalf("helm upgrade to a missing image succeeded:\n%s", out)
	}
	t.Logf("helm upgrade to %s: %v: %s", tag, err, strings.TrimSpace(out))
	var why string
	for _, p := range r.replicas(ctx) {
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
	if out, err := r.helm(ctx, "rollback", releaseName, "--namespace", releaseNS, "--wait", "--timeout", "3m"); err != nil {
		w.stop()
		t.Fatalf("helm rollback: %v\n%s", err, out)
	}
	r.waitImages(ctx, imageRepo+":"+firstVersion)
	r.waitReplicasReady(ctx)
	w.check(t, "a bad image tag and its rollback")
}
