package kube

// Tests against a real kube-apiserver with KWOK playing the nodes
// (testkit/kubetest). KWOK runs a pod placed on its node and fails a
// Running pod at startTime + activeDeadlineSeconds; everything else a
// kubelet would write (a terminated container with its termination
// message, an eviction, phase Unknown) the test writes through the status
// subresource, as the kubelet would, and says so where it does.

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/sdktest"
	"github.com/dexaflow/reaper/testkit/eventually"
	"github.com/dexaflow/reaper/testkit/kubetest"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// cluster is the test binary's Kubernetes control plane. TestMain sets it
// once before the tests and clears it after the last (kubetest's own
// harness cannot be used: pgtest.Run runs the tests, for the sweep's
// board).
var cluster atomic.Pointer[kubetest.Cluster]

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	c, err := kubetest.Start(context.Background(), kubetest.Options{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "kube: the test cluster did not start, so these tests cannot run:\n%v\n", err)
		return 1
	}
	defer func() {
		cluster.Store(nil)
		if err := c.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}()
	cluster.Store(c)
	return pgtest.Run(m)
}

// counter counts the substrate's requests on pods, watches left out.
type counter struct {
	mu   sync.Mutex
	n    map[string]int // by verb: list, get, patch, delete
	hook func(*http.Request)
	// fail, when it answers an error for a request, fails it before it is
	// sent: the connection to the API server breaking for that call.
	fail func(*http.Request) error
}

func (c *counter) RoundTrip(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		if strings.Contains(req.URL.Path, "/pods") && req.URL.Query().Get("watch") != "true" {
			verb := map[string]string{http.MethodGet: "get", http.MethodPatch: "patch", http.MethodDelete: "delete",
				http.MethodPost: "create", http.MethodPut: "update"}[req.Method]
			if verb == "get" && strings.HasSuffix(req.URL.Path, "/pods") {
				verb = "list"
			}
			c.mu.Lock()
			c.n[verb]++
			hook, fail := c.hook, c.fail
			c.mu.Unlock()
			if hook != nil {
				hook(req)
			}
			if fail != nil {
				if err := fail(req); err != nil {
					return nil, err
				}
			}
		}
		return rt.RoundTrip(req)
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func (c *counter) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n = map[string]int{}
}

func (c *counter) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.n {
		n += v
	}
	return n
}

func (c *counter) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprint(c.n)
}

// env is one test's cluster share: a namespace, a KWOK node, an admin
// client, and a substrate configured on the namespace.
type env struct {
	t     testing.TB
	c     *kubetest.Cluster
	cs    kubernetes.Interface
	ns    string
	node  string
	sub   *Substrate
	calls *counter
	logs  *sdktest.LogBuffer
	seq   atomic.Int64
}

func newEnv(t testing.TB) *env {
	t.Helper()
	c := cluster.Load()
	if c == nil {
		t.Fatal("no test cluster: TestMain did not start one")
	}
	e := &env{t: t, c: c, cs: c.Client(t), ns: c.NewNamespace(t), node: c.AddNode(t, "").Name}
	e.sub, e.calls, e.logs = e.substrateAs(kubetest.Admin, nil)
	return e
}

// substrateAs configures a substrate on the namespace as user.
func (e *env) substrateAs(user string, values sdk.Values) (*Substrate, *counter, *sdktest.LogBuffer) {
	e.t.Helper()
	calls := &counter{n: map[string]int{}}
	logs := &sdktest.LogBuffer{}
	rc := e.c.ConfigFor(user)
	rc.Wrap(calls.RoundTrip)
	s := NewWithOptions(hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Info}), Options{RestConfig: rc})
	v := sdk.Values{"namespace": e.ns}
	for k, val := range values {
		v[k] = val
	}
	if err := s.Configure(context.Background(), sdk.ConfigureRequest{Edition: "kube", Values: v}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(s.Close)
	return s, calls, logs
}

// synced waits for the substrate's cache.
func (e *env) synced(s *Substrate) {
	e.t.Helper()
	r, err := s.current()
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if !r.presence.waitSynced(ctx) {
		e.t.Fatal("the presence cache did not sync")
	}
}

// create makes a pod of attempt a. placed puts it on the KWOK node, which
// runs it; an unplaced pod stays Pending and never starts.
func (e *env) create(a sdk.Attempt, placed bool, mutate ...func(*corev1.Pod)) *corev1.Pod {
	e.t.Helper()
	l, ann := AttemptLabels(a)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("task-%d", e.seq.Add(1)), Labels: l, Annotations: ann},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: TaskContainer, Image: "agent"}}},
	}
	if placed {
		p.Spec.NodeName = e.node
	}
	for _, m := range mutate {
		m(p)
	}
	out, err := e.cs.CoreV1().Pods(e.ns).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("creating pod of %s: %v", a, err)
	}
	return out
}

// running creates a placed pod of a and waits until KWOK runs it.
func (e *env) running(a sdk.Attempt, mutate ...func(*corev1.Pod)) *corev1.Pod {
	e.t.Helper()
	p := e.create(a, true, mutate...)
	return e.waitPod(p.Name, "Running", func(p *corev1.Pod) bool { return p != nil && p.Status.Phase == corev1.PodRunning })
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

// waitFor polls cond until it holds (a state the cluster or the informer
// reaches on its own, not a threshold of ours).
func (e *env) waitFor(what string, cond func() bool) {
	e.t.Helper()
	e.waitWithin(30*time.Second, what, cond)
}

// waitWithin is waitFor with a bound of its own (mass creations).
func (e *env) waitWithin(bound time.Duration, what string, cond func() bool) {
	e.t.Helper()
	eventually.True(e.t, bound, what, cond, eventually.Every(5*time.Millisecond))
}

func (e *env) waitPod(name, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	e.t.Helper()
	var p *corev1.Pod
	e.waitFor("pod "+name+" "+what, func() bool { p = e.get(name); return cond(p) })
	return p
}

// cachedPhase waits until the substrate's cache holds pod name in phase.
func (e *env) cachedPhase(s *Substrate, a sdk.Attempt, name string, phase corev1.PodPhase) {
	e.t.Helper()
	r, err := s.current()
	if err != nil {
		e.t.Fatal(err)
	}
	e.waitFor("the cache to hold "+name+" "+string(phase), func() bool {
		for _, p := range r.presence.cached(a) {
			if p.Name == name && p.phase == phase {
				return true
			}
		}
		return false
	})
}

// playStatus writes a pod's status through the status subresource, as the
// kubelet would.
func (e *env) playStatus(name string, mutate func(*corev1.PodStatus)) *corev1.Pod {
	e.t.Helper()
	var out *corev1.Pod
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := e.cs.CoreV1().Pods(e.ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		mutate(&p.Status)
		out, err = e.cs.CoreV1().Pods(e.ns).UpdateStatus(context.Background(), p, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		e.t.Fatalf("writing the status of %s: %v", name, err)
	}
	return out
}

// finish plays the kubelet ending the task container with exit and
// message (the termination message) in phase.
func finish(phase corev1.PodPhase, exit int32, reason, message string) func(*corev1.PodStatus) {
	return func(s *corev1.PodStatus) {
		now := metav1.Now()
		s.Phase = phase
		s.ContainerStatuses = []corev1.ContainerStatus{{Name: TaskContainer, Image: "agent",
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: exit, Reason: reason,
				Message: message, StartedAt: now, FinishedAt: now}}}}
	}
}

func liveness(t testing.TB, s *Substrate, live bool, as ...sdk.Attempt) []sdk.AttemptLiveness {
	t.Helper()
	got, err := s.Liveness(context.Background(), sdk.LivenessRequest{Attempts: as, Live: live, Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(as) {
		t.Fatalf("%d answers for %d attempts", len(got), len(as))
	}
	return got
}

func teardown(t testing.TB, s *Substrate, req sdk.TeardownRequest) []sdk.TeardownOutcome {
	t.Helper()
	out, err := s.Teardown(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func att(task string) sdk.Attempt { return sdk.Attempt{RunID: "run-1", TaskID: task, Try: 1, Epoch: 1} }

func TestPresence(t *testing.T) {
	t.Parallel()
	t.Run("CachedPodAliveWithoutACall", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		a := att("extract")
		p := e.running(a)
		e.synced(e.sub)
		e.cachedPhase(e.sub, a, p.Name, corev1.PodRunning)
		e.calls.reset()
		got := liveness(t, e.sub, false, a)[0]
		if got.State != sdk.Alive || got.Pending {
			t.Fatalf("got %+v, want alive, not pending", got)
		}
		if n := e.calls.total(); n != 0 {
			t.Fatalf("a cached Running pod cost %d API calls (%s), want 0", n, e.calls)
		}
	})
	t.Run("CacheMissFallsThroughToALiveRead", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		e.synced(e.sub)
		gone := att("never_created")
		e.calls.reset()
		if got := liveness(t, e.sub, false, gone)[0]; got.State != sdk.Dead {
			t.Fatalf("an attempt with no pod: %+v, want dead", got)
		}
		if n := e.calls.n["list"]; n != 1 || e.calls.total() != 1 {
			t.Fatalf("a cache miss cost %s, want one LIST", e.calls)
		}
	})
	t.Run("FinishedPodIsPresentNotTrustedFromCache", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		a := att("load")
		p := e.running(a)
		// The kubelet's part: the task container ended, the pod Failed.
		e.playStatus(p.Name, finish(corev1.PodFailed, 1, "Error", ""))
		e.synced(e.sub)
		e.cachedPhase(e.sub, a, p.Name, corev1.PodFailed)
		e.calls.reset()
		got := liveness(t, e.sub, false, a)[0]
		if got.State != sdk.Alive || e.calls.n["list"] != 1 {
			t.Fatalf("a finished pod: %+v after %s; want present (alive) from one live LIST", got, e.calls)
		}
	})
	t.Run("LiveRequestReadsLive", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		a := att("extract")
		p := e.running(a)
		e.synced(e.sub)
		e.cachedPhase(e.sub, a, p.Name, corev1.PodRunning)
		e.calls.reset()
		if got := liveness(t, e.sub, true, a)[0]; got.State != sdk.Alive || e.calls.n["list"] != 1 {
			t.Fatalf("a live request: %+v after %s; want alive from one LIST", got, e.calls)
		}
	})
	t.Run("PendingOnlyWhenNoPodRuns", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		a, b := att("pending_only"), att("both")
		e.create(a, false)
		e.create(b, false)
		e.running(b)
		got := liveness(t, e.sub, true, a, b)
		if got[0].State != sdk.Alive || !got[0].Pending {
			t.Fatalf("only a Pending pod: %+v, want alive and Pending", got[0])
		}
		if got[1].State != sdk.Alive || got[1].Pending {
			t.Fatalf("a Pending and a Running pod: %+v, want alive, not Pending", got[1])
		}
	})
	t.Run("ReadErrorDefers", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		e.running(att("extract"))
		// Bob is bound to nothing: every read is refused.
		s, _, _ := e.substrateAs(kubetest.Bob, nil)
		if got := liveness(t, s, false, att("extract"))[0]; got.State != sdk.Unknown {
			t.Fatalf("a refused read: %+v, want unknown", got)
		}
	})
	t.Run("CollidingTaskIDsNeverReadEachOther", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		mine, sibling := att("load_a"), att("load-a")
		p := e.running(mine)
		e.synced(e.sub)
		e.cachedPhase(e.sub, mine, p.Name, corev1.PodRunning)
		for _, live := range []bool{false, true} {
			got := liveness(t, e.sub, live, mine, sibling)
			if got[0].State != sdk.Alive || got[1].State != sdk.Dead {
				t.Fatalf("live=%v: load_a %+v, load-a %+v; want alive and dead", live, got[0], got[1])
			}
		}
	})
	t.Run("PodWithoutAnnotationMatchesOnLabels", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		old := att("load_a")
		e.running(old, func(p *corev1.Pod) { p.Annotations = nil })
		if got := liveness(t, e.sub, true, old)[0]; got.State != sdk.Alive {
			t.Fatalf("a pod from before the annotation: %+v, want alive", got)
		}
	})
	t.Run("NoEpochLabelCountsAsZero", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		zero := sdk.Attempt{RunID: "run-1", TaskID: "old", Try: 1}
		e.running(zero, func(p *corev1.Pod) { delete(p.Labels, LabelAttemptEpoch) })
		got := liveness(t, e.sub, true, zero, sdk.Attempt{RunID: "run-1", TaskID: "old", Try: 1, Epoch: 1})
		if got[0].State != sdk.Alive || got[1].State != sdk.Dead {
			t.Fatalf("no epoch label: epoch 0 %+v, epoch 1 %+v; want alive and dead", got[0], got[1])
		}
	})
	t.Run("PageOfMissesInAtMostTwoCalls", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		e.synced(e.sub)
		as := make([]sdk.Attempt, 100)
		for i := range as {
			as[i] = sdk.Attempt{RunID: fmt.Sprintf("run-%03d-0123456789abcdef0123456789abcdef", i), TaskID: fmt.Sprintf("task_%03d", i), Try: 1}
		}
		e.create(as[42], false)
		e.calls.reset()
		got := liveness(t, e.sub, false, as...)
		for i, l := range got {
			if want := map[bool]sdk.Liveness{true: sdk.Alive, false: sdk.Dead}[i == 42]; l.State != want {
				t.Fatalf("attempt %d: %+v, want %s", i, l, want)
			}
		}
		if n := e.calls.total(); n > 2 {
			t.Fatalf("a page of 100 misses cost %d calls (%s), want at most 2", n, e.calls)
		}
	})
}

func TestTeardown(t *testing.T) {
	t.Parallel()
	t.Run("StartedPodStoppedInPlace", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		a := att("extract")
		p := e.running(a)
		out := teardown(t, e.sub, sdk.TeardownRequest{Attempt: &a, Reason: "agent_lost"})
		if len(out) != 1 || out[0].Action != sdk.TeardownStoppedInPlace {
			t.Fatalf("outcomes %+v, want one stopped_in_place", out)
		}
		after := e.get(p.Name)
		if after == nil || after.Spec.ActiveDeadlineSeconds == nil || *after.Spec.ActiveDeadlineSeconds != 1 {
			t.Fatalf("the pod after the stop: %+v, want it kept with activeDeadlineSeconds 1", after)
		}
		// KWOK plays the kubelet enforcing the deadline: the pod goes Failed
		// and its object stays.
		e.waitPod(p.Name, "Failed DeadlineExceeded", func(p *corev1.Pod) bool {
			return p != nil && p.Status.Phase == corev1.PodFailed && p.Status.Reason == "DeadlineExceeded"
		})
	})
	// deleted: the teardown deletes the pod pod(e) makes, outright.
	deleted := func(t *testing.T, pod func(e *env, a sdk.Attempt) *corev1.Pod) {
		t.Parallel()
		e := newEnv(t)
		a := att("extract")
		p := pod(e, a)
		out := teardown(t, e.sub, sdk.TeardownRequest{Attempt: &a})
		if len(out) != 1 || out[0].Action != sdk.TeardownDeleted {
			t.Fatalf("outcomes %+v, want one deleted", out)
		}
		e.waitPod(p.Name, "gone", func(p *corev1.Pod) bool { return p == nil })
	}
	t.Run("NeverStartedPodDeleted", func(t *testing.T) {
		deleted(t, func(e *env, a sdk.Attempt) *corev1.Pod { return e.create(a, false) })
	})
	t.Run("UnknownPhaseTornDown", func(t *testing.T) {
		deleted(t, func(e *env, a sdk.Attempt) *corev1.Pod {
			p := e.running(a)
			// The node controller's part: the node stopped reporting.
			return e.playStatus(p.Name, func(s *corev1.PodStatus) { s.Phase = corev1.PodUnknown })
		})
	})
	t.Run("TerminalPodSkippedWithItsRecord", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		a := att("extract")
		p := e.running(a)
		record := rec(t, a, RecordSuccess, code(0), "")
		// The kubelet's part: the container ended with the agent's record.
		e.playStatus(p.Name, finish(corev1.PodSucceeded, 0, "Completed", record))
		out := teardown(t, e.sub, sdk.TeardownRequest{Attempt: &a})
		if len(out) != 1 || out[0].Action != sdk.TeardownSkipTerminal {
			t.Fatalf("outcomes %+v, want one skipped_terminal", out)
		}
		after := e.get(p.Name)
		if after == nil || after.Status.ContainerStatuses[0].State.Terminated.Message != record {
			t.Fatalf("the skipped pod lost its record: %+v", after)
		}
		if !strings.Contains(e.logs.String(), "reap teardown: task pod is already in a terminal phase") {
			t.Fatalf("no INFO line for the skipped pod; logs:\n%s", e.logs)
		}
	})
	t.Run("UIDPreconditionSparesAPodRecreatedBetweenListAndStop", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		a := att("extract")
		p := e.running(a)
		var replaced *corev1.Pod
		var once sync.Once
		// Between the teardown's LIST and its PATCH, the pod is deleted and
		// a new one of the same name created.
		e.calls.mu.Lock()
		e.calls.hook = func(req *http.Request) {
			if req.Method != http.MethodPatch {
				return
			}
			once.Do(func() {
				zero := int64(0)
				if err := e.cs.CoreV1().Pods(e.ns).Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
					t.Error(err)
				}
				e.waitPod(p.Name, "gone", func(p *corev1.Pod) bool { return p == nil })
				replaced = e.create(a, true, func(n *corev1.Pod) { n.Name = p.Name })
			})
		}
		e.calls.mu.Unlock()
		out := teardown(t, e.sub, sdk.TeardownRequest{Attempt: &a})
		if len(out) != 1 || out[0].Action != sdk.TeardownNothing || out[0].Error == "" {
			t.Fatalf("outcomes %+v, want nothing done, with the conflict", out)
		}
		now := e.get(p.Name)
		if now == nil || now.UID != replaced.UID || now.Spec.ActiveDeadlineSeconds != nil || now.DeletionTimestamp != nil {
			t.Fatalf("the re-created pod was touched: %+v", now)
		}
	})
	t.Run("RefusedPatchFallsBackToDelete", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		bindRole(t, e, kubetest.Carol, withoutVerb(roleRules(t), "patch"))
		s, _, _ := e.substrateAs(kubetest.Carol, nil)
		a := att("extract")
		p := e.running(a)
		out := teardown(t, s, sdk.TeardownRequest{Attempt: &a, Reason: "pod_lost"})
		if len(out) != 1 || out[0].Action != sdk.TeardownDeleteFallback {
			t.Fatalf("outcomes %+v, want one delete_fallback", out)
		}
		e.waitPod(p.Name, "gone", func(p *corev1.Pod) bool { return p == nil })
	})
	t.Run("CollidingTaskIDsNeverStopEachOther", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		mine, sibling := att("load_a"), att("load-a")
		p := e.running(mine)
		out := teardown(t, e.sub, sdk.TeardownRequest{Attempt: &sibling})
		if len(out) != 1 || out[0].Action != sdk.TeardownNothing {
			t.Fatalf("tearing down load-a: %+v, want nothing", out)
		}
		if after := e.get(p.Name); after.Spec.ActiveDeadlineSeconds != nil {
			t.Fatalf("load_a's pod was stopped: %+v", after.Spec)
		}
	})
	t.Run("NewerEpochNeverTouched", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		old, newer := att("extract"), att("extract")
		newer.Epoch = 2
		p := e.running(newer)
		if out := teardown(t, e.sub, sdk.TeardownRequest{Attempt: &old}); out[0].Action != sdk.TeardownNothing {
			t.Fatalf("tearing down epoch 1: %+v, want nothing", out)
		}
		if after := e.get(p.Name); after.Spec.ActiveDeadlineSeconds != nil {
			t.Fatalf("the newer epoch's pod was stopped")
		}
	})
	t.Run("RunTeardownEveryPodOfTheRun", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		run, pending, done := att("a"), att("b"), att("c")
		other := sdk.Attempt{RunID: "run-2", TaskID: "a", Try: 1, Epoch: 1}
		pr := e.running(run)
		pp := e.create(pending, false)
		pd := e.running(done)
		e.playStatus(pd.Name, finish(corev1.PodFailed, 1, "Error", ""))
		po := e.running(other)
		out := teardown(t, e.sub, sdk.TeardownRequest{RunID: "run-1", Reason: "orphan_run"})
		want := map[string]string{"pod/" + e.ns + "/" + pr.Name: sdk.TeardownStoppedInPlace,
			"pod/" + e.ns + "/" + pp.Name: sdk.TeardownDeleted, "pod/" + e.ns + "/" + pd.Name: sdk.TeardownSkipTerminal}
		if len(out) != len(want) {
			t.Fatalf("outcomes %+v, want %v", out, want)
		}
		for _, o := range out {
			if want[o.Object] != o.Action {
				t.Fatalf("outcomes %+v, want %v", out, want)
			}
		}
		if after := e.get(po.Name); after.Spec.ActiveDeadlineSeconds != nil {
			t.Fatalf("another run's pod was stopped")
		}
	})
}

func TestWarmWorkersReadLive(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, name := range []string{"warm-a", "warm-b"} {
		w := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{LabelWarmPool: "default"}},
			Spec: corev1.PodSpec{NodeName: e.node, Containers: []corev1.Container{{Name: "worker", Image: "agent"}}}}
		if _, err := e.cs.CoreV1().Pods(e.ns).Create(context.Background(), w, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e.calls.reset()
	got, err := e.sub.WarmWorkers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Name != "warm-a" || got[1].Name != "warm-b" {
		t.Fatalf("warm workers %+v, want warm-a and warm-b", got)
	}
	if e.calls.n["list"] != 1 {
		t.Fatalf("warm workers read with %s, want one live LIST", e.calls)
	}
	bob, _, _ := e.substrateAs(kubetest.Bob, nil)
	if _, err := bob.WarmWorkers(context.Background()); err == nil {
		t.Fatal("a refused LIST of the warm pool answered no error")
	}
}
