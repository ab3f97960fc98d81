package sdktest

import (
	"context"
	"errors"
	"strconv"
	"sync"

	"github.com/dexaflow/reaper/sdk"
)

// Feed is a scripted change feed (sdk.ChangeFeed) for Executions.UseFeed:
// Deleted records an attempt's pod deletion, Break starts a new generation
// (what a relist or a lost watch does to a real one). Its answers follow
// the contract: complete only from a cursor of the current generation.
type Feed struct {
	mu    sync.Mutex
	gen   int
	seq   uint64
	gone  []sdk.Attempt // gone[i] is change i+1 of the generation
	err   error
	calls int
}

// NewFeed returns a feed at its first generation, with no change.
func NewFeed() *Feed { return &Feed{} }

// Deleted records that a of an attempt's pod was seen deleted.
func (f *Feed) Deleted(a sdk.Attempt) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	f.gone = append(f.gone, a)
}

// Break starts a new generation: a cursor of an older one gets an
// incomplete answer.
func (f *Feed) Break() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gen++
	f.seq, f.gone = 0, nil
}

// Fail makes every read answer err (nil: answer again).
func (f *Feed) Fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

// Calls counts the reads.
func (f *Feed) Calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// Changes answers the deletions after since.
func (f *Feed) Changes(ctx context.Context, since sdk.FeedCursor) (sdk.FeedChanges, error) {
	if err := ctx.Err(); err != nil {
		return sdk.FeedChanges{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.err != nil {
		return sdk.FeedChanges{}, f.err
	}
	out := sdk.FeedChanges{Cursor: sdk.FeedCursor{Generation: "g" + strconv.Itoa(f.gen), Seq: f.seq}}
	if since.Generation != out.Cursor.Generation || since.Seq > f.seq {
		out.Detail = "another generation"
		return out, nil
	}
	out.Complete = true
	out.Gone = append(out.Gone, f.gone[since.Seq:]...)
	return out, nil
}

var _ sdk.ChangeFeed = (*Feed)(nil)

// errNoFeed is what Changes answers when no feed is in use, as a
// substrate without one (a reaper then looks at everything).
var errNoFeed = errors.New("the substrate has no change feed")

// UseFeed makes Changes answer from f (nil: no feed, an error).
func (e *Executions) UseFeed(f *Feed) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.feed = f
}

// Changes answers from the feed in use, or errors when there is none.
func (e *Executions) Changes(ctx context.Context, since sdk.FeedCursor) (sdk.FeedChanges, error) {
	e.mu.Lock()
	f := e.feed
	e.mu.Unlock()
	if f == nil {
		return sdk.FeedChanges{}, errNoFeed
	}
	return f.Changes(ctx, since)
}
