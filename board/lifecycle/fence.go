package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
)

// ErrDeposed is the error of a fenced write (see Writer.Fenced) made after
// its leadership term stopped leading the board: another replica took over,
// or the term's lease ran out. Nothing was written. A runner that meets it
// ends its cycle; the new leader's runner carries on from the board.
var ErrDeposed = errors.New("the leadership term no longer leads the board")

// Fenced returns a writer whose runner writes apply only while term is the
// term of the board's leader row and its lease has not run out at the
// write's time, the way the reapers' marks are fenced: the scheduling
// (EnqueueNew), run start (StartQueuedRuns), dispatch (Queue, QueueWarm,
// RecordMint, RecordPod), failure (Fail), rails (Retry, Replace,
// Reschedule, WarmRequeue, DispatchBackoff, Clear) and finalization
// (FinishSettledRuns). The leader row is share-locked by each such write,
// so a takeover waits for a write in flight, and a write after it sees the
// new term. A fenced write that finds its term deposed writes nothing and
// returns ErrDeposed (wrapped).
//
// An agent's reports (Running, Heartbeat, Report) are not fenced: every
// replica serves them, leading or not. A term of 0 or less fences nothing.
func (w *Writer) Fenced(term int64) *Writer {
	c := *w
	c.term = term
	return &c
}

// fence returns the condition that fences a runner write, its arguments
// numbered from $first (leader row, holder, term, the write's time), and
// those arguments; "true" and none for a writer that is not fenced. An
// empty holder (Options.Holder) fences on the term alone.
func (w *Writer) fence(first int, now time.Time) (string, []any) {
	if w.term <= 0 {
		return "true", nil
	}
	p := func(i int) string { return "$" + strconv.Itoa(first+i) }
	return `EXISTS (SELECT 1 FROM leader WHERE name = ` + p(0) + ` AND (` + p(1) + `::text = '' OR holder = ` + p(1) +
			`) AND term = ` + p(2) + ` AND expires_at > ` + p(3) + `::timestamptz FOR SHARE)`,
		[]any{w.leader, w.holder, w.term, now}
}

// deposed, after a fenced write (what: "queue", "retry", ...) that
// applied to nothing, tells whether the fence refused it: ErrDeposed
// (wrapped, with what the board holds) when the writer's term no longer
// leads the board at now, nil when it does (or the writer is not fenced)
// and the write's own guard refused it. A refusal is told to the observer
// as a "runner write" and recorded on the board with the attempts the
// write named (board.Store.Refused).
func (w *Writer) deposed(ctx context.Context, what string, now time.Time, attempts ...sdk.Attempt) error {
	seen, err := w.fenceRefusal(ctx, now)
	if errors.Is(err, ErrDeposed) {
		w.store.Refused(ctx, "runner write", what, w.term, now, attempts, seen)
	}
	return err
}

// Leads checks the fence without writing: nil while the writer's term,
// held by its holder, leads the board at now (or the writer is not
// fenced), ErrDeposed (wrapped, and told to the observer) when it does
// not. For what a runner does outside the board under its term, such as
// creating pods, where no guarded statement can carry the fence.
func (w *Writer) Leads(ctx context.Context, now time.Time) error {
	return w.deposed(ctx, "fence check", now)
}

// fenceRefusal is deposed's reading of the leader row: the refusal, and
// the row it read.
func (w *Writer) fenceRefusal(ctx context.Context, now time.Time) (*board.LeaderSeen, error) {
	if w.term <= 0 {
		return nil, nil
	}
	ctx, cancel := w.bound(ctx)
	defer cancel()
	var (
		term    int64
		holder  *string    // NULL once resigned
		expires *time.Time // NULL once its holder resigned
	)
	err := w.pool.QueryRow(ctx, `SELECT term, holder, expires_at FROM leader WHERE name = $1`, w.leader).Scan(&term, &holder, &expires)
	seen := &board.LeaderSeen{Found: err == nil, Term: term}
	if holder != nil && expires != nil {
		seen.Holder, seen.ExpiresAt = *holder, *expires
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return seen, fmt.Errorf("%w: term %d, and the board has no leader row %q", ErrDeposed, w.term, w.leader)
	case err != nil:
		return nil, fmt.Errorf("reading the board's leader row: %w", err)
	case term != w.term:
		return seen, fmt.Errorf("%w: term %d, the board's is %d", ErrDeposed, w.term, term)
	case w.holder != "" && holder != nil && *holder != w.holder:
		// The same number handed out twice: the board lost the write that
		// gave it to this replica (a failover to a standby behind).
		return seen, fmt.Errorf("%w: term %d is held by %s on the board, not by this replica (%s)", ErrDeposed, w.term, *holder, w.holder)
	case expires == nil:
		return seen, fmt.Errorf("%w: term %d was resigned", ErrDeposed, w.term)
	case !expires.After(now):
		return seen, fmt.Errorf("%w: term %d's lease ran out at %s", ErrDeposed, w.term, expires.UTC().Format(time.RFC3339Nano))
	}
	return nil, nil
}
