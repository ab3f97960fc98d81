package kubelet_test

// The player and the agent's pod mode on the real API server with KWOK:
// real reaper-agent processes in played pods, and the kube substrate's
// sweep settling what they leave against a real PostgreSQL board.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/agent"
	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/runner/attemptapi/attemptapitest"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/runner/kuberunner"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/substrate/kube"
	"github.com/dexaflow/reaper/substrate/kube/podrecord"
	"github.com/dexaflow/reaper/substrate/lite/proc"
	"github.com/dexaflow/reaper/testkit/kubetest"
	"github.com/dexaflow/reaper/testkit/kubetest/kubelet"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// suite is what TestMain sets up once: the cluster and the agent binary.
// It is set before the tests and cleared after the last (kubetest's own
// harness cannot be used: pgtest.Run runs the tests, for the board).
type suite struct {
	cluster *kubetest.Cluster
	agent   string
}

var current atomic.Pointer[suite]

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "kubelet-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer os.RemoveAll(dir)
	agentPath := filepath.Join(dir, "reaper-agent")
	build := exec.Command("go", "build", "-o", agentPath, "github.com/dexaflow/reaper/cmd/reaper-agent")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building reaper-agent:", err)
		return 2
	}
	c, err := kubetest.Start(context.Background(), kubetest.Options{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubelet: the test cluster did not start, so these tests cannot run:\n%v\n", err)
		return 1
	}
	defer func() {
		current.Store(nil)
		if err := c.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}()
	current.Store(&suite{cluster: c, agent: agentPath})
	return pgtest.Run(m)
}

// env is one test's namespace, KWOK node and player.
type env struct {
	t      *testing.T
	s      *suite
	cs     kubernetes.Interface
	ns     string
	node   string
	player *kubelet.Player
	dir    string
	seq    int
}

func newEnv(t *testing.T) *env {
	t.Helper()
	s := current.Load()
	if s == nil {
		t.Fatal("no test cluster: TestMain did not start one")
	}
	e := &env{t: t, s: s, cs: s.cluster.Client(t), ns: s.cluster.NewNamespace(t), node: s.cluster.AddNode(t, "").Name,
		dir: t.TempDir()}
	p, err := kubelet.Start(context.Background(), kubelet.Config{
		Client: e.cs, Namespace: e.ns, Dir: filepath.Join(e.dir, "containers"),
		Commands: map[string]string{"reaper-agent": s.agent}, MaxGrace: 3 * time.Second,
		Logger: hclog.New(&hclog.LoggerOptions{Output: testWriter{t}, Level: hclog.Info}),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	e.player = p
	return e
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// agentPod is a pod of attempt a whose task container is reaper-agent in
// pod mode running command, reporting to a report file (or as inv says).
func (e *env) agentPod(a sdk.Attempt, command string, mutate ...func(*agent.Invocation, *corev1.Pod)) *corev1.Pod {
	e.t.Helper()
	e.seq++
	inv := agent.Invocation{Attempt: a, Command: command, Mode: agent.ModePod, Reporter: agent.ReporterFile,
		ReportFile: filepath.Join(e.dir, fmt.Sprintf("report-%d.jsonl", e.seq)), Heartbeat: 100 * time.Millisecond,
		TerminateGrace: time.Second, KillWait: time.Second}
	l, ann := kube.AttemptLabels(a)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("task-%d", e.seq), Labels: l, Annotations: ann},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, NodeName: e.node,
			Containers: []corev1.Container{{Name: kube.TaskContainer, Image: "reaper-agent", Command: []string{"reaper-agent"}}}},
	}
	kubelet.Own(pod)
	for _, m := range mutate {
		m(&inv, pod)
	}
	pod.Spec.Containers[0].Args = inv.Args()
	out, err := e.cs.CoreV1().Pods(e.ns).Create(context.Background(), pod, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// await waits for the pod to satisfy done.
func (e *env) await(pod *corev1.Pod, what string, done func(*corev1.Pod) bool) *corev1.Pod {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got, err := kubetest.WaitPod(ctx, e.cs, pod, done)
	if err != nil {
		e.t.Fatalf("waiting for pod %s to be %s: %v (last: %+v)", pod.Name, what, err, statusOf(got))
	}
	return got
}

func (e *env) awaitPhase(pod *corev1.Pod, phase corev1.PodPhase) *corev1.Pod {
	e.t.Helper()
	return e.await(pod, string(phase), func(p *corev1.Pod) bool { return p != nil && p.Status.Phase == phase })
}

func statusOf(p *corev1.Pod) any {
	if p == nil {
		return nil
	}
	return p.Status
}

// terminated is the task container's terminated state.
func terminated(t *testing.T, pod *corev1.Pod) *corev1.ContainerStateTerminated {
	t.Helper()
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == kube.TaskContainer && cs.State.Terminated != nil {
			return cs.State.Terminated
		}
	}
	t.Fatalf("pod %s: no terminated task container in %+v", pod.Name, pod.Status.ContainerStatuses)
	return nil
}

func recordOf(t *testing.T, pod *corev1.Pod) podrecord.Record {
	t.Helper()
	term := terminated(t, pod)
	rec, ok := podrecord.Parse(term.Message)
	if !ok {
		t.Fatalf("pod %s: termination message %q is no record", pod.Name, term.Message)
	}
	return rec
}

// processOf waits for the player to have started the pod's container.
func (e *env) processOf(pod *corev1.Pod) (int, <-chan struct{}) {
	e.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if pid, done, ok := e.player.Process(pod.Name); ok {
			return pid, done
		}
		time.Sleep(10 * time.Millisecond)
	}
	e.t.Fatalf("the player never started pod %s", pod.Name)
	return 0, nil
}

// taskGroup waits for the task (which writes $$ to $TMPDIR/task.pid) to
// have started and returns its process group.
func (e *env) taskGroup(pod *corev1.Pod) int {
	e.t.Helper()
	path := filepath.Join(e.dir, "containers", e.ns+"_"+pod.Name+"_"+string(pod.UID), "task.pid")
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if data, err := os.ReadFile(path); err == nil && strings.HasSuffix(string(data), "\n") {
			pgid, err := strconv.Atoi(strings.TrimSpace(string(data)))
			if err != nil {
				e.t.Fatal(err)
			}
			return pgid
		}
		time.Sleep(10 * time.Millisecond)
	}
	e.t.Fatalf("the task of pod %s never started", pod.Name)
	return 0
}

const longTask = `echo $$ > "$TMPDIR/task.pid"; sleep 1000`

func awaitClosed(t *testing.T, done <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatalf("%s: still running", what)
	}
}

func groupGone(t *testing.T, pgid int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		running, err := proc.GroupRunning(pgid)
		if err == nil && !running {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("task group %d still runs (%v)", pgid, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// boardEnv is a PostgreSQL board with an attempt running on it, and the
// kube substrate on the test's namespace to sweep it.
type boardEnv struct {
	t     *testing.T
	store *board.Store
	w     *lifecycle.Writer
	sub   *kube.Substrate
	term  int64
}

func (e *env) board(as ...sdk.Attempt) *boardEnv {
	e.t.Helper()
	return e.boardUpTo(true, as...)
}

// boardUpTo is board with the attempts left queued unless running.
func (e *env) boardUpTo(running bool, as ...sdk.Attempt) *boardEnv {
	e.t.Helper()
	ctx := context.Background()
	pool := pgtest.NewDB(e.t)
	store := board.New(pool, board.Options{})
	lease, ok, err := store.TryAcquire(ctx, "kubelet-test", 24*time.Hour, time.Now().Add(-time.Hour))
	if err != nil || !ok {
		e.t.Fatalf("taking the board's lease: %v, %v", ok, err)
	}
	w := lifecycle.New(pool, lifecycle.Options{})
	now := time.Now().Add(-time.Minute)
	for _, a := range as {
		if err := w.CreateRun(ctx, lifecycle.NewRun{RunID: a.RunID, DagID: "dag",
			Tasks: []lifecycle.NewTask{{TaskID: a.TaskID, Executor: sdk.ExecutorKube, Retries: 2}}}, now); err != nil {
			e.t.Fatal(err)
		}
		for _, step := range []func(context.Context, sdk.Attempt, time.Time) (bool, error){w.Enqueue, w.Queue} {
			if ok, err := step(ctx, a, now); err != nil || !ok {
				e.t.Fatalf("driving %s to queued: %v, %v", a, ok, err)
			}
		}
		if !running {
			continue
		}
		if stop, err := w.Running(ctx, a, now); err != nil || stop {
			e.t.Fatalf("driving %s to running: %v, %v", a, stop, err)
		}
	}
	sub := kube.NewWithOptions(hclog.NewNullLogger(), kube.Options{RestConfig: e.s.cluster.AdminConfig()})
	if err := sub.Configure(ctx, sdk.ConfigureRequest{Edition: "kube", Values: sdk.Values{"namespace": e.ns}}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(sub.Close)
	return &boardEnv{t: e.t, store: store, w: w, sub: sub, term: lease.Term}
}

// sweepUntilSettled sweeps until a's row has left running (the cache may
// not hold the finished pod yet) and returns the row and the decisions.
func (b *boardEnv) sweepUntilSettled(a sdk.Attempt) (board.TaskInstance, []sdk.Decision) {
	b.t.Helper()
	ctx := context.Background()
	var decisions []sdk.Decision
	deadline := time.Now().Add(time.Minute)
	for {
		if ok, err := b.sub.Synced(ctx); err == nil && ok {
			res, err := b.sub.Sweep(ctx, sdk.SweepRequest{Now: time.Now(), Term: b.term, Ladder: ladder.Defaults()}, b.store)
			if err != nil {
				b.t.Fatal(err)
			}
			decisions = append(decisions, res.Decisions...)
		}
		ti, err := b.store.TaskInstance(ctx, a.RunID, a.TaskID)
		if err != nil {
			b.t.Fatal(err)
		}
		if ti.State != sdk.StateRunning {
			return ti, decisions
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("the sweep never settled %s", a)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func ruleOf(ds []sdk.Decision, a sdk.Attempt) string {
	for _, d := range ds {
		if d.Attempt == a && d.Applied {
			return d.Evidence["rule"]
		}
	}
	return ""
}

func TestPlayedPodSucceedsWithSuccessRecordAndTheSweepSettlesIt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := sdk.Attempt{RunID: "run-ok", TaskID: "load_a", Try: 1}
	b := e.board(a)
	pod := e.agentPod(a, `echo hello`)
	done := e.awaitPhase(pod, corev1.PodSucceeded)
	term := terminated(t, done)
	if term.ExitCode != 0 || term.Reason != "Completed" || term.StartedAt.IsZero() || term.FinishedAt.IsZero() {
		t.Fatalf("terminated %+v", term)
	}
	rec := recordOf(t, done)
	if rec.Outcome != podrecord.Success || rec.Attempt() != a {
		t.Fatalf("record %+v", rec)
	}
	// The file reporter is no board: the row only learns the outcome from
	// the durable record, through the sweep.
	ti, ds := b.sweepUntilSettled(a)
	if ti.State != sdk.StateSuccess || ruleOf(ds, a) != "DurableSuccessRecord" {
		t.Fatalf("row %s by rule %q; want success by DurableSuccessRecord", ti.State, ruleOf(ds, a))
	}
}

func TestPlayedPodFailingTaskLeavesFailedRecordSettledAsTaskFailure(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := sdk.Attempt{RunID: "run-fail", TaskID: "load_b", Try: 1}
	b := e.board(a)
	pod := e.agentPod(a, `exit 3`)
	done := e.awaitPhase(pod, corev1.PodFailed)
	if term := terminated(t, done); term.ExitCode != 1 || term.Reason != "Error" {
		t.Fatalf("terminated %+v; want the agent's exit 1 (task failed, reported)", term)
	}
	rec := recordOf(t, done)
	if rec.Outcome != podrecord.Failed || rec.ExitCode == nil || *rec.ExitCode != 3 {
		t.Fatalf("record %+v", rec)
	}
	ti, ds := b.sweepUntilSettled(a)
	if ti.LastFailureKind != sdk.FailureTask || ti.ErrorMessage != "task_failed: exit_code: task exited with code 3" ||
		ruleOf(ds, a) != "FailedRecord" {
		t.Fatalf("row %s/%s %q by rule %q", ti.State, ti.LastFailureKind, ti.ErrorMessage, ruleOf(ds, a))
	}
}

func TestPlayedPodDeletedStopsTheLocalProcess(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pod := e.agentPod(sdk.Attempt{RunID: "run-del", TaskID: "t", Try: 1}, longTask)
	_, done := e.processOf(pod)
	pgid := e.taskGroup(pod)
	if err := e.cs.CoreV1().Pods(e.ns).Delete(context.Background(), pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	awaitClosed(t, done, "the deleted pod's agent")
	groupGone(t, pgid)
}

func TestPlayedPodDeadlineLoweredTo1IsStoppedDeadlineExceeded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := sdk.Attempt{RunID: "run-deadline", TaskID: "t", Try: 1, Epoch: 2}
	pod := e.agentPod(a, longTask, func(_ *agent.Invocation, p *corev1.Pod) {
		d := int64(3600)
		p.Spec.ActiveDeadlineSeconds = &d
	})
	_, done := e.processOf(pod)
	pgid := e.taskGroup(pod)
	// The teardown's way of stopping a started pod in place.
	patch := []byte(`{"spec":{"activeDeadlineSeconds":1}}`)
	if _, err := e.cs.CoreV1().Pods(e.ns).Patch(context.Background(), pod.Name, types.StrategicMergePatchType, patch,
		metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	awaitClosed(t, done, "the agent of the pod past its deadline")
	groupGone(t, pgid)
	failed := e.awaitPhase(pod, corev1.PodFailed)
	if failed.Status.Reason != "DeadlineExceeded" || failed.Status.Message != kubelet.DeadlineMessage {
		t.Fatalf("pod %s: %q", failed.Status.Reason, failed.Status.Message)
	}
	// The agent caught the SIGTERM and left its record: KWOK's own deadline
	// stage (which writes no message) did not get there first.
	rec := recordOf(t, failed)
	if rec.Outcome != podrecord.Failed || rec.Attempt() != a || !strings.HasPrefix(rec.Reason, agent.ReasonAgentStopped) {
		t.Fatalf("record %+v", rec)
	}
}

func TestPlayedPodPreStartUnansweredWritesInfraMarkerSettledOnTheInfraRail(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := sdk.Attempt{RunID: "run-infra", TaskID: "t", Try: 1}
	b := e.board(a)
	closed := attemptapitest.FreeAddr(t)
	// The agent's control plane is an attempt API nobody serves; its
	// pre-start window is shortened to 1s here (the 2-minute default is
	// proven on a fake clock in the agent's own tests).
	pod := e.agentPod(a, `touch "$TMPDIR/ran"`, func(inv *agent.Invocation, p *corev1.Pod) {
		inv.Reporter, inv.ReportFile, inv.StartRetry = agent.ReporterAPI, "", time.Second
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: attempttoken.EnvAPI, Value: "https://" + closed},
			{Name: attempttoken.EnvToken, Value: "rat1.unverified"}}
	})
	done := e.awaitPhase(pod, corev1.PodFailed)
	rec := recordOf(t, done)
	if rec.Outcome != podrecord.Infra || rec.ExitCode != nil || !rec.HonoredInfra() || rec.Attempt() != a {
		t.Fatalf("record %+v; want the agent's infra marker", rec)
	}
	if term := terminated(t, done); term.ExitCode != 6 {
		t.Fatalf("terminated %+v; want exit 6", term)
	}
	ti, _ := b.sweepUntilSettled(a)
	if ti.LastFailureKind != sdk.FailureInfra || !strings.HasPrefix(ti.ErrorMessage, sdk.ReasonControlPlaneUnavailable+": ") ||
		ti.InfraConfirmedAt.IsZero() {
		t.Fatalf("row %s/%s %q confirmed=%v", ti.State, ti.LastFailureKind, ti.ErrorMessage, !ti.InfraConfirmedAt.IsZero())
	}
}

func TestPlayedPodShouldTerminateStopsTheTaskGroup(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	stopFile := filepath.Join(e.dir, "terminate")
	a := sdk.Attempt{RunID: "run-term", TaskID: "t", Try: 1}
	pod := e.agentPod(a, longTask, func(inv *agent.Invocation, _ *corev1.Pod) { inv.TerminateFile = stopFile })
	pgid := e.taskGroup(pod)
	// The control plane answers should_terminate from now on.
	if err := os.WriteFile(stopFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	failed := e.awaitPhase(pod, corev1.PodFailed)
	groupGone(t, pgid)
	rec := recordOf(t, failed)
	if rec.Outcome != podrecord.Failed || !strings.HasPrefix(rec.Reason, agent.ReasonTerminated+":") {
		t.Fatalf("record %+v", rec)
	}
}

func TestPlayedPodOOMKilled(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pod := e.agentPod(sdk.Attempt{RunID: "run-oom", TaskID: "t", Try: 1}, longTask)
	pgid := e.taskGroup(pod)
	patch := []byte(`{"metadata":{"annotations":{"` + kubelet.AnnotationOOMKill + `":"true"}}}`)
	if _, err := e.cs.CoreV1().Pods(e.ns).Patch(context.Background(), pod.Name, types.MergePatchType, patch,
		metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	failed := e.awaitPhase(pod, corev1.PodFailed)
	if term := terminated(t, failed); term.Reason != "OOMKilled" || term.ExitCode != 137 {
		t.Fatalf("terminated %+v", term)
	}
	groupGone(t, pgid)
}

func TestPlayerLeavesPodsItDoesNotOwn(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := sdk.Attempt{RunID: "run-other", TaskID: "t", Try: 1}
	l, ann := kube.AttemptLabels(a)
	pod, err := e.cs.CoreV1().Pods(e.ns).Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "not-owned", Labels: l, Annotations: ann},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, NodeName: e.node,
			Containers: []corev1.Container{{Name: kube.TaskContainer, Image: "x", Command: []string{"reaper-agent"}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.awaitPhase(pod, corev1.PodRunning)
	// An owned pod created after it runs to its end first: by then the
	// player has seen both.
	owned := e.agentPod(sdk.Attempt{RunID: "run-owned", TaskID: "t", Try: 1}, `true`)
	e.awaitPhase(owned, corev1.PodSucceeded)
	if _, _, ok := e.player.Process(pod.Name); ok {
		t.Fatal("the player ran a pod it does not own")
	}
}

// The kube runner's own pod (kuberunner.BuildPod), handed to the player:
// the agent finds its record file where the runner says, in pod mode
// without being told, and reports to the board itself. Its exchange
// proves its pod with the token the player projects as a kubelet does (a
// TokenRequest for the task ServiceAccount bound to the pod), which the
// API has the real API server review; the pod's UID is recorded only
// after the create, as the runner does, so an early exchange is told to
// retry.
func TestPlayedKubeRunnerPodRunsTheAgentInPodMode(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := sdk.Attempt{RunID: "run-runner", TaskID: "load.c", Try: 1}
	b := e.boardUpTo(false, a)
	ti, err := b.store.TaskInstance(context.Background(), a.RunID, a.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	ti.Command = "echo from the runner pod"
	// The runner's own credential seam: the attempt API (served in process)
	// mints the attempt's credential, and the agent reports through it.
	if err := kubetest.CreateServiceAccount(context.Background(), e.cs, e.ns, kuberunner.ServiceAccountDefault); err != nil {
		t.Fatal(err)
	}
	pods, err := kuberunner.NewPodVerifier(kuberunner.Settings{Namespace: e.ns}, e.cs)
	if err != nil {
		t.Fatal(err)
	}
	meter := &attemptapitest.Meter{}
	api := attemptapitest.Start(t, b.w, attemptapitest.Options{Pods: pods, Meter: meter})
	env, err := kuberunner.MintedCredentials{Minter: api.Issuer, Recorder: b.w}.Env(context.Background(), a, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	pod := kuberunner.BuildPod(kuberunner.PodSpec{Namespace: e.ns, Image: "agent", AgentPath: "/usr/local/bin/reaper-agent",
		Heartbeat: 100 * time.Millisecond, TerminationGrace: time.Second, DispatchLost: time.Minute, CredentialCeiling: time.Hour},
		ti, env)
	pod.Spec.NodeName = e.node
	kubelet.Own(pod)
	e.player.MapCommand("/usr/local/bin/reaper-agent", e.s.agent)
	pod, err = e.cs.CoreV1().Pods(e.ns).Create(context.Background(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := b.w.RecordPod(context.Background(), a, string(pod.UID), pod.CreationTimestamp.Time, time.Now()); err != nil || !ok {
		t.Fatalf("recording the pod: %v %v", ok, err)
	}
	done := e.awaitPhase(pod, corev1.PodSucceeded)
	if n := meter.Count(attemptapi.CallExchange + "/ok"); n != 1 {
		t.Fatalf("the agent's exchange metered ok %d times, want 1 (its pod proved)", n)
	}
	if rec := recordOf(t, done); rec.Outcome != podrecord.Success || rec.Attempt() != a {
		t.Fatalf("record %+v", rec)
	}
	if ti, err := b.store.TaskInstance(context.Background(), a.RunID, a.TaskID); err != nil || ti.State != sdk.StateSuccess {
		t.Fatalf("row %s (%v); want success as the agent reported it", ti.State, err)
	}
}
