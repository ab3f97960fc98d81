package plugin

import (
	"context"
	"fmt"
	"github.com/dexaflow/reaper/sdk"
	"strconv"
	"strings"
	"sync"
	"time"
)

// readAhead lets a plugin's board read the next page of a listing while
// the plugin works on the page it was just given. Across the process
// boundary a page costs a round trip to the host and one to the database;
// a reaper that drains a backlog asks for page after page, so the round
// trip for the next page can run while the current page's marks go out,
// instead of after them. (boardClient sends it with the pass's next write:
// sent at once, it competed with the page's liveness read for the host and
// slowed that read by more than it saved.)
//
// A page read ahead is no staler than the same page read by a slower pass:
// every mark is guarded on the board, and liveness is read after the
// listing either way. The read ahead of a listing the plugin stops paging
// (its budget ran out) is cancelled when the pass ends, unread.
//
// Each listing (a query without its cursor) has at most one page in
// flight; a request for any other position of that listing drops it. The
// read of the next page is armed when a page is served and sent by fire,
// which the board calls on the pass's next write.
type readAhead[P any] struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	pending map[string]*aheadPage[P]
	armed   map[string]func() // reads waiting for fire, by listing
}

// maxListingsAhead bounds the listings read ahead at once; a pass drains a
// handful.
const maxListingsAhead = 8

type aheadPage[P any] struct {
	at     string // the cursor it was read after
	cancel context.CancelFunc
	done   chan struct{}
	page   P
	err    error
}

func newReadAhead[P any](ctx context.Context) *readAhead[P] {
	ctx, cancel := context.WithCancel(ctx)
	return &readAhead[P]{ctx: ctx, cancel: cancel, pending: map[string]*aheadPage[P]{}, armed: map[string]func(){}}
}

// serve answers a request for the page of listing after cursor at: with
// the page read ahead for that position if there is one, else by read.
// When next says where the page after it starts, that page's read is
// armed.
func (r *readAhead[P]) serve(ctx context.Context, listing, at string, read func(context.Context) (P, error),
	next func(P) (at string, read func(context.Context) (P, error), ok bool)) (P, error) {
	r.mu.Lock()
	delete(r.armed, listing)
	r.mu.Unlock()
	page, ok, err := r.take(ctx, listing, at)
	if err != nil {
		return page, fmt.Errorf("wait for the page read ahead: %w", err)
	}
	if !ok {
		if page, err = read(ctx); err != nil {
			return page, err
		}
	}
	if nextAt, nextRead, more := next(page); more {
		r.mu.Lock()
		r.armed[listing] = func() { r.start(listing, nextAt, nextRead) }
		r.mu.Unlock()
	}
	return page, nil
}

// fire sends the armed reads.
func (r *readAhead[P]) fire() {
	r.mu.Lock()
	armed := r.armed
	r.armed = map[string]func(){}
	r.mu.Unlock()
	for _, start := range armed {
		start()
	}
}

// take returns the page of listing read ahead after cursor at, waiting for
// it if it is still in flight; ok is false when there is none (or reading it
// failed: the caller reads it itself and the error, if it lasts, is its
// own).
func (r *readAhead[P]) take(ctx context.Context, listing, at string) (page P, ok bool, err error) {
	r.mu.Lock()
	p := r.pending[listing]
	delete(r.pending, listing)
	r.mu.Unlock()
	if p == nil {
		return page, false, nil
	}
	if p.at != at {
		p.cancel()
		return page, false, nil
	}
	select {
	case <-p.done:
		if p.err != nil {
			return page, false, nil
		}
		return p.page, true, nil
	case <-ctx.Done():
		p.cancel()
		return page, false, ctx.Err()
	}
}

// start reads the page of listing after cursor at in the background.
func (r *readAhead[P]) start(listing, at string, read func(context.Context) (P, error)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ctx.Err() != nil {
		return
	}
	if old := r.pending[listing]; old != nil {
		old.cancel()
	} else if len(r.pending) >= maxListingsAhead {
		return
	}
	ctx, cancel := context.WithCancel(r.ctx)
	p := &aheadPage[P]{at: at, cancel: cancel, done: make(chan struct{})}
	r.pending[listing] = p
	r.wg.Go(func() {
		defer close(p.done)
		defer cancel()
		p.page, p.err = read(ctx)
	})
}

// close cancels what is still in flight and waits for it.
func (r *readAhead[P]) close() {
	r.cancel()
	r.wg.Wait()
}

// listingKey names a candidate listing: its query without cursor.
func listingKey(q sdk.CandidateQuery) string {
	var only strings.Builder
	for _, a := range q.Only {
		fmt.Fprintf(&only, "%q/%q,", a.RunID, a.TaskID)
	}
	return fmt.Sprintf("%s|%s|%s|%d|%s|%d|%s", strings.Join(q.States, ","), strings.Join(q.Executors, ","),
		q.OrderBy, timeKey(q.OlderThan), q.Heartbeat, q.Limit, only.String())
}

func cursorKey(c *sdk.Cursor) string {
	if c == nil {
		return ""
	}
	return strconv.FormatInt(timeKey(c.At), 10) + "|" + c.RunID + "|" + c.TaskID
}

func runListingKey(q sdk.RunQuery) string {
	return strconv.FormatInt(timeKey(q.OlderThan), 10) + "|" + strconv.Itoa(q.Limit)
}

func runCursorKey(c *sdk.RunCursor) string {
	if c == nil {
		return ""
	}
	return strconv.FormatInt(timeKey(c.At), 10) + "|" + c.RunID
}

func timeKey(t time.Time) int64 { return tsToPB(t) }
