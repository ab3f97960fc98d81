package kuberunner_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/host/metrics"
	"github.com/dexaflow/reaper/runner/kuberunner"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/eventually"
	"github.com/dexaflow/reaper/testkit/kubetest"
)

// dispatchMode is how a test's runner dispatches: on the tick (no buffer)
// or through the dispatch workers.
type dispatchMode struct {
	name            string
	buffer, workers int
}

var dispatchModes = []dispatchMode{{"Tick", 0, 0}, {"Workers", 4, 2}}

func (m dispatchMode) on(cfg kuberunner.Config) kuberunner.Config {
	cfg.DispatchBuffer, cfg.DispatchWorkers = m.buffer, m.workers
	return cfg
}

// noAnswer is a transport that carries the first pod create to the API
// server (the pod is made) and then loses the connection before the
// answer: the client sees an unexpected EOF, which client-go does not send
// again for a POST.
type noAnswer struct {
	next  http.RoundTripper
	posts atomic.Int32
}

func (l *noAnswer) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := l.next.RoundTrip(req)
	if err != nil || req.Method != http.MethodPost || !strings.HasSuffix(req.URL.Path, "/pods") || l.posts.Add(1) != 1 {
		return resp, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return nil, io.ErrUnexpectedEOF
}

// wrapped is an admin client whose transport is wrap's.
func (e *env) wrapped(t *testing.T, wrap func(http.RoundTripper) http.RoundTripper) kubernetes.Interface {
	t.Helper()
	rc := e.c.AdminConfig()
	rc.WrapTransport = wrap
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// probe is a pod the admission checks are probed with (a dry run: nothing
// is made).
func (e *env) probe(ctx context.Context) error {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/probe"}}}}
	_, err := e.cs.CoreV1().Pods(e.ns).Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	return err
}

// webhookDown answers every pod create in the env's namespace 500: a
// validating webhook that cannot be called, failurePolicy Fail (the API
// server's own answer when its admission chain is down).
func (e *env) webhookDown(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	fail, none, url := admissionv1.Fail, admissionv1.SideEffectClassNone, "https://127.0.0.1:1/validate"
	hook := &admissionv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: e.ns + "-down"},
		Webhooks: []admissionv1.ValidatingWebhook{{
			Name:         "down.kuberunner.reaper.test",
			ClientConfig: admissionv1.WebhookClientConfig{URL: &url},
			Rules: []admissionv1.RuleWithOperations{{Operations: []admissionv1.OperationType{admissionv1.Create},
				Rule: admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}},
			FailurePolicy: &fail, SideEffects: &none, AdmissionReviewVersions: []string{"v1"},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": e.ns}},
		}},
	}
	if _, err := e.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, hook, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(context.Background(), hook.Name, metav1.DeleteOptions{})
	})
	eventually.True(t, clusterWait, "the webhook to answer pod creates 500", func() bool {
		return apierrors.IsInternalError(e.probe(ctx))
	}, eventually.Every(clusterPoll))
}

// quotaSpent sets a ResourceQuota of no pods on the env's namespace, its
// status written as the quota controller would (the test cluster runs
// none): every pod create is refused 403, exceeded quota.
func (e *env) quotaSpent(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	zero := corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}
	q, err := e.cs.CoreV1().ResourceQuotas(e.ns).Create(ctx, &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "no-pods"},
		Spec: corev1.ResourceQuotaSpec{Hard: zero}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	q.Status = corev1.ResourceQuotaStatus{Hard: zero, Used: zero}
	if _, err := e.cs.CoreV1().ResourceQuotas(e.ns).UpdateStatus(ctx, q, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, clusterWait, "the quota to refuse pod creates", func() bool {
		err := e.probe(ctx)
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exceeded quota")
	}, eventually.Every(clusterPoll))
}

// squatFrom is squat for a Customize hook, which a dispatch worker may
// call: it reports a failure without stopping the goroutine.
func squatFrom(t *testing.T, tenant kubernetes.Interface, ns, name string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "squat", Image: "registry.invalid/squat"}}}}
	made, err := tenant.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Errorf("the tenant's pod %s: %v", name, err)
	}
	return made
}

// TestEveryPodCreateErrorClassTheSameOnTheTickAndInTheWorkers runs each
// class of pod create outcome on the real API server twice, once created
// on the tick and once through the dispatch workers, with the very same
// expectations: created; unavailable (no API server at the address, an
// admission webhook down answering 500) offered again on a new epoch with
// no retry spent and the row's outage clock kept; the window exhausted,
// dispatch_failed; refused (RBAC forbidden, an invalid spec, a spent
// ResourceQuota) dispatch_failed at once; AlreadyExists on the pod this
// dispatch made (its first answer lost, the create sent again) adopted;
// AlreadyExists on a pod someone else put under the name, the squat on
// the infra rail; and an answer lost outright, offered again, the pod it
// made refused at its RUNNING report.
func TestEveryPodCreateErrorClassTheSameOnTheTickAndInTheWorkers(t *testing.T) {
	ctx := context.Background()
	type check func(t *testing.T, e *env, r *kuberunner.Runner, res kuberunner.Result)
	// dispatchedBeside: the attempt dispatched in a pod of its own,
	// recorded, beside the other pods made before it.
	dispatchedBeside := func(t *testing.T, e *env, res kuberunner.Result, others int) {
		t.Helper()
		ti := e.ti(t, "run", "t")
		p, ok := e.pods(t)[ti.Attempt]
		rec, err := e.w.RecordedPod(ctx, ti.Attempt)
		if res.Dispatched != 1 || len(res.Decisions) != 0 || ti.State != sdk.StateQueued || !ok || len(e.pods(t)) != 1+others ||
			err != nil || rec.UID != string(p.UID) || rec.Name != p.Name {
			t.Fatalf("dispatched %d, decisions %v, row %+v, %d pods, recorded %+v (%v): want its pod recorded on the queued attempt",
				res.Dispatched, labels(res), ti, len(e.pods(t)), rec, err)
		}
	}
	dispatched := func(t *testing.T, e *env, _ *kuberunner.Runner, res kuberunner.Result) {
		t.Helper()
		dispatchedBeside(t, e, res, 0)
	}
	offeredAgain := func(t *testing.T, e *env, res kuberunner.Result, epoch int32, since time.Time) {
		t.Helper()
		ti := e.ti(t, "run", "t")
		if !slices.Equal(labels(res), []string{sdk.LabelDispatchUnavailable}) || res.OfferedAgain != 1 || res.Failed != 0 ||
			ti.State != sdk.StateScheduled || ti.Try != 1 || ti.Epoch != epoch || ti.Retries != 2 || !ti.DispatchUnavailableSince.Equal(since) {
			t.Fatalf("decisions %v, offered again %d, row %+v: want dispatch_unavailable, scheduled on epoch %d, try 1, retries 2, unavailable since %v",
				labels(res), res.OfferedAgain, ti, epoch, since)
		}
	}
	unavailable := func(t *testing.T, e *env, r *kuberunner.Runner, res kuberunner.Result) {
		t.Helper()
		start := e.clk.Now()
		offeredAgain(t, e, res, 1, start)
		if n := len(e.pods(t)); n != 0 {
			t.Fatalf("%d pods, want none", n)
		}
		e.clk.Advance(time.Minute) // again: the outage clock is the row's first failure
		offeredAgain(t, e, cycle(t, r, e.clk.Now()), 2, start)
	}
	failedForGood := func(label string) check {
		return func(t *testing.T, e *env, _ *kuberunner.Runner, res kuberunner.Result) {
			t.Helper()
			ti := e.ti(t, "run", "t")
			if !slices.Equal(labels(res), []string{label}) || res.Failed != 1 || res.OfferedAgain != 0 || ti.State != sdk.StateFailed ||
				ti.LastFailureKind != sdk.FailureInfra || ti.FailureReason != sdk.LabelDispatchFailed || ti.Try != 1 {
				t.Fatalf("decisions %v, failed %d, row %+v: want %s, failed for good as dispatch_failed on try 1 (no new try)", labels(res), res.Failed, ti, label)
			}
			if n := len(e.pods(t)); n != 0 {
				t.Fatalf("%d pods, want none", n)
			}
			if run, _ := e.w.Run(ctx, "run"); run.State != sdk.RunFailed {
				t.Fatalf("run %s, want failed", run.State)
			}
		}
	}
	refused := failedForGood(sdk.LabelDispatchFailed)

	var (
		squatted *corev1.Pod // the tenant's pod of the squat case (set by a worker before its tick ends)
		lost     *lostAnswer
		dropped  *noAnswer
	)
	cases := []struct {
		name   string
		config func(t *testing.T, e *env) kuberunner.Config
		check  check
	}{
		{"Created", func(t *testing.T, e *env) kuberunner.Config { return e.config(e.cs) }, dispatched},
		{"UnavailableNoAPIServer", func(t *testing.T, e *env) kuberunner.Config { return e.config(unreachable(t)) }, unavailable},
		{"UnavailableWebhookDown500", func(t *testing.T, e *env) kuberunner.Config { e.webhookDown(t); return e.config(e.cs) }, unavailable},
		{"UnavailableWindowExhausted", func(t *testing.T, e *env) kuberunner.Config { return e.config(unreachable(t)) },
			func(t *testing.T, e *env, r *kuberunner.Runner, res kuberunner.Result) {
				offeredAgain(t, e, res, 1, e.clk.Now())
				e.clk.Advance(kuberunner.DispatchUnavailableWindowDefault)
				failedForGood(sdk.LabelDispatchUnavailableSpent)(t, e, r, cycle(t, r, e.clk.Now()))
			}},
		{"RefusedForbidden", func(t *testing.T, e *env) kuberunner.Config { return e.config(e.c.ClientFor(t, kubetest.Alice)) }, refused},
		{"RefusedInvalid", func(t *testing.T, e *env) kuberunner.Config {
			cfg := e.config(e.cs)
			cfg.Resources = corev1.ResourceRequirements{ // a request over its limit
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")},
				Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")},
			}
			return cfg
		}, refused},
		{"RefusedQuota", func(t *testing.T, e *env) kuberunner.Config { e.quotaSpent(t); return e.config(e.cs) }, refused},
		{"AlreadyExistsAdopted", func(t *testing.T, e *env) kuberunner.Config {
			lost = &lostAnswer{}
			return e.config(e.wrapped(t, func(rt http.RoundTripper) http.RoundTripper { lost.next = rt; return lost }))
		}, func(t *testing.T, e *env, r *kuberunner.Runner, res kuberunner.Result) {
			dispatched(t, e, r, res)
			if n := lost.posts.Load(); n != 2 || !strings.Contains(e.logs.String(), "adopted") {
				t.Fatalf("%d creates sent, want 2 (the first one's answer lost) and the adoption logged", n)
			}
		}},
		{"AlreadyExistsSquatted", func(t *testing.T, e *env) kuberunner.Config {
			tenant := e.tenant(t)
			squatted = nil
			cfg := e.config(e.cs)
			cfg.Customize = func(p *corev1.Pod) { squatted = squatFrom(t, tenant, e.ns, p.Name) }
			return cfg
		}, func(t *testing.T, e *env, _ *kuberunner.Runner, res kuberunner.Result) {
			ti := e.ti(t, "run", "t")
			if !slices.Equal(labels(res), []string{sdk.LabelPodNameSquatted}) || res.Dispatched != 0 || res.Failed != 0 ||
				ti.State != sdk.StateFailed || ti.FailureReason != sdk.LabelPodNameSquatted || ti.LastFailureKind != sdk.FailureInfra ||
				ti.InfraConfirmedAt.IsZero() || ti.Retries != 2 || squatted == nil || res.Decisions[0].Evidence["pod_uid"] != string(squatted.UID) {
				t.Fatalf("decisions %v, row %+v: want pod_name_squatted on the infra rail, confirmed, naming the tenant's pod", labels(res), ti)
			}
			e.untouched(t, squatted)
		}},
		{"AnswerLost", func(t *testing.T, e *env) kuberunner.Config {
			dropped = &noAnswer{}
			return e.config(e.wrapped(t, func(rt http.RoundTripper) http.RoundTripper { dropped.next = rt; return dropped }))
		}, func(t *testing.T, e *env, r *kuberunner.Runner, res kuberunner.Result) {
			stray := e.ti(t, "run", "t").Attempt
			offeredAgain(t, e, res, 1, e.clk.Now())
			stray.Epoch--
			if _, ok := e.pods(t)[stray]; !ok || len(e.pods(t)) != 1 {
				t.Fatalf("pods %v: want the one the create whose answer was lost made", e.pods(t))
			}
			if sd, err := e.w.Running(ctx, stray, e.clk.Now()); err != nil || !sd {
				t.Fatalf("the stray pod's RUNNING report: should_terminate %v (%v), want true", sd, err)
			}
			e.clk.Advance(time.Second)
			dispatchedBeside(t, e, cycle(t, r, e.clk.Now()), 1)
			if sd, err := e.w.Running(ctx, e.ti(t, "run", "t").Attempt, e.clk.Now()); err != nil || sd {
				t.Fatalf("the new attempt's RUNNING report: should_terminate %v (%v), want false", sd, err)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, m := range dispatchModes {
				t.Run(m.name, func(t *testing.T) {
					e := newEnv(t)
					e.mkRun(t, "run", lifecycle.NewTask{TaskID: "t", Retries: 2})
					r := e.runner(t, m.on(c.config(t, e)))
					res := cycle(t, r, e.clk.Now())
					if want := min(m.buffer, 1); res.Handed != want {
						t.Fatalf("handed %d to the workers, want %d", res.Handed, want)
					}
					c.check(t, e, r, res)
				})
			}
		})
	}
}

// bufferProbe observes a runner's dispatch buffer: its depth, and a
// channel closed at the tick's first wait on a full buffer.
type bufferProbe struct {
	depth, waits atomic.Int64
	full         chan struct{}
	once         sync.Once
}

func newBufferProbe() *bufferProbe { return &bufferProbe{full: make(chan struct{})} }

func (p *bufferProbe) DispatchBuffered(delta int) { p.depth.Add(int64(delta)) }
func (p *bufferProbe) DispatchBufferFull() {
	p.waits.Add(1)
	p.once.Do(func() { close(p.full) })
}

// both tells the probe and the host's collectors.
type both struct {
	*bufferProbe
	m *metrics.Metrics
}

func (b both) DispatchBuffered(delta int) {
	b.bufferProbe.DispatchBuffered(delta)
	b.m.DispatchBuffered(delta)
}
func (b both) DispatchBufferFull() { b.bufferProbe.DispatchBufferFull(); b.m.DispatchBufferFull() }

// holdFirst is a Customize hook that holds the first pod's create (in the
// worker that dispatches it) until release is closed, telling held once it
// is held.
func holdFirst(held chan<- struct{}, release <-chan struct{}) func(*corev1.Pod) {
	var n atomic.Int32
	return func(*corev1.Pod) {
		if n.Add(1) == 1 {
			close(held)
			<-release
		}
	}
}

// A tick that finds the dispatch buffer full waits for a worker to take an
// attempt and drops nothing: with one worker held in its first create and
// a buffer of 2, the tick waits (counted, and metered by the host's
// collector), and once the worker goes on every one of the 12 attempts
// has its pod, recorded; the buffer is empty at the end.
func TestAFullBufferMakesTheTickWaitAndDropsNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const n = 12
	var tasks []lifecycle.NewTask
	for i := range n {
		tasks = append(tasks, lifecycle.NewTask{TaskID: "t" + string(rune('a'+i))})
	}
	e.mkRun(t, "run", tasks...)
	probe, m := newBufferProbe(), metrics.New()
	held, release := make(chan struct{}), make(chan struct{})
	cfg := e.config(e.cs)
	cfg.DispatchBuffer, cfg.DispatchWorkers = 2, 1
	cfg.DispatchObserver = both{probe, m}
	cfg.Customize = holdFirst(held, release)
	go func() {
		<-held
		<-probe.full // the tick waits on a full buffer while the worker is held
		close(release)
	}()
	res := cycle(t, e.runner(t, cfg), e.clk.Now())
	if res.Handed != n || res.Dispatched != n || len(res.Decisions) != 0 || res.BufferWaits < 1 || int64(res.BufferWaits) != probe.waits.Load() {
		t.Fatalf("handed %d, dispatched %d, decisions %v, buffer waits %d (probe %d): want all %d dispatched after at least one wait",
			res.Handed, res.Dispatched, labels(res), res.BufferWaits, probe.waits.Load(), n)
	}
	pods := e.pods(t)
	for _, task := range tasks {
		ti := e.ti(t, "run", task.TaskID)
		rec, err := e.w.RecordedPod(context.Background(), ti.Attempt)
		if p, ok := pods[ti.Attempt]; !ok || ti.State != sdk.StateQueued || err != nil || rec.UID != string(p.UID) {
			t.Fatalf("%s: row %+v, pod %v, recorded %+v (%v): want queued with its pod recorded", task.TaskID, ti, ok, rec, err)
		}
	}
	if len(pods) != n || probe.depth.Load() != 0 {
		t.Fatalf("%d pods, buffer depth %d at the end: want %d, 0", len(pods), probe.depth.Load(), n)
	}
	got := gathered(t, m)
	if got["reaper_dispatch_buffer_full_waits_total"] != float64(res.BufferWaits) || got["reaper_dispatch_buffer_depth"] != 0 {
		t.Fatalf("collectors %v: want %d full-buffer waits and an empty buffer", got, res.BufferWaits)
	}
}

// MaxParallel bounds what is active counting the attempts handed to the
// workers: no more are handed off than there are free slots.
func TestMaxParallelCountsTheBufferedAttempts(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.mkRun(t, "run", lifecycle.NewTask{TaskID: "a"}, lifecycle.NewTask{TaskID: "b"}, lifecycle.NewTask{TaskID: "c"},
		lifecycle.NewTask{TaskID: "d"}, lifecycle.NewTask{TaskID: "e"})
	cfg := e.config(e.cs)
	cfg.MaxParallel, cfg.DispatchBuffer, cfg.DispatchWorkers = 3, 8, 4
	r := e.runner(t, cfg)
	if res := cycle(t, r, e.clk.Now()); res.Handed != 3 || res.Dispatched != 3 {
		t.Fatalf("handed %d, dispatched %d: want 3", res.Handed, res.Dispatched)
	}
	if res := cycle(t, r, e.clk.Now()); res.Handed != 0 || len(e.pods(t)) != 3 {
		t.Fatalf("handed %d with every slot taken, %d pods", res.Handed, len(e.pods(t)))
	}
}

// A worker holding an attempt from a term that ended creates no pod: the
// one worker is held in the first attempt's create, the second waits in
// the buffer and the tick waits with the third; the term is deposed (the
// board's lead taken by another holder) and the worker let go. The
// attempts it then takes were handed off under the old term: their queue,
// fenced by that term, is refused, so neither gets a pod and both stay
// scheduled; the cycle ends as deposed. (The first attempt's create was
// under way when the term ended, as it may be on the tick: its pod is
// made, and its record refused.) The new term's cycle dispatches the
// other two.
func TestAWorkerHoldingAnAttemptOfAnEndedTermCreatesNoPod(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.mkRun(t, "run", lifecycle.NewTask{TaskID: "a"}, lifecycle.NewTask{TaskID: "b"}, lifecycle.NewTask{TaskID: "c"})
	probe := newBufferProbe()
	held, release := make(chan struct{}), make(chan struct{})
	cfg := e.config(e.cs)
	cfg.DispatchBuffer, cfg.DispatchWorkers = 1, 1
	cfg.DispatchObserver = probe
	cfg.Customize = holdFirst(held, release)
	r := e.runner(t, cfg)
	var (
		res  kuberunner.Result
		err  error
		done = make(chan struct{})
	)
	go func() {
		defer close(done)
		res, err = r.RunOnceFenced(ctx, e.clk.Now(), e.term)
	}()
	<-held
	<-probe.full
	if ok, err := e.store.Resign(ctx, e.term, "test"); err != nil || !ok {
		t.Fatalf("resigning: %v, %v", ok, err)
	}
	lease, ok, lerr := e.store.TryAcquire(ctx, "other", time.Hour, e.clk.Now())
	if lerr != nil || !ok {
		t.Fatalf("the takeover: %v, %v", ok, lerr)
	}
	close(release)
	<-done
	if !errors.Is(err, lifecycle.ErrDeposed) || res.Dispatched != 0 || res.Handed != 3 {
		t.Fatalf("the deposed term's cycle: %v, handed %d, dispatched %d; want it ended as deposed with nothing recorded", err, res.Handed, res.Dispatched)
	}
	pods := e.pods(t)
	for _, task := range []string{"b", "c"} {
		ti := e.ti(t, "run", task)
		if _, ok := pods[ti.Attempt]; ok || ti.State != sdk.StateScheduled || ti.Epoch != 0 {
			t.Fatalf("%s: row %+v, pod %v: want no pod and the attempt still scheduled", task, ti, ok)
		}
	}
	if len(pods) != 1 {
		t.Fatalf("%d pods: want only the one whose create was under way", len(pods))
	}
	res, err = e.runner(t, e.config(e.cs)).RunOnceFenced(ctx, e.clk.Now(), lease.Term)
	if err != nil || res.Dispatched != 2 || len(e.pods(t)) != 3 {
		t.Fatalf("the new term's cycle: dispatched %d, %v, %d pods; want b and c dispatched", res.Dispatched, err, len(e.pods(t)))
	}
}

// workers counts the goroutines running a dispatch worker.
func workers() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "kuberunner.(*dispatchPool).work") {
			count++
		}
	}
	return count
}

// The dispatch workers are Run's: started with it, serving its ticks, and
// every one of them stopped once its context is cancelled and Run has
// returned. RunOnce's own workers are gone when it returns.
func TestTheDispatchWorkersStopWithRun(t *testing.T) {
	e := newEnv(t)
	if n := workers(); n != 0 {
		t.Fatalf("%d dispatch workers before the test", n)
	}
	e.mkRun(t, "run", lifecycle.NewTask{TaskID: "t"})
	cfg := e.config(e.cs)
	cfg.DispatchBuffer, cfg.DispatchWorkers = 4, 3
	results := make(chan kuberunner.Result, 64)
	cfg.OnResult = func(res kuberunner.Result) { results <- res }
	cfg.Leading = func(time.Time) (int64, bool) { return e.term, true }
	r := e.runner(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	eventually.True(t, clusterWait, "Run's three workers", func() bool { return workers() == 3 }, eventually.Every(clusterPoll))
	dispatched := 0
	eventually.True(t, clusterWait, "a tick of Run to dispatch the task", func() bool {
		e.clk.Advance(cfg.Interval + time.Second)
		for {
			select {
			case res := <-results:
				dispatched += res.Dispatched
				continue
			default:
			}
			return dispatched == 1
		}
	}, eventually.Every(clusterPoll))
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(clusterWait):
		t.Fatal("Run did not return once cancelled")
	}
	eventually.True(t, clusterWait, "every dispatch worker to be gone", func() bool { return workers() == 0 }, eventually.Every(clusterPoll))

	e.mkRun(t, "run-2", lifecycle.NewTask{TaskID: "t"})
	if res := cycle(t, r, e.clk.Now()); res.Dispatched != 1 || res.Handed != 1 {
		t.Fatalf("RunOnce: handed %d, dispatched %d", res.Handed, res.Dispatched)
	}
	eventually.True(t, clusterWait, "RunOnce's workers to be gone", func() bool { return workers() == 0 }, eventually.Every(clusterPoll))
}

// The buffer's configuration is checked: no negative buffer, workers only
// with a buffer and within DispatchWorkersMax; a buffer alone takes the
// default workers.
func TestTheDispatchBufferIsChecked(t *testing.T) {
	e := newEnv(t)
	for _, c := range []struct {
		buffer, workers int
		want            string
	}{{-1, 0, "dispatch_buffer"}, {0, 2, "dispatch_workers"}, {4, -1, "dispatch_workers"}, {4, kuberunner.DispatchWorkersMax + 1, "dispatch_workers"}} {
		cfg := e.config(e.cs)
		cfg.DispatchBuffer, cfg.DispatchWorkers = c.buffer, c.workers
		if _, err := kuberunner.New(cfg, e.w); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("buffer %d, workers %d: %v, want a refusal naming %s", c.buffer, c.workers, err, c.want)
		}
	}
	cfg := e.config(e.cs)
	cfg.DispatchBuffer = 8
	if _, err := kuberunner.New(cfg, e.w); err != nil {
		t.Fatalf("a buffer with the default workers: %v", err)
	}
}
