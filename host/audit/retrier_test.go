package audit_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/host/audit"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/sdktest"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// scripted is a Writer whose writes fail as it is told, in turn, and that
// notes every write it was asked for. Past the end of fail, writes
// succeed; a write that succeeds goes on to next, when set.
type scripted struct {
	next audit.Writer

	mu     sync.Mutex
	fail   []error // the outcome of each write in turn (nil: written)
	writes []written
}

// written is one write a scripted Writer was asked for.
type written struct {
	term int64
	at   time.Time
	ds   []sdk.Decision
	err  error
}

func (s *scripted) RecordDecisions(ctx context.Context, term int64, at time.Time, ds []sdk.Decision) error {
	s.mu.Lock()
	var err error
	if n := len(s.writes); n < len(s.fail) {
		err = s.fail[n]
	}
	s.writes = append(s.writes, written{term: term, at: at, ds: ds, err: err})
	s.mu.Unlock()
	if err == nil && s.next != nil {
		return s.next.RecordDecisions(ctx, term, at, ds)
	}
	return err
}

// asked returns the writes asked for so far.
func (s *scripted) asked() []written {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]written(nil), s.writes...)
}

func newRetrier(w audit.Writer) (*audit.Retrier, *sdktest.LogBuffer) {
	var logs sdktest.LogBuffer
	return audit.NewRetrier(w, hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Debug})), &logs
}

// sameAttempts says whether two lists of decisions are about the same
// attempts, in the same order.
func sameAttempts(a, b []sdk.Decision) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Attempt != b[i].Attempt {
			return false
		}
	}
	return true
}

func TestRetrier(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	refused := errors.New("connection refused")

	// A decision written the first time is not kept.
	t.Run("WrittenIsNotKept", func(t *testing.T) {
		t.Parallel()
		w := &scripted{}
		r, _ := newRetrier(w)
		if out := r.Record(ctx, 7, t0, decisions(0, 3)); out != (audit.Outcome{Written: 3}) {
			t.Fatalf("outcome %+v, want 3 written, none kept", out)
		}
		if out := r.Retry(ctx); out != (audit.Outcome{}) || len(w.asked()) != 1 {
			t.Fatalf("retry %+v after %d writes, want nothing to retry", out, len(w.asked()))
		}
	})

	// A failed write is kept, and written at the next Retry, oldest first,
	// each batch under the term and the time it was recorded under.
	t.Run("FailedWriteIsKeptAndWrittenAtTheNextRetryInOrder", func(t *testing.T) {
		t.Parallel()
		w := &scripted{fail: []error{refused, refused}}
		r, logs := newRetrier(w)
		first, second := decisions(0, 3), decisions(3, 2)
		if out := r.Record(ctx, 7, t0, first); out.Written != 0 || out.Pending != 3 || !errors.Is(out.Err, refused) {
			t.Fatalf("outcome %+v, want the 3 kept and the write's error", out)
		}
		if out := r.Record(ctx, 8, t0.Add(time.Minute), second); out.Pending != 5 || out.Dropped != 0 {
			t.Fatalf("outcome %+v, want 5 kept in all", out)
		}
		if !strings.Contains(logs.String(), "audit of decisions failed: kept for the next cycle: count=3 error=\"connection refused\"") {
			t.Fatalf("the failed write was not logged:\n%s", logs)
		}
		if out := r.Retry(ctx); out != (audit.Outcome{Written: 5}) {
			t.Fatalf("retry %+v, want the 5 written, none kept", out)
		}
		got := w.asked()[2:]
		if len(got) != 2 || got[0].term != 7 || !got[0].at.Equal(t0) || !sameAttempts(got[0].ds, first) ||
			got[1].term != 8 || !got[1].at.Equal(t0.Add(time.Minute)) || !sameAttempts(got[1].ds, second) {
			t.Fatalf("retried %+v, want the first batch under term 7, then the second under term 8", got)
		}
		if n := strings.Count(logs.String(), "decisions kept from before are in the audit now"); n != 2 {
			t.Fatalf("%d batches logged as written at last, want 2:\n%s", n, logs)
		}
		if out := r.Retry(ctx); out != (audit.Outcome{}) || len(w.asked()) != 4 {
			t.Fatalf("a second retry %+v after %d writes, want nothing left", out, len(w.asked()))
		}
	})

	// A retry stops at the first batch that fails again and keeps it, with
	// every batch after it, in order, for the next.
	t.Run("RetryThatFailsAgainKeepsTheRestInOrder", func(t *testing.T) {
		t.Parallel()
		w := &scripted{fail: []error{refused, refused, refused, nil, refused}}
		r, logs := newRetrier(w)
		for i := range 3 {
			r.Record(ctx, int64(i+1), t0, decisions(i*10, 10))
		}
		if out := r.Retry(ctx); out.Written != 10 || out.Pending != 20 || !errors.Is(out.Err, refused) {
			t.Fatalf("retry %+v, want the first batch written and two kept", out)
		}
		if !strings.Contains(logs.String(), "audit of decisions kept from before failed again: count=10") {
			t.Fatalf("the failed retry was not logged:\n%s", logs)
		}
		if out := r.Retry(ctx); out != (audit.Outcome{Written: 20}) {
			t.Fatalf("second retry %+v, want the two kept written", out)
		}
		var terms []int64
		for _, wr := range w.asked()[3:] {
			terms = append(terms, wr.term)
		}
		if want := []int64{1, 2, 2, 3}; !slices.Equal(terms, want) {
			t.Fatalf("retried terms %v, want %v", terms, want)
		}
	})

	// Of a write the board made in part, only what it left out is kept.
	t.Run("PartialWriteKeepsOnlyTheRest", func(t *testing.T) {
		t.Parallel()
		partial := &board.PartialAuditError{Written: 2, Total: 3, Err: errors.New("timeout")}
		w := &scripted{fail: []error{partial}}
		r, _ := newRetrier(w)
		if out := r.Record(ctx, 7, t0, decisions(0, 3)); out.Written != 2 || out.Pending != 1 {
			t.Fatalf("outcome %+v, want 2 written and 1 kept", out)
		}
		r.Retry(ctx)
		if got := w.asked(); len(got) != 2 || !sameAttempts(got[1].ds, decisions(2, 1)) {
			t.Fatalf("writes %+v, want the last decision retried", got)
		}
	})

	// Past MaxPendingDecisions the oldest batch kept is given up, said at
	// ERROR with how many, and never written; the newest is kept.
	t.Run("PastTheBoundTheOldestIsGivenUp", func(t *testing.T) {
		t.Parallel()
		w := &scripted{fail: []error{refused, refused}}
		r, logs := newRetrier(w)
		n := audit.MaxPendingDecisions/2 + 1
		older, newer := decisions(0, n), decisions(n, n)
		if out := r.Record(ctx, 7, t0, older); out.Dropped != 0 || out.Pending != n {
			t.Fatalf("outcome %+v, want %d kept", out, n)
		}
		if out := r.Record(ctx, 8, t0.Add(time.Minute), newer); out.Dropped != n || out.Pending != n {
			t.Fatalf("outcome %+v, want the older %d given up and the newer kept", out, n)
		}
		if want := "[ERROR] audit writes kept failing: decisions given up, never audited: count=" +
			strconv.Itoa(n) + " term=7"; !strings.Contains(logs.String(), want) {
			t.Fatalf("the loss was not logged as %q:\n%s", want, logs)
		}
		if out := r.Retry(ctx); out != (audit.Outcome{Written: n}) {
			t.Fatalf("retry %+v, want the newer %d written", out, n)
		}
		if got := w.asked(); len(got) != 3 || got[2].term != 8 || !sameAttempts(got[2].ds, newer) {
			t.Fatalf("%d writes, want the newer batch alone retried", len(got))
		}
	})

	// A batch larger than the bound on its own is kept all the same: the
	// bound gives up older batches, never the one just kept.
	t.Run("OneBatchPastTheBoundIsKept", func(t *testing.T) {
		t.Parallel()
		r, _ := newRetrier(&scripted{fail: []error{refused}})
		n := audit.MaxPendingDecisions + 1
		if out := r.Record(ctx, 7, t0, decisions(0, n)); out.Dropped != 0 || out.Pending != n {
			t.Fatalf("outcome %+v, want all %d kept", out, n)
		}
	})

	// A pass's sink whose write failed: Finish keeps what it left out as
	// one batch under the sink's term and time, for the next Retry.
	t.Run("FinishKeepsWhatTheSinkFailedToWrite", func(t *testing.T) {
		t.Parallel()
		w := &scripted{fail: []error{refused}}
		r, logs := newRetrier(w)
		s := audit.NewSink(ctx, w, 7, t0, "agentlost", false)
		if err := s.Record(ctx, decisions(0, 4)); err != nil {
			t.Fatal(err)
		}
		if out := r.Finish(s); out.Written != 0 || out.Pending != 4 || !errors.Is(out.Err, refused) {
			t.Fatalf("outcome %+v, want the 4 kept", out)
		}
		if !strings.Contains(logs.String(), "audit of decisions failed: kept for the next cycle: count=4") {
			t.Fatalf("the failed write was not logged:\n%s", logs)
		}
		if out := r.Retry(ctx); out != (audit.Outcome{Written: 4}) {
			t.Fatalf("retry %+v, want the 4 written", out)
		}
		got := w.asked()
		if len(got) != 2 || got[1].term != 7 || !got[1].at.Equal(t0) || !sameAttempts(got[1].ds, decisions(0, 4)) ||
			got[1].ds[0].Reaper != "agentlost" {
			t.Fatalf("writes %+v, want the sink's 4 retried under its term and time, stamped", got)
		}
	})

	// A sink that wrote everything leaves nothing kept.
	t.Run("FinishOfAWrittenSink", func(t *testing.T) {
		t.Parallel()
		w := &scripted{}
		r, _ := newRetrier(w)
		s := audit.NewSink(ctx, w, 7, t0, "agentlost", false)
		if err := s.Record(ctx, decisions(0, 4)); err != nil {
			t.Fatal(err)
		}
		if out := r.Finish(s); out != (audit.Outcome{Written: 4}) {
			t.Fatalf("outcome %+v, want 4 written", out)
		}
	})

	// Without a Writer nothing is written and nothing kept.
	t.Run("WithoutWriter", func(t *testing.T) {
		t.Parallel()
		r, _ := newRetrier(nil)
		if out := r.Record(ctx, 7, t0, decisions(0, 3)); out != (audit.Outcome{}) {
			t.Fatalf("outcome %+v, want nothing", out)
		}
		if out := r.Retry(ctx); out != (audit.Outcome{}) {
			t.Fatalf("retry %+v, want nothing", out)
		}
	})
}

// The retrier knows no leadership: what a leader deposed since has
// left pending is written at its next Retry, on the board, under the term and at
// the time that decided it, whoever leads now.
func TestRetrier_DeposedLeadersDecisionsAreWrittenUnderTheirTerm(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	store := board.New(pool, board.Options{})
	old, ok, err := store.TryAcquire(ctx, "old", time.Minute, t0)
	if err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	w := &scripted{next: store, fail: []error{errors.New("connection refused")}}
	r, _ := newRetrier(w)
	r.Record(ctx, old.Term, t0, decisions(0, 3))
	next, ok, err := store.TryAcquire(ctx, "new", time.Minute, t0.Add(2*time.Minute))
	if err != nil || !ok || next.Term == old.Term {
		t.Fatalf("a new leader: %+v %v %v", next, ok, err)
	}
	if out := r.Retry(ctx); out != (audit.Outcome{Written: 3}) {
		t.Fatalf("retry %+v, want the 3 written", out)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM reap_decisions WHERE term = $1 AND at = $2`,
		old.Term, t0).Scan(&n); err != nil || n != 3 {
		t.Fatalf("%d rows under the old term at its time (err %v), want 3", n, err)
	}
}
