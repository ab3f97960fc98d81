// Package kuberunner is the kube runner: the scheduler's side of the
// Kubernetes edition, the counterpart of the Lite runner (package
// runner/literunner) over the same board and the same rails. On the leader,
// every cycle (RunOnce) drives the task instances of the kube executor:
//
//  1. release: the retry and reschedule rails, and infra failures re-placed
//     on the infra budget (a new epoch, the retries untouched) once their
//     mark is confirmed (by the substrate's sweep) or, unconfirmed, once the
//     infra confirmation valve has passed since the mark; with the budget
//     spent, failed for good (see package runner/internal/steps).
//  2. start and schedule: queued runs under the run start cap; task
//     instances in state none of running runs whose upstreams all
//     succeeded become scheduled (the blocked ones settled, as on Lite).
//  3. dispatch: each scheduled attempt becomes queued and gets a pod
//     (BuildPod: the attempt's labels and raw task id annotation, the task
//     container with the outcome record path, the activeDeadlineSeconds of
//     ActiveDeadline), whose UID is recorded on the attempt. A create that
//     fails as unavailable (see Unavailable) offers the task again on the
//     dispatch-failure backoff rail, a new epoch and no retry spent, for
//     DispatchUnavailableWindow from the task's dispatch_unavailable_since,
//     which the row keeps across restarts and leader changes
//     (dispatch_unavailable, WARN); then it fails as dispatch_failed
//     (dispatch_unavailable_exhausted, ERROR). A create refused fails as
//     dispatch_failed at once. dispatch_failed is terminal and spends no
//     retry: a clear starts the task over.
//     With Config.DispatchBuffer above 0 the tick hands the attempts to
//     dispatch workers instead, which dispatch each one through the same
//     function, under the tick's leadership term, and the tick waits for
//     them (see dispatchbuf.go).
//  4. warm (with Config.WarmPool): the task instances of executor warm
//     through the same release and schedule steps, then requeued off
//     workers that will not start them and bound to live ones (see
//     warm.go; the pool's refill is a loop of its own in Run).
//  5. observe: the dispatch latency (queued to the agent's RUNNING report)
//     of the attempts this runner queued, pods and warm binds alike, for
//     the same collectors as the Lite runner's.
//  6. finalize: a running run whose task instances are all settled ends.
//
// Dispatch fills only open slots of each task's pool, under its run's
// max_active_tasks, and a retry or re-place only as its pool's recovery
// budget admits it (see runner/internal/steps).
//
// A create whose answer was lost may have made its pod anyway. Offering the
// task again moves it to a new epoch, so that pod's agent is refused at its
// RUNNING report and never starts the task. A pod's name (PodName) ends in
// a hash of a value drawn at random for each create, carried on the pod
// (AnnotationDispatch), so nobody can create a pod under an attempt's name
// before the runner does. A create that meets AlreadyExists (the client
// sent it again after losing its first answer) adopts the pod only when its
// labels and annotation name exactly that attempt and it carries this
// dispatch's value (or the UID the attempt records); any other pod under
// the name is left alone, and the attempt fails on the infra rail
// (pod_name_squatted, confirmed) to be re-placed under a new name on its
// infra budget: a name someone took is no verdict on the task, so never
// dispatch_failed. The pod's name is recorded on the attempt with its UID.
//
// Before a create, the runner looks for live pods of the attempt the board
// does not know (an asynchronous failover lost their dispatch): it deletes
// them and holds the dispatch until none is live (see ghost.go). Those are
// the only pods it deletes: teardown, presence and the reconcile sweep are
// the substrate's (package substrate/kube).
package kuberunner

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/internal/steps"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/kube"
)

// Name is the runner's name in its decisions (sdk.Decision.Reaper) and logs.
const Name = "runner"

// Runner is the kube runner.
type Runner struct {
	cfg   Config
	w     *lifecycle.Writer
	spec  PodSpec
	steps steps.Driver
	log   hclog.Logger

	// The warm pool's (set when Config.WarmPool is).
	warm      WorkerSpec
	warmSteps steps.Driver
	// shunned: live workers that left an attempt unclaimed, bound nothing
	// until the time given. Read and written by the cycle only.
	shunned map[string]time.Time

	// dispatched: attempts this runner queued (a pod created, a warm worker
	// bound) whose running report it has not seen yet; their dispatch
	// latency is measured on the tick that finds them running. Used by the
	// cycle only, and by the dispatch workers during the cycle's dispatch
	// step (Queued under dispatchedMu).
	dispatched   steps.Dispatches
	dispatchedMu sync.Mutex

	// valveNoted: held marks past the valve and when their decision was
	// last recorded (valve.go). Used by the cycle only.
	valveNoted map[sdk.Attempt]time.Time

	// The watch for a failover that may have left ghosts (ghost.go):
	// timeline is the board's WAL timeline as last read (0: not read yet;
	// the cycle only), lookUntil when dispatches stop looking for ghosts
	// (Unix nanoseconds; written by the cycle, read by the dispatch
	// workers too).
	timeline  int64
	lookUntil atomic.Int64
}

// New checks the configuration.
func New(cfg Config, w *lifecycle.Writer) (*Runner, error) {
	if w == nil {
		return nil, errors.New("kube runner: no board writer")
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	r := &Runner{
		cfg: cfg, w: w, log: cfg.Logger,
		spec: PodSpec{
			Namespace: cfg.Namespace, Image: cfg.Image, AgentPath: cfg.AgentPath,
			ServiceAccount: cfg.ServiceAccount, TokenAudience: cfg.TokenAudience, Resources: cfg.Resources, PullPolicy: cfg.PullPolicy,
			TerminationGrace: cfg.TerminationGrace, Heartbeat: cfg.Heartbeat,
			DispatchLost: cfg.Ladder.DispatchLost, CredentialCeiling: cfg.Ladder.CredentialCeiling,
			Hardening: cfg.Hardening,
		},
		steps: steps.Driver{
			W: w, Executor: sdk.ExecutorKube, Name: Name, Valve: cfg.Ladder.InfraConfirmValve,
			MaxActiveRuns: cfg.MaxActiveRuns, DispatchUnavailableWindow: cfg.DispatchUnavailableWindow, Log: cfg.Logger,
			Pools: cfg.Pools, Heartbeat: cfg.Heartbeat, Recovery: steps.NewRecovery(cfg.Recovery),
			PoolReads: &steps.PoolReads{},
		},
		valveNoted: map[sdk.Attempt]time.Time{},
	}
	r.steps.ValveHold = r.valveHold
	if cfg.WarmPool != nil {
		r.warm = warmSpec(cfg, r.spec)
		r.warmSteps = r.steps
		// A warm attempt's pod is its worker's, not named for it: the
		// warm-worker sweep judges those marks.
		r.warmSteps.ValveHold = nil
		r.warmSteps.Executor = sdk.ExecutorWarm
		r.shunned = map[string]time.Time{}
	}
	return r, nil
}

// Close releases nothing (the runner holds no resource of its own; the
// client is the caller's) and stops no pod. It exists so that a host drives
// both runners alike.
func (r *Runner) Close() error { return nil }

// Result reports one cycle.
type Result struct {
	At time.Time // the cycle's now
	// Term is the leadership term the cycle's writes were fenced by (0:
	// none), which its decisions are audited under.
	Term int64
	// Dispatched counts scheduled -> queued with a pod created (or
	// adopted), on the tick or by the dispatch workers.
	Dispatched int
	// Handed counts the attempts handed to the dispatch workers (with
	// Config.DispatchBuffer); BufferWaits the times the cycle found the
	// buffer full and waited for a worker.
	Handed      int
	BufferWaits int
	// WarmBound counts warm attempts bound to a worker (scheduled ->
	// queued); WarmRequeued those offered again on the warm requeue rail.
	WarmBound    int
	WarmRequeued int
	// Adopted counts the pods whose create answered unrecorded that this
	// cycle recorded on their attempts (adoptUnrecorded).
	Adopted int
	Took    time.Duration // how long the cycle took (the runner's clock)
	// Tally counts the shared steps, holds the dispatch latencies measured
	// (task pods and warm binds alike) and the decisions made, for the host
	// to meter and audit.
	steps.Tally
}

// Changed reports whether the cycle wrote anything.
func (res Result) Changed() bool {
	return res.Scheduled+res.Dispatched+res.WarmBound+res.WarmRequeued+res.Retried+res.Rescheduled+res.Replaced+
		res.OfferedAgain+res.Failed+res.Finalized+len(res.RunsStarted) > 0 || len(res.Decisions) > 0
}

// NeedsLeadership is true: the runner writes under the elector's term, so
// the host stops it before the elector resigns.
func (r *Runner) NeedsLeadership() bool { return true }

// Run runs a cycle every Interval until ctx is done, while Config.Leading
// reports true at the tick. Ticks missed by a long cycle are coalesced.
// Start it on a goroutine of the caller's; it returns nil once ctx is done,
// and an error at once without Config.Leading.
func (r *Runner) Run(ctx context.Context) error {
	leading := r.cfg.Leading
	if leading == nil {
		return errors.New("kube runner: Run needs Config.Leading")
	}
	if r.cfg.WarmPool != nil {
		done := make(chan struct{})
		go func() {
			defer close(done)
			r.refillLoop(ctx, leading)
		}()
		defer func() { <-done }()
	}
	// The dispatch workers serve every tick and stop once the last one
	// has returned.
	if p := r.startDispatchPool(); p != nil {
		defer p.stop()
		return r.loop(ctx, leading, p)
	}
	return r.loop(ctx, leading, nil)
}

// loop is Run's loop of ticks, with the dispatch workers of p (nil: none).
func (r *Runner) loop(ctx context.Context, leading func(time.Time) (int64, bool), p *dispatchPool) error {
	tk := r.cfg.Clock.NewTicker(r.cfg.Interval)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tk.C():
		}
		now := r.cfg.Clock.Now()
		term, ok := leading(now)
		if !ok {
			continue
		}
		res, err := r.runOnce(ctx, now, term, p)
		if err != nil && ctx.Err() == nil {
			r.steps.CycleFailed(err)
		}
		r.cfg.Meter.RunnerCycle(res.Cycle(res.Took, r.cfg.Pools))
		if r.cfg.OnResult != nil {
			r.cfg.OnResult(res)
		}
	}
}

// RunOnce runs one cycle at now (see the package documentation). It must
// run on the leader only, and its writes are not fenced: Run fences them
// (RunOnceFenced). On an error it stops where it was: what was written
// stays, and the next cycle picks up from the board.
func (r *Runner) RunOnce(ctx context.Context, now time.Time) (Result, error) {
	return r.RunOnceFenced(ctx, now, 0)
}

// RunOnceFenced is RunOnce with every board write of the cycle fenced by
// the leadership term (lifecycle.Writer.Fenced): once term no longer leads
// the board, the cycle writes nothing more and ends with an error that
// wraps lifecycle.ErrDeposed. A term of 0 fences nothing. With a dispatch
// buffer, the workers are started for the call and stopped before it
// returns (Run keeps its own across its ticks).
func (r *Runner) RunOnceFenced(ctx context.Context, now time.Time, term int64) (Result, error) {
	if p := r.startDispatchPool(); p != nil {
		defer p.stop()
		return r.runOnce(ctx, now, term, p)
	}
	return r.runOnce(ctx, now, term, nil)
}

// runOnce is one cycle, dispatching through the workers of p (nil: on the
// tick).
func (r *Runner) runOnce(ctx context.Context, now time.Time, term int64, p *dispatchPool) (Result, error) {
	res := Result{At: now, Term: term}
	d := r.steps
	d.W = r.w.Fenced(term)
	phases := []step{
		{"watch the board's timeline", func(ctx context.Context, now time.Time, _ *steps.Tally) error {
			r.watchTimeline(ctx, now)
			return nil
		}},
		{"adopt unrecorded pods", func(ctx context.Context, now time.Time, _ *steps.Tally) error {
			return r.adoptUnrecorded(ctx, d, now, &res)
		}},
		{"release", d.Release},
		{"start", d.StartRuns},
		{"schedule", d.Schedule},
		{"dispatch", func(ctx context.Context, now time.Time, _ *steps.Tally) error {
			return r.dispatch(ctx, p, d, now, &res)
		}},
	}
	if r.cfg.WarmPool != nil {
		wd := r.warmSteps
		wd.W = d.W
		phases = append(phases,
			step{"warm release", wd.Release},
			step{"warm schedule", wd.Schedule},
			step{"warm dispatch", func(ctx context.Context, now time.Time, _ *steps.Tally) error {
				return r.warmDispatch(ctx, wd, now, &res)
			}})
	}
	phases = append(phases, step{"observe", r.observeDispatches}, step{"finalize", d.Finalize}, step{"pools", d.ReadPools})
	var err error
	for _, s := range phases {
		if err = s.run(ctx, now, &res.Tally); err != nil {
			err = fmt.Errorf("kube runner: %s: %w", s.name, err)
			break
		}
	}
	res.Took = r.cfg.Clock.Now().Sub(now)
	if res.Changed() {
		r.log.Info("kube runner cycle", "runs_started", len(res.RunsStarted), "runs_waiting", res.RunsWaiting,
			"scheduled", res.Scheduled, "dispatched", res.Dispatched, "handed", res.Handed, "buffer_waits", res.BufferWaits, "warm_bound", res.WarmBound, "warm_requeued", res.WarmRequeued,
			"retried", res.Retried, "rescheduled", res.Rescheduled, "replaced", res.Replaced,
			"offered_again", res.OfferedAgain, "failed", res.Failed, "finalized", res.Finalized, "waiting", res.Waiting)
	}
	return res, err
}

// observeDispatches measures the dispatch latency of the attempts this
// runner queued (task pods and warm binds) that have since reported
// running. An attempt that never reports running is forgotten once the
// dispatch-lost threshold and a tick have passed: it is the reapers' then.
func (r *Runner) observeDispatches(ctx context.Context, now time.Time, t *steps.Tally) error {
	return r.dispatched.Observe(ctx, r.w, now, r.cfg.Ladder.DispatchLost+r.cfg.Interval, t)
}

// step is one step of a cycle.
type step struct {
	name string
	run  func(context.Context, time.Time, *steps.Tally) error
}

// dispatch queues scheduled attempts and creates their pods, within
// MaxParallel: on the tick, one at a time, or through the dispatch
// workers of p (see dispatchbuf.go). Both go through dispatchOne.
func (r *Runner) dispatch(ctx context.Context, p *dispatchPool, d steps.Driver, now time.Time, res *Result) error {
	one := func(ctx context.Context, ti board.TaskInstance, res *Result) (bool, error) {
		return r.dispatchOne(ctx, d, ti, now, res)
	}
	if p != nil {
		return r.dispatchBuffered(ctx, p, d, now, res, one)
	}
	return d.Dispatch(ctx, now, &res.Tally, r.cfg.MaxParallel, func(ctx context.Context, ti board.TaskInstance) (bool, error) {
		return one(ctx, ti, res)
	})
}

// dispatchOne queues one attempt and creates its pod. It reports whether
// the attempt got a pod. The tick and the dispatch workers alike dispatch
// through it (a worker with a res of its own, merged into its tick's).
func (r *Runner) dispatchOne(ctx context.Context, d steps.Driver, ti board.TaskInstance, now time.Time, res *Result) (bool, error) {
	a := ti.Attempt
	if err := ctx.Err(); err != nil {
		return false, err
	}
	// No start beside a pod of the attempt that the board lost (ghost.go).
	if held, err := r.heldForGhost(ctx, d.W, a, now); err != nil || held {
		return false, err
	}
	// Queued first: the agent's RUNNING report is accepted only from queued.
	// The pod's name goes with it, before the create: if the create's
	// answer is never recorded (this runner deposed or stopped in between),
	// a later cycle still knows the pod for the attempt's (adoptUnrecorded).
	dispatch := NewDispatch()
	ok, err := d.W.QueuePod(ctx, a, PodName(a, dispatch), now)
	if err != nil || !ok {
		return false, err
	}
	env, err := fencedBy(r.cfg.Credentials, d.W).Env(ctx, a, now)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return false, fmt.Errorf("dispatching %s: %w", a, cerr)
		}
		return false, r.failed(ctx, d, ti, fmt.Errorf("minting the attempt's credential: %w", err), true, now, res)
	}
	pod := BuildPodFor(r.spec, ti, env, dispatch)
	if r.cfg.Customize != nil {
		r.cfg.Customize(pod)
	}
	cctx, cancel := context.WithTimeout(ctx, r.cfg.CreateTimeout)
	created, err := r.cfg.Client.CoreV1().Pods(r.cfg.Namespace).Create(cctx, pod, metav1.CreateOptions{})
	cancel()
	if apierrors.IsAlreadyExists(err) {
		created, err = r.adopt(ctx, d, a, pod)
	}
	var taken *nameTaken
	if errors.As(err, &taken) {
		return false, r.squatted(ctx, d, ti, pod.Name, taken, now, res)
	}
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			// Stopping, not a verdict on the dispatch: the attempt stays
			// queued, which is what the dispatch-lost reaper settles.
			return false, fmt.Errorf("dispatching %s: %w", a, cerr)
		}
		return false, r.failed(ctx, d, ti, fmt.Errorf("creating pod %s/%s: %w", r.cfg.Namespace, pod.Name, err),
			Unavailable(err), now, res)
	}
	r.noteQueued(ti, now)
	rec := lifecycle.CreatedPod{Name: created.Name, UID: string(created.UID), Created: created.CreationTimestamp.Time}
	if _, err := d.W.RecordCreatedPod(ctx, a, rec, now); err != nil {
		return true, err
	}
	res.Dispatched++
	return true, nil
}

// nameTaken is adopt's answer when the pod under the name is not the
// attempt's: someone else made it (or it was gone when read).
type nameTaken struct {
	pod *corev1.Pod // nil: gone when read
	why string
}

func (e *nameTaken) Error() string { return e.why }

// adopt reads the pod a create met as AlreadyExists under the name of want.
// The name ends in a hash of this dispatch's own random value (PodName), so
// nobody could know it before the create: the pod is most likely the one
// this very create made, whose first answer was lost and which the client
// sent again. It is adopted only when that is proven: its labels and
// annotation name exactly the attempt, and it carries this dispatch's value
// (AnnotationDispatch) while the attempt records no pod, or its UID is the
// one the attempt records. Any other pod (a tenant who guessed or read the
// name) is a *nameTaken, left alone; so is a pod gone by the time it is
// read. A read that fails is returned as it is.
func (r *Runner) adopt(ctx context.Context, d steps.Driver, a sdk.Attempt, want *corev1.Pod) (*corev1.Pod, error) {
	cctx, cancel := context.WithTimeout(ctx, r.cfg.CreateTimeout)
	defer cancel()
	got, err := r.cfg.Client.CoreV1().Pods(r.cfg.Namespace).Get(cctx, want.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, &nameTaken{why: fmt.Sprintf("pod %s/%s existed at the create and was gone when read", r.cfg.Namespace, want.Name)}
	}
	if err != nil {
		return nil, fmt.Errorf("reading the pod that already exists: %w", err)
	}
	recorded, err := d.W.PodUID(ctx, a)
	if err != nil {
		return nil, fmt.Errorf("reading the pod UID recorded on the attempt: %w", err)
	}
	if why := notOurs(got, want, recorded); why != "" {
		return nil, &nameTaken{pod: got, why: why}
	}
	r.log.Info("the attempt's pod already existed, made by this dispatch: adopted", "attempt", a.String(),
		"pod", got.Name, "uid", got.UID)
	return got, nil
}

// notOurs says why got, found under want's name, is not the pod the
// runner made for want's attempt ("": it is).
func notOurs(got, want *corev1.Pod, recorded string) string {
	what := fmt.Sprintf("pod %s/%s (uid %s) is under the attempt's pod name but ", got.Namespace, got.Name, got.UID)
	for k, v := range want.Labels {
		if got.Labels[k] != v {
			return what + fmt.Sprintf("its label %s is %q: it is not the attempt's", k, got.Labels[k])
		}
	}
	if raw := kube.AnnotationRawTaskID; got.Annotations[raw] != want.Annotations[raw] {
		return what + fmt.Sprintf("its annotation %s is %q: it is not the attempt's", raw, got.Annotations[raw])
	}
	switch {
	case recorded != "" && recorded == string(got.UID):
		return ""
	case recorded != "":
		return what + "the attempt records pod uid " + recorded + ": the runner did not make that pod"
	case got.Annotations[AnnotationDispatch] == "" || got.Annotations[AnnotationDispatch] != want.Annotations[AnnotationDispatch]:
		return what + "it does not carry this dispatch's " + AnnotationDispatch + ": the runner did not make that pod"
	}
	return ""
}

// squatted settles a queued attempt whose pod name was taken: the pod
// under it is left alone and the attempt fails on the infra rail,
// confirmed (nothing of the attempt runs: its pod was never created), so
// that the next cycle's release re-places it under a new name on its
// infra budget, or fails it for good once that is spent
// (infra_budget_spent). Never dispatch_failed: a name someone else took is
// no verdict on the task. Logged and metered as pod_name_squatted.
func (r *Runner) squatted(ctx context.Context, d steps.Driver, ti board.TaskInstance, name string, taken *nameTaken, now time.Time, res *Result) error {
	a := ti.Attempt
	ev := map[string]string{"pod": name, "error": taken.why}
	if p := taken.pod; p != nil {
		ev["pod_uid"] = string(p.UID)
		got, ok := kube.PodAttempt(p.Labels, p.Annotations)
		ev["names_attempt"] = strconv.FormatBool(ok && got == a)
	}
	ok, err := d.W.Fail(ctx, a, []string{sdk.StateQueued}, lifecycle.Failure{
		Kind: sdk.MarkInfra, Reason: sdk.LabelPodNameSquatted, Confirm: true,
		Message: sdk.LabelPodNameSquatted + ": " + taken.why,
	}, now)
	if err != nil {
		return err
	}
	ev["infra_used"] = strconv.Itoa(int(ti.InfraUsed))
	ev["infra_budget"] = strconv.Itoa(int(ti.InfraBudget))
	d.Decide(&res.Tally, hclog.Warn, sdk.Decision{Label: sdk.LabelPodNameSquatted, Attempt: a, Applied: ok,
		Detail: "the pod create met a pod the runner did not make under the attempt's pod name: left alone; " +
			"the attempt fails on the infra rail and is re-placed under a new name",
		Evidence: ev})
	return nil
}

// failed settles a queued attempt whose dispatch failed: passing errors are
// offered again within the window, the others fail at once.
func (r *Runner) failed(ctx context.Context, d steps.Driver, ti board.TaskInstance, err error, passing bool, now time.Time, res *Result) error {
	return d.DispatchFailed(ctx, steps.DispatchFailure{
		TI: ti, Err: err, What: "the pod create failed",
		Move:        steps.DecideDispatchFailure(passing, ti.DispatchUnavailableSince, now, r.cfg.DispatchUnavailableWindow),
		AgainDetail: "Kubernetes API unavailable: offering the task again",
	}, now, &res.Tally)
}
