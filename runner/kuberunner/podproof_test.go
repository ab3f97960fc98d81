package kuberunner_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/runner/attemptapi/attemptapitest"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/runner/kuberunner"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/sdktest"
	"github.com/dexaflow/reaper/testkit/eventually"
	"github.com/dexaflow/reaper/testkit/kubetest"
	"github.com/dexaflow/reaper/testkit/kubetest/kubelet"
)

// decisions collects what the attempt API hands on.
type decisions struct {
	mu sync.Mutex
	ds []sdk.Decision
}

func (d *decisions) add(_ context.Context, ds []sdk.Decision) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ds = append(d.ds, ds...)
}

func (d *decisions) labelled(label string) []sdk.Decision {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []sdk.Decision
	for _, x := range d.ds {
		if x.Label == label {
			out = append(out, x)
		}
	}
	return out
}

// podVerifier is the kube edition's pod proof over the env's namespace:
// TokenReviews on the real API server, the default ServiceAccount and
// audience.
func (e *env) podVerifier(t *testing.T) attemptapi.PodVerifier {
	t.Helper()
	v, err := kuberunner.NewPodVerifier(kuberunner.Settings{Namespace: e.ns}, e.cs)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// viewerSpec reads pod name's spec as a viewer of the namespace (the rules
// of the built-in view role, nothing more) and returns its one container's
// environment.
func (e *env) viewerSpec(t *testing.T, name string) map[string]string {
	t.Helper()
	ctx := context.Background()
	viewer := e.c.ClientFor(t, kubetest.Carol)
	if _, err := e.cs.RbacV1().RoleBindings(e.ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "carol-views"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:aggregate-to-view"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: kubetest.Carol}},
	}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	var pod *corev1.Pod
	eventually.True(t, clusterWait, "the viewer to read the pod", func() bool {
		p, err := viewer.CoreV1().Pods(e.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil && !apierrors.IsForbidden(err) {
			t.Fatal(err)
		}
		pod = p
		return err == nil
	}, eventually.Every(clusterPoll))
	env := map[string]string{}
	for _, v := range pod.Spec.Containers[0].Env {
		env[v.Name] = v.Value
	}
	return env
}

// podToken makes a token of the task ServiceAccount as a TokenRequest does
// (what the kubelet makes for a projected volume when bound is the pod it
// runs), for audience, bound to pod bound (nil: to no pod), and writes it
// to a file of its own.
func (e *env) podToken(t *testing.T, bound *corev1.Pod, audience string) string {
	t.Helper()
	expiry := kuberunner.PodTokenExpiry
	tr := &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{Audiences: []string{audience}, ExpirationSeconds: &expiry}}
	if bound != nil {
		tr.Spec.BoundObjectRef = &authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: bound.Name, UID: bound.UID}
	}
	got, err := e.cs.CoreV1().ServiceAccounts(e.ns).CreateToken(context.Background(), kuberunner.ServiceAccountDefault, tr,
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(f, []byte(got.Status.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// otherPod is a pod of the attacker's own making in the task namespace, as
// the task ServiceAccount (what a tenant with pods/create may make): its
// token is genuine, but it is not the attempt's pod.
func (e *env) otherPod(t *testing.T) *corev1.Pod {
	t.Helper()
	p, err := e.cs.CoreV1().Pods(e.ns).Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "attacker"},
		Spec: corev1.PodSpec{ServiceAccountName: kuberunner.ServiceAccountDefault,
			Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/attacker"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// forgedPodProofs are the exchanges a viewer can make with a bootstrap it
// read, each refused exchange_not_from_pod: no pod token; a genuine
// projected token of another pod (its own); a token of the right pod for
// another audience; a token of the right audience bound to no pod.
func (e *env) forgedPodProofs(t *testing.T, own *corev1.Pod) map[string]forgedProof {
	other := e.otherPod(t)
	return map[string]forgedProof{
		"NoPodToken":          {"", "no pod token"},
		"AnotherPodsToken":    {e.podToken(t, other, kuberunner.TokenAudienceDefault), "the board records pod uid " + string(own.UID)},
		"WrongAudience":       {e.podToken(t, own, "https://kubernetes.default.svc"), "does not authenticate"},
		"TokenBoundToNoPod":   {e.podToken(t, nil, kuberunner.TokenAudienceDefault), "bound to no pod"},
		"AnotherPodsAPIToken": {e.podToken(t, other, "https://kubernetes.default.svc"), "does not authenticate"},
	}
}

// forgedProof is a pod token file ("": none) and what its refusal says.
type forgedProof struct{ file, why string }

// lastWhy is the why of the last exchange_not_from_pod decision.
func (d *decisions) lastWhy() string {
	ds := d.labelled(sdk.LabelExchangeNotFromPod)
	if len(ds) == 0 {
		return ""
	}
	return ds[len(ds)-1].Evidence["why"]
}

// TestViewerCannotSpendAPendingTaskPodsBootstrap: a viewer of the task
// namespace (the built-in view role's rules) who reads the bootstrap from a
// task pod's spec while the pod is still Pending (no node yet) and
// exchanges it first is refused exchange_not_from_pod every way it can
// try: without a pod token, with another pod's genuine projected token,
// with the right pod's token for another audience, with a token bound to
// no pod. Each refusal is logged, metered and handed on as a decision; the
// board is unchanged and the bootstrap unspent. Once the pod runs, its
// agent (the kubelet player projects the pod-bound token as a kubelet
// does) exchanges the same bootstrap and the attempt runs to SUCCESS.
func TestViewerCannotSpendAPendingTaskPodsBootstrap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	log := &sdktest.LogBuffer{}
	meter := &attemptapitest.Meter{}
	ds := &decisions{}
	api := attemptapitest.Start(t, e.w, attemptapitest.Options{Clock: e.clk, Meter: meter, Pods: e.podVerifier(t),
		Decisions: ds.add, Logger: hclog.New(&hclog.LoggerOptions{Output: log, Level: hclog.Info, Name: "attempt-api"})})
	player, err := kubelet.Start(ctx, kubelet.Config{
		Client: e.cs, Namespace: e.ns, Dir: filepath.Join(t.TempDir(), "containers"),
		Commands: map[string]string{kuberunner.AgentPathDefault: agentBinary(t)}, MaxGrace: time.Second,
		Logger: hclog.New(&hclog.LoggerOptions{Output: log, Level: hclog.Info}),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(player.Stop)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("player and API log:\n%s", log.String())
		}
	})
	cfg := e.config(e.cs)
	cfg.Heartbeat = 200 * time.Millisecond
	cfg.TerminationGrace = time.Second
	cfg.Credentials = kuberunner.MintedCredentials{Minter: api.Issuer, Recorder: e.w}
	cfg.Customize = kubelet.Own // no node: the pod stays Pending until the test binds it
	r := e.runner(t, cfg)
	e.mkRun(t, "run", lifecycle.NewTask{TaskID: "t", Command: "true"})
	if res := cycle(t, r, e.clk.Now()); res.Dispatched != 1 {
		t.Fatalf("dispatched %d, want 1", res.Dispatched)
	}
	before := e.ti(t, "run", "t")
	a := before.Attempt
	made, ok := e.pods(t)[a]
	if !ok || made.Spec.NodeName != "" {
		t.Fatalf("the attempt's pod: found %v (node %q), want it Pending with no node", ok, made.Spec.NodeName)
	}
	pod := &made

	env := e.viewerSpec(t, pod.Name)
	if !attempttoken.IsBootstrap(env[attempttoken.EnvToken]) {
		t.Fatalf("the pod spec carries a %.4s token, want the bootstrap", env[attempttoken.EnvToken])
	}
	forged := e.forgedPodProofs(t, pod)
	for name, f := range forged {
		t.Run(name, func(t *testing.T) {
			stolen, err := attemptapi.ClientFromEnv(func(k string) string { return env[k] })
			if err != nil {
				t.Fatal(err)
			}
			defer stolen.Close()
			stolen.UsePodToken(f.file)
			_, err = stolen.Exchange(ctx, a)
			wantCode(t, "the viewer's exchange", err, attemptapi.CodeNotFromPod)
			if !attempttoken.IsBootstrap(stolen.Token()) {
				t.Fatal("a refused exchange gave the viewer a token")
			}
			if why := ds.lastWhy(); !strings.Contains(why, f.why) {
				t.Fatalf("refused because %q, want %q", why, f.why)
			}
		})
	}
	if n := meter.Count(attemptapi.CallExchange + "/" + attemptapi.CodeNotFromPod); n != len(forged) {
		t.Fatalf("refused exchanges metered %d times, want %d", n, len(forged))
	}
	refusals := ds.labelled(sdk.LabelExchangeNotFromPod)
	if len(refusals) != len(forged) {
		t.Fatalf("%d %s decisions, want %d", len(refusals), sdk.LabelExchangeNotFromPod, len(forged))
	}
	for _, d := range refusals {
		if d.Applied || d.Attempt != a || d.Evidence["recorded_pod_uid"] != string(pod.UID) || d.Evidence["why"] == "" {
			t.Fatalf("decision %+v: want not applied, for %s, naming the recorded pod and why", d, a)
		}
	}
	if n := strings.Count(log.String(), "did not prove it comes from the recorded pod"); n != len(forged) {
		t.Fatalf("refusals logged %d times, want %d", n, len(forged))
	}
	if after := e.ti(t, "run", "t"); after != before {
		t.Fatalf("the refused exchanges changed the attempt:\nbefore %+v\nafter  %+v", before, after)
	}
	if e.exchangedAt(t, a) {
		t.Fatal("a refused exchange spent the bootstrap")
	}

	// The pod gets its node: the kubelet (the player) projects the token
	// bound to it, and its agent exchanges the same bootstrap and runs.
	node := e.c.AddNode(t, "").Name
	if err := e.cs.CoreV1().Pods(e.ns).Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: pod.Name},
		Target: corev1.ObjectReference{Kind: "Node", Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var ti board.TaskInstance
	eventually.True(t, clusterWait, "the pod's own agent to exchange and succeed", func() bool {
		e.clk.Advance(time.Second)
		cycle(t, r, e.clk.Now())
		ti = e.ti(t, "run", "t")
		return ti.State == sdk.StateSuccess
	}, eventually.Every(clusterPoll))
	if ti.Attempt != a {
		t.Fatalf("the attempt %s succeeded, want %s", ti.Attempt, a)
	}
	if n := meter.Count(attemptapi.CallExchange + "/ok"); n != 1 {
		t.Fatalf("the agent's exchange metered ok %d times, want 1", n)
	}
}

// exchangedAt reports whether the attempt's bootstrap was exchanged.
func (e *env) exchangedAt(t *testing.T, a sdk.Attempt) bool {
	t.Helper()
	var spent bool
	if err := e.store.Pool().QueryRow(context.Background(), `SELECT credential_exchanged_at IS NOT NULL FROM task_instances
        WHERE run_id = $1 AND task_id = $2 AND try_number = $3 AND attempt_epoch = $4`,
		a.RunID, a.TaskID, a.Try, a.Epoch).Scan(&spent); err != nil {
		t.Fatal(err)
	}
	return spent
}

// TestViewerCannotSpendAPendingWarmWorkersBootstrap: the same for a warm
// worker. A viewer who reads a Pending worker pod's bootstrap is refused
// exchange_not_from_pod every way it tries, and nothing is recorded for the
// worker; once the pod runs, the worker (the player projects its
// pod-bound token) exchanges the same bootstrap, claims and runs a warm
// attempt to SUCCESS.
func TestViewerCannotSpendAPendingWarmWorkersBootstrap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newWarmEnv(t)
	cfg := e.warmConfig(1)
	cfg.Customize = kubelet.Own // no node: the worker stays Pending until the test binds it
	r := e.runner(t, cfg)
	res := e.refill(t, r)
	if len(res.Created) != 1 {
		t.Fatalf("refill created %v, want one worker", res.Created)
	}
	name := res.Created[0]
	pod, err := e.cs.CoreV1().Pods(e.ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if uid, err := e.w.WarmWorkerPodUID(ctx, name); err != nil || uid != string(pod.UID) {
		t.Fatalf("the worker's recorded pod %q (%v), want %s", uid, err, pod.UID)
	}
	env := e.viewerSpec(t, name)
	boot := env[attempttoken.EnvWorkerToken]
	if !attempttoken.IsWorkerBootstrap(boot) {
		t.Fatalf("the worker pod spec carries a %.4s token, want the worker bootstrap", boot)
	}
	forged := e.forgedPodProofs(t, pod)
	for what, f := range forged {
		t.Run(what, func(t *testing.T) {
			stolen, err := attemptapi.NewClient(env[attempttoken.EnvAPI], boot, env[attempttoken.EnvCA])
			if err != nil {
				t.Fatal(err)
			}
			defer stolen.Close()
			stolen.UsePodToken(f.file)
			wantCode(t, "the viewer's worker exchange", stolen.ExchangeWorker(ctx, name), attemptapi.CodeNotFromPod)
			if why := e.decisions.lastWhy(); !strings.Contains(why, f.why) {
				t.Fatalf("refused because %q, want %q", why, f.why)
			}
		})
	}
	if n := e.meter.Count(attemptapi.CallWorkerExchange + "/" + attemptapi.CodeNotFromPod); n != len(forged) {
		t.Fatalf("refused worker exchanges metered %d times, want %d", n, len(forged))
	}
	refusals := e.decisions.labelled(sdk.LabelExchangeNotFromPod)
	if len(refusals) != len(forged) {
		t.Fatalf("%d %s decisions, want %d", len(refusals), sdk.LabelExchangeNotFromPod, len(forged))
	}
	for _, d := range refusals {
		if d.Applied || d.Evidence["warm_worker"] != name || d.Evidence["recorded_pod_uid"] != string(pod.UID) {
			t.Fatalf("decision %+v: want not applied, naming the worker and its recorded pod", d)
		}
	}
	var exchanges int
	if err := e.store.Pool().QueryRow(ctx, `SELECT count(*) FROM worker_credential_exchanges WHERE worker = $1`, name).
		Scan(&exchanges); err != nil || exchanges != 0 {
		t.Fatalf("%d exchanges recorded for the worker (%v): the refusals spent its bootstrap", exchanges, err)
	}

	if err := e.cs.CoreV1().Pods(e.ns).Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: name},
		Target: corev1.ObjectReference{Kind: "Node", Name: e.node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.workersRunning(t, 1)
	e.mkWarmRun(t, "run-warm", lifecycle.NewTask{TaskID: "hello", Command: "echo warm hello"})
	e.cycleUntil(t, r, "run-warm", "hello", "the warm attempt to succeed", func(ti board.TaskInstance) bool {
		return ti.State == sdk.StateSuccess
	})
	if n := e.meter.Count(attemptapi.CallWorkerExchange + "/ok"); n != 1 {
		t.Fatalf("the worker's exchange metered ok %d times, want 1", n)
	}
}
