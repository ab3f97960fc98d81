package kube

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"sync"

	"github.com/dexaflow/reaper/sdk"
)

// maxFeedChanges bounds the deletions the change feed keeps (a few MiB of
// attempt names). A reader whose cursor is older than the oldest kept is
// told the answer is not complete, and looks at everything.
const maxFeedChanges = 1 << 16

// feed is the presence cache's change feed: the attempts whose pods the
// informer saw deleted, numbered in the order it saw them, within one
// generation of the cache. The generation changes whenever the informer
// lists afresh (its first list, a relist after a lost or expired watch)
// or reports a list or watch error: across such a break the cache may
// have missed a deletion, so a reader holding an older generation is told
// to look at everything. A periodic resync replays the cache as it is and
// loses nothing, so it keeps the generation.
type feed struct {
	base string // unique to this feed: a restarted substrate is a new generation

	mu      sync.Mutex
	gen     uint64
	seq     uint64      // the last change's number in this generation
	changes []feedEntry // oldest first, at most maxFeedChanges
	broke   string      // what began the current generation
}

type feedEntry struct {
	seq     uint64
	attempt sdk.Attempt
}

func newFeed() *feed {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand panics rather)
	return &feed{base: hex.EncodeToString(b[:]), broke: "the cache has not listed yet"}
}

// cursor is the feed's current position; the caller holds mu.
func (f *feed) cursor() sdk.FeedCursor {
	return sdk.FeedCursor{Generation: f.base + "." + strconv.FormatUint(f.gen, 10), Seq: f.seq}
}

// brokenBy starts a new generation: what the cache saw before it may have
// missed deletions.
func (f *feed) brokenBy(why string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gen++
	f.seq = 0
	f.changes = nil
	f.broke = why
}

// deleted is the informer's delete handler: it records the attempt of a
// deleted task pod (from the pod's labels, however the deletion came).
func (f *feed) deleted(obj any) {
	p, ok := deletedPod(obj)
	if !ok {
		return
	}
	a, ok := p.labels.attempt()
	if !ok {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	f.changes = append(f.changes, feedEntry{seq: f.seq, attempt: a})
	if len(f.changes) > maxFeedChanges {
		f.changes = append([]feedEntry(nil), f.changes[len(f.changes)-maxFeedChanges:]...)
	}
}

// since answers the deletions after c. The answer is complete only when c
// is of the current generation and nothing after it was dropped, and the
// cache has synced.
func (f *feed) since(c sdk.FeedCursor, synced bool) sdk.FeedChanges {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := sdk.FeedChanges{Cursor: f.cursor()}
	switch {
	case !synced:
		out.Detail = "the pod cache has not synced"
	case c.Generation != out.Cursor.Generation:
		out.Detail = "the pod cache's view began again since the cursor: " + f.broke
	case c.Seq > f.seq:
		out.Detail = "the cursor is ahead of the feed"
	case c.Seq < f.seq && (len(f.changes) == 0 || f.changes[0].seq > c.Seq+1):
		out.Detail = "deletions since the cursor were dropped (the feed is bounded)"
	default:
		out.Complete = true
		for _, e := range f.changes {
			if e.seq > c.Seq {
				out.Gone = append(out.Gone, e.attempt)
			}
		}
	}
	return out
}

// Changes answers the presence cache's change feed: the attempts whose
// pods it saw deleted since the cursor. An unconfigured substrate answers
// incomplete, never an error, so that the caller looks at everything.
func (s *Substrate) Changes(_ context.Context, since sdk.FeedCursor) (sdk.FeedChanges, error) {
	r, err := s.current()
	if err != nil {
		return sdk.FeedChanges{Detail: err.Error()}, nil
	}
	return r.presence.feed.since(since, r.presence.synced()), nil
}

var _ sdk.ChangeFeed = (*Substrate)(nil)
