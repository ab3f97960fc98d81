package kubereapers_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dexaflow/reaper/plugins/agentlost"
	"github.com/dexaflow/reaper/plugins/dispatchlost"
	"github.com/dexaflow/reaper/plugins/orphanrun"
	"github.com/dexaflow/reaper/plugins/podlost"
	"github.com/dexaflow/reaper/plugins/warmworker"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/substrate/kube"
	"github.com/dexaflow/reaper/testkit/kubetest"
	"github.com/dexaflow/reaper/testkit/massbench"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// fleetSize is how many running attempts BenchmarkKubeFleet holds:
// 10,000, or REAPER_BENCH_PODS.
func fleetSize(tb testing.TB) int {
	if s := os.Getenv("REAPER_BENCH_PODS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < ladder.PageSize {
			tb.Fatalf("REAPER_BENCH_PODS=%q: want a number of at least %d", s, ladder.PageSize)
		}
		return n
	}
	return 10_000
}

// podWorkers is how many goroutines create or delete the fleet's pods.
const podWorkers = 16

// fleet is a board of n running kube attempts (massbench.Attempts(n)) and,
// on the test's namespace, a pod of each, made through a client whose rate
// limit is out of the way (the API server's own is what bounds it).
type fleet struct {
	e     *env
	n     int
	board *massbench.Board
	as    []sdk.Attempt
	fast  kubernetes.Interface
}

func newFleet(tb testing.TB, n int) *fleet {
	tb.Helper()
	e := newWorld(tb)
	bb, err := massbench.NewBoard(context.Background(), e.store.Pool())
	if err != nil {
		tb.Fatal(err)
	}
	if err := bb.SeedRunningOn(context.Background(), sdk.ExecutorKube, n, 5*time.Second); err != nil {
		tb.Fatal(err)
	}
	rc := e.c.ConfigFor(kubetest.Admin)
	rc.QPS, rc.Burst = 5000, 10000
	fast, err := kubernetes.NewForConfig(rc)
	if err != nil {
		tb.Fatal(err)
	}
	return &fleet{e: e, n: n, board: bb, as: massbench.Attempts(n), fast: fast}
}

// each runs f for every attempt's index on podWorkers goroutines and
// returns the first error.
func (f *fleet) each(do func(i int) error) error { return massbench.Each(f.n, podWorkers, do) }

func podName(a sdk.Attempt) string {
	return strings.ToLower(a.RunID + "-" + kube.TaskIDLabel(a.TaskID))
}

// createPods makes every attempt's pod on the KWOK node, as the kube
// runner would, and returns how long the creates took.
func (f *fleet) createPods() time.Duration {
	f.e.t.Helper()
	start := time.Now()
	err := f.each(func(i int) error {
		l, ann := kube.AttemptLabels(f.as[i])
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName(f.as[i]), Labels: l, Annotations: ann},
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, NodeName: f.e.node,
				Containers: []corev1.Container{{Name: kube.TaskContainer, Image: "agent"}}}}
		_, err := f.fast.CoreV1().Pods(f.e.ns).Create(context.Background(), p, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		f.e.t.Fatalf("creating the fleet's pods: %v", err)
	}
	return time.Since(start)
}

// deletePods deletes every attempt's pod at once (grace 0, as the pods of
// a lost node pool go) and returns how long the deletes took.
func (f *fleet) deletePods() time.Duration {
	f.e.t.Helper()
	zero := int64(0)
	start := time.Now()
	err := f.each(func(i int) error {
		err := f.fast.CoreV1().Pods(f.e.ns).Delete(context.Background(), podName(f.as[i]), metav1.DeleteOptions{GracePeriodSeconds: &zero})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
	if err != nil {
		f.e.t.Fatalf("deleting the fleet's pods: %v", err)
	}
	return time.Since(start)
}

// podsIn counts the namespace's pods, and those Running, read live.
func (f *fleet) podsIn() (all, running int) {
	f.e.t.Helper()
	opts := metav1.ListOptions{Limit: 2000}
	for {
		l, err := f.fast.CoreV1().Pods(f.e.ns).List(context.Background(), opts)
		if err != nil {
			f.e.t.Fatal(err)
		}
		for _, p := range l.Items {
			all++
			if p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		if l.Continue == "" {
			return all, running
		}
		opts.Continue = l.Continue
	}
}

// cachedAlive counts the attempts the substrate answers alive from its
// cache (answers read live do not count).
func (f *fleet) cachedAlive(sub *kube.Substrate) int {
	f.e.t.Helper()
	n := 0
	for i := 0; i < f.n; i += ladder.PageSize {
		got, err := sub.Liveness(context.Background(), sdk.LivenessRequest{Attempts: f.as[i:min(i+ladder.PageSize, f.n)]})
		if err != nil {
			f.e.t.Fatal(err)
		}
		for _, l := range got {
			if l.State == sdk.Alive && strings.HasPrefix(l.Detail, "cached") {
				n++
			}
		}
	}
	return n
}

// waitWithin polls cond, a state the cluster reaches on its own, every
// second until it holds, failing after limit.
func (f *fleet) waitWithin(limit time.Duration, what string, cond func() bool) time.Duration {
	f.e.t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > limit {
			f.e.t.Fatalf("timed out after %s waiting for %s", limit, what)
		}
		time.Sleep(time.Second)
	}
	return time.Since(start)
}

// kubeReapers are the five kube reapers in the order of a kube
// configuration, each configured with its defaults.
func kubeReapers(tb testing.TB) []sdk.Reaper {
	tb.Helper()
	rs := []sdk.Reaper{dispatchlost.New(nil), podlost.New(nil), agentlost.New(nil), warmworker.New(nil), orphanrun.New(nil)}
	configure(tb, ladder.EditionKube, rs)
	return rs
}

// configurePodLost sets podlost's full_walk_every among rs.
func configurePodLost(tb testing.TB, rs []sdk.Reaper, fullWalkEvery string) {
	tb.Helper()
	for _, r := range rs {
		if pl, ok := r.(*podlost.Reaper); ok {
			v := defaults(tb, pl)
			v["full_walk_every"] = fullWalkEvery
			if err := pl.Configure(context.Background(), sdk.ConfigureRequest{Edition: ladder.EditionKube,
				Ladder: ladder.Defaults(), Values: v}); err != nil {
				tb.Fatal(err)
			}
		}
	}
}

// liteReapers are the three Lite reapers, in the Lite configuration's
// order.
func liteReapers(tb testing.TB) []sdk.Reaper {
	tb.Helper()
	rs := []sdk.Reaper{dispatchlost.New(nil), agentlost.New(nil), orphanrun.New(nil)}
	configure(tb, ladder.EditionLite, rs)
	return rs
}

func configure(tb testing.TB, edition string, rs []sdk.Reaper) {
	tb.Helper()
	for _, r := range rs {
		if err := r.Configure(context.Background(), sdk.ConfigureRequest{Edition: edition, Ladder: ladder.Defaults(),
			Values: defaults(tb, r)}); err != nil {
			tb.Fatal(err)
		}
	}
}

// steadyPass runs one pass of every reaper of rs, in order, at now over a
// healthy board, fails on any decision, and adds each reaper's time to
// took (by position). states (by position, nil: none kept) carries each
// reaper's pass state into its next pass, as the host does.
func steadyPass(tb testing.TB, rs []sdk.Reaper, edition string, now time.Time, term int64, b sdk.Board, exec sdk.Executions,
	took []time.Duration, states [][]byte) {
	l := ladder.Defaults()
	for i, r := range rs {
		pass := sdk.Pass{Now: now, Ladder: l, Term: term, Deadline: now.Add(l.MaintenanceInterval), Edition: edition}
		if states != nil {
			pass.State = states[i]
		}
		var sink sdk.Collector
		start := time.Now()
		res, err := r.Reap(context.Background(), pass, b, exec, &sink)
		if err != nil {
			tb.Fatal(err)
		}
		took[i] += time.Since(start)
		if states != nil {
			states[i] = res.State
		}
		if ds := sink.Decisions(); len(ds) != 0 {
			tb.Fatalf("a healthy board gave %d decisions, the first %+v", len(ds), ds[0])
		}
	}
}

// reportReapers reports each reaper's mean time of a pass, in ms.
func reportReapers(b *testing.B, rs []sdk.Reaper, took []time.Duration) {
	for i, r := range rs {
		info, err := r.Info(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(took[i].Microseconds())/1000/float64(b.N), info.Name+"_ms")
	}
}

// markClock notes, at each mark, when it was written and how many API
// calls the substrate had made by then.
type markClock struct {
	sdk.Board
	reqs     *requests
	lastMark atomic.Int64 // unix nanoseconds
	calls    atomic.Int64
}

func (b *markClock) Mark(ctx context.Context, ms []sdk.Mark) ([]sdk.MarkResult, error) {
	res, err := b.Board.Mark(ctx, ms)
	b.lastMark.Store(time.Now().UnixNano())
	b.calls.Store(int64(b.reqs.calls()))
	return res, err
}

// BenchmarkKubeFleet measures the kube edition over a fleet of 10,000
// running attempts (REAPER_BENCH_PODS overrides) against the real API
// server, with KWOK running their pods. The pods are created through the
// API, 16 at a time (their creation time and the time KWOK takes to run
// them all are reported by the setup, not measured). Then:
//
//   - SteadyState/Lite and SteadyState/Kube: one reap pass over the healthy
//     fleet, every pod Running. Lite: dispatchlost, agentlost and orphanrun
//     over the same number of healthy Lite attempts (massbench's board and
//     the Lite substrate); Kube: the five kube reapers over the kube
//     substrate, whose cache answers every attempt, so the pass makes no
//     API call (asserted each iteration). ns/op is a whole pass.
//   - MassPodLoss: every pod deleted at once (a node pool lost); podlost
//     passes of a 30s budget, one per 30s cycle of the fake clock, until
//     every attempt is marked pod_lost (asserted within 2 passes), each
//     pass's decisions written to the audit as the host does. Reports the
//     passes, marks/s up to the last mark, the API calls per page of 100
//     while marking (by verb in the log), and the teardowns' calls that
//     follow the marks within the budget.
func BenchmarkKubeFleet(b *testing.B) {
	ctx := context.Background()
	n := fleetSize(b)
	f := newFleet(b, n)
	sub, reqs := f.e.countedSubstrate()

	created := f.createPods()
	ran := f.waitWithin(15*time.Minute, fmt.Sprintf("KWOK to run %d pods", n), func() bool {
		_, running := f.podsIn()
		return running == n
	})
	cached := f.waitWithin(5*time.Minute, "the cache to hold every pod Running", func() bool { return f.cachedAlive(sub) == n })
	setup := fmt.Sprintf("under load: %d pods created in %s (%.0f/s, %d at a time); all Running %s later; in the cache %s after that",
		n, created.Round(time.Millisecond), float64(n)/created.Seconds(), podWorkers, ran.Round(time.Second), cached.Round(time.Second))

	lite, err := massbench.NewBoard(ctx, pgtest.NewDB(b))
	if err != nil {
		b.Fatal(err)
	}
	if err := lite.SeedRunning(ctx, n, 5*time.Second); err != nil {
		b.Fatal(err)
	}
	liteSub, err := massbench.NewLite(ctx, filepath.Join(b.TempDir(), "records"))
	if err != nil {
		b.Fatal(err)
	}
	b.Run("SteadyState/Lite", func(b *testing.B) {
		rs := liteReapers(b)
		took, states := make([]time.Duration, len(rs)), make([][]byte, len(rs))
		for b.Loop() {
			steadyPass(b, rs, ladder.EditionLite, massbench.Now, lite.Term, lite.Store, liteSub, took, states)
		}
		reportReapers(b, rs, took)
	})
	// Kube: the steady pass proper, each reaper's state carried from pass
	// to pass as the host carries it, after a first pass (podlost's full
	// walk) that is timed apart. KubeFullWalk: every pass a full walk
	// (podlost's full_walk_every = 0s, the pass as it was before the
	// change feed, and what the backstop walk costs).
	for _, mode := range []struct {
		name string
		walk string
	}{{"SteadyState/Kube", ""}, {"SteadyState/KubeFullWalk", "0s"}} {
		b.Run(mode.name, func(b *testing.B) {
			b.Log(setup)
			rs := kubeReapers(b)
			if mode.walk != "" {
				configurePodLost(b, rs, mode.walk)
			}
			took, states := make([]time.Duration, len(rs)), make([][]byte, len(rs))
			reqs.reset()
			first := time.Now()
			steadyPass(b, rs, ladder.EditionKube, massbench.Now, f.board.Term, f.board.Store, sub, make([]time.Duration, len(rs)), states)
			b.Logf("under load: the first pass (podlost's full walk) took %s", time.Since(first).Round(time.Microsecond))
			for b.Loop() {
				steadyPass(b, rs, ladder.EditionKube, massbench.Now, f.board.Term, f.board.Store, sub, took, states)
				if c := reqs.calls(); c != 0 {
					b.Fatalf("a pass over a healthy fleet made %d API calls: %s", c, reqs)
				}
			}
			reportReapers(b, rs, took)
			b.ReportMetric(0, "api_calls")
		})
	}

	b.Run("MassPodLoss", func(b *testing.B) {
		deleted := f.deletePods()
		gone := f.waitWithin(5*time.Minute, "every pod gone, and gone from the cache", func() bool {
			all, _ := f.podsIn()
			return all == 0 && f.cachedAlive(sub) == 0
		})
		b.Logf("under load: %d pods deleted in %s (%d at a time), gone from the cache %s later",
			n, deleted.Round(time.Millisecond), podWorkers, gone.Round(time.Second))
		r := podlost.New(nil)
		configure(b, ladder.EditionKube, []sdk.Reaper{r})
		maxPasses, pages := 0, (n+ladder.PageSize-1)/ladder.PageSize
		var toLastMark, elapsed time.Duration
		var markCalls, allCalls int
		for b.Loop() {
			b.StopTimer()
			if err := f.board.Reset(ctx); err != nil {
				b.Fatal(err)
			}
			marks := &markClock{Board: f.board.Store, reqs: reqs}
			reqs.reset()
			b.StartTimer()
			start := time.Now()
			rec, err := massbench.Recover(ctx, massbench.Spec{Board: f.board, N: n, Edition: ladder.EditionKube,
				Label: sdk.LabelPodLost, Reaper: podlost.Name, Marks: marks}, r, sub)
			if err != nil {
				b.Fatal(err)
			}
			if rec.Passes > 2 {
				b.Fatalf("%d lost attempts took %d passes to mark, want at most 2", n, rec.Passes)
			}
			maxPasses = max(maxPasses, rec.Passes)
			toLastMark = time.Duration(marks.lastMark.Load()) - time.Duration(start.UnixNano())
			elapsed = rec.Elapsed
			markCalls, allCalls = int(marks.calls.Load()), reqs.calls()
			b.Logf("under load: %d marked in %d passes, the last mark %s in (%.0f marks/s); %d API calls until then (%.2f a page of %d); "+
				"the passes took %s with the teardowns that follow the marks in the budget (%d calls); calls by verb: %s",
				n, rec.Passes, toLastMark.Round(time.Millisecond), float64(n)/toLastMark.Seconds(), markCalls,
				float64(markCalls)/float64(pages), ladder.PageSize, elapsed.Round(time.Millisecond), allCalls-markCalls, reqs)
		}
		b.ReportMetric(float64(maxPasses), "passes")
		b.ReportMetric(float64(n)/toLastMark.Seconds(), "marks/s")
		b.ReportMetric(float64(markCalls)/float64(pages), "calls/page")
		b.ReportMetric(float64(allCalls-markCalls), "teardown_calls")
	})
}
