package kuberunner_test

import (
	"bytes"
	"context"
	"errors"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/agent"
	"github.com/dexaflow/reaper/runner/attemptapi/attemptapitest"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/runner/kuberunner"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/substrate/kube"
	"github.com/dexaflow/reaper/testkit/kubetest"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

func TestMain(m *testing.M) {
	os.Exit(kubetest.RunWithin(m, kubetest.Options{NoControllerManager: true}, pgtest.Run))
}

// env is one test's world: a fresh board, a namespace of its own on the
// real API server, a fake clock.
type env struct {
	c     *kubetest.Cluster
	cs    kubernetes.Interface // admin
	ns    string
	w     *lifecycle.Writer
	store *board.Store
	dsn   string // the board's connection string (reaperctl's)
	term  int64  // the test's leadership term on the board
	clk   *clock.Fake
	logs  *bytes.Buffer // RunOnce runs on the test goroutine only
}

func newEnv(t *testing.T) *env {
	t.Helper()
	c := kubetest.Current(t)
	pool := pgtest.NewDB(t)
	ctx := context.Background()
	clk := clock.NewFake(time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC))
	store := board.New(pool, board.Options{})
	lease, ok, err := store.TryAcquire(ctx, "test", 24*time.Hour, clk.Now())
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	e := &env{c: c, cs: c.Client(t), ns: c.NewNamespace(t), w: lifecycle.New(pool, lifecycle.Options{}), store: store,
		dsn: pgtest.DSN(pool), term: lease.Term, clk: clk, logs: &bytes.Buffer{}}
	if err := kubetest.CreateServiceAccount(ctx, e.cs, e.ns, kuberunner.ServiceAccountDefault); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("runner log:\n%s", e.logs.String())
		}
	})
	return e
}

// config is a runner configuration over the env, with client cs.
func (e *env) config(cs kubernetes.Interface) kuberunner.Config {
	return kuberunner.Config{
		Client: cs, Namespace: e.ns, Image: "registry.invalid/reaper-task:test", Ladder: ladder.Defaults(),
		Clock: e.clk, Logger: hclog.New(&hclog.LoggerOptions{Output: e.logs, Level: hclog.Debug}),
	}
}

func (e *env) runner(t *testing.T, cfg kuberunner.Config) *kuberunner.Runner {
	t.Helper()
	r, err := kuberunner.New(cfg, e.w)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (e *env) mkRun(t *testing.T, runID string, tasks ...lifecycle.NewTask) {
	t.Helper()
	e.mkRunOf(t, sdk.ExecutorKube, runID, tasks...)
}

// mkRunOf creates a running run of tasks of executor (the command "true"
// unless given).
func (e *env) mkRunOf(t *testing.T, executor, runID string, tasks ...lifecycle.NewTask) {
	t.Helper()
	for i := range tasks {
		tasks[i].Executor = executor
		if tasks[i].Command == "" {
			tasks[i].Command = "true"
		}
	}
	if err := e.w.CreateRun(context.Background(), lifecycle.NewRun{RunID: runID, DagID: "dag", Tasks: tasks}, e.clk.Now()); err != nil {
		t.Fatal(err)
	}
}

func cycle(t *testing.T, r *kuberunner.Runner, now time.Time) kuberunner.Result {
	t.Helper()
	res, err := r.RunOnce(context.Background(), now)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func (e *env) ti(t *testing.T, runID, taskID string) board.TaskInstance {
	t.Helper()
	ti, err := e.w.TaskInstance(context.Background(), runID, taskID)
	if err != nil {
		t.Fatal(err)
	}
	return ti
}

// pods lists the namespace's pods by attempt.
func (e *env) pods(t *testing.T) map[sdk.Attempt]corev1.Pod {
	t.Helper()
	list, err := e.cs.CoreV1().Pods(e.ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[sdk.Attempt]corev1.Pod{}
	for _, p := range list.Items {
		try, _ := strconv.Atoi(p.Labels[kube.LabelTryNumber])
		epoch, _ := strconv.Atoi(p.Labels[kube.LabelAttemptEpoch])
		a := sdk.Attempt{RunID: p.Labels[kube.LabelRunID], TaskID: p.Annotations[kube.AnnotationRawTaskID],
			Try: int32(try), Epoch: int32(epoch)}
		out[a] = p
	}
	return out
}

// labels are the labels of res's decisions about attempts, in order. A
// run's finalization (a decision about the run, no task) is left out: the
// tests that read these are about what happened to an attempt, and a run
// of one task that failed for good finishes in the same cycle.
func labels(res kuberunner.Result) []string {
	var out []string
	for _, d := range res.Decisions {
		if d.Attempt.TaskID == "" {
			continue
		}
		out = append(out, d.Label)
	}
	return out
}

// finalized are the runs res finished, by the decisions about them: run id
// to label.
func finalized(res kuberunner.Result) map[string]string {
	out := map[string]string{}
	for _, d := range res.Decisions {
		if d.Attempt.TaskID == "" {
			out[d.Attempt.RunID] = d.Label
		}
	}
	return out
}

// TestDispatchCreatesThePodOfTheAttempt proves the pod's shape on the real
// API server: the attempt's labels (the task id lossy) and raw task id
// annotation, the task container with the outcome record path, the
// activeDeadlineSeconds arithmetic (timeout + dispatch_lost + the grace
// capped at 60 s, clamped to MaxInt32, the credential ceiling for a task
// without a timeout, none when the ceiling is disabled), and the pod's UID
// recorded on the attempt.
func TestDispatchCreatesThePodOfTheAttempt(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.mkRun(t, "run-1",
		lifecycle.NewTask{TaskID: "load_A.x", ExecutionTimeout: 10 * time.Minute},
		lifecycle.NewTask{TaskID: "no_timeout"},
		lifecycle.NewTask{TaskID: "huge", ExecutionTimeout: (math.MaxInt32 - 100) * time.Second},
	)
	cfg := e.config(e.cs)
	cfg.TerminationGrace = 90 * time.Second // over the 60 s the arithmetic adds
	cfg.ServiceAccount = "default"
	cfg.Credentials = credentials{}
	cfg.Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}}
	res := cycle(t, e.runner(t, cfg), e.clk.Now())
	if res.Scheduled != 3 || res.Dispatched != 3 || len(res.Decisions) != 0 {
		t.Fatalf("scheduled %d, dispatched %d, decisions %v: want 3, 3, none", res.Scheduled, res.Dispatched, labels(res))
	}
	pods := e.pods(t)
	want := map[string]int64{
		"load_A.x":   600 + 180 + 60,
		"no_timeout": 3600, // the credential ceiling
		"huge":       math.MaxInt32,
	}
	for task, deadline := range want {
		ti := e.ti(t, "run-1", task)
		if ti.State != sdk.StateQueued || ti.QueuedAt.IsZero() {
			t.Errorf("%s: state %s, queued at %v: want queued", task, ti.State, ti.QueuedAt)
		}
		p, ok := pods[ti.Attempt]
		if !ok {
			t.Fatalf("%s: no pod of %s among %d", task, ti.Attempt, len(pods))
		}
		lbl, ann := kube.AttemptLabels(ti.Attempt)
		for k, v := range lbl {
			if p.Labels[k] != v {
				t.Errorf("%s: label %s = %q, want %q", task, k, p.Labels[k], v)
			}
		}
		if p.Annotations[kube.AnnotationRawTaskID] != ann[kube.AnnotationRawTaskID] || p.Annotations[kube.AnnotationRawTaskID] != task {
			t.Errorf("%s: annotation %q", task, p.Annotations[kube.AnnotationRawTaskID])
		}
		if d := p.Annotations[kuberunner.AnnotationDispatch]; d == "" || p.Name != kuberunner.PodName(ti.Attempt, d) {
			t.Errorf("%s: pod name %s, dispatch %q: want the name of the attempt and its dispatch", task, p.Name, d)
		}
		// The outcome record finalizer: a deletion leaves the pod for the
		// sweep to read.
		if !slices.Equal(p.Finalizers, []string{kube.FinalizerOutcomeRecord}) {
			t.Errorf("%s: finalizers %q, want the outcome record's %q", task, p.Finalizers, kube.FinalizerOutcomeRecord)
		}
		if p.Spec.ActiveDeadlineSeconds == nil || *p.Spec.ActiveDeadlineSeconds != deadline {
			t.Errorf("%s: activeDeadlineSeconds %v, want %d", task, p.Spec.ActiveDeadlineSeconds, deadline)
		}
		if g := p.Spec.TerminationGracePeriodSeconds; g == nil || *g != 90 {
			t.Errorf("%s: terminationGracePeriodSeconds %v, want the declared 90", task, g)
		}
		if p.Spec.RestartPolicy != corev1.RestartPolicyNever || p.Spec.ServiceAccountName != "default" {
			t.Errorf("%s: restart policy %s, service account %q", task, p.Spec.RestartPolicy, p.Spec.ServiceAccountName)
		}
		c := p.Spec.Containers[0]
		if len(p.Spec.Containers) != 1 || c.Name != kube.TaskContainer || c.Image != cfg.Image {
			t.Errorf("%s: containers %d, the first %q with image %q", task, len(p.Spec.Containers), c.Name, c.Image)
		}
		if c.TerminationMessagePath != kuberunner.TerminationMessagePath || c.TerminationMessagePolicy != corev1.TerminationMessageReadFile {
			t.Errorf("%s: termination message %s %s", task, c.TerminationMessagePath, c.TerminationMessagePolicy)
		}
		envs := map[string]string{}
		for _, v := range c.Env {
			envs[v.Name] = v.Value
		}
		if envs[kuberunner.EnvRecordFile] != kuberunner.TerminationMessagePath || envs["REAPER_ATTEMPT_TOKEN"] != "token-of-"+ti.Attempt.String() {
			t.Errorf("%s: environment %v: want the record file and the attempt's credential", task, envs)
		}
		if !c.Resources.Limits.Memory().Equal(resource.MustParse("64Mi")) {
			t.Errorf("%s: resources %v", task, c.Resources)
		}
		rec, err := e.w.RecordedPod(ctx, ti.Attempt)
		if err != nil || rec.UID == "" || rec.UID != string(p.UID) || rec.Name != p.Name {
			t.Errorf("%s: recorded pod %+v (%v), pod %s UID %q", task, rec, err, p.Name, p.UID)
		}
	}

	// A non-positive credential ceiling disables the floor: a task without
	// a timeout gets no deadline at all.
	e.mkRun(t, "run-2", lifecycle.NewTask{TaskID: "no_timeout"})
	cfg = e.config(e.cs)
	cfg.Ladder.CredentialCeiling = 0
	if res := cycle(t, e.runner(t, cfg), e.clk.Now()); res.Dispatched != 1 {
		t.Fatalf("dispatched %d, decisions %v", res.Dispatched, labels(res))
	}
	p := e.pods(t)[e.ti(t, "run-2", "no_timeout").Attempt]
	if p.Name == "" || p.Spec.ActiveDeadlineSeconds != nil {
		t.Fatalf("pod %q: activeDeadlineSeconds %v, want none", p.Name, p.Spec.ActiveDeadlineSeconds)
	}
}

// credentials mints a fake credential per attempt, or fails when fail is
// set.
type credentials struct{ fail bool }

func (c credentials) Env(_ context.Context, a sdk.Attempt, _ time.Time) ([]corev1.EnvVar, error) {
	if c.fail {
		return nil, errors.New("the credential store is down")
	}
	return []corev1.EnvVar{{Name: "REAPER_ATTEMPT_TOKEN", Value: "token-of-" + a.String()}}, nil
}

// TestACredentialNotMintedIsOfferedAgain: a dispatch whose credential
// cannot be minted creates no pod and is offered again on a new epoch, as
// for an unavailable API.
func TestACredentialNotMintedIsOfferedAgain(t *testing.T) {
	e := newEnv(t)
	e.mkRun(t, "run-1", lifecycle.NewTask{TaskID: "t"})
	cfg := e.config(e.cs)
	cfg.Credentials = credentials{fail: true}
	res := cycle(t, e.runner(t, cfg), e.clk.Now())
	if !slices.Equal(labels(res), []string{sdk.LabelDispatchUnavailable}) || res.Dispatched != 0 {
		t.Fatalf("decisions %v, dispatched %d", labels(res), res.Dispatched)
	}
	if ti := e.ti(t, "run-1", "t"); ti.Epoch != 1 || ti.State != sdk.StateScheduled || len(e.pods(t)) != 0 {
		t.Fatalf("row %+v, %d pods", ti, len(e.pods(t)))
	}
}

// TestACreateRefusedFailsTheDispatchAtOnce: a create the API server refuses
// (forbidden by RBAC, an invalid pod spec) fails the dispatch as
// dispatch_failed in the same cycle: terminal, an infra failure, no new
// try and no retry taken, and never re-offered.
func TestACreateRefusedFailsTheDispatchAtOnce(t *testing.T) {
	e := newEnv(t)
	forbidden := e.config(e.c.ClientFor(t, kubetest.Alice)) // no Role: no create
	invalid := e.config(e.cs)
	invalid.Resources = corev1.ResourceRequirements{ // a request over its limit
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")},
	}
	for name, cfg := range map[string]kuberunner.Config{"Forbidden": forbidden, "InvalidSpec": invalid} {
		t.Run(name, func(t *testing.T) {
			runID := "run-" + name
			e.mkRun(t, runID, lifecycle.NewTask{TaskID: "t", Retries: 2})
			r := e.runner(t, cfg)
			res := cycle(t, r, e.clk.Now())
			if !slices.Equal(labels(res), []string{sdk.LabelDispatchFailed}) || res.Failed != 1 || res.OfferedAgain != 0 {
				t.Fatalf("decisions %v, failed %d, offered again %d: want one dispatch_failed", labels(res), res.Failed, res.OfferedAgain)
			}
			if got := finalized(res); got[runID] != sdk.LabelRunFinalizedFailed {
				t.Fatalf("run decisions %v: want the run of its one task finalized failed in the same cycle", got)
			}
			ti := e.ti(t, runID, "t")
			if ti.State != sdk.StateFailed || ti.LastFailureKind != sdk.FailureInfra || ti.FailureReason != sdk.LabelDispatchFailed ||
				ti.Try != 1 || ti.Epoch != 0 || !ti.DispatchUnavailableSince.IsZero() {
				t.Fatalf("row %+v: want failed, infra, dispatch_failed, try 1, epoch 0", ti)
			}
			e.clk.Advance(time.Minute)
			res = cycle(t, r, e.clk.Now())
			if after := e.ti(t, runID, "t"); after.Try != 1 || after.State != sdk.StateFailed || res.Dispatched != 0 {
				t.Fatalf("the refused task ran again: %+v", after)
			}
			if run, _ := e.w.Run(context.Background(), runID); run.State != sdk.RunFailed {
				t.Fatalf("run %s, want failed", run.State)
			}
		})
	}
	if n := len(e.pods(t)); n != 0 {
		t.Fatalf("%d pods, want none", n)
	}
}

// unreachable is a client of an API server address nothing listens on:
// every create fails with connection refused.
func unreachable(t *testing.T) kubernetes.Interface {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: "https://" + addr,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// TestAnUnavailableAPIReOffersTheTaskFor15Minutes: a create that fails as
// unavailable offers the task again on a new epoch, no retry spent, each
// time; the outage clock (dispatch_unavailable_since) is the row's, so a
// new runner (a restart, a new leader) keeps it; 15 minutes after the
// first failure the task fails (dispatch_unavailable_exhausted, then
// dispatch_failed). A clear resets the clock, and once the API answers the
// cleared task gets its pod.
func TestAnUnavailableAPIReOffersTheTaskFor15Minutes(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.mkRun(t, "run-1", lifecycle.NewTask{TaskID: "t", Retries: 2})
	down := e.config(unreachable(t))
	start := e.clk.Now()

	r := e.runner(t, down)
	res := cycle(t, r, e.clk.Now())
	if !slices.Equal(labels(res), []string{sdk.LabelDispatchUnavailable}) || res.OfferedAgain != 1 {
		t.Fatalf("decisions %v, offered again %d: want one dispatch_unavailable", labels(res), res.OfferedAgain)
	}
	ti := e.ti(t, "run-1", "t")
	if ti.State != sdk.StateScheduled || ti.Try != 1 || ti.Epoch != 1 || ti.Retries != 2 || !ti.DispatchUnavailableSince.Equal(start) {
		t.Fatalf("row %+v: want scheduled, try 1, epoch 1, retries 2, unavailable since %v", ti, start)
	}

	// Offered again every cycle, the clock kept, across a new runner.
	for i, step := range []time.Duration{5 * time.Minute, 5 * time.Minute, 5*time.Minute - time.Second} {
		e.clk.Advance(step)
		if i == 1 {
			r = e.runner(t, down) // a restart: nothing of the outage is in memory
		}
		res = cycle(t, r, e.clk.Now())
		if !slices.Equal(labels(res), []string{sdk.LabelDispatchUnavailable}) {
			t.Fatalf("at %s: decisions %v", e.clk.Now().Sub(start), labels(res))
		}
		ti = e.ti(t, "run-1", "t")
		if ti.Epoch != int32(i+2) || ti.Try != 1 || ti.Retries != 2 || !ti.DispatchUnavailableSince.Equal(start) {
			t.Fatalf("at %s: row %+v", e.clk.Now().Sub(start), ti)
		}
	}

	// 15 minutes after the first failure: given up.
	e.clk.Advance(time.Second)
	res = cycle(t, r, e.clk.Now())
	if !slices.Equal(labels(res), []string{sdk.LabelDispatchUnavailableSpent}) || res.Failed != 1 {
		t.Fatalf("decisions %v, failed %d: want dispatch_unavailable_exhausted", labels(res), res.Failed)
	}
	ti = e.ti(t, "run-1", "t")
	if ti.State != sdk.StateFailed || ti.FailureReason != sdk.LabelDispatchFailed || ti.LastFailureKind != sdk.FailureInfra || ti.Try != 1 {
		t.Fatalf("row %+v: want failed as dispatch_failed, try 1", ti)
	}
	if !bytes.Contains([]byte(e.logs.String()), []byte("[ERROR]")) || !bytes.Contains([]byte(e.logs.String()), []byte("[WARN]")) {
		t.Fatalf("want a WARN per re-offer and an ERROR at the give-up in the log")
	}

	// A clear starts the task over with the clock reset; the API is back.
	rel, err := e.w.Clear(ctx, ti.Attempt, e.clk.Now())
	if err != nil || !rel.Applied {
		t.Fatal(rel, err)
	}
	if ti = e.ti(t, "run-1", "t"); !ti.DispatchUnavailableSince.IsZero() || ti.Try != 2 {
		t.Fatalf("after the clear: row %+v: want try 2 and no outage clock", ti)
	}
	e.clk.Advance(time.Second)
	res = cycle(t, e.runner(t, e.config(e.cs)), e.clk.Now())
	if res.Dispatched != 1 {
		t.Fatalf("dispatched %d, decisions %v", res.Dispatched, labels(res))
	}
	if _, ok := e.pods(t)[e.ti(t, "run-1", "t").Attempt]; !ok {
		t.Fatal("no pod of the cleared attempt")
	}
}

// TestTheOutageClockIsResetByARetry: the retry rail clears
// dispatch_unavailable_since, so a later outage gets its own 15 minutes.
func TestTheOutageClockIsResetByARetry(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.mkRun(t, "run-1", lifecycle.NewTask{TaskID: "t", Retries: 1})
	cycle(t, e.runner(t, e.config(unreachable(t))), e.clk.Now())
	e.clk.Advance(time.Minute)
	cycle(t, e.runner(t, e.config(e.cs)), e.clk.Now()) // the API is back: a pod
	ti := e.ti(t, "run-1", "t")
	if ti.State != sdk.StateQueued || ti.DispatchUnavailableSince.IsZero() {
		t.Fatalf("row %+v: want queued with the outage clock still set", ti)
	}
	if sd, err := e.w.Running(ctx, ti.Attempt, e.clk.Now()); err != nil || sd {
		t.Fatal(sd, err)
	}
	if ok, err := e.w.Fail(ctx, ti.Attempt, []string{sdk.StateRunning}, lifecycle.Failure{Kind: sdk.MarkTask, Reason: "exit_code"}, e.clk.Now()); err != nil || !ok {
		t.Fatal(ok, err)
	}
	res := cycle(t, e.runner(t, e.config(e.cs)), e.clk.Now())
	ti = e.ti(t, "run-1", "t")
	if res.Retried != 1 || ti.Try != 2 || !ti.DispatchUnavailableSince.IsZero() {
		t.Fatalf("retried %d, row %+v: want try 2 and no outage clock", res.Retried, ti)
	}
}

// TestAConfirmedInfraMarkRePlacesThePodOnANewEpoch: a confirmed infra mark
// is re-placed on the infra budget (a new epoch, the retries untouched) and
// the new attempt gets a pod of its own beside the old one; an unconfirmed
// mark waits for the confirmation valve, then is re-placed anyway
// (infra_confirm_valve_open).
func TestAConfirmedInfraMarkRePlacesThePodOnANewEpoch(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.mkRun(t, "run-1", lifecycle.NewTask{TaskID: "confirmed", Retries: 1}, lifecycle.NewTask{TaskID: "provisional", Retries: 1})
	r := e.runner(t, e.config(e.cs))
	if res := cycle(t, r, e.clk.Now()); res.Dispatched != 2 {
		t.Fatalf("dispatched %d", res.Dispatched)
	}
	old := map[string]sdk.Attempt{}
	for task, confirm := range map[string]bool{"confirmed": true, "provisional": false} {
		a := e.ti(t, "run-1", task).Attempt
		old[task] = a
		if sd, err := e.w.Running(ctx, a, e.clk.Now()); err != nil || sd {
			t.Fatal(sd, err)
		}
		ok, err := e.w.Fail(ctx, a, []string{sdk.StateRunning},
			lifecycle.Failure{Kind: sdk.MarkInfra, Reason: sdk.LabelPodLost, Confirm: confirm}, e.clk.Now())
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	e.clk.Advance(time.Second)
	res := cycle(t, r, e.clk.Now())
	if res.Replaced != 1 || res.Waiting != 1 || res.Dispatched != 1 || !slices.Equal(labels(res), []string{sdk.LabelInfraReplace}) {
		t.Fatalf("replaced %d, waiting %d, dispatched %d, decisions %v", res.Replaced, res.Waiting, res.Dispatched, labels(res))
	}
	ti := e.ti(t, "run-1", "confirmed")
	if ti.Try != 1 || ti.Epoch != 1 || ti.InfraUsed != 1 || ti.Retries != 1 || ti.State != sdk.StateQueued {
		t.Fatalf("row %+v: want try 1, epoch 1, one re-place, retries untouched, queued", ti)
	}
	pods := e.pods(t)
	if _, ok := pods[ti.Attempt]; !ok {
		t.Fatal("no pod of the re-placed attempt")
	}
	if _, ok := pods[old["confirmed"]]; !ok {
		t.Fatal("the runner touched the old attempt's pod (teardown is the substrate's)")
	}

	e.clk.Advance(ladder.Defaults().InfraConfirmValve)
	res = cycle(t, r, e.clk.Now())
	if res.Replaced != 1 || !slices.Equal(labels(res), []string{sdk.LabelInfraConfirmValveOpen, sdk.LabelInfraReplace}) {
		t.Fatalf("replaced %d, decisions %v: want the valve open, then a re-place", res.Replaced, labels(res))
	}
	if ti := e.ti(t, "run-1", "provisional"); ti.Epoch != 1 || ti.State != sdk.StateQueued {
		t.Fatalf("row %+v", ti)
	}
}

// TestACreateWhoseAnswerWasLostIsHarmless: a create that made its pod but
// whose answer never came (here: the pod made beforehand, the runner's
// client unreachable) is offered again on a new epoch, so the stray pod's
// agent is told to stop at its RUNNING report; the new attempt's pod is the
// only one that may run the task.
func TestACreateWhoseAnswerWasLostIsHarmless(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.mkRun(t, "run-1", lifecycle.NewTask{TaskID: "t"})
	cycle(t, e.runner(t, e.config(unreachable(t))), e.clk.Now()) // scheduled, then re-offered
	stray := e.ti(t, "run-1", "t").Attempt
	stray.Epoch-- // the attempt whose create "got through"
	spec := kuberunner.PodSpec{Namespace: e.ns, Image: "x", AgentPath: "reaper-agent"}
	ti := e.ti(t, "run-1", "t")
	ti.Attempt = stray
	if _, err := e.cs.CoreV1().Pods(e.ns).Create(ctx, kuberunner.BuildPod(spec, ti, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if sd, err := e.w.Running(ctx, stray, e.clk.Now()); err != nil || !sd {
		t.Fatalf("the stray pod's RUNNING report: should_terminate %v (%v), want true", sd, err)
	}
	e.clk.Advance(time.Second)
	if res := cycle(t, e.runner(t, e.config(e.cs)), e.clk.Now()); res.Dispatched != 1 {
		t.Fatalf("dispatched %d, decisions %v", res.Dispatched, labels(res))
	}
	current := e.ti(t, "run-1", "t").Attempt
	if pods := e.pods(t); len(pods) != 2 || pods[current].Name == "" {
		t.Fatalf("pods %d, current %s has one: %v", len(pods), current, pods[current].Name != "")
	}
	if sd, err := e.w.Running(ctx, current, e.clk.Now()); err != nil || sd {
		t.Fatalf("the current pod's RUNNING report: should_terminate %v (%v), want false", sd, err)
	}
}

// TestMaxParallelBoundsTheQueuedAndRunningAttempts: no more pods than
// max_parallel attempts are handed out at once; the rest wait scheduled.
func TestMaxParallelBoundsTheQueuedAndRunningAttempts(t *testing.T) {
	e := newEnv(t)
	e.mkRun(t, "run-1", lifecycle.NewTask{TaskID: "a"}, lifecycle.NewTask{TaskID: "b"}, lifecycle.NewTask{TaskID: "c"})
	cfg := e.config(e.cs)
	cfg.MaxParallel = 2
	r := e.runner(t, cfg)
	if res := cycle(t, r, e.clk.Now()); res.Dispatched != 2 {
		t.Fatalf("dispatched %d, want 2", res.Dispatched)
	}
	if res := cycle(t, r, e.clk.Now()); res.Dispatched != 0 || len(e.pods(t)) != 2 {
		t.Fatalf("dispatched %d with both slots taken, %d pods", res.Dispatched, len(e.pods(t)))
	}
	if ti := e.ti(t, "run-1", "c"); ti.State != sdk.StateScheduled {
		t.Fatalf("c is %s, want scheduled", ti.State)
	}
}

// TestDispatchGivesThePodTheAttemptAPICredential: with the attempt API's
// minter on the seam, a dispatched pod's environment carries the token of
// its own attempt, the API's address and the CA, and the mint time is
// recorded on the attempt (what the credential ceiling measures), through
// the runner's own writer when the credentials name no recorder (as
// reaperd's do), so under the cycle's term fence.
func TestDispatchGivesThePodTheAttemptAPICredential(t *testing.T) {
	e := newEnv(t)
	e.mkRun(t, "run-1", lifecycle.NewTask{TaskID: "t"})
	api := attemptapitest.Start(t, e.w, attemptapitest.Options{Clock: e.clk})
	cfg := e.config(e.cs)
	cfg.Credentials = kuberunner.MintedCredentials{Minter: api.Issuer}
	res, err := e.runner(t, cfg).RunOnceFenced(context.Background(), e.clk.Now(), e.term)
	if err != nil || res.Dispatched != 1 {
		t.Fatalf("dispatched %d, decisions %v, error %v", res.Dispatched, labels(res), err)
	}
	ti := e.ti(t, "run-1", "t")
	p, ok := e.pods(t)[ti.Attempt]
	if !ok {
		t.Fatalf("no pod of %s", ti.Attempt)
	}
	envs := map[string]string{}
	for _, v := range p.Spec.Containers[0].Env {
		envs[v.Name] = v.Value
	}
	if envs[attempttoken.EnvAPI] != api.URL || envs[attempttoken.EnvCA] != api.CA || api.CA == "" {
		t.Fatalf("environment %v: want the API %s and its CA", envs, api.URL)
	}
	c, err := api.Keys.VerifyBootstrapFor(envs[attempttoken.EnvToken], ti.Attempt, e.clk.Now())
	if err != nil {
		t.Fatalf("the pod's token: %v", err)
	}
	if !ti.CredentialMintedAt.Equal(c.MintedAt) || !c.MintedAt.Equal(e.clk.Now()) {
		t.Fatalf("minted at %v recorded, %v in the token, want %v", ti.CredentialMintedAt, c.MintedAt, e.clk.Now())
	}
	if !slices.Contains(p.Spec.Containers[0].Args, "-reporter="+agent.ReporterAPI) {
		t.Fatalf("agent arguments %v: want -reporter %s", p.Spec.Containers[0].Args, agent.ReporterAPI)
	}
}

// A runner whose leader was deposed (another replica took the board's
// lead) writes nothing and creates no pod: its cycle's writes are fenced
// by its term and it stops at the first one refused. The new leader's
// runner then dispatches the task.
func TestADeposedLeadersRunnerWritesNothingAndCreatesNoPod(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.mkRun(t, "run", lifecycle.NewTask{TaskID: "load"})
	r := e.runner(t, e.config(e.cs))
	if ok, err := e.store.Resign(ctx, e.term, "test"); err != nil || !ok {
		t.Fatalf("resigning: %v, %v", ok, err)
	}
	lease, ok, err := e.store.TryAcquire(ctx, "other", time.Hour, e.clk.Now())
	if err != nil || !ok {
		t.Fatalf("the takeover: %v, %v", ok, err)
	}
	res, err := r.RunOnceFenced(ctx, e.clk.Now(), e.term)
	if !errors.Is(err, lifecycle.ErrDeposed) {
		t.Fatalf("the deposed term's cycle: %v; want it ended as deposed", err)
	}
	if res.Changed() || len(e.pods(t)) != 0 || e.ti(t, "run", "load").State != sdk.StateNone {
		t.Fatalf("the deposed term's cycle wrote: %+v, pods %v, row %+v", res, e.pods(t), e.ti(t, "run", "load"))
	}
	res, err = r.RunOnceFenced(ctx, e.clk.Now(), lease.Term)
	if err != nil || res.Dispatched != 1 || len(e.pods(t)) != 1 {
		t.Fatalf("the new term's cycle: %+v, %v, pods %v; want the task dispatched", res, err, e.pods(t))
	}
}
