package kubereapers_test

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/plugins/podlost"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/substrate/kube"
	"github.com/dexaflow/reaper/testkit/kubetest"
	"github.com/dexaflow/reaper/testkit/massbench"
)

// requests counts the requests a substrate's client makes, by verb and
// resource ("list pods", "patch pods", "watch pods"...).
type requests struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *requests) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		key := verbOf(req)
		c.mu.Lock()
		c.n[key]++
		c.mu.Unlock()
		return rt.RoundTrip(req)
	})
}

// verbOf names a request the way the API server's audit does: the verb
// (list, get, watch, create, update, patch, delete, deletecollection) and
// the resource, with its subresource ("update pods/status").
func verbOf(req *http.Request) string {
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	}
	if len(parts) > 2 && parts[0] == "namespaces" {
		parts = parts[2:]
	}
	resource, named := strings.Join(parts, "/"), len(parts) >= 2
	if named {
		resource = parts[0]
		if len(parts) >= 3 {
			resource += "/" + parts[2]
		}
	}
	verb := strings.ToLower(req.Method)
	switch {
	case req.Method == http.MethodGet && req.URL.Query().Get("watch") == "true":
		verb = "watch"
	case req.Method == http.MethodGet && named:
		verb = "get"
	case req.Method == http.MethodGet:
		verb = "list"
	case req.Method == http.MethodPost:
		verb = "create"
	case req.Method == http.MethodPut:
		verb = "update"
	case req.Method == http.MethodDelete && !named:
		verb = "deletecollection"
	}
	return verb + " " + resource
}

// reset forgets every request counted so far.
func (c *requests) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n = map[string]int{}
}

// count is the number of requests of one kind ("list pods").
func (c *requests) count(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[key]
}

// calls is the number of requests but the watches (the cache's own, which
// no pass makes).
func (c *requests) calls() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	total := 0
	for k, v := range c.n {
		if !strings.HasPrefix(k, "watch ") {
			total += v
		}
	}
	return total
}

func (c *requests) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	keys := make([]string, 0, len(c.n))
	for k := range c.n {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = fmt.Sprintf("%s: %d", k, c.n[k])
	}
	return strings.Join(out, ", ")
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// countedSubstrate is an admin kube substrate on the namespace whose
// requests are counted, its cache synced.
func (e *env) countedSubstrate() (*kube.Substrate, *requests) {
	e.t.Helper()
	ctx := context.Background()
	reqs := &requests{n: map[string]int{}}
	rc := e.c.ConfigFor(kubetest.Admin)
	rc.Wrap(reqs.wrap)
	sub := kube.NewWithOptions(hclog.NewNullLogger(), kube.Options{RestConfig: rc})
	if err := sub.Configure(ctx, sdk.ConfigureRequest{Edition: ladder.EditionKube, Values: sdk.Values{"namespace": e.ns}}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(sub.Close)
	e.waitFor("the presence cache to sync", func() bool { ok, _ := sub.Synced(ctx); return ok })
	return sub, reqs
}

// Steady state: a pass over a page of healthy running attempts, their pods
// Running in the substrate's cache, makes no API call and no decision.
func TestHealthyFleet_CachedPresentDefersWithoutAPICall(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	sub, reqs := e.countedSubstrate()
	var names []string
	var as []sdk.Attempt
	for i := range ladder.PageSize {
		a := att("run-1", fmt.Sprintf("task-%03d", i))
		e.running(a)
		l, ann := kube.AttemptLabels(a)
		names = append(names, e.create(fmt.Sprintf("task-%03d", i), l, ann, true).Name)
		as = append(as, a)
	}
	for _, name := range names {
		e.waitPhase(name, corev1.PodRunning)
	}
	e.waitFor("the cache to hold every pod Running", func() bool {
		got, err := sub.Liveness(context.Background(), sdk.LivenessRequest{Attempts: as})
		if err != nil {
			return false
		}
		for _, l := range got {
			if l.State != sdk.Alive || !strings.HasPrefix(l.Detail, "cached") {
				return false
			}
		}
		return true
	})
	e.clk.Advance(10 * time.Minute)
	reqs.reset()
	if ds := e.reap(podlost.New(nil), sub); len(ds) != 0 {
		t.Fatalf("decisions about healthy attempts: %+v", ds)
	}
	if n := reqs.calls(); n != 0 {
		t.Fatalf("%d API calls for a healthy page: %s", n, reqs)
	}
}

// Steady state, the whole pass: the five kube reapers, in order, over a
// fleet of healthy running attempts (three pages), every pod Running in the
// substrate's cache, make no API call of any verb and no decision. (The
// cache's own watch is not the pass's and is not counted.)
func TestSteadyState_HealthyFleetPassMakesNoAPICall(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 300 pods")
	}
	t.Parallel()
	const n = 3 * ladder.PageSize
	f := newFleet(t, n)
	sub, reqs := f.e.countedSubstrate()
	f.createPods()
	f.waitWithin(2*time.Minute, "KWOK to run every pod", func() bool { _, running := f.podsIn(); return running == n })
	f.waitWithin(time.Minute, "the cache to hold every pod Running", func() bool { return f.cachedAlive(sub) == n })
	rs := kubeReapers(t)
	reqs.reset()
	// The first pass walks every attempt (podlost's full walk), the next
	// ones go on the change feed: neither calls the API.
	states := make([][]byte, len(rs))
	for pass := range 3 {
		steadyPass(t, rs, ladder.EditionKube, massbench.Now.Add(time.Duration(pass)*time.Second), f.board.Term, f.board.Store, sub,
			make([]time.Duration, len(rs)), states)
		if c := reqs.calls(); c != 0 {
			t.Fatalf("pass %d over %d healthy attempts made %d API calls: %s", pass+1, n, c, reqs)
		}
	}
}

// timedBoard notes when the last mark was written.
type timedBoard struct {
	sdk.Board
	lastMark atomic.Int64 // unix nanoseconds
}

func (b *timedBoard) Mark(ctx context.Context, ms []sdk.Mark) ([]sdk.MarkResult, error) {
	res, err := b.Board.Mark(ctx, ms)
	b.lastMark.Store(time.Now().UnixNano())
	return res, err
}

// A node pool lost: 2,000 running attempts whose pods are all gone are all
// marked in one pass of one phase budget, one LIST a page; the teardowns
// follow within what is left of the budget and the rest are carried to the
// next passes.
func TestMassPodLoss_AllMarkedInOnePass(t *testing.T) {
	if testing.Short() {
		t.Skip("seeds 2,000 attempts")
	}
	t.Parallel()
	const n = 2000
	e := newEnv(t)
	ctx := context.Background()
	now := e.clk.Now()
	if err := e.w.CreateRun(ctx, lifecycle.NewRun{RunID: "pool", DagID: "dag"}, now); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Pool().Exec(ctx, `INSERT INTO task_instances (run_id, task_id, executor, state, retries, max_retries,
        infra_budget, try_number, attempt_epoch, queued_at, running_at, last_heartbeat_at, updated_at)
        SELECT 'pool', 'task-' || lpad(i::text, 5, '0'), 'kube', 'running', 0, 0, 3, 1, 1, $1, $1, $1, $1
        FROM generate_series(1, $2) AS i`, now, n); err != nil {
		t.Fatal(err)
	}
	sub, reqs := e.countedSubstrate()
	e.clk.Advance(e.ladder.PodLostFloor + time.Second)

	reqs.reset()
	r := podlost.New(nil)
	if err := r.Configure(ctx, sdk.ConfigureRequest{Edition: ladder.EditionKube, Ladder: e.ladder, Values: defaults(t, r)}); err != nil {
		t.Fatal(err)
	}
	b := &timedBoard{Board: e.store}
	var sink sdk.Collector
	started := time.Now()
	pass := sdk.Pass{Now: e.clk.Now(), Ladder: e.ladder, Term: e.term, Deadline: e.clk.Now().Add(e.ladder.MaintenanceInterval),
		Edition: ladder.EditionKube}
	if _, err := r.Reap(ctx, pass, b, sub, &sink); err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(started)
	markedIn := time.Duration(b.lastMark.Load()) - time.Duration(started.UnixNano())
	ds := sink.Decisions()
	marked, tornDown := 0, reqs.count("list pods")-n/ladder.PageSize
	for _, d := range ds {
		if d.Label == sdk.LabelPodLost && d.Applied {
			marked++
		}
	}
	if marked != n {
		t.Fatalf("%d of %d marked in one pass", marked, n)
	}
	t.Logf("under load: %d lost attempts all marked %s into one pass (%.0f marks/s), %d pod LISTs for the %d pages' liveness (1 a page); "+
		"then %d teardowns (a LIST each) until the pass ended at %s, the rest carried to the next pass",
		n, markedIn.Round(time.Millisecond), float64(n)/markedIn.Seconds(), n/ladder.PageSize, n/ladder.PageSize,
		tornDown, elapsed.Round(time.Millisecond))
	if elapsed > e.ladder.MaintenanceInterval {
		t.Fatalf("the pass took %s, more than its budget", elapsed)
	}
}
