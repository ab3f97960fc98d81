package kubereapers_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	authv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/cmd/reaperctl/ctl"
	"github.com/dexaflow/reaper/host/cycle"
	"github.com/dexaflow/reaper/host/leader"
	"github.com/dexaflow/reaper/host/metrics"
	"github.com/dexaflow/reaper/host/owed"
	"github.com/dexaflow/reaper/plugins/agentlost"
	"github.com/dexaflow/reaper/runner/kuberunner"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/substrate/kube"
	"github.com/dexaflow/reaper/testkit/kubetest"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// The executor Role's pod rules: reading always, stopping (patch, to lower
// the deadline; delete) only when granted.
var (
	podsRead  = rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}
	podsWrite = rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"patch", "delete"}}
)

// stubLead is a leadership the test holds by hand.
type stubLead struct {
	mu sync.Mutex
	st leader.Status
}

func (l *stubLead) Status(time.Time) leader.Status {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.st
}

// fixed is a Supervised plugin that never restarts.
type fixed[T any] struct{ v T }

func (f fixed[T]) Get(context.Context, time.Time) (T, error) { return f.v, nil }
func (fixed[T]) Down() bool                                  { return false }
func (fixed[T]) Recycle()                                    {}

// owedWorld is the maintenance loop over the env's board, the kube
// substrate as a user whose Role the test edits, and agentlost.
type owedWorld struct {
	*env
	user    string
	sub     sdk.Substrate
	metrics *metrics.Metrics
}

func newOwedWorld(t *testing.T, user string) *owedWorld {
	t.Helper()
	e := newEnv(t)
	w := &owedWorld{env: e, user: user, metrics: metrics.New()}
	w.grant(podsRead)
	s := e.substrateAs(user)
	e.waitFor("the substrate's cache to sync as "+user, func() bool { ok, _ := s.Synced(context.Background()); return ok })
	w.sub = s
	return w
}

// grant makes the user's Role in the namespace exactly rules, and waits
// until the authorizer allows the last rule's last verb.
func (w *owedWorld) grant(rules ...rbacv1.PolicyRule) {
	w.t.Helper()
	ctx := context.Background()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "reaperd"}, Rules: rules}
	if _, err := w.cs.RbacV1().Roles(w.ns).Get(ctx, "reaperd", metav1.GetOptions{}); err == nil {
		if _, err := w.cs.RbacV1().Roles(w.ns).Update(ctx, role, metav1.UpdateOptions{}); err != nil {
			w.t.Fatal(err)
		}
	} else {
		if _, err := w.cs.RbacV1().Roles(w.ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
			w.t.Fatal(err)
		}
		rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "reaperd"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "reaperd"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: w.user}}}
		if _, err := w.cs.RbacV1().RoleBindings(w.ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
			w.t.Fatal(err)
		}
	}
	last := rules[len(rules)-1]
	verb := last.Verbs[len(last.Verbs)-1]
	// The authorizer reads RBAC objects from its own informer.
	w.waitFor("the authorizer to allow "+verb+" on pods", func() bool {
		r, err := w.cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authv1.SubjectAccessReview{Spec: authv1.SubjectAccessReviewSpec{
			User: w.user, ResourceAttributes: &authv1.ResourceAttributes{Namespace: w.ns, Verb: verb, Resource: "pods"}}},
			metav1.CreateOptions{})
		return err == nil && r.Status.Allowed
	})
}

// loop is a maintenance loop of term, led since an hour before the fake
// clock's time (its settling gate opens on its first cycle), with dryRun
// the global dry-run.
func (w *owedWorld) loop(term int64, dryRun bool, logs *bytes.Buffer) *loopAndOwed {
	w.t.Helper()
	r := agentlost.New(nil)
	if err := r.Configure(context.Background(), sdk.ConfigureRequest{Edition: ladder.EditionKube, Ladder: w.ladder,
		Values: defaults(w.t, r)}); err != nil {
		w.t.Fatal(err)
	}
	info, err := r.Info(context.Background())
	if err != nil {
		w.t.Fatal(err)
	}
	lg := hclog.NewNullLogger()
	if logs != nil {
		lg = hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Debug})
	}
	lead := &stubLead{st: leader.Status{Leading: true, Term: term, Since: w.clk.Now().Add(-time.Hour),
		ValidUntil: w.clk.Now().Add(24 * time.Hour)}}
	paying := owed.New(owed.Config{Interval: w.ladder.MaintenanceInterval, DryRun: dryRun, Clock: w.clk, Logger: lg,
		Metrics: w.metrics, Declared: map[string][]string{"agentlost": info.DecisionLabels}},
		lead, w.store, fixed[sdk.Substrate]{w.sub}, w.store)
	return &loopAndOwed{loop: cycle.New(cycle.Config{Ladder: w.ladder, Edition: ladder.EditionKube, DryRun: dryRun, Clock: w.clk,
		Logger: lg, Metrics: w.metrics, Owed: paying},
		lead, w.store, w.store, fixed[sdk.Substrate]{w.sub}, []cycle.Reaper{{Name: "agentlost", Plugin: fixed[sdk.Reaper]{r},
			MarkReasons: info.MarkReasons, Labels: info.DecisionLabels}}), owed: paying}
}

// loopAndOwed is a maintenance loop and its owed teardowns' service,
// driven one after the other as the daemon's RunCycle drives them.
type loopAndOwed struct {
	loop *cycle.Loop
	owed *owed.Service
}

// RunOnce runs a cycle, then the owed teardowns, and returns the cycle's
// result with the retries' decisions and overrun.
func (l *loopAndOwed) RunOnce(ctx context.Context) cycle.Result {
	res := l.loop.RunOnce(ctx)
	paid := l.owed.RunOnce(ctx)
	res.Decisions = append(res.Decisions, paid.Decisions...)
	res.DecisionCount += len(paid.Decisions)
	if paid.Overran {
		res.Overruns = append(res.Overruns, "teardown")
	}
	return res
}

// silent puts a running attempt with a running pod on the board and lets
// its agent fall silent past agent_lost.
func (w *owedWorld) silent(a sdk.Attempt) *corev1.Pod {
	w.t.Helper()
	w.running(a)
	p := w.pod(a, true)
	w.clk.Advance(w.ladder.AgentLost + time.Second)
	return p
}

// owed is the one owed teardown of a, failing the test unless there is
// exactly one.
func (w *owedWorld) owed(a sdk.Attempt) board.OwedTeardown {
	w.t.Helper()
	rows, err := w.store.OwedTeardownsFor(context.Background(), a.RunID, a.TaskID)
	if err != nil || len(rows) != 1 {
		w.t.Fatalf("owed teardowns of %s: %+v, %v; want one", a, rows, err)
	}
	return rows[0]
}

func (w *owedWorld) noneOwed(a sdk.Attempt) {
	w.t.Helper()
	rows, err := w.store.OwedTeardownsFor(context.Background(), a.RunID, a.TaskID)
	if err != nil || len(rows) != 0 {
		w.t.Fatalf("owed teardowns of %s: %+v, %v; want none", a, rows, err)
	}
}

// gauge reads reaper_owed_teardowns.
func (w *owedWorld) gauge() float64 {
	w.t.Helper()
	mfs, err := w.metrics.Registry.Gather()
	if err != nil {
		w.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "reaper_owed_teardowns" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	w.t.Fatal("reaper_owed_teardowns is not registered")
	return 0
}

// explain runs reaperctl explain RUN TASK against the board.
func (w *owedWorld) explain(a sdk.Attempt) string {
	w.t.Helper()
	path := filepath.Join(w.t.TempDir(), "reaper.hcl")
	src := fmt.Sprintf("edition = \"lite\"\n\nstore {\n  dsn = %q\n}\n\nsubstrate \"lite\" {}\n", pgtest.DSN(w.store.Pool()))
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		w.t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	cli := ctl.CLI{Now: w.clk.Now, Getenv: func(string) string { return "" }}
	if code := cli.Run(context.Background(), []string{"explain", "-config", path, a.RunID, a.TaskID}, &out, &errOut); code != 0 {
		w.t.Fatalf("reaperctl explain: exit %d: %s", code, errOut.String())
	}
	return out.String()
}

func cycleDecided(res cycle.Result, a sdk.Attempt, label string) (sdk.Decision, bool) {
	for _, d := range res.Decisions {
		if d.Attempt == a && d.Label == label {
			return d, true
		}
	}
	return sdk.Decision{}, false
}

func TestOwedTeardowns(t *testing.T) {
	t.Parallel()

	t.Run("RefusedThenGranted_RetriedOnALaterPassUntilThePodStops", func(t *testing.T) {
		t.Parallel()
		w := newOwedWorld(t, kubetest.Bob)
		a := att("run-1", "t")
		p := w.silent(a)
		loop := w.loop(w.term, false, nil)

		// The reaper marks the attempt; its teardown is refused (no patch,
		// no delete): the mark stands, the teardown is owed.
		res := loop.RunOnce(context.Background())
		if _, ok := cycleDecided(res, a, sdk.LabelAgentLost); !ok {
			t.Fatalf("no agent_lost mark: %+v", res.Decisions)
		}
		if _, ok := cycleDecided(res, a, sdk.LabelAgentLostPodDeleteErr); !ok {
			t.Fatalf("no agent_lost_pod_delete_error: %+v", res.Decisions)
		}
		w.wantProvisional(a, sdk.LabelAgentLost)
		o := w.owed(a)
		if o.Tries != 1 || o.Reaper != "agentlost" || o.Label != sdk.LabelAgentLostPodDeleteErr || o.Reason != sdk.LabelAgentLost ||
			!strings.Contains(o.LastError, "forbidden") || !o.NextTryAt.Equal(o.FirstFailedAt.Add(w.ladder.MaintenanceInterval)) {
			t.Fatalf("owed row %+v", o)
		}
		if g := w.gauge(); g != 1 {
			t.Fatalf("TheGaugeCountsIt: %v", g)
		}
		out := w.explain(a)
		if !strings.Contains(out, "teardown owed of try 1 epoch 1") || !strings.Contains(out, "last error (agent_lost_pod_delete_error") ||
			!strings.Contains(out, "forbidden") {
			t.Fatalf("ExplainShowsItAndItsLastError:\n%s", out)
		}

		// BackoffRespected: before one interval has passed, no retry.
		w.clk.Advance(w.ladder.MaintenanceInterval / 2)
		res = loop.RunOnce(context.Background())
		if _, ok := cycleDecided(res, a, sdk.LabelAgentLostPodDeleteErr); ok {
			t.Fatalf("retried before its time: %+v", res.Decisions)
		}
		if got := w.owed(a); got.Tries != 1 {
			t.Fatalf("tried before its time: %+v", got)
		}

		// Due: tried again, still refused: metered as the reaper's
		// *_pod_delete_error, and the next wait doubles.
		w.clk.Advance(w.ladder.MaintenanceInterval / 2)
		res = loop.RunOnce(context.Background())
		d, ok := cycleDecided(res, a, sdk.LabelAgentLostPodDeleteErr)
		if !ok || d.Applied || d.Reaper != "agentlost" || d.Evidence["tries"] != "2" {
			t.Fatalf("FailedRetryMeteredAsTheReapersDeleteError: %+v (%+v)", d, res.Decisions)
		}
		o = w.owed(a)
		if o.Tries != 2 || !o.NextTryAt.Equal(o.LastTriedAt.Add(2*w.ladder.MaintenanceInterval)) {
			t.Fatalf("after the second try: %+v", o)
		}
		if stoppedInPlace(w.get(p.Name)) {
			t.Fatal("the pod was stopped while patch was refused")
		}
		w.wantProvisional(a, sdk.LabelAgentLost)

		// The verbs granted: not before the doubled wait, then stopped.
		w.grant(podsRead, podsWrite)
		w.clk.Advance(w.ladder.MaintenanceInterval)
		loop.RunOnce(context.Background())
		if got := w.owed(a); got.Tries != 2 || stoppedInPlace(w.get(p.Name)) {
			t.Fatalf("BackoffDoubles: retried inside the doubled wait: %+v", got)
		}
		w.clk.Advance(w.ladder.MaintenanceInterval)
		res = loop.RunOnce(context.Background())
		if d, ok := cycleDecided(res, a, sdk.LabelTeardownRetried); !ok || !d.Applied || d.Reaper != "agentlost" {
			t.Fatalf("no applied reap_teardown_retried: %+v", res.Decisions)
		}
		if !stoppedInPlace(w.get(p.Name)) {
			t.Fatalf("the pod was not stopped in place: %+v", w.get(p.Name).Spec)
		}
		w.noneOwed(a)
		if g := w.gauge(); g != 0 {
			t.Fatalf("the gauge after the retry: %v", g)
		}
		// TheMarkIsNeverUndone.
		if ti := w.row(a); ti.State != sdk.StateFailed || ti.LastFailureKind != sdk.FailureInfra {
			t.Fatalf("row after the retries: %+v", ti)
		}
		if out := w.explain(a); strings.Contains(out, "teardown owed of") || !strings.Contains(out, sdk.LabelTeardownRetried) {
			t.Fatalf("explain after the retry:\n%s", out)
		}
		// TheReplaceWaitedForTheTeardown: the mark stayed unconfirmed while
		// the pod ran; once its container is stopped, a sweep confirms it.
		w.waitPhase(p.Name, corev1.PodFailed)
		w.waitFor("a sweep to confirm the mark", func() bool {
			loop.RunOnce(context.Background())
			return !w.row(a).InfraConfirmedAt.IsZero()
		})
	})

	t.Run("PastTheValve_TheOldPodToldToStopAndTheRetryNeverTouchesTheSuccessor", func(t *testing.T) {
		t.Parallel()
		w := newOwedWorld(t, kubetest.Bob)
		ctx := context.Background()
		a := att("run-1", "t")
		old := w.silent(a)
		loop := w.loop(w.term, false, nil)
		loop.RunOnce(ctx)
		w.owed(a)
		// The sweeps of the valve's span hold the mark: the old pod runs.
		for w.clk.Advance(w.ladder.MaintenanceInterval); w.clk.Now().Before(w.row(a).InfraMarkedAt.Add(w.ladder.InfraConfirmValve)); w.clk.Advance(w.ladder.MaintenanceInterval) {
			loop.RunOnce(ctx)
			if !w.row(a).InfraConfirmedAt.IsZero() {
				t.Fatal("the mark was confirmed while the old pod's container runs")
			}
		}
		// Past the valve the task is re-placed on a new epoch, through the
		// rail directly (the kube runner itself holds the mark while this
		// pod may run: see the AFrozenAgentsPod subtests), and the
		// successor's pod runs.
		rel, err := w.w.Replace(ctx, a, w.clk.Now())
		if err != nil || !rel.Applied {
			t.Fatalf("re-place: %+v, %v", rel, err)
		}
		next := a
		next.Epoch++
		successor := w.pod(next, true)
		// The old pod's agent is told to stop on its next heartbeat.
		if stop, err := w.w.Heartbeat(ctx, a, w.clk.Now()); err != nil || !stop {
			t.Fatalf("the old attempt's heartbeat: stop=%v, %v; want should_terminate", stop, err)
		}
		if got := w.owed(a); got.Tries < 2 {
			t.Fatalf("the owed teardown was not retried across the valve: %+v", got)
		}
		// The verbs return: the retry stops the old pod, and only it.
		w.grant(podsRead, podsWrite)
		w.clk.Advance(owed.BackoffCapDefault)
		res := loop.RunOnce(ctx)
		if _, ok := cycleDecided(res, a, sdk.LabelTeardownRetried); !ok {
			t.Fatalf("no retry: %+v", res.Decisions)
		}
		if !stoppedInPlace(w.get(old.Name)) {
			t.Fatal("the old pod was not stopped")
		}
		if p := w.get(successor.Name); p.Spec.ActiveDeadlineSeconds != nil || p.DeletionTimestamp != nil {
			t.Fatalf("the successor's pod was touched: %+v", p.Spec)
		}
		w.noneOwed(a)
	})

	// The owed-teardown hold: the stop and the delete refused by RBAC, the
	// old agent frozen (it never heartbeats again, so it never hears
	// should_terminate), the valve passed: the kube runner, reading the
	// pod live, starts no successor while the teardown is owed and the old
	// pod may run; once the pod is gone, exactly one starts.
	for name, gone := range map[string]func(w *owedWorld, p *corev1.Pod) (clears bool){
		// The runbook's step: an admin force-deletes the pod (grace 0);
		// its outcome record finalizer keeps the object, which reaperd
		// may not patch away, so its teardown stays owed (on a real node
		// the kubelet would end the container and its phase with it)
		// until the verbs are granted back.
		"ForceDeletedByAnAdmin": func(w *owedWorld, p *corev1.Pod) bool {
			if err := w.cs.CoreV1().Pods(w.ns).Delete(context.Background(), p.Name, *metav1.NewDeleteOptions(0)); err != nil {
				w.t.Fatal(err)
			}
			w.waitFor("the pod deleted with no grace", func() bool {
				got := w.get(p.Name)
				return got == nil || (got.DeletionGracePeriodSeconds != nil && *got.DeletionGracePeriodSeconds == 0)
			})
			return false
		},
		// The backstop: the pod's activeDeadlineSeconds passes and the
		// kubelet (KWOK's stage) fails it. An admin brings the deadline
		// to now rather than the test waiting out the credential ceiling.
		"ItsOwnDeadlinePasses": func(w *owedWorld, p *corev1.Pod) bool {
			if _, err := w.cs.CoreV1().Pods(w.ns).Patch(context.Background(), p.Name, types.MergePatchType,
				[]byte(`{"spec":{"activeDeadlineSeconds":1}}`), metav1.PatchOptions{}); err != nil {
				w.t.Fatal(err)
			}
			if got := w.waitPhase(p.Name, corev1.PodFailed); got.Status.Reason != "DeadlineExceeded" {
				w.t.Fatalf("the pod failed for %q", got.Status.Reason)
			}
			return true
		},
	} {
		t.Run("PastTheValve_AFrozenAgentsPodHoldsTheMarkUntilItIsGone/"+name, func(t *testing.T) {
			t.Parallel()
			pastTheValveFrozenAgent(t, gone)
		})
	}

	t.Run("LeaderChange_TheNewTermPicksUpTheRowAndTheDeposedDoesNothing", func(t *testing.T) {
		t.Parallel()
		w := newOwedWorld(t, kubetest.Bob)
		ctx := context.Background()
		a := att("run-1", "t")
		p := w.silent(a)
		old := w.loop(w.term, false, nil)
		old.RunOnce(ctx)
		before := w.owed(a)

		// Another replica takes the lease (a new term); the old loop still
		// believes it leads.
		if ok, err := w.store.Resign(ctx, w.term, "kubereapers-test"); err != nil || !ok {
			t.Fatalf("resign: %v, %v", ok, err)
		}
		lease, ok, err := w.store.TryAcquire(ctx, "the-next-leader", 24*time.Hour, w.clk.Now())
		if err != nil || !ok || lease.Term <= w.term {
			t.Fatalf("the next leader's acquire: %+v, %v, %v", lease, ok, err)
		}
		w.grant(podsRead, podsWrite)
		w.clk.Advance(w.ladder.MaintenanceInterval)

		// ADeposedTermRetriesNothing.
		res := old.RunOnce(ctx)
		if _, ok := cycleDecided(res, a, sdk.LabelTeardownRetried); ok {
			t.Fatalf("the deposed term retried: %+v", res.Decisions)
		}
		if stoppedInPlace(w.get(p.Name)) {
			t.Fatal("the deposed term stopped the pod")
		}
		if got := w.owed(a); got.Tries != before.Tries || !got.LastTriedAt.Equal(before.LastTriedAt) {
			t.Fatalf("the deposed term wrote the row: %+v, was %+v", got, before)
		}

		// A new loop (a restarted host) under the new term: the table is the
		// memory.
		next := w.loop(lease.Term, false, nil)
		res = next.RunOnce(ctx)
		if _, ok := cycleDecided(res, a, sdk.LabelTeardownRetried); !ok {
			t.Fatalf("the new term did not retry: %+v", res.Decisions)
		}
		if !stoppedInPlace(w.get(p.Name)) {
			t.Fatal("the new term's retry did not stop the pod")
		}
		w.noneOwed(a)
	})

	t.Run("DryRun_NothingOwed", func(t *testing.T) {
		t.Parallel()
		w := newOwedWorld(t, kubetest.Bob)
		a := att("run-1", "t")
		p := w.silent(a)
		res := w.loop(w.term, true, nil).RunOnce(context.Background())
		if d, ok := cycleDecided(res, a, sdk.LabelAgentLost); !ok || !d.DryRun || d.Applied {
			t.Fatalf("no dry-run agent_lost: %+v", res.Decisions)
		}
		w.noneOwed(a)
		if g := w.gauge(); g != 0 {
			t.Fatalf("the gauge under dry-run: %v", g)
		}
		if stoppedInPlace(w.get(p.Name)) {
			t.Fatal("dry-run stopped the pod")
		}
		w.wantState(a, sdk.StateRunning)
	})
}

// podsCreate lets the runner, on reaperd's identity, create the task pods.
var podsCreate = rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create"}}

// pastTheValveFrozenAgent runs the owed-teardown hold's scenario; gone
// ends the old pod and says whether the owed teardown then completes on its
// own, RBAC still refusing.
func pastTheValveFrozenAgent(t *testing.T, gone func(w *owedWorld, p *corev1.Pod) (clears bool)) {
	w := newOwedWorld(t, kubetest.Bob)
	ctx := context.Background()
	// reaperd's Role: read and create pods, never patch or delete them.
	w.grant(podsRead, podsCreate)
	var logs bytes.Buffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("runner log:\n%s", logs.String())
		}
	})
	r, err := kuberunner.New(kuberunner.Config{Client: w.c.ClientFor(t, w.user), Namespace: w.ns,
		Image: "registry.invalid/reaper-task:test", Ladder: w.ladder, Clock: w.clk,
		Logger: hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Debug})}, w.w)
	if err != nil {
		t.Fatal(err)
	}
	runner := func() kuberunner.Result {
		t.Helper()
		res, err := r.RunOnce(ctx, w.clk.Now())
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if err := w.w.CreateRun(ctx, lifecycle.NewRun{RunID: "run-1", DagID: "dag", Tasks: []lifecycle.NewTask{
		{TaskID: "t", Executor: sdk.ExecutorKube, Command: "true", Retries: 1}}}, w.clk.Now()); err != nil {
		t.Fatal(err)
	}
	if res := runner(); res.Dispatched != 1 {
		t.Fatalf("dispatched %d", res.Dispatched)
	}
	a := w.row(sdk.Attempt{RunID: "run-1", TaskID: "t"}).Attempt
	taskPods := func() map[sdk.Attempt]corev1.Pod {
		t.Helper()
		list, err := w.cs.CoreV1().Pods(w.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[sdk.Attempt]corev1.Pod{}
		for _, p := range list.Items {
			if got, ok := kube.PodAttempt(p.Labels, p.Annotations); ok && got.RunID == a.RunID && got.TaskID == a.TaskID {
				out[got] = p
			}
		}
		return out
	}
	old, ok := taskPods()[a]
	if !ok {
		t.Fatalf("no pod for %s: %v", a, taskPods())
	}
	// The scheduler's part: bound to the KWOK node, where it runs.
	if err := w.cs.CoreV1().Pods(w.ns).Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: old.Name},
		Target: corev1.ObjectReference{Kind: "Node", Name: w.node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.waitPhase(old.Name, corev1.PodRunning)
	// The agent reports running and heartbeats once, then freezes.
	w.toRunning(a)
	w.clk.Advance(w.ladder.AgentLost + time.Second)

	loop := w.loop(w.term, false, nil)
	res := loop.RunOnce(ctx)
	if _, ok := cycleDecided(res, a, sdk.LabelAgentLost); !ok {
		t.Fatalf("no agent_lost mark: %+v", res.Decisions)
	}
	w.wantProvisional(a, sdk.LabelAgentLost)
	w.owed(a)
	marked := w.row(a).InfraMarkedAt

	// The valve's span, then ten minutes past it, a maintenance interval
	// at a time: the host's cycle (the sweep, the owed retries) and the
	// runner's, the old agent silent throughout.
	var held int
	for end := marked.Add(w.ladder.InfraConfirmValve + 10*time.Minute); w.clk.Now().Before(end); {
		w.clk.Advance(w.ladder.MaintenanceInterval)
		loop.RunOnce(ctx)
		res := runner()
		if res.Replaced != 0 || res.Dispatched != 0 {
			t.Fatalf("at %s past the mark: replaced %d, dispatched %d, decisions %v: a successor while the teardown is owed",
				w.clk.Now().Sub(marked), res.Replaced, res.Dispatched, res.Decisions)
		}
		if n := len(taskPods()); n != 1 {
			t.Fatalf("%d pods of the task while the teardown is owed", n)
		}
		for _, d := range res.Decisions {
			if d.Attempt != a || d.Label != sdk.LabelInfraConfirmValveHeld {
				t.Fatalf("runner decision %+v", d)
			}
			o := w.owed(a)
			if !strings.Contains(d.Detail, "a teardown of the attempt is owed") || d.Evidence["pod"] != old.Name ||
				d.Evidence["owed_teardown"] != strconv.FormatInt(o.ID, 10) || d.Evidence["owed_tries"] != strconv.Itoa(o.Tries) ||
				!strings.Contains(d.Evidence["owed_last_error"], "forbidden") || d.Evidence["owed_next_try_at"] != o.NextTryAt.UTC().Format(time.RFC3339) {
				t.Fatalf("held decision %+v (owed %+v)", d, o)
			}
			held++
		}
	}
	if held == 0 {
		t.Fatal("the runner never recorded infra_confirm_valve_held")
	}
	// The owed teardown's own backoff kept trying, and kept being refused.
	if o := w.owed(a); o.Tries < 4 || !strings.Contains(o.LastError, "forbidden") {
		t.Fatalf("the owed teardown across the hold: %+v", o)
	}
	if p := w.get(old.Name); p == nil || p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
		t.Fatalf("the old pod changed while everything was refused: %+v", p)
	}
	w.wantProvisional(a, sdk.LabelAgentLost)

	// The old pod goes: the next runner cycle re-places, exactly one
	// successor starts, and no later cycle starts another.
	clears := gone(w, &old)
	w.clk.Advance(time.Second)
	res2 := runner()
	if res2.Replaced != 1 {
		t.Fatalf("once the old pod is gone: replaced %d, decisions %v", res2.Replaced, res2.Decisions)
	}
	for range 5 {
		w.clk.Advance(w.ladder.MaintenanceInterval)
		loop.RunOnce(ctx)
		runner()
	}
	next := a
	next.Epoch++
	pods := taskPods()
	if _, ok := pods[next]; !ok || len(pods) != 2 {
		t.Fatalf("pods of the task after the hold: %v; want the old one and exactly one successor (%s)", pods, next)
	}
	if got := w.row(a); got.Attempt != next {
		t.Fatalf("the task's attempt after the hold: %s, want %s", got.Attempt, next)
	}
	if !clears {
		return
	}
	// A finished pod's teardown is complete: the next due retry clears
	// the row on its own (within the backoff's cap).
	for end := w.clk.Now().Add(owed.BackoffCapDefault + w.ladder.MaintenanceInterval); ; {
		rows, err := w.store.OwedTeardownsFor(ctx, a.RunID, a.TaskID)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) == 0 {
			break
		}
		if !w.clk.Now().Before(end) {
			t.Fatalf("the owed teardown of the finished pod was never cleared: %+v", rows)
		}
		w.clk.Advance(w.ladder.MaintenanceInterval)
		loop.RunOnce(ctx)
	}
}
