package kubereapers_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/internal/kubetest"
	"github.com/dexaflow/reaper/plugins/podlost"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/substrate/kube"
)

// podLists counts the LIST requests on pods a substrate makes (watches
// left out).
type podLists struct{ n atomic.Int64 }

func (c *podLists) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		if req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "/pods") && req.URL.Query().Get("watch") != "true" {
			c.n.Add(1)
		}
		return rt.RoundTrip(req)
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// countedSubstrate is an admin kube substrate on the namespace whose pod
// LISTs are counted, its cache synced.
func (e *env) countedSubstrate() (*kube.Substrate, *podLists) {
	e.t.Helper()
	ctx := context.Background()
	lists := &podLists{}
	rc := e.c.ConfigFor(kubetest.Admin)
	rc.Wrap(lists.wrap)
	sub := kube.NewWithOptions(hclog.NewNullLogger(), kube.Options{RestConfig: rc})
	if err := sub.Configure(ctx, sdk.ConfigureRequest{Edition: ladder.EditionKube, Values: sdk.Values{"namespace": e.ns}}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(sub.Close)
	e.waitFor("the presence cache to sync", func() bool { ok, _ := sub.Synced(ctx); return ok })
	return sub, lists
}

// Steady state: a pass over a page of healthy running attempts, their pods
// Running in the substrate's cache, makes no API call and no decision.
func TestHealthyFleet_CachedPresentDefersWithoutAPICall(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	sub, lists := e.countedSubstrate()
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
	lists.n.Store(0)
	if ds := e.reap(podlost.New(nil), sub); len(ds) != 0 {
		t.Fatalf("decisions about healthy attempts: %+v", ds)
	}
	if n := lists.n.Load(); n != 0 {
		t.Fatalf("%d pod LISTs for a healthy page", n)
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
	sub, lists := e.countedSubstrate()
	e.clk.Advance(e.ladder.PodLostFloor + time.Second)

	lists.n.Store(0)
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
	marked, tornDown := 0, int(lists.n.Load())-n/ladder.PageSize
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
