package kuberunner

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/agent"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/runner/internal/steps"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/substrate/kube"
)

// The warm pool: long-lived worker pods, each running reaper-agent in
// worker mode, to which the runner binds the attempts of executor warm.
//
//   - Refill (its own loop in Run, every WarmPool.Refill, on the leader,
//     never held by the reapers' settling gate) keeps WarmPool.Size worker
//     pods that are neither finished nor being deleted: a worker whose pod
//     is gone, finished or terminating is replaced by a new one, with a new
//     name and a new worker credential. It never deletes a pod.
//   - Dispatch binds each scheduled warm attempt to the Running worker
//     with the fewest bound attempts below WarmPool.Slots: queued with the
//     worker's name (warm_worker), in one write guarded on the attempt's
//     (state, try, epoch) and its run; the credential's mint time is
//     recorded then (the dispatch), and the worker claims the attempt
//     through the attempt API.
//   - Requeue: a queued (never started) attempt bound to a worker whose
//     pod is terminating, finished or gone, or to a live worker that has
//     not started it within WarmPool.UnclaimedAfter (the worker is then
//     bound nothing for as long again), goes back to scheduled on the
//     warm requeue rail (a new epoch, the heartbeat and the binding
//     cleared), decision warm_requeue. A running attempt is never moved
//     here: if its worker's pod vanished, the warm-worker-lost reaper fails
//     it on the infra rail, and the release step re-places it like any
//     confirmed infra mark.
//
// A worker pod carries the pool's label (kube.LabelWarmPool = the pool's
// name, which the kube substrate's warm_pool_selector selects), one
// container named WorkerContainer running the agent in worker mode with
// its name, slots, poll, heartbeat and watchdog as flags and its worker
// credential in the environment, restartPolicy Never, and no
// activeDeadlineSeconds: each attempt's wall-clock bound is the worker's
// watchdog (ladder.WarmAttemptWatchdog, the credential ceiling).

// WorkerContainer is the name of a warm worker pod's one container.
const WorkerContainer = "worker"

// Defaults of WarmPool.
const (
	WarmPoolNameDefault   = "default"
	WarmSlotsDefault      = 1
	WarmPollDefault       = time.Second
	WarmRefillDefault     = 5 * time.Second
	warmWorkerNamePrefix  = "reaper-warm-"
	warmWorkerNamePoolLen = 30
)

// WarmPool configures the warm pool (Config.WarmPool).
type WarmPool struct {
	// Name is the pool's name: the value of kube.LabelWarmPool on its
	// pods. Default WarmPoolNameDefault.
	Name string
	// Size is how many worker pods the pool keeps. Required (> 0).
	Size int
	// Slots is how many attempts a worker runs at once. Default
	// WarmSlotsDefault.
	Slots int
	// Poll is how often a worker claims. Default WarmPollDefault.
	Poll time.Duration
	// Refill is how often the pool is refilled. Default WarmRefillDefault.
	Refill time.Duration
	// Credentials mints a worker's credential at its pod's creation.
	// Default: none (the worker cannot claim; tests of the pod's shape).
	Credentials WorkerCredentials
	// UnclaimedAfter is how long an attempt may stay bound to a live
	// worker without being started before it is requeued and the worker
	// is bound nothing for as long again. Default: the ladder's
	// dispatch_lost (3 min).
	UnclaimedAfter time.Duration
}

// WorkerCredentials gives a warm worker pod its worker credential.
type WorkerCredentials interface {
	WorkerEnv(ctx context.Context, worker string, now time.Time) ([]corev1.EnvVar, error)
}

// WorkerMinter mints a worker credential: attempttoken.Issuer, whose
// MintWorkerBootstrap is the worker's bootstrap token (the worker
// exchanges it once for its worker token).
type WorkerMinter interface {
	MintWorkerBootstrap(worker string, now time.Time) (attempttoken.WorkerCredential, error)
}

// MintedWorkerCredentials is the WorkerCredentials of reaperd: the attempt
// API's issuer mints the worker's bootstrap token (bound to the worker's
// name; the worker exchanges it once for its worker token), and the pod
// gets it with the API's address and CA.
type MintedWorkerCredentials struct {
	Minter WorkerMinter
}

// WorkerEnv mints worker's credential at now.
func (m MintedWorkerCredentials) WorkerEnv(_ context.Context, worker string, now time.Time) ([]corev1.EnvVar, error) {
	cred, err := m.Minter.MintWorkerBootstrap(worker, now)
	if err != nil {
		return nil, err
	}
	return envVars(cred.Env), nil
}

func envVars(kvs []string) []corev1.EnvVar {
	env := make([]corev1.EnvVar, 0, len(kvs))
	for _, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		env = append(env, corev1.EnvVar{Name: k, Value: v})
	}
	return env
}

func (p WarmPool) withDefaults(dispatchLost time.Duration) (WarmPool, error) {
	if p.Name == "" {
		p.Name = WarmPoolNameDefault
	}
	if p.Slots == 0 {
		p.Slots = WarmSlotsDefault
	}
	if p.Poll == 0 {
		p.Poll = WarmPollDefault
	}
	if p.Refill == 0 {
		p.Refill = WarmRefillDefault
	}
	if p.UnclaimedAfter == 0 {
		p.UnclaimedAfter = dispatchLost
		if p.UnclaimedAfter <= 0 {
			p.UnclaimedAfter = ladder.Defaults().DispatchLost
		}
	}
	var errs []error
	if p.Size <= 0 {
		errs = append(errs, fmt.Errorf("warm pool size %d: must be positive", p.Size))
	}
	if p.Slots < 0 || p.Poll < 0 || p.Refill < 0 || p.UnclaimedAfter < 0 {
		errs = append(errs, errors.New("warm pool slots, poll, refill and unclaimed-after must be positive"))
	}
	if name := namePart(p.Name, 63); name != p.Name {
		errs = append(errs, fmt.Errorf("warm pool name %q: must be a label value of [a-z0-9-]", p.Name))
	}
	return p, errors.Join(errs...)
}

// WorkerName is a new worker name of pool: a fixed prefix, the pool's name
// cut short and a random part. It is a DNS label.
func WorkerName(pool string) (string, error) {
	b := make([]byte, 5)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("naming a warm worker: %w", err)
	}
	return warmWorkerNamePrefix + namePart(pool, warmWorkerNamePoolLen) + "-" + hex.EncodeToString(b), nil
}

// WorkerSpec is what the configuration says of every warm worker pod.
type WorkerSpec struct {
	PodSpec
	Pool     string
	Slots    int
	Poll     time.Duration
	Watchdog time.Duration // ladder.WarmAttemptWatchdog; 0: none
}

// BuildWorkerPod is the pod of warm worker name (see the warm pool notes
// above), hardened like a task pod (see harden), with the pod token its
// exchange proves the pod with (see projectPodToken); env is its worker
// credential.
func BuildWorkerPod(spec WorkerSpec, name string, env []corev1.EnvVar) *corev1.Pod {
	inv := agent.Invocation{Worker: name, Slots: spec.Slots, Poll: spec.Poll, Watchdog: spec.Watchdog,
		Heartbeat: spec.Heartbeat}
	grace := ceilSeconds(spec.TerminationGrace)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: spec.Namespace,
			Labels: map[string]string{kube.LabelWarmPool: spec.Pool}},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			ServiceAccountName:            spec.ServiceAccount,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name:            WorkerContainer,
				Image:           spec.Image,
				ImagePullPolicy: spec.PullPolicy,
				Command:         []string{spec.AgentPath},
				Args:            inv.WorkerArgs(),
				Env:             env,
				Resources:       spec.Resources,
			}},
		},
	}
	harden(spec.Hardening, pod, &pod.Spec.Containers[0])
	projectPodToken(pod, &pod.Spec.Containers[0], spec.TokenAudience)
	return pod
}

// worker is one pod of the pool as a listing saw it.
type worker struct {
	name string
	live bool // neither finished nor being deleted
	// running: live and Running, so its worker process is up: only such a
	// worker is bound new attempts (a Pending pod may wait long for its
	// node or image, and the attempt's credential would age meanwhile).
	running bool
}

// listWorkers lists the pool's pods, live (never a cache).
func (r *Runner) listWorkers(ctx context.Context) (map[string]worker, error) {
	sel := labels.SelectorFromSet(labels.Set{kube.LabelWarmPool: r.warm.Pool}).String()
	cctx, cancel := context.WithTimeout(ctx, r.cfg.CreateTimeout)
	defer cancel()
	list, err := r.cfg.Client.CoreV1().Pods(r.cfg.Namespace).List(cctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("listing the warm pool %s: %w", r.warm.Pool, err)
	}
	out := make(map[string]worker, len(list.Items))
	for _, p := range list.Items {
		live := p.DeletionTimestamp == nil && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
		out[p.Name] = worker{name: p.Name, live: live, running: live && p.Status.Phase == corev1.PodRunning}
	}
	return out, nil
}

// RefillResult reports one refill.
type RefillResult struct {
	Live    int      // live workers before the refill
	Created []string // workers created
}

// Refill creates worker pods until the pool holds WarmPool.Size live ones,
// recording each one's pod UID on the board (what the worker's exchange
// proves it comes from). A create that fails is returned (joined) and tried
// again at the next refill. It must run on the leader only, and its writes
// are not fenced: the refill loop fences them (RefillFenced).
func (r *Runner) Refill(ctx context.Context, now time.Time) (RefillResult, error) {
	return r.RefillFenced(ctx, now, 0)
}

// warmPodRecordKeep is how long a warm worker's pod record is kept at
// least: far longer than its bootstrap credential can be exchanged (one
// attempt token TTL from the pod's creation).
const warmPodRecordKeep = 24 * time.Hour

// RefillFenced is Refill with its board writes fenced by the leadership
// term (a term of 0 fences nothing).
func (r *Runner) RefillFenced(ctx context.Context, now time.Time, term int64) (RefillResult, error) {
	if r.cfg.WarmPool == nil {
		return RefillResult{}, nil
	}
	ws, err := r.listWorkers(ctx)
	if err != nil {
		return RefillResult{}, err
	}
	var res RefillResult
	for _, w := range ws {
		if w.live {
			res.Live++
		}
	}
	var errs []error
	w := r.w.Fenced(term)
	if res.Live < r.cfg.WarmPool.Size {
		// Pods are made before the board records them: a replica whose
		// term no longer leads makes none.
		if err := w.Leads(ctx, now); err != nil {
			return res, fmt.Errorf("warm pool %s: refill: %w", r.warm.Pool, err)
		}
	}
	for n := res.Live; n < r.cfg.WarmPool.Size; n++ {
		name, err := r.createWorker(ctx, w, now)
		if err != nil {
			if cerr := ctx.Err(); cerr != nil {
				return res, cerr
			}
			errs = append(errs, err)
			continue
		}
		res.Created = append(res.Created, name)
	}
	if len(res.Created) > 0 {
		r.log.Info("warm pool refilled", "pool", r.warm.Pool, "live", res.Live, "created", res.Created)
	}
	if err := errors.Join(errs...); err != nil {
		return res, fmt.Errorf("warm pool %s: %d worker pods not created: %w", r.warm.Pool, len(errs), err)
	}
	return res, nil
}

// createWorker creates a worker pod and records its UID through w. A
// worker whose record failed is returned with the error: its pod runs, but
// its exchange is answered "not recorded" until its bootstrap lapses, and
// its pod then ends and is replaced.
func (r *Runner) createWorker(ctx context.Context, w *lifecycle.Writer, now time.Time) (string, error) {
	name, err := WorkerName(r.warm.Pool)
	if err != nil {
		return "", err
	}
	var env []corev1.EnvVar
	if c := r.cfg.WarmPool.Credentials; c != nil {
		if env, err = c.WorkerEnv(ctx, name, now); err != nil {
			return "", fmt.Errorf("minting the credential of warm worker %s: %w", name, err)
		}
	}
	pod := BuildWorkerPod(r.warm, name, env)
	if r.cfg.Customize != nil {
		r.cfg.Customize(pod)
	}
	cctx, cancel := context.WithTimeout(ctx, r.cfg.CreateTimeout)
	defer cancel()
	created, err := r.cfg.Client.CoreV1().Pods(r.cfg.Namespace).Create(cctx, pod, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("creating warm worker pod %s/%s: %w", r.cfg.Namespace, name, err)
	}
	keep := max(warmPodRecordKeep, 2*r.cfg.Ladder.AttemptTokenTTL)
	if err := w.RecordWarmWorkerPod(ctx, name, string(created.UID), keep, now); err != nil {
		return name, fmt.Errorf("warm worker pod %s/%s created: %w", r.cfg.Namespace, name, err)
	}
	return name, nil
}

// refillLoop runs Refill every WarmPool.Refill while leading, fenced by
// the term, until ctx is done. It does not wait for anything else: not for
// the runner's cycle, and not for the reapers' settling gate.
func (r *Runner) refillLoop(ctx context.Context, leading func(time.Time) (int64, bool)) {
	tk := r.cfg.Clock.NewTicker(r.cfg.WarmPool.Refill)
	defer tk.Stop()
	for {
		now := r.cfg.Clock.Now()
		if term, ok := leading(now); ok {
			res, err := r.RefillFenced(ctx, now, term)
			if err != nil && ctx.Err() == nil {
				r.log.Warn("warm pool refill failed; the next one tries again", "error", err)
			}
			if r.cfg.OnRefill != nil {
				r.cfg.OnRefill(res, err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tk.C():
		}
	}
}

// warmDispatch requeues the queued warm attempts whose worker will not
// start them, then binds the scheduled ones to live workers with a free
// slot.
func (r *Runner) warmDispatch(ctx context.Context, wd steps.Driver, now time.Time, res *Result) error {
	ws, err := r.listWorkers(ctx)
	if err != nil {
		// No worker can be judged: nothing is bound or requeued this cycle.
		r.log.Warn("warm dispatch skipped: the pool could not be listed", "error", err)
		return nil
	}
	load := map[string]int{}
	var after *lifecycle.Key
	for {
		page, err := wd.W.ListWarmBound(ctx, after, ladder.PageSize)
		if err != nil {
			return err
		}
		for _, ti := range page {
			w := ws[ti.WarmWorker]
			unclaimed := w.live && ti.State == sdk.StateQueued && now.Sub(ti.QueuedAt) >= r.cfg.WarmPool.UnclaimedAfter
			if w.live && !unclaimed {
				load[ti.WarmWorker]++
				continue
			}
			if ti.State == sdk.StateQueued {
				if unclaimed {
					r.shunned[w.name] = now.Add(r.cfg.WarmPool.UnclaimedAfter)
				}
				if err := r.warmRequeue(ctx, wd, ti, w, now, res); err != nil {
					return err
				}
			}
		}
		if len(page) < ladder.PageSize {
			break
		}
		last := page[len(page)-1]
		after = &lifecycle.Key{RunID: last.RunID, TaskID: last.TaskID}
	}
	for name, until := range r.shunned {
		if _, ok := ws[name]; !ok || !now.Before(until) {
			delete(r.shunned, name)
		}
	}
	bindable := func(w worker) bool { _, shunned := r.shunned[w.name]; return w.running && !shunned }
	free := 0
	for _, w := range ws {
		if bindable(w) {
			free += max(r.warm.Slots-load[w.name], 0)
		}
	}
	if free == 0 {
		return nil
	}
	return wd.DispatchUpTo(ctx, now, &res.Tally, free, func(ctx context.Context, ti board.TaskInstance) (bool, error) {
		name := ""
		for _, w := range ws {
			if bindable(w) && load[w.name] < r.warm.Slots && (name == "" || load[w.name] < load[name] ||
				(load[w.name] == load[name] && w.name < name)) {
				name = w.name
			}
		}
		if name == "" {
			return false, nil
		}
		ok, err := wd.W.QueueWarm(ctx, ti.Attempt, name, now)
		if err != nil || !ok {
			return false, err
		}
		r.dispatched.Queued(ti.Attempt, now)
		if _, err := wd.W.RecordMint(ctx, ti.Attempt, now); err != nil {
			return true, err
		}
		load[name]++
		res.WarmBound++
		return true, nil
	})
}

func (r *Runner) warmRequeue(ctx context.Context, wd steps.Driver, ti board.TaskInstance, w worker, now time.Time, res *Result) error {
	rel, err := wd.W.WarmRequeueUnstarted(ctx, ti.Attempt, now)
	if err != nil {
		return err
	}
	why, detail := "gone", "its warm worker's pod is gone and never started it: offered again"
	switch {
	case w.live:
		why = "live"
		detail = "its warm worker did not start it within " + ladder.Format(r.cfg.WarmPool.UnclaimedAfter) +
			": offered again, and the worker is bound nothing for as long"
	case w.name != "":
		why = "finished or being deleted"
		detail = "its warm worker's pod is finished or being deleted and never started it: offered again"
	}
	ev := map[string]string{"warm_worker": ti.WarmWorker, "worker_pod": why,
		"queued_at": ti.QueuedAt.UTC().Format(time.RFC3339)}
	if rel.Applied {
		res.WarmRequeued++
		ev["next"] = rel.Attempt.String()
	} else {
		detail += " not done: " + rel.Reason
	}
	wd.Decide(&res.Tally, hclog.Info, sdk.Decision{Label: sdk.LabelWarmRequeue, Attempt: ti.Attempt,
		Applied: rel.Applied, Detail: detail, Evidence: ev})
	return nil
}

// warmSpec is the worker spec of the configuration.
func warmSpec(cfg Config, spec PodSpec) WorkerSpec {
	return WorkerSpec{PodSpec: spec, Pool: cfg.WarmPool.Name, Slots: cfg.WarmPool.Slots, Poll: cfg.WarmPool.Poll,
		Watchdog: cfg.Ladder.WarmAttemptWatchdog()}
}
