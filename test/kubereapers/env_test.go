package kubereapers_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/substrate/kube"
	"github.com/dexaflow/reaper/testkit/kubetest"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// warmLabel is the label the substrate's default warm_pool_selector selects.
const warmLabel = "leoflow.io/warm-pool"

// env is one test's share of the world: a namespace with a KWOK node, an
// admin client, the kube substrate on the namespace, a board of its own
// whose lease the test holds, and the reapers' fake clock.
type env struct {
	t      testing.TB
	c      *kubetest.Cluster
	cs     kubernetes.Interface
	ns     string
	node   string
	sub    *kube.Substrate
	store  *board.Store
	w      *lifecycle.Writer
	term   int64
	clk    *clock.Fake
	ladder ladder.Ladder
	states map[string][]byte
	runs   map[string]bool
	seq    int
}

// newEnv is an env whose board lease the test holds, for reaper passes run
// in process.
func newEnv(t testing.TB) *env {
	t.Helper()
	e := newWorld(t)
	lease, ok, err := e.store.TryAcquire(context.Background(), "kubereapers-test", 24*time.Hour, time.Now().Add(-time.Hour))
	if err != nil || !ok {
		t.Fatalf("taking the board's lease: %v, %v", ok, err)
	}
	e.term = lease.Term
	e.sub = e.substrateAs(kubetest.Admin)
	return e
}

// newWorld is the cluster's share and a board nobody leads yet.
func newWorld(t testing.TB) *env {
	t.Helper()
	c := kubetest.Current(t)
	pool := pgtest.NewDB(t)
	return &env{t: t, c: c, cs: c.Client(t), ns: c.NewNamespace(t), node: c.AddNode(t, "").Name,
		store: board.New(pool, board.Options{}), w: lifecycle.New(pool, lifecycle.Options{}),
		clk: clock.NewFake(time.Now().Truncate(time.Second)), ladder: ladder.Defaults(),
		states: map[string][]byte{}, runs: map[string]bool{}}
}

// substrateAs configures a kube substrate on the namespace as user and, for
// the admin, waits for its cache.
func (e *env) substrateAs(user string) *kube.Substrate {
	e.t.Helper()
	s := kube.NewWithOptions(hclog.NewNullLogger(), kube.Options{RestConfig: e.c.ConfigFor(user)})
	if err := s.Configure(context.Background(), sdk.ConfigureRequest{Edition: ladder.EditionKube,
		Values: sdk.Values{"namespace": e.ns}}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(s.Close)
	if user == kubetest.Admin {
		e.waitFor("the presence cache to sync", func() bool { ok, _ := s.Synced(context.Background()); return ok })
	}
	return s
}

// unreachableSubstrate is a kube substrate whose API server address
// nothing listens on (a stopped API server, as its clients see it).
func (e *env) unreachableSubstrate() *kube.Substrate {
	e.t.Helper()
	rc := e.c.ConfigFor(kubetest.Admin)
	rc.Host = "https://127.0.0.1:1"
	rc.Timeout = 5 * time.Second
	s := kube.NewWithOptions(hclog.NewNullLogger(), kube.Options{RestConfig: rc})
	if err := s.Configure(context.Background(), sdk.ConfigureRequest{Edition: ladder.EditionKube,
		Values: sdk.Values{"namespace": e.ns}}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(s.Close)
	return s
}

// reap runs one pass of r at the fake clock's time against the board and
// exec, carrying r's state from its previous pass, and returns the pass's
// decisions.
func (e *env) reap(r sdk.Reaper, exec sdk.Executions) []sdk.Decision {
	e.t.Helper()
	return e.reapWith(r, nil, e.store, exec)
}

// reapWith is reap with values over r's defaults, against board b.
func (e *env) reapWith(r sdk.Reaper, values sdk.Values, b sdk.Board, exec sdk.Executions) []sdk.Decision {
	e.t.Helper()
	ctx := context.Background()
	info, err := r.Info(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	v := defaults(e.t, r)
	for k, x := range values {
		v[k] = x
	}
	if err := r.Configure(ctx, sdk.ConfigureRequest{Edition: ladder.EditionKube, Ladder: e.ladder, Values: v}); err != nil {
		e.t.Fatal(err)
	}
	now := e.clk.Now()
	var sink sdk.Collector
	res, err := r.Reap(ctx, sdk.Pass{Now: now, Ladder: e.ladder, Term: e.term, Deadline: now.Add(e.ladder.MaintenanceInterval),
		State: e.states[info.Name], Edition: ladder.EditionKube}, b, exec, &sink)
	if err != nil {
		e.t.Fatalf("%s pass: %v", info.Name, err)
	}
	e.states[info.Name] = res.State
	return sink.Decisions()
}

func defaults(t testing.TB, p sdk.Plugin) sdk.Values {
	t.Helper()
	schema, err := p.ConfigSchema(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return schema.WithDefaults(nil)
}

// labels are the labels of the decisions about a, in order.
func labels(ds []sdk.Decision, a sdk.Attempt) string {
	var out []string
	for _, d := range ds {
		if d.Attempt == a {
			out = append(out, d.Label)
		}
	}
	return strings.Join(out, ",")
}

// applied finds the applied decision labelled label about a.
func applied(ds []sdk.Decision, a sdk.Attempt, label string) (sdk.Decision, bool) {
	for _, d := range ds {
		if d.Attempt == a && d.Label == label && d.Applied {
			return d, true
		}
	}
	return sdk.Decision{}, false
}

// onBoard puts a fresh first attempt of task a (executor kube or warm) on
// the board, in a running run.
func (e *env) onBoard(a sdk.Attempt, executor string) {
	e.t.Helper()
	ctx := context.Background()
	now := e.clk.Now()
	if !e.runs[a.RunID] {
		if err := e.w.CreateRun(ctx, lifecycle.NewRun{RunID: a.RunID, DagID: "dag"}, now); err != nil {
			e.t.Fatal(err)
		}
		e.runs[a.RunID] = true
	}
	if _, err := e.store.Pool().Exec(ctx, `INSERT INTO task_instances (run_id, task_id, executor, retries, max_retries,
        infra_budget, try_number, attempt_epoch, updated_at) VALUES ($1, $2, $3, 0, 0, 3, $4, $5, $6)`,
		a.RunID, a.TaskID, executor, a.Try, a.Epoch, now); err != nil {
		e.t.Fatal(err)
	}
	if ok, err := e.w.Enqueue(ctx, a, now); err != nil || !ok {
		e.t.Fatalf("enqueueing %s: %v, %v", a, ok, err)
	}
}

// queued puts a kube attempt on the board, queued now.
func (e *env) queued(a sdk.Attempt) {
	e.t.Helper()
	e.onBoard(a, sdk.ExecutorKube)
	if ok, err := e.w.Queue(context.Background(), a, e.clk.Now()); err != nil || !ok {
		e.t.Fatalf("queueing %s: %v, %v", a, ok, err)
	}
}

// running puts a kube attempt on the board, queued, running and
// heartbeating now.
func (e *env) running(a sdk.Attempt) {
	e.t.Helper()
	e.queued(a)
	e.toRunning(a)
}

// runningWarm puts a warm attempt bound to worker on the board, running
// and heartbeating now.
func (e *env) runningWarm(a sdk.Attempt, worker string) {
	e.t.Helper()
	e.onBoard(a, sdk.ExecutorWarm)
	if ok, err := e.w.QueueWarm(context.Background(), a, worker, e.clk.Now()); err != nil || !ok {
		e.t.Fatalf("queueing %s on %s: %v, %v", a, worker, ok, err)
	}
	e.toRunning(a)
}

func (e *env) toRunning(a sdk.Attempt) {
	e.t.Helper()
	ctx, now := context.Background(), e.clk.Now()
	if stop, err := e.w.Running(ctx, a, now); err != nil || stop {
		e.t.Fatalf("driving %s to running: %v, %v", a, stop, err)
	}
	if stop, err := e.w.Heartbeat(ctx, a, now); err != nil || stop {
		e.t.Fatalf("heartbeat of %s: %v, %v", a, stop, err)
	}
}

func (e *env) row(a sdk.Attempt) board.TaskInstance {
	e.t.Helper()
	ti, err := e.store.TaskInstance(context.Background(), a.RunID, a.TaskID)
	if err != nil {
		e.t.Fatal(err)
	}
	return ti
}

// wantProvisional checks that a was failed on the infra rail with reason,
// its mark not confirmed.
func (e *env) wantProvisional(a sdk.Attempt, reason string) {
	e.t.Helper()
	ti := e.row(a)
	if ti.State != sdk.StateFailed || ti.LastFailureKind != sdk.FailureInfra || !strings.HasPrefix(ti.ErrorMessage, reason+": ") ||
		!ti.InfraConfirmedAt.IsZero() {
		e.t.Fatalf("row of %s: %s/%s %q confirmed at %v; want a provisional %s mark", a, ti.State, ti.LastFailureKind,
			ti.ErrorMessage, ti.InfraConfirmedAt, reason)
	}
}

func (e *env) wantState(a sdk.Attempt, state string) {
	e.t.Helper()
	if got := e.row(a).State; got != state {
		e.t.Fatalf("row of %s is %s, want %s", a, got, state)
	}
}

// pod makes a pod of attempt a the way the kube runner does. A placed pod
// is put on the KWOK node and waited for until it runs; an unplaced one
// stays Pending and never starts.
func (e *env) pod(a sdk.Attempt, placed bool) *corev1.Pod {
	e.t.Helper()
	l, ann := kube.AttemptLabels(a)
	e.seq++
	p := e.create(fmt.Sprintf("task-%d", e.seq), l, ann, placed)
	if placed {
		p = e.waitPhase(p.Name, corev1.PodRunning)
	}
	return p
}

// warmPod makes a running warm worker pod named name.
func (e *env) warmPod(name string) *corev1.Pod {
	e.t.Helper()
	p := e.create(name, map[string]string{warmLabel: "true"}, nil, true)
	return e.waitPhase(p.Name, corev1.PodRunning)
}

func (e *env) create(name string, l, ann map[string]string, placed bool) *corev1.Pod {
	e.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l, Annotations: ann},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: kube.TaskContainer, Image: "agent"}}},
	}
	if placed {
		p.Spec.NodeName = e.node
	}
	out, err := e.cs.CoreV1().Pods(e.ns).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("creating pod %s: %v", name, err)
	}
	return out
}

// get reads a pod; nil when it is gone.
func (e *env) get(name string) *corev1.Pod {
	e.t.Helper()
	p, err := e.cs.CoreV1().Pods(e.ns).Get(context.Background(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

func (e *env) waitPhase(name string, phase corev1.PodPhase) *corev1.Pod {
	e.t.Helper()
	var p *corev1.Pod
	e.waitFor("pod "+name+" "+string(phase), func() bool { p = e.get(name); return p != nil && p.Status.Phase == phase })
	return p
}

// remove deletes a pod at once (as a lost node's pods go) and waits until
// the API server and the substrate's cache no longer hold it.
func (e *env) remove(p *corev1.Pod, a *sdk.Attempt) {
	e.t.Helper()
	zero := int64(0)
	err := e.cs.CoreV1().Pods(e.ns).Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if err != nil && !apierrors.IsNotFound(err) {
		e.t.Fatal(err)
	}
	e.waitFor("pod "+p.Name+" to go", func() bool { return e.get(p.Name) == nil })
	if a != nil && e.sub != nil {
		e.waitFor("the cache to drop "+p.Name, func() bool {
			got, err := e.sub.Liveness(context.Background(), sdk.LivenessRequest{Attempts: []sdk.Attempt{*a}, Now: time.Now()})
			return err == nil && len(got) == 1 && got[0].State == sdk.Dead
		})
	}
}

// playStatus writes a pod's status through the status subresource, as the
// kubelet would.
func (e *env) playStatus(name string, mutate func(*corev1.PodStatus)) {
	e.t.Helper()
	p := e.get(name)
	mutate(&p.Status)
	if _, err := e.cs.CoreV1().Pods(e.ns).UpdateStatus(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		e.t.Fatalf("writing the status of %s: %v", name, err)
	}
}

// waitFor polls cond, a state the cluster reaches on its own, until it
// holds, with a deadline.
func (e *env) waitFor(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stoppedInPlace reports whether teardown lowered the pod's deadline.
func stoppedInPlace(p *corev1.Pod) bool {
	return p != nil && p.Spec.ActiveDeadlineSeconds != nil && *p.Spec.ActiveDeadlineSeconds == 1
}

func att(run, task string) sdk.Attempt {
	return sdk.Attempt{RunID: run, TaskID: task, Try: 1, Epoch: 1}
}
