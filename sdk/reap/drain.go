package reap

import (
	"context"
	"fmt"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// Budget bounds how long one pass keeps paging.
//
// The host hands a pass its clock reading (Pass.Now) and the end of the
// phase budget (Pass.Deadline). The plugin cannot read the host's clock
// again, so it measures its own elapsed time with a stopwatch (the real
// clock in production, a fake one in tests) and counts it against
// Deadline − Now. A new page starts only while the time left exceeds the
// slowest page seen so far plus a tenth of the budget, kept for the pass's
// closing writes (the brake's marks, teardowns). The context's deadline, if
// any, bounds it too. A pass without a deadline reads one page per listing,
// which is the specification's behaviour.
//
// The pages of a sized listing (Listing.Sized) grow after its first: the
// budget keeps the slowest time per row any page took (its round trip
// counted against its rows, so a small page overstates it) and sizes the
// next page to what that rate fits in the time left before the reserve,
// between ladder.PageSize and ladder.DrainPage.
type Budget struct {
	clock    clock.Clock
	started  time.Time
	total    time.Duration
	maxPages int
	slowest  time.Duration
	perRow   time.Duration
}

// NewBudget starts the stopwatch of a pass. maxPages (> 0) caps the pages
// read from each listing in one pass; 0 leaves only the time bound.
func NewBudget(c clock.Clock, pass sdk.Pass, maxPages int) *Budget {
	var total time.Duration
	if !pass.Deadline.IsZero() {
		total = pass.Deadline.Sub(pass.Now)
	}
	return &Budget{clock: c, started: c.Now(), total: total, maxPages: maxPages}
}

// Elapsed is the stopwatch's reading.
func (b *Budget) Elapsed() time.Duration { return b.clock.Now().Sub(b.started) }

// more reports whether another page may start.
func (b *Budget) more(ctx context.Context) bool {
	if ctx.Err() != nil || b.total <= 0 {
		return false
	}
	return b.spare(ctx) > b.slowest
}

// spare is the time left before the reserve of a tenth of the budget (the
// context's deadline counted too).
func (b *Budget) spare(ctx context.Context) time.Duration {
	now := b.clock.Now()
	left := b.total - now.Sub(b.started)
	if dl, ok := ctx.Deadline(); ok {
		left = min(left, dl.Sub(now))
	}
	return left - b.total/10
}

// pageSize is the size of a sized listing's next page after its first.
func (b *Budget) pageSize(ctx context.Context) int {
	if b.perRow <= 0 {
		return ladder.PageSize
	}
	n := int(b.spare(ctx) / b.perRow)
	n -= n % ladder.PageSize
	return max(ladder.PageSize, min(ladder.DrainPage, n))
}

// observe counts a page of rows that took took.
func (b *Budget) observe(took time.Duration, rows int) {
	b.slowest = max(b.slowest, took)
	if rows > 0 {
		b.perRow = max(b.perRow, took/time.Duration(rows))
	}
}

// Listing is one keyset listing a pass drains. Page reads and judges the
// page after the cursor (nil: from the oldest row) and returns the cursor
// after it, nil when the page was short and the listing is exhausted.
//
// Sized, when set, is used instead of Page: it reads and judges at most
// limit rows after the cursor and says how many it read. A pass reads the
// first page of a sized listing at ladder.PageSize, the specification's
// page, and the pages after it, while it drains a backlog, as large as the
// budget fits, up to ladder.DrainPage: a drain of many pages pays a page's
// round trips a tenth as often. Candidates and Runs are sized. A Listing
// is made for one pass.
type Listing struct {
	Name  string
	Page  func(ctx context.Context, after *Cursor) (*Cursor, error)
	Sized func(ctx context.Context, after *Cursor, limit int) (next *Cursor, rows int, err error)
}

// DrainStats says how far a drain got.
type DrainStats struct {
	Pages     int  // pages read, all listings together
	Exhausted bool // every listing reached its end (its cursor is reset)
}

// Drain pages through the listings round-robin, one page of each per round,
// so that no listing starves another: every listing gets its first page, and
// further pages while the budget lasts. Each listing starts from its cursor
// in st and leaves there the cursor after its last page (none once it read a
// short page, so the next pass starts over). On an error the failing
// listing's cursor is left where it was, so the next pass reads that page
// again.
func Drain(ctx context.Context, budget *Budget, st State, listings ...Listing) (DrainStats, error) {
	var stats DrainStats
	active := append([]Listing(nil), listings...)
	pages := map[string]int{}
	for round := 0; len(active) > 0; round++ {
		var next []Listing
		for _, l := range active {
			if err := ctx.Err(); err != nil {
				if stats.Pages == 0 {
					return stats, fmt.Errorf("drain %s: %w", l.Name, err)
				}
				return stats, nil // out of time: keep what was done
			}
			if round > 0 && !budget.more(ctx) {
				return stats, nil // cursors kept: the next pass goes on from them
			}
			start := budget.clock.Now()
			var after *Cursor
			if c, ok := st.Cursors[l.Name]; ok {
				after = &c
			}
			var (
				cur  *Cursor
				rows int
				err  error
			)
			if l.Sized != nil {
				limit := ladder.PageSize
				if pages[l.Name] > 0 {
					limit = budget.pageSize(ctx)
				}
				cur, rows, err = l.Sized(ctx, after, limit)
			} else {
				cur, err = l.Page(ctx, after)
			}
			if err != nil {
				return stats, fmt.Errorf("drain %s: %w", l.Name, err)
			}
			budget.observe(budget.clock.Now().Sub(start), rows)
			st.set(l.Name, cur)
			stats.Pages++
			pages[l.Name]++
			if cur != nil && (budget.maxPages <= 0 || pages[l.Name] < budget.maxPages) {
				next = append(next, l)
			}
		}
		active = next
	}
	stats.Exhausted = allReset(st, listings)
	return stats, nil
}

func allReset(st State, listings []Listing) bool {
	for _, l := range listings {
		if _, ok := st.Cursors[l.Name]; ok {
			return false
		}
	}
	return true
}

// Candidates is a sized listing of task instances: q (without cursor and
// limit) read a page at a time, each page handed to judge.
func Candidates(name string, board sdk.Board, q sdk.CandidateQuery, judge func(context.Context, []sdk.Candidate) error) Listing {
	return Listing{Name: name, Sized: func(ctx context.Context, after *Cursor, limit int) (*Cursor, int, error) {
		q := q
		q.Limit = limit
		q.After = nil
		if after != nil {
			q.After = &sdk.Cursor{At: after.At, RunID: after.RunID, TaskID: after.TaskID}
		}
		page, err := board.ListCandidates(ctx, q)
		if err != nil {
			return nil, 0, fmt.Errorf("list candidates: %w", err)
		}
		if err := judge(ctx, page.Candidates); err != nil {
			return nil, 0, err
		}
		if page.Next == nil {
			return nil, len(page.Candidates), nil
		}
		return &Cursor{At: page.Next.At, RunID: page.Next.RunID, TaskID: page.Next.TaskID}, len(page.Candidates), nil
	}}
}

// Runs is a sized listing of the orphan-looking runs that query selects
// (its threshold and valve cutoff; its cursor and limit are the
// listing's), a page at a time, each page handed to judge.
func Runs(name string, board sdk.Board, query sdk.RunQuery, judge func(context.Context, []sdk.RunCandidate) error) Listing {
	return Listing{Name: name, Sized: func(ctx context.Context, after *Cursor, limit int) (*Cursor, int, error) {
		q := query
		q.After, q.Limit = nil, limit
		if after != nil {
			q.After = &sdk.RunCursor{At: after.At, RunID: after.RunID}
		}
		page, err := board.ListOrphanRuns(ctx, q)
		if err != nil {
			return nil, 0, fmt.Errorf("list orphan runs: %w", err)
		}
		if err := judge(ctx, page.Runs); err != nil {
			return nil, 0, err
		}
		if page.Next == nil {
			return nil, len(page.Runs), nil
		}
		return &Cursor{At: page.Next.At, RunID: page.Next.RunID}, len(page.Runs), nil
	}}
}
