package kubereapers_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"

	"github.com/dexaflow/reaper/plugins/podlost"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/substrate/kube"
	"github.com/dexaflow/reaper/testkit/kubetest"
)

// listings records the candidate listings a pass reads.
type listings struct {
	sdk.Board
	mu sync.Mutex
	qs []sdk.CandidateQuery
}

func (l *listings) ListCandidates(ctx context.Context, q sdk.CandidateQuery) (sdk.CandidatePage, error) {
	l.mu.Lock()
	l.qs = append(l.qs, q)
	l.mu.Unlock()
	return l.Board.ListCandidates(ctx, q)
}

// take returns the listings read since the last take and whether one of
// them read from the oldest row (a full walk).
func (l *listings) take() (qs []sdk.CandidateQuery, walked bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	qs, l.qs = l.qs, nil
	for _, q := range qs {
		walked = walked || (q.After == nil && len(q.Only) == 0)
	}
	return qs, walked
}

// podFleet puts n running kube attempts of one run on the board, each with
// a Running pod.
func (e *env) podFleet(n int) ([]sdk.Attempt, []*corev1.Pod) {
	e.t.Helper()
	as, ps := make([]sdk.Attempt, n), make([]*corev1.Pod, n)
	for i := range n {
		as[i] = att("run-1", fmt.Sprintf("t%02d", i))
		e.running(as[i])
		ps[i] = e.pod(as[i], true)
	}
	return as, ps
}

// wantLive fails unless every attempt of as but except is running and its
// pod Running and untouched: nothing live was marked or torn down.
func (e *env) wantLive(as []sdk.Attempt, ps []*corev1.Pod, except int) {
	e.t.Helper()
	for i, a := range as {
		if i == except {
			continue
		}
		e.wantState(a, sdk.StateRunning)
		if got := e.get(ps[i].Name); got == nil || got.Status.Phase != corev1.PodRunning || stoppedInPlace(got) {
			e.t.Fatalf("the pod of live %s was touched: %+v", a, got)
		}
	}
}

// waitNamed waits until the feed names a after cursor from.
func (e *env) waitNamed(feed sdk.ChangeFeed, from sdk.FeedCursor, a sdk.Attempt) {
	e.t.Helper()
	e.waitFor("the change feed to name "+a.String(), func() bool {
		ch, err := feed.Changes(context.Background(), from)
		return err == nil && ch.Complete && slices.Contains(ch.Gone, a)
	})
}

// steadyStart runs podlost's first pass (a full walk) and a second (on the
// feed) over a healthy fleet past the floor.
func (e *env) steadyStart(r sdk.Reaper, values sdk.Values, b *listings, exec sdk.Executions) {
	e.t.Helper()
	e.clk.Advance(e.ladder.PodLostFloor + time.Second)
	if ds := e.reapWith(r, values, b, exec); len(ds) != 0 {
		e.t.Fatalf("the first pass over a healthy fleet decided %+v", ds)
	}
	if _, walked := b.take(); !walked {
		e.t.Fatal("the first pass did not walk")
	}
	e.clk.Advance(e.ladder.MaintenanceInterval)
	if ds := e.reapWith(r, values, b, exec); len(ds) != 0 {
		e.t.Fatalf("a steady pass decided %+v", ds)
	}
	if _, walked := b.take(); walked {
		e.t.Fatal("the second pass walked: the change feed was not used")
	}
}

func TestPodLostIncremental(t *testing.T) {
	t.Parallel()
	t.Run("PodDeletedWhileIncremental_MarkedWithinSLA", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		as, ps := e.podFleet(4)
		r, b := podlost.New(nil), &listings{Board: e.store}
		e.steadyStart(r, nil, b, e.sub)
		from, _ := e.sub.Changes(context.Background(), sdk.FeedCursor{})
		e.remove(ps[2], &as[2])
		e.waitNamed(e.sub, from.Cursor, as[2])
		e.clk.Advance(e.ladder.MaintenanceInterval) // the next pass: within the floor (passed) and one interval
		ds := e.reapWith(r, nil, b, e.sub)
		if _, ok := applied(ds, as[2], sdk.LabelPodLost); !ok || len(ds) != 1 {
			t.Fatalf("decisions %+v, want pod_lost of %s alone", ds, as[2])
		}
		qs, walked := b.take()
		if walked || !slices.ContainsFunc(qs, func(q sdk.CandidateQuery) bool { return slices.Contains(q.Only, as[2]) }) {
			t.Fatalf("listings %+v: want the feed's attempt looked up by name, no full walk", qs)
		}
		e.wantProvisional(as[2], sdk.LabelPodLost)
		e.wantLive(as, ps, 2)
	})
	t.Run("WatchLost_ForcesTheFullWalk", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		as, ps := e.podFleet(3)
		cut := &cutter{}
		sub := e.cutSubstrate(cut)
		r, b := podlost.New(nil), &listings{Board: e.store}
		e.steadyStart(r, nil, b, sub)
		before, _ := sub.Changes(context.Background(), sdk.FeedCursor{})
		cut.cut()
		e.waitFor("the cache to lose its watch (a new feed generation)", func() bool {
			ch, err := sub.Changes(context.Background(), before.Cursor)
			return err == nil && ch.Cursor.Generation != before.Cursor.Generation
		})
		// Deleted while the cache is blind; it learns of it only by listing.
		e.remove(ps[1], nil)
		cut.heal()
		e.waitFor("the cache to relist without the pod", func() bool { return !cachedAlive(sub, as[1]) })
		e.clk.Advance(e.ladder.MaintenanceInterval)
		ds := e.reapWith(r, nil, b, sub)
		if _, walked := b.take(); !walked {
			t.Fatal("the pass after a lost watch did not walk every attempt")
		}
		if _, ok := applied(ds, as[1], sdk.LabelPodLost); !ok || len(ds) != 1 {
			t.Fatalf("decisions %+v, want pod_lost of %s alone", ds, as[1])
		}
		e.wantLive(as, ps, 1)
	})
	t.Run("BackstopWalk_CatchesWhatTheFeedMissed", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		as, ps := e.podFleet(3)
		blind := &blindFeed{Substrate: e.sub}
		r, b := podlost.New(nil), &listings{Board: e.store}
		every := sdk.Values{"full_walk_every": "2m"}
		e.steadyStart(r, every, b, blind)
		walkedAt := e.clk.Now().Add(-e.ladder.MaintenanceInterval)
		e.remove(ps[0], &as[0])
		deleted := e.clk.Now()
		for {
			e.clk.Advance(e.ladder.MaintenanceInterval)
			ds := e.reapWith(r, every, b, blind)
			_, walked := b.take()
			if _, ok := applied(ds, as[0], sdk.LabelPodLost); ok {
				if !walked || e.clk.Now().Sub(walkedAt) < 2*time.Minute {
					t.Fatalf("marked at %s after the last walk, walked %v: not by the backstop", e.clk.Now().Sub(walkedAt), walked)
				}
				break
			}
			if len(ds) != 0 {
				t.Fatalf("decisions %+v", ds)
			}
			if e.clk.Now().Sub(deleted) > 2*time.Minute+e.ladder.MaintenanceInterval {
				t.Fatal("the backstop walk did not come within full_walk_every and one interval")
			}
		}
		e.wantProvisional(as[0], sdk.LabelPodLost)
		e.wantLive(as, ps, 0)
	})
}

// cachedAlive reports whether the substrate answers a alive from its cache.
func cachedAlive(sub *kube.Substrate, a sdk.Attempt) bool {
	got, err := sub.Liveness(context.Background(), sdk.LivenessRequest{Attempts: []sdk.Attempt{a}})
	return err == nil && got[0].State == sdk.Alive
}

// blindFeed is the kube substrate with a change feed that misses every
// deletion (its answers say complete): what the backstop walk is for.
type blindFeed struct{ *kube.Substrate }

func (b *blindFeed) Changes(ctx context.Context, since sdk.FeedCursor) (sdk.FeedChanges, error) {
	ch, err := b.Substrate.Changes(ctx, since)
	ch.Gone = nil
	return ch, err
}

// cutSubstrate is a kube substrate on the namespace whose connection to
// the API server cut can sever (its watch included) and heal.
func (e *env) cutSubstrate(c *cutter) *kube.Substrate {
	e.t.Helper()
	rc := e.c.ConfigFor(kubetest.Admin)
	rc.Wrap(c.wrap)
	s := kube.NewWithOptions(hclog.NewNullLogger(), kube.Options{RestConfig: rc})
	if err := s.Configure(context.Background(), sdk.ConfigureRequest{Edition: ladder.EditionKube,
		Values: sdk.Values{"namespace": e.ns}}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(s.Close)
	e.waitFor("the presence cache to sync", func() bool { ok, _ := s.Synced(context.Background()); return ok })
	return s
}

// cutter is a transport wrapper: cut closes every open response body (a
// watch's stream ends) and refuses requests until heal.
type cutter struct {
	mu   sync.Mutex
	down bool
	open map[*cutBody]bool
}

var errCut = errors.New("connection cut by the test")

func (c *cutter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTrip(func(req *http.Request) (*http.Response, error) {
		c.mu.Lock()
		down := c.down
		c.mu.Unlock()
		if down {
			return nil, errCut
		}
		resp, err := rt.RoundTrip(req)
		if err != nil {
			return resp, err
		}
		body := &cutBody{ReadCloser: resp.Body, c: c}
		c.mu.Lock()
		if c.open == nil {
			c.open = map[*cutBody]bool{}
		}
		c.open[body] = true
		c.mu.Unlock()
		resp.Body = body
		return resp, nil
	})
}

func (c *cutter) cut() {
	c.mu.Lock()
	c.down = true
	open := c.open
	c.open = nil
	c.mu.Unlock()
	for b := range open {
		_ = b.ReadCloser.Close()
	}
}

func (c *cutter) heal() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.down = false
}

type cutBody struct {
	io.ReadCloser
	c *cutter
}

func (b *cutBody) Close() error {
	b.c.mu.Lock()
	delete(b.c.open, b)
	b.c.mu.Unlock()
	return b.ReadCloser.Close()
}

type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }
