package kuberunner_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/host/gate"
	"github.com/dexaflow/reaper/plugins/warmworker"
	"github.com/dexaflow/reaper/runner/attemptapi/attemptapitest"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/runner/kuberunner"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/sdk/sdktest"
	"github.com/dexaflow/reaper/substrate/kube"
	"github.com/dexaflow/reaper/testkit/eventually"
	"github.com/dexaflow/reaper/testkit/kubetest"
	"github.com/dexaflow/reaper/testkit/kubetest/kubelet"
)

// The warm pool on the real API server with KWOK, real reaper-agent
// processes in worker mode played as the pods' containers (the kubelet
// player), the attempt API served in process over real TLS, and a real
// PostgreSQL board. The runner's and the API's clock is the test's fake
// one; the workers run in real time (a short poll and heartbeat).

var agentBin struct {
	once sync.Once
	path string
	err  error
}

// agentBinary builds reaper-agent once per test binary.
func agentBinary(t *testing.T) string {
	t.Helper()
	agentBin.once.Do(func() {
		dir, err := os.MkdirTemp("", "kuberunner-agent-")
		if err != nil {
			agentBin.err = err
			return
		}
		agentBin.path = filepath.Join(dir, "reaper-agent")
		out, err := exec.Command("go", "build", "-o", agentBin.path, "github.com/dexaflow/reaper/cmd/reaper-agent").CombinedOutput()
		if err != nil {
			agentBin.err = &buildError{out: string(out), err: err}
		}
	})
	if agentBin.err != nil {
		t.Fatal(agentBin.err)
	}
	return agentBin.path
}

type buildError struct {
	out string
	err error
}

func (e *buildError) Error() string { return "building reaper-agent: " + e.err.Error() + "\n" + e.out }

// warmEnv is an env with a node, the kubelet player and the attempt API,
// which asks every worker's exchange to prove its pod (the kube edition's
// pod proof, over the real API server's TokenReviews).
type warmEnv struct {
	*env
	node      string
	player    *kubelet.Player
	api       *attemptapitest.API
	log       *sdktest.LogBuffer
	meter     *attemptapitest.Meter
	decisions *decisions
}

func newWarmEnv(t *testing.T) *warmEnv {
	t.Helper()
	e := &warmEnv{env: newEnv(t), log: &sdktest.LogBuffer{}, meter: &attemptapitest.Meter{}, decisions: &decisions{}}
	e.node = e.c.AddNode(t, "").Name
	p, err := kubelet.Start(context.Background(), kubelet.Config{
		Client: e.cs, Namespace: e.ns, Dir: filepath.Join(t.TempDir(), "containers"),
		Commands: map[string]string{kuberunner.AgentPathDefault: agentBinary(t)}, MaxGrace: time.Second,
		Logger: hclog.New(&hclog.LoggerOptions{Output: e.log, Level: hclog.Info}),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	e.player = p
	e.api = attemptapitest.Start(t, e.w, attemptapitest.Options{Clock: e.clk, Meter: e.meter, Decisions: e.decisions.add,
		Pods: e.podVerifier(t), Logger: hclog.New(&hclog.LoggerOptions{Output: e.log, Level: hclog.Info, Name: "attempt-api"})})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("player, API and runner log:\n%s", e.log.String())
		}
	})
	return e
}

// warmConfig is a runner with a warm pool of size workers, whose pods the
// player runs on the env's node.
func (e *warmEnv) warmConfig(size int) kuberunner.Config {
	cfg := e.config(e.cs)
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Output: e.log, Level: hclog.Debug, Name: "runner"})
	cfg.Heartbeat = 200 * time.Millisecond
	cfg.TerminationGrace = time.Second
	cfg.Credentials = kuberunner.MintedCredentials{Minter: e.api.Issuer, Recorder: e.w}
	// The fake clock runs ahead of the workers' real time (a second per
	// cycle of cycleUntil): the unclaimed requeue is left out unless a test
	// sets it, so a worker slowed by a loaded machine is not taken for a
	// wedged one.
	cfg.WarmPool = &kuberunner.WarmPool{Size: size, Poll: 100 * time.Millisecond, UnclaimedAfter: 24 * time.Hour,
		Credentials: kuberunner.MintedWorkerCredentials{Minter: e.api.Issuer}}
	cfg.Customize = func(p *corev1.Pod) {
		p.Spec.NodeName = e.node
		kubelet.Own(p)
	}
	return cfg
}

// workers lists the pool's pods by name.
func (e *warmEnv) workers(t *testing.T) map[string]corev1.Pod {
	t.Helper()
	list, err := e.cs.CoreV1().Pods(e.ns).List(context.Background(), metav1.ListOptions{LabelSelector: kube.LabelWarmPool})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]corev1.Pod{}
	for _, p := range list.Items {
		out[p.Name] = p
	}
	return out
}

func (e *warmEnv) refill(t *testing.T, r *kuberunner.Runner) kuberunner.RefillResult {
	t.Helper()
	res, err := r.Refill(context.Background(), e.clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// workersRunning waits for n of the pool's worker processes to run.
func (e *warmEnv) workersRunning(t *testing.T, n int) []string {
	t.Helper()
	var names []string
	eventually.True(t, clusterWait, "warm worker processes to run", func() bool {
		names = names[:0]
		for name := range e.workers(t) {
			if _, _, ok := e.player.Process(name); ok {
				names = append(names, name)
			}
		}
		return len(names) >= n
	}, eventually.Every(clusterPoll))
	slices.Sort(names)
	return names
}

func (e *warmEnv) mkWarmRun(t *testing.T, runID string, tasks ...lifecycle.NewTask) {
	t.Helper()
	e.mkRunOf(t, sdk.ExecutorWarm, runID, tasks...)
}

// cycleUntil runs runner cycles (the fake clock a second further each
// time) until done holds for the task instance, bounded.
func (e *warmEnv) cycleUntil(t *testing.T, r *kuberunner.Runner, runID, taskID, what string, done func(board.TaskInstance) bool) board.TaskInstance {
	t.Helper()
	var ti board.TaskInstance
	eventually.True(t, clusterWait, what, func() bool {
		e.clk.Advance(time.Second)
		cycle(t, r, e.clk.Now())
		ti = e.ti(t, runID, taskID)
		return done(ti)
	}, eventually.Every(clusterPoll))
	return ti
}

// clusterWait bounds a wait on the test cluster (its API server, the
// kubelet player's processes); clusterPoll is its pace, which also sets how
// fast cycleUntil moves the fake clock.
const (
	clusterWait = 120 * time.Second
	clusterPoll = 50 * time.Millisecond
)

// TestWarmPoolFilledToSizeAndRefilledAfterAWorkerPodIsDeleted: the refill
// keeps Size live worker pods, each labelled for the substrate's
// warm_pool_selector, with the agent in worker mode and no
// activeDeadlineSeconds; a deleted worker is replaced by a new one.
func TestWarmPoolFilledToSizeAndRefilledAfterAWorkerPodIsDeleted(t *testing.T) {
	e := newWarmEnv(t)
	r := e.runner(t, e.warmConfig(2))
	if res := e.refill(t, r); res.Live != 0 || len(res.Created) != 2 {
		t.Fatalf("first refill %+v: want 2 created", res)
	}
	ws := e.workers(t)
	if len(ws) != 2 {
		t.Fatalf("%d worker pods", len(ws))
	}
	for name, p := range ws {
		if p.Labels[kube.LabelWarmPool] != kuberunner.WarmPoolNameDefault || !strings.HasPrefix(name, "reaper-warm-default-") {
			t.Errorf("worker %s labels %v", name, p.Labels)
		}
		if p.Spec.ActiveDeadlineSeconds != nil {
			t.Errorf("worker %s has activeDeadlineSeconds %d: a warm pod has none", name, *p.Spec.ActiveDeadlineSeconds)
		}
		c := p.Spec.Containers[0]
		args := strings.Join(c.Args, " ")
		if c.Name != kuberunner.WorkerContainer || !strings.Contains(args, "-mode=worker") ||
			!strings.Contains(args, "-worker="+name) || !strings.Contains(args, "-watchdog=1h0m0s") {
			t.Errorf("worker %s container %s args %q", name, c.Name, args)
		}
		var token bool
		for _, env := range c.Env {
			token = token || (env.Name == "REAPER_WORKER_TOKEN" && attempttoken.IsWorkerBootstrap(env.Value))
		}
		if !token {
			t.Errorf("worker %s has no worker bootstrap token in its environment", name)
		}
	}
	if res := e.refill(t, r); res.Live != 2 || len(res.Created) != 0 {
		t.Fatalf("refill of a full pool %+v", res)
	}
	names := e.workersRunning(t, 2)
	if err := e.cs.CoreV1().Pods(e.ns).Delete(context.Background(), names[0], metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, clusterWait, "the deleted worker pod to go", func() bool { _, ok := e.workers(t)[names[0]]; return !ok }, eventually.Every(clusterPoll))
	res := e.refill(t, r)
	if res.Live != 1 || len(res.Created) != 1 || res.Created[0] == names[0] {
		t.Fatalf("refill after a delete %+v", res)
	}
}

// TestWarmPoolRefillLoopIsNotHeldByTheSettlingGate: the refill is a loop of
// its own that waits only for leadership: while the reapers' settling gate
// of the same leadership still holds (inside the grace, no sweep yet), and
// before the runner's first cycle, the pool is filled, and a worker pod
// deleted then is replaced at the next refill.
func TestWarmPoolRefillLoopIsNotHeldByTheSettlingGate(t *testing.T) {
	e := newWarmEnv(t)
	cfg := e.warmConfig(1)
	refilled := make(chan kuberunner.RefillResult, 64)
	cfg.OnRefill = func(res kuberunner.RefillResult, _ error) { refilled <- res }
	cycles := make(chan struct{}, 64)
	cfg.OnResult = func(kuberunner.Result) { cycles <- struct{}{} }
	cfg.Leading = func(time.Time) (int64, bool) { return e.term, true }
	r := e.runner(t, cfg)
	l := ladder.Defaults()
	leaderSince := e.clk.Now()
	g := gate.New(l.SettlingGrace)
	g.Lead(e.term, leaderSince)
	gateHolds := func() {
		t.Helper()
		if v := g.Check(e.clk.Now(), true); v.Open || v.Label != sdk.LabelSettlingSkip {
			t.Fatalf("the settling gate does not hold: %+v", v)
		}
	}
	created := func(what string) {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for {
			select {
			case res := <-refilled:
				if len(res.Created) == 1 {
					return
				}
			case <-deadline:
				t.Fatalf("the pool was not %s", what)
			}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := r.Run(ctx); err != nil {
			t.Error(err)
		}
	}()
	defer func() { cancel(); <-done }()
	created("filled")
	gateHolds()
	select {
	case <-cycles:
		t.Fatal("a runner cycle ran: the fake clock never ticked")
	default:
	}
	names := e.workersRunning(t, 1)
	if err := e.cs.CoreV1().Pods(e.ns).Delete(context.Background(), names[0], metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, clusterWait, "the deleted worker pod to go", func() bool { _, ok := e.workers(t)[names[0]]; return !ok }, eventually.Every(clusterPoll))
	e.clk.Advance(kuberunner.WarmRefillDefault)
	created("refilled")
	gateHolds()
}

// TestWarmAttemptRunsOnAWorkerAndSucceedsEndToEnd: a warm attempt is bound
// to a live worker, claimed with the worker's credential, run by the
// worker with the attempt's own credential (RUNNING, heartbeats, the
// report), and its run finishes.
func TestWarmAttemptRunsOnAWorkerAndSucceedsEndToEnd(t *testing.T) {
	e := newWarmEnv(t)
	r := e.runner(t, e.warmConfig(1))
	e.refill(t, r)
	names := e.workersRunning(t, 1)
	e.mkWarmRun(t, "run-warm", lifecycle.NewTask{TaskID: "hello", Command: "echo warm hello"})
	start := time.Now()
	res := cycle(t, r, e.clk.Now())
	if res.WarmBound != 1 {
		t.Fatalf("cycle %+v: want one warm attempt bound", res)
	}
	ti := e.ti(t, "run-warm", "hello")
	// Bound to the worker with its credential minted; the worker polls its
	// claims, so a quick one may have started the attempt (or even ended it)
	// by the time the row is read.
	bound := ti.State == sdk.StateQueued || ti.State == sdk.StateRunning || ti.State == sdk.StateSuccess
	if !bound || ti.WarmWorker != names[0] || ti.CredentialMintedAt.IsZero() {
		t.Fatalf("row %s on %q minted %v: want bound to %s", ti.State, ti.WarmWorker, ti.CredentialMintedAt, names[0])
	}
	ti = e.cycleUntil(t, r, "run-warm", "hello", "the warm attempt to succeed", func(ti board.TaskInstance) bool {
		return ti.State == sdk.StateSuccess
	})
	if ti.RunningAt.IsZero() {
		t.Fatalf("row %+v: never reported running", ti)
	}
	t.Logf("bind to success through a warm worker: %s (poll %s, wall clock, under load)", time.Since(start).Round(time.Millisecond),
		100*time.Millisecond)
	cycle(t, r, e.clk.Now())
	if run, err := e.w.Run(context.Background(), "run-warm"); err != nil || run.State != sdk.RunSuccess {
		t.Fatalf("run %s (%v)", run.State, err)
	}
	if len(e.pods(t)) != 1 { // the worker only: a warm attempt has no pod of its own
		t.Fatalf("%d pods", len(e.pods(t)))
	}
}

// TestWarmFailingTaskIsReportedFailedWithItsRetrySpent: a warm task that
// exits non-zero is reported failed through the API (no outcome record:
// the worker's pod serves other attempts), the retry rail runs its next
// try on a worker, and with no retry left it stays failed, a task
// failure.
func TestWarmFailingTaskIsReportedFailedWithItsRetrySpent(t *testing.T) {
	e := newWarmEnv(t)
	r := e.runner(t, e.warmConfig(1))
	e.refill(t, r)
	e.workersRunning(t, 1)
	e.mkWarmRun(t, "run-fail", lifecycle.NewTask{TaskID: "boom", Command: "exit 3", Retries: 1})
	ti := e.cycleUntil(t, r, "run-fail", "boom", "the second try to fail", func(ti board.TaskInstance) bool {
		return ti.Try == 2 && ti.State == sdk.StateFailed
	})
	if ti.LastFailureKind != sdk.FailureTask || ti.Retries != 0 || ti.ErrorMessage != "exit_code: task exited with code 3" {
		t.Fatalf("row %s/%s retries %d %q", ti.State, ti.LastFailureKind, ti.Retries, ti.ErrorMessage)
	}
	cycle(t, r, e.clk.Now())
	if run, err := e.w.Run(context.Background(), "run-fail"); err != nil || run.State != sdk.RunFailed {
		t.Fatalf("run %s (%v)", run.State, err)
	}
}

// TestWarmWatchdogKillsTheAttemptAtTheCredentialCeiling: the worker's
// attempt watchdog (the credential ceiling; a warm pod has no deadline)
// kills a task that would run on and reports it failed as
// credential_ceiling, a task failure.
func TestWarmWatchdogKillsTheAttemptAtTheCredentialCeiling(t *testing.T) {
	e := newWarmEnv(t)
	cfg := e.warmConfig(1)
	cfg.Ladder.CredentialCeiling = 2 * time.Second // the worker's watchdog, in its real time
	r := e.runner(t, cfg)
	e.refill(t, r)
	e.workersRunning(t, 1)
	e.mkWarmRun(t, "run-dog", lifecycle.NewTask{TaskID: "forever", Command: "sleep 1000"})
	ti := e.cycleUntil(t, r, "run-dog", "forever", "the watchdog to end the attempt", func(ti board.TaskInstance) bool {
		return ti.State == sdk.StateFailed
	})
	if ti.LastFailureKind != sdk.FailureTask || ti.FailureReason != sdk.LabelCredentialCeiling ||
		!strings.HasPrefix(ti.ErrorMessage, sdk.LabelCredentialCeiling+": ") {
		t.Fatalf("row %s/%s %q %q", ti.State, ti.LastFailureKind, ti.FailureReason, ti.ErrorMessage)
	}
}

// TestWarmWorkerPodDeletedWithARunningAttempt_WarmWorkerLostThenReplacedOnAnotherWorker:
// the worker pod running an attempt is deleted; its container is stopped
// with the attempt unreported; the warm-worker-lost reaper (in process,
// over the real kube substrate) fails it on the infra rail, provisionally
// (a reaper never confirms its own mark); the reconcile sweep confirms it
// from the warm pool's live list; the runner re-places it on the infra
// budget, binds it to another worker, and it succeeds there.
func TestWarmWorkerPodDeletedWithARunningAttempt_WarmWorkerLostThenReplacedOnAnotherWorker(t *testing.T) {
	e := newWarmEnv(t)
	r := e.runner(t, e.warmConfig(2))
	e.refill(t, r)
	e.workersRunning(t, 2)
	gate := filepath.Join(t.TempDir(), "go")
	e.mkWarmRun(t, "run-lost", lifecycle.NewTask{TaskID: "wait",
		Command: `while [ ! -f "` + gate + `" ]; do sleep 0.1; done`})
	ti := e.cycleUntil(t, r, "run-lost", "wait", "the attempt to run", func(ti board.TaskInstance) bool {
		return ti.State == sdk.StateRunning
	})
	first, lost := ti.Attempt, ti.WarmWorker
	if err := e.cs.CoreV1().Pods(e.ns).Delete(context.Background(), lost, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, clusterWait, "the worker pod to go", func() bool { _, ok := e.workers(t)[lost]; return !ok }, eventually.Every(clusterPoll))

	sub := kube.NewWithOptions(hclog.NewNullLogger(), kube.Options{RestConfig: e.c.ConfigFor(kubetest.Admin)})
	if err := sub.Configure(context.Background(), sdk.ConfigureRequest{Edition: ladder.EditionKube,
		Values: sdk.Values{"namespace": e.ns}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sub.Close)
	reaper := warmworker.New(nil)
	var sink sdk.Collector
	// The pass comes after the dispatch: a worker that claimed within the
	// cycle that bound the attempt leaves its queued_at at the clock's
	// reading, which a pass at the same instant does not list.
	e.clk.Advance(time.Second)
	now := e.clk.Now()
	l := ladder.Defaults()
	if _, err := reaper.Reap(context.Background(), sdk.Pass{Now: now, Ladder: l, Term: e.term,
		Deadline: now.Add(l.MaintenanceInterval), Edition: ladder.EditionKube}, e.store, sub, &sink); err != nil {
		t.Fatal(err)
	}
	ds := sink.Decisions()
	if len(ds) != 1 || ds[0].Label != sdk.LabelWarmWorkerLost || !ds[0].Applied || ds[0].Attempt != first {
		t.Fatalf("decisions %+v: want warm_worker_lost of %s", ds, first)
	}
	ti = e.ti(t, "run-lost", "wait")
	if ti.LastFailureKind != sdk.FailureInfra || !ti.InfraConfirmedAt.IsZero() {
		t.Fatalf("row %s/%s confirmed %v: want a provisional infra mark", ti.State, ti.LastFailureKind, ti.InfraConfirmedAt)
	}
	eventually.True(t, clusterWait, "the substrate's cache to sync", func() bool { ok, err := sub.Synced(context.Background()); return err == nil && ok }, eventually.Every(clusterPoll))
	if _, err := sub.Sweep(context.Background(), sdk.SweepRequest{Now: e.clk.Now(), Term: e.term, Ladder: l}, e.store); err != nil {
		t.Fatal(err)
	}
	if ti = e.ti(t, "run-lost", "wait"); ti.InfraConfirmedAt.IsZero() {
		t.Fatalf("the sweep did not confirm the warm mark: row %s/%s", ti.State, ti.LastFailureKind)
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	e.refill(t, r)
	ti = e.cycleUntil(t, r, "run-lost", "wait", "the re-placed attempt to succeed", func(ti board.TaskInstance) bool {
		return ti.State == sdk.StateSuccess
	})
	if ti.Try != first.Try || ti.Epoch <= first.Epoch || ti.InfraUsed != 1 || ti.Retries != 0 {
		t.Fatalf("row try %d epoch %d infra used %d: want the same try on a new epoch, one re-place", ti.Try, ti.Epoch, ti.InfraUsed)
	}
}

// TestWarmQueuedAttemptOfAWorkerGoneIsRequeuedAndRunsOnAnother: an
// attempt bound to a worker that never started it (here a Running worker
// pod whose process never claims, then deleted) goes back to scheduled on
// the warm requeue rail (a new epoch, unbound, no retry or infra budget
// spent) and then runs on a new worker. A Pending worker is bound nothing.
func TestWarmQueuedAttemptOfAWorkerGoneIsRequeuedAndRunsOnAnother(t *testing.T) {
	e := newWarmEnv(t)
	cfg := e.warmConfig(1)
	mode := "pending" // then "silent" (Running, never claims), then the real worker
	customize := cfg.Customize
	cfg.Customize = func(p *corev1.Pod) {
		switch mode {
		case "silent":
			customize(p)
			p.Spec.Containers[0].Command, p.Spec.Containers[0].Args = []string{"sleep"}, []string{"1000"}
		case "worker":
			customize(p)
		}
	}
	r := e.runner(t, cfg)
	e.refill(t, r)
	e.mkWarmRun(t, "run-requeue", lifecycle.NewTask{TaskID: "t", Command: "true"})
	if res := cycle(t, r, e.clk.Now()); res.WarmBound != 0 || e.ti(t, "run-requeue", "t").State != sdk.StateScheduled {
		t.Fatalf("cycle %+v: a Pending worker was bound an attempt", res)
	}
	for name := range e.workers(t) {
		if err := e.cs.CoreV1().Pods(e.ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mode = "silent"
	eventually.True(t, clusterWait, "the silent worker to run", func() bool {
		e.refill(t, r) // the deleted Pending worker is replaced once it is gone
		for _, p := range e.workers(t) {
			if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
				return true
			}
		}
		return false
	}, eventually.Every(clusterPoll))
	if res := cycle(t, r, e.clk.Now()); res.WarmBound != 1 {
		t.Fatalf("cycle %+v", res)
	}
	bound := e.ti(t, "run-requeue", "t")
	if err := e.cs.CoreV1().Pods(e.ns).Delete(context.Background(), bound.WarmWorker, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, clusterWait, "the silent worker pod to go", func() bool { _, ok := e.workers(t)[bound.WarmWorker]; return !ok }, eventually.Every(clusterPoll))
	e.clk.Advance(time.Second)
	res := cycle(t, r, e.clk.Now())
	if res.WarmRequeued != 1 || !slices.Contains(labels(res), sdk.LabelWarmRequeue) {
		t.Fatalf("cycle %+v %v: want one warm_requeue", res, labels(res))
	}
	ti := e.ti(t, "run-requeue", "t")
	if ti.State != sdk.StateScheduled || ti.Epoch != bound.Epoch+1 || ti.WarmWorker != "" || ti.Retries != bound.Retries ||
		ti.InfraUsed != 0 {
		t.Fatalf("row %s epoch %d on %q retries %d infra %d", ti.State, ti.Epoch, ti.WarmWorker, ti.Retries, ti.InfraUsed)
	}
	mode = "worker"
	e.refill(t, r)
	ti = e.cycleUntil(t, r, "run-requeue", "t", "the requeued attempt to succeed", func(ti board.TaskInstance) bool {
		return ti.State == sdk.StateSuccess
	})
	if ti.Epoch != bound.Epoch+1 {
		t.Fatalf("succeeded on epoch %d", ti.Epoch)
	}
}

// TestWarmAttemptLeftUnclaimedByALiveWorkerIsRequeuedAndTheWorkerShunned:
// a Running worker that does not start the attempt bound to it within the
// dispatch-lost threshold (here a worker process that never claims) has it
// requeued on the warm requeue rail, and is bound nothing for as long
// again: the attempt runs on another worker.
func TestWarmAttemptLeftUnclaimedByALiveWorkerIsRequeuedAndTheWorkerShunned(t *testing.T) {
	e := newWarmEnv(t)
	cfg := e.warmConfig(2)
	cfg.WarmPool.UnclaimedAfter = 0 // the default: the ladder's dispatch_lost
	n := 0
	customize := cfg.Customize
	cfg.Customize = func(p *corev1.Pod) {
		n++
		switch n {
		case 1: // placed, Running, never claims
			customize(p)
			p.Spec.Containers[0].Command, p.Spec.Containers[0].Args = []string{"sleep"}, []string{"1000"}
		case 2: // left Pending: bound nothing
		default:
			customize(p)
		}
	}
	r := e.runner(t, cfg)
	e.refill(t, r)
	var silent string
	eventually.True(t, clusterWait, "the silent worker to run", func() bool {
		for name, p := range e.workers(t) {
			if p.Status.Phase == corev1.PodRunning {
				silent = name
				return true
			}
		}
		return false
	}, eventually.Every(clusterPoll))
	e.mkWarmRun(t, "run-unclaimed", lifecycle.NewTask{TaskID: "t", Command: "true"})
	if res := cycle(t, r, e.clk.Now()); res.WarmBound != 1 || e.ti(t, "run-unclaimed", "t").WarmWorker != silent {
		t.Fatalf("cycle %+v: want the attempt bound to the silent worker %s", res, silent)
	}
	e.clk.Advance(ladder.Defaults().DispatchLost - time.Second)
	if res := cycle(t, r, e.clk.Now()); res.WarmRequeued != 0 {
		t.Fatalf("requeued inside the threshold: %+v", res)
	}
	e.clk.Advance(time.Second)
	res := cycle(t, r, e.clk.Now())
	if res.WarmRequeued != 1 || res.WarmBound != 0 {
		t.Fatalf("cycle %+v %v: want the attempt requeued and not bound to the shunned worker again", res, labels(res))
	}
	for _, d := range res.Decisions {
		if d.Label == sdk.LabelWarmRequeue && (d.Evidence["worker_pod"] != "live" || d.Evidence["warm_worker"] != silent) {
			t.Fatalf("decision evidence %v", d.Evidence)
		}
	}
	for name, p := range e.workers(t) {
		if p.Status.Phase == corev1.PodPending {
			if err := e.cs.CoreV1().Pods(e.ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	eventually.True(t, clusterWait, "a claiming worker to run", func() bool {
		e.refill(t, r)
		_, _, ok := e.player.Process(silent)
		running := 0
		for _, p := range e.workers(t) {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				running++
			}
		}
		return ok && running == 2
	}, eventually.Every(clusterPoll))
	ti := e.cycleUntil(t, r, "run-unclaimed", "t", "the requeued attempt to succeed elsewhere", func(ti board.TaskInstance) bool {
		return ti.State == sdk.StateSuccess
	})
	if ti.WarmWorker == silent || ti.Epoch != 1 {
		t.Fatalf("succeeded on %s at epoch %d: want another worker than %s, epoch 1", ti.WarmWorker, ti.Epoch, silent)
	}
}

// TestWarmAgentLostMarkConfirmedBySweepWithoutTheValve: an attempt running
// on a warm worker goes silent because its worker pod was deleted, and the
// heartbeat reaper marks it agent_lost (provisional, as every kube mark is)
// before the warm-worker-lost reaper saw the worker go. The reconcile sweep
// (the real kube substrate) confirms the mark from the warm pool's own
// signal, a live LIST without the worker, so once the valve would have
// passed the runner re-places it as a confirmed mark: infra_replace, and no
// infra_confirm_valve_open (the "reconciler broken" alert).
func TestWarmAgentLostMarkConfirmedBySweepWithoutTheValve(t *testing.T) {
	e := newWarmEnv(t)
	r := e.runner(t, e.warmConfig(1))
	e.refill(t, r)
	e.workersRunning(t, 1)
	gate := filepath.Join(t.TempDir(), "go")
	e.mkWarmRun(t, "run-silent", lifecycle.NewTask{TaskID: "wait",
		Command: `while [ ! -f "` + gate + `" ]; do sleep 0.1; done`})
	ti := e.cycleUntil(t, r, "run-silent", "wait", "the attempt to run", func(ti board.TaskInstance) bool {
		return ti.State == sdk.StateRunning
	})
	first, lost := ti.Attempt, ti.WarmWorker
	if err := e.cs.CoreV1().Pods(e.ns).Delete(context.Background(), lost, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, clusterWait, "the worker pod to go", func() bool { _, ok := e.workers(t)[lost]; return !ok }, eventually.Every(clusterPoll))
	// The heartbeat reaper's mark: provisional.
	if ok, err := e.w.Fail(context.Background(), first, []string{sdk.StateRunning}, lifecycle.Failure{Kind: sdk.MarkInfra,
		Reason: sdk.LabelAgentLost, Message: "agent_lost: silent"}, e.clk.Now()); err != nil || !ok {
		t.Fatalf("marking %s agent_lost: %v, %v", first, ok, err)
	}

	sub := kube.NewWithOptions(hclog.NewNullLogger(), kube.Options{RestConfig: e.c.ConfigFor(kubetest.Admin)})
	if err := sub.Configure(context.Background(), sdk.ConfigureRequest{Edition: ladder.EditionKube,
		Values: sdk.Values{"namespace": e.ns}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sub.Close)
	eventually.True(t, clusterWait, "the substrate's cache to sync", func() bool { ok, err := sub.Synced(context.Background()); return err == nil && ok }, eventually.Every(clusterPoll))
	res, err := sub.Sweep(context.Background(), sdk.SweepRequest{Now: e.clk.Now(), Term: e.term, Ladder: ladder.Defaults()}, e.store)
	if err != nil {
		t.Fatal(err)
	}
	var confirmed bool
	for _, d := range res.Decisions {
		confirmed = confirmed || (d.Label == sdk.LabelReconcileInfraConfirmed && d.Applied && d.Attempt == first)
	}
	if ti := e.ti(t, "run-silent", "wait"); !confirmed || ti.InfraConfirmedAt.IsZero() {
		t.Fatalf("the sweep did not confirm the warm mark: decisions %+v, row confirmed %v", res.Decisions, ti.InfraConfirmedAt)
	}

	e.clk.Advance(ladder.Defaults().InfraConfirmValve + time.Second)
	got := labels(cycle(t, r, e.clk.Now()))
	if slices.Contains(got, sdk.LabelInfraConfirmValveOpen) || !slices.Contains(got, sdk.LabelInfraReplace) {
		t.Fatalf("runner decisions %v: want infra_replace and no infra_confirm_valve_open", got)
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	e.refill(t, r)
	ti = e.cycleUntil(t, r, "run-silent", "wait", "the re-placed attempt to succeed", func(ti board.TaskInstance) bool {
		return ti.State == sdk.StateSuccess
	})
	if ti.Epoch <= first.Epoch || ti.InfraUsed != 1 {
		t.Fatalf("row epoch %d infra used %d: want a new epoch, one re-place", ti.Epoch, ti.InfraUsed)
	}
}

// TestWarmAgentLostMarkOnALiveWorkerConfirmedFromItsClaim: an attempt on a
// warm worker is marked agent_lost while its worker pod lives on (the
// heartbeat reaper's provisional mark). The worker is told to stop the
// attempt at its next heartbeat, its run ends, and its next claims say it
// runs nothing; once a claim timed after the mark says so, the reconcile
// sweep (the real kube substrate) confirms the mark from the worker's word,
// the worker's pod still running, and past the valve the runner re-places
// it as a confirmed mark: infra_replace, and no infra_confirm_valve_open.
func TestWarmAgentLostMarkOnALiveWorkerConfirmedFromItsClaim(t *testing.T) {
	e := newWarmEnv(t)
	r := e.runner(t, e.warmConfig(1))
	e.refill(t, r)
	e.workersRunning(t, 1)
	e.mkWarmRun(t, "run-live", lifecycle.NewTask{TaskID: "wait", Command: `while true; do sleep 0.1; done`})
	ti := e.cycleUntil(t, r, "run-live", "wait", "the attempt to run", func(ti board.TaskInstance) bool {
		return ti.State == sdk.StateRunning && !ti.LastHeartbeatAt.IsZero()
	})
	first, worker := ti.Attempt, ti.WarmWorker
	marked := e.clk.Now()
	if ok, err := e.w.Fail(context.Background(), first, []string{sdk.StateRunning}, lifecycle.Failure{Kind: sdk.MarkInfra,
		Reason: sdk.LabelAgentLost, Message: "agent_lost: silent"}, marked); err != nil || !ok {
		t.Fatalf("marking %s agent_lost: %v, %v", first, ok, err)
	}
	// The worker's claims after the attempt ended present tokens issued
	// from now on: after the mark.
	e.clk.Advance(time.Second)

	sub := kube.NewWithOptions(hclog.NewNullLogger(), kube.Options{RestConfig: e.c.ConfigFor(kubetest.Admin)})
	if err := sub.Configure(context.Background(), sdk.ConfigureRequest{Edition: ladder.EditionKube,
		Values: sdk.Values{"namespace": e.ns}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sub.Close)
	eventually.True(t, clusterWait, "the substrate's cache to sync", func() bool { ok, err := sub.Synced(context.Background()); return err == nil && ok }, eventually.Every(clusterPoll))
	var confirm sdk.Decision
	eventually.True(t, clusterWait, "the sweep to confirm the mark from the worker's claim", func() bool {
		res, err := sub.Sweep(context.Background(), sdk.SweepRequest{Now: e.clk.Now(), Term: e.term, Ladder: ladder.Defaults()}, e.store)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range res.Decisions {
			if d.Label == sdk.LabelReconcileInfraConfirmed && d.Attempt == first {
				confirm = d
				return true
			}
		}
		return false
	}, eventually.Every(clusterPoll))
	if !confirm.Applied || confirm.Evidence["warm_signal"] != "worker_claim" || confirm.Evidence["warm_worker"] != worker {
		t.Fatalf("confirmation %+v: want it applied on worker %s's claim", confirm, worker)
	}
	if at, err := time.Parse(time.RFC3339Nano, confirm.Evidence["warm_claimed_at"]); err != nil || !at.After(marked) {
		t.Fatalf("claim time %q (%v): want one after the mark %s", confirm.Evidence["warm_claimed_at"], err, marked)
	}
	if p, ok := e.workers(t)[worker]; !ok || p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
		t.Fatalf("worker %s: want its pod alive and running, got %v %+v", worker, ok, p.Status)
	}
	if ti := e.ti(t, "run-live", "wait"); ti.InfraConfirmedAt.IsZero() {
		t.Fatalf("row %+v: want the mark confirmed", ti)
	}

	e.clk.Advance(ladder.Defaults().InfraConfirmValve + time.Second)
	got := labels(cycle(t, r, e.clk.Now()))
	if slices.Contains(got, sdk.LabelInfraConfirmValveOpen) || !slices.Contains(got, sdk.LabelInfraReplace) {
		t.Fatalf("runner decisions %v: want infra_replace and no infra_confirm_valve_open", got)
	}
}

// TestWarmRefillOfATermThatNoLongerLeadsMakesNoPod: the refill makes pods
// before the board records them, so it asks the fence first: a refill
// under a term the board does not name (deposed, or handed to another
// replica) creates no worker pod and says so.
func TestWarmRefillOfATermThatNoLongerLeadsMakesNoPod(t *testing.T) {
	e := newWarmEnv(t)
	r := e.runner(t, e.warmConfig(2))
	res, err := r.RefillFenced(context.Background(), e.clk.Now(), 999)
	if !errors.Is(err, lifecycle.ErrDeposed) || len(res.Created) != 0 {
		t.Fatalf("refill under a term that does not lead: %+v, %v; want nothing created and ErrDeposed", res, err)
	}
	if ws := e.workers(t); len(ws) != 0 {
		t.Fatalf("%d worker pods made under a deposed term", len(ws))
	}
}
