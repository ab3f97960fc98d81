package podlost

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/sdk/sdktest"
)

// steady is a harness whose substrate has a change feed, every attempt's
// pod present unless scripted, over a fleet of healthy attempts past the
// floor, after the first pass (a full walk).
type steady struct {
	*bundle
	feed    *sdktest.Feed
	fleet   []sdk.Attempt
	mu      sync.Mutex
	queries []sdk.CandidateQuery
	// walk: the listings of the first pass, a full walk.
	walk []sdk.CandidateQuery
}

func newSteady(t *testing.T, n int, values sdk.Values) *steady {
	t.Helper()
	s := &steady{bundle: setup(t, values), feed: sdktest.NewFeed()}
	s.H.Exec.UseFeed(s.feed)
	s.H.Exec.SetDefault(sdk.Alive)
	for i := range n {
		s.fleet = append(s.fleet, s.H.Running(fmt.Sprintf("r%04d", i), "t", time.Hour-time.Duration(i)*time.Second, 5*time.Second))
	}
	s.H.Board.OnList(func(q sdk.CandidateQuery) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.queries = append(s.queries, q)
	})
	if ds := s.Reap(t); len(ds) != 0 {
		t.Fatalf("the first pass over a healthy fleet decided %v", ds)
	}
	// A full walk from the oldest row: its first page of ladder.PageSize,
	// the next as large as the budget fits, never more pages than rows of
	// 100 (one more when the last page is full).
	q := s.take()
	if len(q) == 0 || q[0].After != nil || q[0].Limit != ladder.PageSize ||
		len(q) > (n+ladder.PageSize-1)/ladder.PageSize+boolInt(n%ladder.PageSize == 0) {
		t.Fatalf("the first pass is not a full walk from the oldest row: %d listings", len(q))
	}
	s.walk = q
	return s
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// take returns the listings read since the last take.
func (s *steady) take() []sdk.CandidateQuery {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queries
	s.queries = nil
	return q
}

// next advances the clock one interval and runs a pass.
func (s *steady) next(t *testing.T) sdktest.Decisions {
	t.Helper()
	s.H.Clock.Advance(s.H.Ladder.MaintenanceInterval)
	return s.Reap(t)
}

// walked reports whether the listings read from the oldest row.
func walked(qs []sdk.CandidateQuery) bool {
	for _, q := range qs {
		if q.After == nil && len(q.Only) == 0 {
			return true
		}
	}
	return false
}

func TestIncremental_SteadyPassReadsOnlyWhatCrossedTheFloor(t *testing.T) {
	t.Parallel()
	s := newSteady(t, 250, nil)
	reads := len(s.H.Exec.LivenessCalls())
	for range 5 {
		if ds := s.next(t); len(ds) != 0 {
			t.Fatalf("a steady pass decided %v", ds)
		}
		qs := s.take()
		if len(qs) != 1 || qs[0].After == nil || len(qs[0].Only) != 0 {
			t.Fatalf("a steady pass read %d listings (%+v), want the one of attempts that crossed the floor", len(qs), qs)
		}
		if !qs[0].OlderThan.Equal(s.H.Now().Add(-s.H.Ladder.PodLostFloor)) {
			t.Fatalf("floor not in the query: older than %s", qs[0].OlderThan)
		}
	}
	if got := len(s.H.Exec.LivenessCalls()); got != reads {
		t.Fatalf("steady passes made %d liveness reads over a fleet that crossed nothing", got-reads)
	}
}

func TestIncremental_AttemptCrossingTheFloorIsJudged(t *testing.T) {
	t.Parallel()
	s := newSteady(t, 10, nil)
	fresh := s.H.Running("fresh", "t", 10*time.Second, time.Second) // inside the floor
	s.H.Exec.Dead(fresh)
	if ds := s.next(t); len(ds) != 0 || s.H.Board.Row(fresh).State != running {
		t.Fatalf("inside the floor: %v", ds)
	}
	s.H.Clock.Advance(s.H.Ladder.PodLostFloor)
	ds := s.Reap(t)
	if got := ds.Label(fresh); got != sdk.LabelPodLost || s.H.Board.Row(fresh).State != failed {
		t.Fatalf("an attempt that crossed the floor with no pod: %q", got)
	}
	if walked(s.take()) {
		t.Fatal("the pass walked everything")
	}
	assertFleetRunning(t, s)
}

func TestIncremental_PodDeletedPastTheFloorMarkedByTheFeed(t *testing.T) {
	t.Parallel()
	s := newSteady(t, 250, nil)
	a := s.fleet[123]
	s.H.Exec.Dead(a)
	s.feed.Deleted(a)
	ds := s.next(t)
	if got := ds.Label(a); got != sdk.LabelPodLost || s.H.Board.Row(a).State != failed {
		t.Fatalf("a pod the feed saw deleted: %q, state %s", got, s.H.Board.Row(a).State)
	}
	qs := s.take()
	if walked(qs) || len(qs) != 2 || len(qs[1].Only) != 1 || qs[1].Only[0] != a {
		t.Fatalf("listings %+v, want the crossed listing and one naming the attempt", qs)
	}
	if len(ds) != 1 {
		t.Fatalf("decisions %v", ds)
	}
	assertFleetRunning(t, s, a)
}

func TestIncremental_NamedAttemptStillNeedsThePositiveSignal(t *testing.T) {
	t.Parallel()
	s := newSteady(t, 10, nil)
	present, unknown := s.fleet[1], s.fleet[2]
	s.feed.Deleted(present) // a pod of the attempt is still present (the cache or the live read says so)
	s.H.Exec.Unknown(unknown, "reading the attempt's pods failed: timeout")
	s.feed.Deleted(unknown)
	ds := s.next(t)
	if got := ds.Label(present); got != "" {
		t.Fatalf("a named attempt with a present pod: %q", got)
	}
	if got := ds.Label(unknown); got != sdk.LabelPodLostPodQueryErr {
		t.Fatalf("a named attempt whose read failed: %q, want a deferral", got)
	}
	assertFleetRunning(t, s)
}

func TestIncremental_SupersededOrFreshNamedAttemptNotMarked(t *testing.T) {
	t.Parallel()
	s := newSteady(t, 10, nil)
	old := s.fleet[3]
	s.H.Board.Replace(old.RunID, old.TaskID, false, running, s.H.Now()) // a new attempt, its pod not yet made
	s.H.Exec.SetDefault(sdk.Dead)
	for _, a := range s.fleet {
		s.H.Exec.Alive(a)
	}
	s.feed.Deleted(old)
	ds := s.next(t)
	if len(ds) != 0 {
		t.Fatalf("the old attempt's pod deleted, the new attempt inside the floor: %v", ds)
	}
	if row := s.H.Board.Row(old); row.State != running {
		t.Fatalf("row %+v", row)
	}
}

func TestIncremental_CacheRelistOrWatchLossForcesTheFullWalk(t *testing.T) {
	t.Parallel()
	s := newSteady(t, 250, nil)
	missed := s.fleet[200] // deleted while the cache was blind: the feed never names it
	s.H.Exec.Dead(missed)
	s.feed.Break()
	ds := s.next(t)
	if got := ds.Label(missed); got != sdk.LabelPodLost {
		t.Fatalf("after the cache began again: %q", got)
	}
	if !walked(s.take()) {
		t.Fatal("the pass after a break did not walk from the oldest row")
	}
	if ds := s.next(t); len(ds) != 0 || walked(s.take()) {
		t.Fatalf("the pass after the walk is not incremental again: %v", ds)
	}
	assertFleetRunning(t, s, missed)
}

func TestIncremental_FeedErrorWalksEverything(t *testing.T) {
	t.Parallel()
	s := newSteady(t, 10, nil)
	missed := s.fleet[4]
	s.H.Exec.Dead(missed)
	s.feed.Fail(errors.New("Unimplemented"))
	ds := s.next(t)
	if got := ds.Label(missed); got != sdk.LabelPodLost || !walked(s.take()) {
		t.Fatalf("with the feed failing: %q", got)
	}
}

func TestIncremental_BackstopWalkCatchesWhatTheFeedMissed(t *testing.T) {
	t.Parallel()
	s := newSteady(t, 250, sdk.Values{"full_walk_every": "5m"})
	missed := s.fleet[17]
	s.H.Exec.Dead(missed) // lost without the feed naming it
	start := s.H.Now()
	for s.H.Board.Row(missed).State == running {
		if s.H.Now().Sub(start) > 5*time.Minute+s.H.Ladder.MaintenanceInterval {
			t.Fatalf("not caught within full_walk_every and one interval")
		}
		s.next(t)
	}
	if s.H.Now().Sub(start) < 5*time.Minute {
		t.Fatalf("caught after %s, before the backstop was due: the incremental pass walked", s.H.Now().Sub(start))
	}
	assertFleetRunning(t, s, missed)
}

func TestIncremental_ZeroFullWalkEveryWalksEveryPass(t *testing.T) {
	t.Parallel()
	s := newSteady(t, 10, sdk.Values{"full_walk_every": "0s"})
	for range 3 {
		s.next(t)
		if !walked(s.take()) {
			t.Fatal("full_walk_every 0s: a pass did not walk")
		}
	}
	if s.feed.Calls() != 0 {
		t.Fatalf("the feed was read %d times with the incremental pass off", s.feed.Calls())
	}
}

func TestIncremental_NamedAttemptsLeftOverAreCarried(t *testing.T) {
	t.Parallel()
	s := newSteady(t, 250, nil)
	if err := s.H.Configure(t.Context(), s.R, sdk.Values{"drain_max_pages": 1}); err != nil {
		t.Fatal(err)
	}
	for _, a := range s.fleet[:150] {
		s.H.Exec.Dead(a)
		s.feed.Deleted(a)
	}
	s.next(t)
	marked := func() int {
		n := 0
		for _, a := range s.fleet {
			if s.H.Board.Row(a).State == failed {
				n++
			}
		}
		return n
	}
	if n := marked(); n != ladder.PageSize {
		t.Fatalf("one page: %d marked", n)
	}
	s.next(t)
	if n := marked(); n != 150 {
		t.Fatalf("after the carried rest: %d marked, want 150", n)
	}
	assertFleetRunning(t, s, s.fleet[:150]...)
}

// assertFleetRunning fails if an attempt of the fleet other than except
// left running: nothing live is marked.
func assertFleetRunning(t *testing.T, s *steady, except ...sdk.Attempt) {
	t.Helper()
	skip := map[sdk.Attempt]bool{}
	for _, a := range except {
		skip[a] = true
	}
	for _, a := range s.fleet {
		if !skip[a] && s.H.Board.Row(a).State != running {
			t.Fatalf("a live attempt %s left running: %+v", a, s.H.Board.Row(a))
		}
	}
}

// A full walk reads the board in pages larger than 100 when its budget
// fits them, but never asks the substrate about more than 100 attempts in
// one liveness read: a read's cache misses are live reads against the API
// server.
func TestFullWalkReadsLivenessAHundredAtATime(t *testing.T) {
	t.Parallel()
	s := newSteady(t, 2500, nil)
	seen := map[sdk.Attempt]bool{}
	for _, rq := range s.H.Exec.LivenessCalls() {
		if len(rq.Attempts) > ladder.PageSize {
			t.Fatalf("one liveness read asked about %d attempts, want at most %d", len(rq.Attempts), ladder.PageSize)
		}
		for _, a := range rq.Attempts {
			seen[a] = true
		}
	}
	for _, a := range s.fleet {
		if !seen[a] {
			t.Fatalf("the walk never read the liveness of %v", a)
		}
	}
	if len(s.walk) >= len(s.fleet)/ladder.PageSize {
		t.Fatalf("the walk read %d pages of the board for %d attempts: none larger than %d", len(s.walk), len(s.fleet), ladder.PageSize)
	}
}
