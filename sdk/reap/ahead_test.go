package reap

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/sdk/sdktest"
)

// aheadBoard is a board of n running attempts past an hour, one a second.
func aheadBoard(n int) *sdktest.Board {
	b := sdktest.NewBoard()
	for i := range n {
		b.PutRunning(fmt.Sprintf("r%05d", i), "t", t0.Add(-2*time.Hour+time.Duration(i)*time.Second), t0)
	}
	return b
}

func aheadQuery() sdk.CandidateQuery {
	return sdk.CandidateQuery{States: []string{sdk.StateRunning}, OrderBy: sdk.FieldRunningAt, OlderThan: t0.Add(-time.Hour)}
}

// aheadBudget is the budget of a pass of 30 s, which fits every page; a
// judgment advances clk by a millisecond, so that the pages after the
// first are ladder.DrainPage.
func aheadBudget() (*clock.Fake, *Budget) {
	clk := clock.NewFake(t0)
	return clk, NewBudget(clk, sdk.Pass{Now: t0, Deadline: t0.Add(30 * time.Second)}, 0)
}

// waitFor fails the test if ch is not closed within a minute (a bound on
// a test that would otherwise hang, not a threshold that must pass).
func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(time.Minute):
		t.Fatalf("%s: not within a minute", what)
	}
}

// The read ahead changes when pages are read, not what is judged: the
// same attempts in the same order as a plain drain, every page after the
// first read while the page before it is still being judged.
func TestCandidatesAheadJudgesInOrderWhileTheNextPageIsRead(t *testing.T) {
	t.Parallel()
	const n = 2550
	drain := func(ahead bool) []sdk.Attempt {
		b := aheadBoard(n)
		var mu sync.Mutex
		started := map[string]chan struct{}{} // by the cursor's run: a read after it began
		closed := map[string]bool{}
		began := func(run string) chan struct{} {
			mu.Lock()
			defer mu.Unlock()
			if started[run] == nil {
				started[run] = make(chan struct{})
			}
			return started[run]
		}
		b.OnList(func(q sdk.CandidateQuery) {
			if q.After == nil {
				return
			}
			ch := began(q.After.RunID)
			mu.Lock()
			defer mu.Unlock()
			if !closed[q.After.RunID] {
				closed[q.After.RunID] = true
				close(ch)
			}
		})
		clk, budget := aheadBudget()
		var judged []sdk.Attempt
		judge := func(_ context.Context, page []sdk.Candidate) error {
			clk.Advance(time.Millisecond)
			for _, c := range page {
				judged = append(judged, c.Attempt)
			}
			if ahead && len(page) == ladder.DrainPage || ahead && len(judged) == ladder.PageSize {
				// The next page's read has begun before this page's
				// judgment ends.
				waitFor(t, began(page[len(page)-1].RunID), "the read of the page after "+page[len(page)-1].RunID)
			}
			return nil
		}
		list := Candidates("l", b, aheadQuery(), judge)
		if ahead {
			list = CandidatesAhead("l", b, aheadQuery(), judge)
		}
		st := State{Cursors: map[string]Cursor{}}
		stats, err := Drain(context.Background(), budget, st, list)
		if err != nil || !stats.Exhausted || stats.Pages != 4 {
			t.Fatalf("drain (ahead %v): %+v, %v; want 4 pages (100, 1,000, 1,000, 450)", ahead, stats, err)
		}
		return judged
	}
	plain, ahead := drain(false), drain(true)
	if len(plain) != n || !slices.Equal(plain, ahead) {
		t.Fatalf("judged %d attempts plainly and %d with the read ahead, or in another order", len(plain), len(ahead))
	}
}

// A read ahead that fails fails the call that takes it: the drain ends
// with the error, the page before it judged and the cursor left at the
// failed page, so that the next pass reads it again.
func TestCandidatesAheadErrorOfTheNextPageSurfaces(t *testing.T) {
	t.Parallel()
	b := aheadBoard(2550)
	broken := errors.New("connection reset")
	b.OnList(func(q sdk.CandidateQuery) {
		if q.After != nil {
			b.Fail(sdktest.OpListCandidates, broken)
		}
	})
	var judged int
	list := CandidatesAhead("l", b, aheadQuery(), func(_ context.Context, page []sdk.Candidate) error {
		judged += len(page)
		return nil
	})
	_, budget := aheadBudget()
	st := State{Cursors: map[string]Cursor{}}
	_, err := Drain(context.Background(), budget, st, list)
	if !errors.Is(err, broken) {
		t.Fatalf("drain: %v, want the read ahead's error", err)
	}
	if judged != ladder.PageSize {
		t.Fatalf("judged %d attempts, want the first page's %d", judged, ladder.PageSize)
	}
	if c, ok := st.Cursors["l"]; !ok || c.RunID != fmt.Sprintf("r%05d", ladder.PageSize-1) {
		t.Fatalf("cursor %+v, want after the first page", st.Cursors["l"])
	}
}

// stallBoard holds every listing after a cursor until its context ends,
// saying when one begins and when it has ended.
type stallBoard struct {
	*sdktest.Board
	began, ended chan struct{}
}

func (b *stallBoard) ListCandidates(ctx context.Context, q sdk.CandidateQuery) (sdk.CandidatePage, error) {
	if q.After == nil {
		return b.Board.ListCandidates(ctx, q)
	}
	close(b.began)
	<-ctx.Done()
	defer close(b.ended)
	return sdk.CandidatePage{}, ctx.Err()
}

// The read ahead is the drain's: cancelled with the pass's context
// mid-walk, or passed over when the drain stops paging (its page cap
// here), it ends before Drain returns.
func TestCandidatesAheadStopsWithTheDrain(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"the pass's context cancelled mid-walk", "the drain stops paging"} {
		b := &stallBoard{Board: aheadBoard(2550), began: make(chan struct{}), ended: make(chan struct{})}
		ctx, cancel := context.WithCancel(context.Background())
		list := CandidatesAhead("l", b, aheadQuery(), func(context.Context, []sdk.Candidate) error {
			waitFor(t, b.began, how+": the read ahead")
			if strings.HasPrefix(how, "the pass's context") {
				cancel()
			}
			return nil
		})
		pass := sdk.Pass{Now: t0, Deadline: t0.Add(30 * time.Second)}
		maxPages := 0
		if how == "the drain stops paging" {
			maxPages = 1
		}
		st := State{Cursors: map[string]Cursor{}}
		_, err := Drain(ctx, NewBudget(clock.NewFake(t0), pass, maxPages), st, list)
		select {
		case <-b.ended:
		default:
			t.Fatalf("%s: the read ahead still runs after Drain returned (%v)", how, err)
		}
		if err != nil {
			t.Fatalf("%s: drain: %v (the first page was judged: out of time, not failed)", how, err)
		}
		if c := st.Cursors["l"]; c.RunID != fmt.Sprintf("r%05d", ladder.PageSize-1) {
			t.Fatalf("%s: cursor %+v, want after the first page", how, c)
		}
		cancel()
	}
}

// A call for fewer rows than were read ahead (the budget running out)
// reads afresh: the page is what a plain read of that many rows answers.
func TestCandidatesAheadFewerRowsReadAfresh(t *testing.T) {
	t.Parallel()
	b := aheadBoard(2550)
	var got [][]sdk.Candidate
	judge := func(_ context.Context, page []sdk.Candidate) error {
		got = append(got, page)
		return nil
	}
	list := CandidatesAhead("l", b, aheadQuery(), judge)
	defer list.Stop()
	ctx := context.Background()
	next, _, err := list.Sized(ctx, nil, ladder.PageSize)
	if err != nil {
		t.Fatal(err)
	}
	after, rows, err := list.Sized(ctx, next, 150)
	if err != nil || rows != 150 {
		t.Fatalf("a page of 150 after the read ahead of %d: %d rows, %v", ladder.DrainPage, rows, err)
	}
	plain, err := b.ListCandidates(ctx, sdk.CandidateQuery{States: aheadQuery().States, OrderBy: sdk.FieldRunningAt,
		OlderThan: aheadQuery().OlderThan, Limit: 150, After: &sdk.Cursor{At: next.At, RunID: next.RunID, TaskID: next.TaskID}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(got[1], plain.Candidates, func(a, b sdk.Candidate) bool { return a.Attempt == b.Attempt }) ||
		after.RunID != plain.Next.RunID {
		t.Fatalf("the page of 150 is not the plain read's")
	}
}
