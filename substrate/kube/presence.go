package kube

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
)

// listPageSize is the page size of every live LIST.
const listPageSize = 500

// maxSelectorBytes bounds the values of one set-based selector, so that a
// page of attempts with long run ids is read in a few LISTs rather than one
// request line the server refuses.
const maxSelectorBytes = 6000

// presence is the informer on the namespace's task pods, reduced by the
// transform to what reaping needs.
type presence struct {
	informer cache.SharedIndexInformer
	// handled: the informer's handler has been handed every pod of its
	// first list.
	handled cache.ResourceEventHandlerRegistration
	// byAttempt finds an attempt's pods (attemptpods.go).
	byAttempt *attemptPods
	tombs     *tombstones
	feed      *feed
	// seen: the pods the cache missed, for the sweep to record
	// (sightings.go).
	seen   *sightings
	cancel context.CancelFunc
	done   chan struct{}
}

// startPresence starts the informer, reducing every pod, in a goroutine
// that stop ends.
func startPresence(client kubernetes.Interface, namespace string, resync time.Duration, c clock.Clock,
	log hclog.Logger) *presence {
	return startInformer(client, namespace, resync, c, log, cacheReducer().object)
}

// startInformer starts the informer with transform (nil: pods are kept
// whole, which only a benchmark wants).
func startInformer(client kubernetes.Interface, namespace string, resync time.Duration, c clock.Clock,
	log hclog.Logger, transform cache.TransformFunc) *presence {
	sel := taskPodSelector().String()
	pods := client.CoreV1().Pods(namespace)
	changes := newFeed()
	// A list, or a watch that streams the initial state (watch-list), is
	// the cache starting its view over: a new generation of the feed.
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			changes.brokenBy("the cache listed the pods afresh")
			o.LabelSelector = sel
			return pods.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			if o.SendInitialEvents != nil && *o.SendInitialEvents {
				changes.brokenBy("the cache listed the pods afresh (watch-list)")
			}
			o.LabelSelector = sel
			return pods.Watch(ctx, o)
		},
	}
	inf := cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, client), &corev1.Pod{},
		cache.SharedIndexInformerOptions{ResyncPeriod: resync})
	if transform != nil {
		if err := inf.SetTransform(transform); err != nil {
			panic(fmt.Sprintf("kube: setting the informer's transform before it runs: %v", err)) // cannot fail before Run
		}
	}
	tombs, seen, byAttempt := newTombstones(c, log), newSightings(c), newAttemptPods()
	// The detailed handler says whether an add is of the cache's first
	// list (not a miss: see sightings.go). A deleted pod leaves byAttempt
	// before the feed names it.
	handled, err := inf.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, inInitialList bool) {
			if p, ok := obj.(*pod); ok {
				byAttempt.add(p)
			}
			seen.added(obj, inInitialList)
		},
		UpdateFunc: func(old, obj any) {
			was, _ := old.(*pod)
			now, _ := obj.(*pod)
			byAttempt.replace(was, now)
		},
		DeleteFunc: func(obj any) {
			gone := obj
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				gone = d.Obj
			}
			if p, ok := gone.(*pod); ok {
				byAttempt.remove(p)
			}
			changes.deleted(obj)
			tombs.deleted(obj)
			seen.deleted(obj)
		}})
	if err != nil {
		panic(fmt.Sprintf("kube: adding the informer's handlers before it runs: %v", err)) // cannot fail before Run
	}
	if err := inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		changes.brokenBy("the cache lost its list or watch: " + err.Error())
		cache.DefaultWatchErrorHandler(ctx, r, err)
	}); err != nil {
		panic(fmt.Sprintf("kube: setting the informer's watch error handler before it runs: %v", err)) // cannot fail before Run
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &presence{informer: inf, handled: handled, byAttempt: byAttempt, tombs: tombs, feed: changes, seen: seen, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		log.Debug("presence informer started", "namespace", namespace, "selector", sel)
		inf.RunWithContext(ctx)
	}()
	return p
}

func (p *presence) stop() {
	p.cancel()
	<-p.done
}

// synced: the informer has listed every task pod once, and its handler
// (which keeps byAttempt) has been handed each of them.
func (p *presence) synced() bool { return p.informer.HasSynced() && p.handled.HasSynced() }

// cached returns the cache's pods of exactly attempt a.
func (p *presence) cached(a sdk.Attempt) []*pod { return p.byAttempt.of(a) }

// snapshot returns every cached pod, in name order.
func (p *presence) snapshot() []*pod {
	objs := p.informer.GetIndexer().List()
	out := make([]*pod, 0, len(objs))
	for _, o := range objs {
		if pd, ok := o.(*pod); ok {
			out = append(out, pd)
		}
	}
	sortPods(out)
	return out
}

func sortPods(ps []*pod) {
	sort.Slice(ps, func(i, j int) bool { return ps[i].Name < ps[j].Name })
}

// list reads the pods sel selects live, page by page, reduced.
func (r *running) list(ctx context.Context, sel labels.Selector, each func(*pod)) error {
	opts := metav1.ListOptions{LabelSelector: sel.String(), Limit: listPageSize}
	for {
		l, err := r.client.CoreV1().Pods(r.cfg.Namespace).List(ctx, opts)
		if err != nil {
			return fmt.Errorf("listing pods of namespace %s by %q: %w", r.cfg.Namespace, opts.LabelSelector, err)
		}
		for i := range l.Items {
			each(reduce(&l.Items[i]))
		}
		if l.Continue == "" {
			return nil
		}
		opts.Continue = l.Continue
	}
}

// listAttempts reads live every pod of the given attempts, in as few LISTs
// as the selector bound allows (one for a page of attempts with ordinary
// ids), and returns each attempt's own pods.
func (r *running) listAttempts(ctx context.Context, as []sdk.Attempt) (map[sdk.Attempt][]*pod, error) {
	out := make(map[sdk.Attempt][]*pod, len(as))
	for _, chunk := range selectorChunks(as) {
		sel, err := attemptsSelector(chunk)
		if err != nil {
			return nil, err
		}
		err = r.list(ctx, sel, func(p *pod) {
			for _, a := range chunk {
				if p.labels.matches(a) {
					out[a] = append(out[a], p)
				}
			}
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// selectorChunks splits attempts so that each chunk's distinct run and task
// values stay under maxSelectorBytes.
func selectorChunks(as []sdk.Attempt) [][]sdk.Attempt {
	var (
		out    [][]sdk.Attempt
		cur    []sdk.Attempt
		size   int
		values = map[string]bool{}
	)
	for _, a := range as {
		add := 0
		for _, v := range []string{"r" + a.RunID, "t" + TaskIDLabel(a.TaskID)} {
			if !values[v] {
				add += len(v) + 1
			}
		}
		if len(cur) > 0 && size+add > maxSelectorBytes {
			out = append(out, cur)
			cur, size, values = nil, 0, map[string]bool{}
			add = len(a.RunID) + len(TaskIDLabel(a.TaskID)) + 4
		}
		values["r"+a.RunID], values["t"+TaskIDLabel(a.TaskID)] = true, true
		cur = append(cur, a)
		size += add
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// Liveness answers, for each attempt, whether a pod of exactly that attempt
// is present. When the request names the pod UID the attempt records, only
// the pod of that UID counts: any other pod with the attempt's labels is
// foreign (foreign.go) and keeps nothing alive. A cached Pending or Running pod answers alive with no API
// call (unless the request asks for a live read); every other attempt is
// read live, all of them in one LIST. A read error answers unknown. An
// alive answer whose pods may be on a lost node also says whether that node
// is Ready (see node.go).
func (s *Substrate) Liveness(ctx context.Context, req sdk.LivenessRequest) ([]sdk.AttemptLiveness, error) {
	out := make([]sdk.AttemptLiveness, len(req.Attempts))
	r, err := s.current()
	if err != nil {
		// Not configured: nothing is known, so every reaper defers.
		for i, a := range req.Attempts {
			out[i] = sdk.AttemptLiveness{Attempt: a, State: sdk.Unknown, Agent: sdk.Unknown, Detail: err.Error()}
		}
		return out, nil
	}
	var misses []sdk.Attempt
	nodes := newNodeReads(r)
	useCache := !req.Live && r.presence.synced()
	for i, a := range req.Attempts {
		if useCache {
			pods := r.ownPods(a, req.PodUIDs[a], r.presence.cached(a), "presence")
			if l, ok := presentFromCache(a, pods); ok {
				out[i] = l
				nodes.annotate(ctx, &out[i], pods)
				continue
			}
		}
		misses = append(misses, a)
	}
	if len(misses) == 0 {
		return out, nil
	}
	pods, err := r.listAttempts(ctx, misses)
	for i, a := range req.Attempts {
		if out[i].State != "" {
			continue
		}
		if err != nil {
			out[i] = sdk.AttemptLiveness{Attempt: a, State: sdk.Unknown, Agent: sdk.Unknown,
				Detail: "reading the attempt's pods failed: " + err.Error()}
			continue
		}
		own := r.ownPods(a, req.PodUIDs[a], pods[a], "presence")
		out[i] = presentLive(a, own)
		nodes.annotate(ctx, &out[i], own)
	}
	return out, nil
}

// presentFromCache answers from the cache only when it holds a Pending or
// Running pod of the attempt; anything else is a miss, never trusted.
func presentFromCache(a sdk.Attempt, pods []*pod) (sdk.AttemptLiveness, bool) {
	l := presentLive(a, pods)
	if l.State != sdk.Alive || !runningOrPending(pods) {
		return sdk.AttemptLiveness{}, false
	}
	l.Detail = "cached: " + l.Detail
	return l, true
}

func runningOrPending(pods []*pod) bool {
	for _, p := range pods {
		if p.phase == corev1.PodRunning || p.phase == corev1.PodPending {
			return true
		}
	}
	return false
}

// presentLive is the answer for an attempt whose pods were read: alive
// while any pod of it is present, whatever its phase (a finished pod is a
// present pod: its outcome is the reconciler's to settle, not a reaper's
// to guess), dead when there is none. Pending is set when a Pending pod
// exists and none Running.
func presentLive(a sdk.Attempt, pods []*pod) sdk.AttemptLiveness {
	if len(pods) == 0 {
		return sdk.AttemptLiveness{Attempt: a, State: sdk.Dead, Agent: sdk.Dead,
			Detail: "no pod of the attempt"}
	}
	var running, pending bool
	phases := make([]string, 0, len(pods))
	for _, p := range pods {
		running = running || p.phase == corev1.PodRunning
		pending = pending || p.phase == corev1.PodPending
		phases = append(phases, p.Name+" "+string(p.phase))
	}
	detail := "pod " + strings.Join(phases, ", ")
	if !running && !pending {
		detail += " present: a finished or unreachable pod is the reconciler's"
	}
	return sdk.AttemptLiveness{Attempt: a, State: sdk.Alive, Agent: sdk.Alive,
		Pending: pending && !running, Detail: detail}
}

// waitSynced blocks until the cache has synced or ctx ends (tests and
// benchmarks).
func (p *presence) waitSynced(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), p.synced)
}
