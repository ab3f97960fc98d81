package kuberunner_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
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

// TestPodSpecBootstrapToken: what the kube runner puts in a task pod's spec
// is the attempt's bootstrap token, which the agent (played by the kubelet
// player from the runner's own pod, on the real API server) exchanges
// before RUNNING and then runs its task to its outcome. A viewer of the
// namespace (the built-in view role: get pods) who reads the token from the
// pod spec while the task runs gets nothing with it: its exchange is
// refused and metered, it cannot heartbeat, renew, report, start or read
// the attempt, and the board is unchanged.
func TestPodSpecBootstrapToken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	log := &sdktest.LogBuffer{}
	node := e.c.AddNode(t, "").Name
	player, err := kubelet.Start(ctx, kubelet.Config{
		Client: e.cs, Namespace: e.ns, Dir: filepath.Join(t.TempDir(), "containers"),
		Commands: map[string]string{kuberunner.AgentPathDefault: agentBinary(t)}, MaxGrace: time.Second,
		Logger: hclog.New(&hclog.LoggerOptions{Output: log, Level: hclog.Info}),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(player.Stop)
	meter := &attemptapitest.Meter{}
	api := attemptapitest.Start(t, e.w, attemptapitest.Options{Clock: e.clk, Meter: meter,
		Logger: hclog.New(&hclog.LoggerOptions{Output: log, Level: hclog.Info, Name: "attempt-api"})})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("player and API log:\n%s", log.String())
		}
	})
	cfg := e.config(e.cs)
	cfg.Heartbeat = 200 * time.Millisecond
	cfg.TerminationGrace = time.Second
	cfg.Credentials = kuberunner.MintedCredentials{Minter: api.Issuer, Recorder: e.w}
	cfg.Customize = func(p *corev1.Pod) {
		p.Spec.NodeName = node
		kubelet.Own(p)
	}
	r := e.runner(t, cfg)
	gate := filepath.Join(t.TempDir(), "go")
	e.mkRun(t, "run", lifecycle.NewTask{TaskID: "t", Command: `while [ ! -f ` + gate + ` ]; do sleep 0.05; done`})

	until := func(what string, done func(board.TaskInstance) bool) board.TaskInstance {
		t.Helper()
		var ti board.TaskInstance
		eventually.True(t, clusterWait, what, func() bool {
			e.clk.Advance(time.Second)
			cycle(t, r, e.clk.Now())
			ti = e.ti(t, "run", "t")
			return done(ti)
		}, eventually.Every(clusterPoll))
		return ti
	}
	ti := until("the agent to exchange and report running", func(ti board.TaskInstance) bool { return ti.State == sdk.StateRunning })
	a := ti.Attempt
	if n := meter.Count(attemptapi.CallExchange + "/ok"); n != 1 {
		t.Fatalf("the agent's exchange metered ok %d times, want 1", n)
	}

	// The viewer: the namespace's built-in view role, nothing more. This
	// package's cluster runs no controller manager, whose aggregation
	// controller fills view's rules in from system:aggregate-to-view: the
	// binding names that role, the rules view is made of.
	viewer := e.c.ClientFor(t, kubetest.Carol)
	if _, err := e.cs.RbacV1().RoleBindings(e.ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "carol-views"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:aggregate-to-view"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: kubetest.Carol}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pods *corev1.PodList
	var lastErr error
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the viewer's last list: %v", lastErr)
		}
	})
	eventually.True(t, clusterWait, "the viewer to read the namespace's pods", func() bool {
		pods, err = viewer.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{})
		lastErr = err
		if err != nil && !apierrors.IsForbidden(err) {
			t.Fatal(err)
		}
		return err == nil && len(pods.Items) == 1
	}, eventually.Every(clusterPoll))
	env := map[string]string{}
	for _, v := range pods.Items[0].Spec.Containers[0].Env {
		env[v.Name] = v.Value
	}
	boot := env[attempttoken.EnvToken]
	if !attempttoken.IsBootstrap(boot) {
		t.Fatalf("the pod spec carries a %.4s token, want the bootstrap", boot)
	}
	stolen, err := attemptapi.ClientFromEnv(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	defer stolen.Close()

	before := e.ti(t, "run", "t")
	_, err = stolen.Exchange(ctx, a)
	wantCode(t, "the viewer's exchange", err, attemptapi.CodeBootstrapSpent)
	_, err = stolen.Heartbeat(ctx, a)
	wantCode(t, "the viewer's heartbeat", err, attemptapi.CodeWrongKind)
	_, err = stolen.Report(ctx, a, attemptapi.ReportBody{State: sdk.StateFailed, Reason: "forged"})
	wantCode(t, "the viewer's report", err, attemptapi.CodeWrongKind)
	_, err = stolen.Running(ctx, a)
	wantCode(t, "the viewer's running", err, attemptapi.CodeWrongKind)
	_, err = stolen.State(ctx, a)
	wantCode(t, "the viewer's state", err, attemptapi.CodeWrongKind)
	if stolen.Token() != boot {
		t.Fatal("a refused call gave the viewer a token")
	}
	after := e.ti(t, "run", "t")
	// The real agent keeps heartbeating: its stamps may move, nothing else.
	after.LastHeartbeatAt, after.UpdatedAt, after.CredentialRenewedAt = before.LastHeartbeatAt, before.UpdatedAt, before.CredentialRenewedAt
	if after != before {
		t.Fatalf("the viewer's calls changed the attempt:\nbefore %+v\nafter  %+v", before, after)
	}
	if n := meter.Count(attemptapi.CallExchange + "/" + attemptapi.CodeBootstrapSpent); n != 1 {
		t.Fatalf("the refused exchange metered %d times, want 1", n)
	}

	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if ti := until("the agent to report its outcome", func(ti board.TaskInstance) bool { return ti.State == sdk.StateSuccess }); ti.Attempt != a {
		t.Fatalf("the attempt %s ended, want %s", ti.Attempt, a)
	}
}

func wantCode(t *testing.T, what string, err error, code string) {
	t.Helper()
	var ce *attemptapi.CallError
	if !errors.As(err, &ce) || ce.Body.Code != code {
		t.Fatalf("%s: %v, want refused %s", what, err, code)
	}
}

// TestWarmWorkerPodSpecBootstrapToken: a warm worker's pod spec carries the
// worker's bootstrap token, which the worker (played from the runner's own
// worker pod) exchanges before its first claim, then runs a warm attempt
// to its outcome. A viewer of the namespace who reads the token from the
// worker pod's spec can neither exchange it again nor claim with it: from
// outside the pod its exchange proves no pod (exchange_not_from_pod), and
// even with a token bound to the worker's own pod, the bootstrap is spent.
func TestWarmWorkerPodSpecBootstrapToken(t *testing.T) {
	ctx := context.Background()
	e := newWarmEnv(t)
	r := e.runner(t, e.warmConfig(1))
	e.refill(t, r)
	names := e.workersRunning(t, 1)
	e.mkWarmRun(t, "run-warm", lifecycle.NewTask{TaskID: "hello", Command: "echo warm hello"})
	e.cycleUntil(t, r, "run-warm", "hello", "the warm attempt to succeed", func(ti board.TaskInstance) bool {
		return ti.State == sdk.StateSuccess
	})

	pod, err := e.cs.CoreV1().Pods(e.ns).Get(ctx, names[0], metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, v := range pod.Spec.Containers[0].Env {
		env[v.Name] = v.Value
	}
	boot := env[attempttoken.EnvWorkerToken]
	if !attempttoken.IsWorkerBootstrap(boot) {
		t.Fatalf("the worker pod spec carries a %.4s token, want the worker bootstrap", boot)
	}
	stolen, err := attemptapi.NewClient(env[attempttoken.EnvAPI], boot, env[attempttoken.EnvCA])
	if err != nil {
		t.Fatal(err)
	}
	defer stolen.Close()
	wantCode(t, "the viewer's worker exchange", stolen.ExchangeWorker(ctx, names[0]), attemptapi.CodeNotFromPod)
	stolen.UsePodToken(e.podToken(t, pod, kuberunner.TokenAudienceDefault))
	wantCode(t, "the worker exchange again from its pod", stolen.ExchangeWorker(ctx, names[0]), attemptapi.CodeBootstrapSpent)
	_, err = stolen.Claim(ctx, names[0], 1, nil)
	wantCode(t, "the viewer's claim", err, attemptapi.CodeWrongKind)
}
