package board

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dexaflow/reaper/sdk"
)

// OwedTeardown is one row of owed_teardowns: a reap-time teardown that did
// not complete, kept until a retry completes it.
type OwedTeardown struct {
	ID    int64
	RunID string
	// Attempt is the attempt torn down; nil for a run's teardown (every
	// execution of the run).
	Attempt       *sdk.Attempt
	PodUID        string // the pod the kube runner recorded for the attempt, when known
	Reaper        string
	Label         string // the decision a failed try is metered as
	Reason        string // the teardown's reason (the mark)
	Tries         int
	FirstFailedAt time.Time
	LastTriedAt   time.Time
	LastError     string
	NextTryAt     time.Time
	Term          int64 // the term of the last try
	// Live is set by DueTeardowns when the attempt is still its task's
	// current attempt on its way to execute or executing (scheduled, queued,
	// running), or, for a run's teardown, when the run is still running: no
	// applied mark stands behind the teardown, and it must not be tried.
	Live bool
}

// Subject names what the teardown stops: the attempt, or "run RUN".
func (o OwedTeardown) Subject() string {
	if o.Attempt != nil {
		return o.Attempt.String()
	}
	return "run " + o.RunID
}

// Request is the teardown to try again, under term.
func (o OwedTeardown) Request(term int64) sdk.TeardownRequest {
	req := sdk.TeardownRequest{Reason: o.Reason, Term: term}
	if o.Attempt != nil {
		a := *o.Attempt
		req.Attempt, req.PodUID = &a, o.PodUID
	} else {
		req.RunID = o.RunID
	}
	return req
}

// TeardownFailure is a teardown that did not complete, as OweTeardown
// records it.
type TeardownFailure struct {
	RunID   string
	Attempt *sdk.Attempt // nil for a run's teardown
	Reaper  string
	Label   string
	Reason  string
	Error   string
	At      time.Time
	Term    int64
}

// TeardownBackoff spaces the tries of an owed teardown: the first retry
// Base after the failure, each later one twice as far as the one before,
// never more than Cap.
type TeardownBackoff struct {
	Base, Cap time.Duration
}

// After is the wait after the tries-th failed try (tries >= 1).
func (b TeardownBackoff) After(tries int) time.Duration {
	d := b.Base
	for i := 1; i < tries && d < b.Cap; i++ {
		d *= 2
	}
	return min(d, b.Cap)
}

// owedColumns are the columns scanOwed reads.
const owedColumns = `o.id, o.run_id, o.task_id, o.try_number, o.attempt_epoch, o.pod_uid, o.reaper, o.label,
    o.reason, o.tries, o.first_failed_at, o.last_tried_at, o.last_error, o.next_try_at, o.term`

func scanOwed(row pgx.Row, more ...any) (OwedTeardown, error) {
	var (
		o            OwedTeardown
		task, uid    *string
		try, epoch   *int32
		first, tried time.Time
	)
	dest := append([]any{&o.ID, &o.RunID, &task, &try, &epoch, &uid, &o.Reaper, &o.Label, &o.Reason, &o.Tries,
		&first, &tried, &o.LastError, &o.NextTryAt, &o.Term}, more...)
	if err := row.Scan(dest...); err != nil {
		return OwedTeardown{}, err
	}
	if task != nil && try != nil && epoch != nil {
		o.Attempt = &sdk.Attempt{RunID: o.RunID, TaskID: *task, Try: *try, Epoch: *epoch}
	}
	o.PodUID, o.FirstFailedAt, o.LastTriedAt = deref(uid), first, tried
	return o, nil
}

// collectOwed reads rows of owedColumns, followed by the live flag when
// withLive.
func collectOwed(rows pgx.Rows, withLive bool) ([]OwedTeardown, error) {
	defer rows.Close()
	var out []OwedTeardown
	for rows.Next() {
		var (
			live bool
			more []any
		)
		if withLive {
			more = append(more, &live)
		}
		o, err := scanOwed(rows, more...)
		if err != nil {
			return nil, err
		}
		o.Live = live
		out = append(out, o)
	}
	return out, rows.Err()
}

// executingStates are the states of a current attempt on its way to
// execute or executing.
const executingStates = `('` + sdk.StateScheduled + `', '` + sdk.StateQueued + `', '` + sdk.StateRunning + `')`

// OweTeardown records a teardown that did not complete: a new row due
// b.Base from f.At, or, when the attempt's (or the run's) teardown is owed
// already, one more failed try of it. It is not fenced: a teardown that a
// deposed leader's reaper failed is owed all the same (its mark was fenced
// when written), and whichever leader comes next retries it.
func (s *Store) OweTeardown(ctx context.Context, f TeardownFailure, b TeardownBackoff) (OwedTeardown, error) {
	switch {
	case f.RunID == "":
		return OwedTeardown{}, errors.New("board: owe teardown: no run id")
	case f.Attempt != nil && (f.Attempt.RunID != f.RunID || f.Attempt.TaskID == ""):
		return OwedTeardown{}, fmt.Errorf("board: owe teardown of %s: the attempt is not of run %s", f.Attempt, f.RunID)
	case f.Reaper == "" || f.Label == "" || f.At.IsZero():
		return OwedTeardown{}, fmt.Errorf("board: owe teardown of run %s: reaper, label and time are required", f.RunID)
	}
	var task, try, epoch any // NULL for a run's teardown
	conflict := `(run_id) WHERE task_id IS NULL`
	if f.Attempt != nil {
		task, try, epoch = f.Attempt.TaskID, f.Attempt.Try, f.Attempt.Epoch
		conflict = `(run_id, task_id, try_number, attempt_epoch) WHERE task_id IS NOT NULL`
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	o, err := scanOwed(s.pool.QueryRow(ctx, `
INSERT INTO owed_teardowns AS o (run_id, task_id, try_number, attempt_epoch, pod_uid, reaper, label, reason,
    tries, first_failed_at, last_tried_at, last_error, next_try_at, term)
VALUES ($1, $2, $3, $4,
    (SELECT pod_uid FROM task_instances ti WHERE ti.run_id = $1 AND ti.task_id = $2
         AND ti.try_number = $3 AND ti.attempt_epoch = $4),
    $5, $6, $7, 1, $8::timestamptz, $8::timestamptz, $9, $8::timestamptz + `+backoffSQL("1", "$10", "$11")+`, $12)
ON CONFLICT `+conflict+` DO UPDATE SET
    tries = o.tries + 1, last_tried_at = $8::timestamptz, last_error = $9, term = $12,
    pod_uid = coalesce(o.pod_uid, EXCLUDED.pod_uid),
    next_try_at = greatest(o.next_try_at, $8::timestamptz + `+backoffSQL("o.tries + 1", "$10", "$11")+`)
RETURNING `+owedColumns,
		f.RunID, task, try, epoch, f.Reaper, f.Label, s.Safe(FieldReason, f.Reason), f.At, s.Safe(FieldTeardownError, f.Error),
		b.Base.Microseconds(), b.Cap.Microseconds(), f.Term))
	if err != nil {
		return OwedTeardown{}, fmt.Errorf("board: owe teardown of run %s: %w", f.RunID, err)
	}
	return o, nil
}

// backoffSQL is TeardownBackoff.After(tries) as an interval, with the base
// and the cap in microseconds as the parameters base and cap.
func backoffSQL(tries, base, cap string) string {
	return `least(` + base + `::float8 * power(2::float8, least(` + tries + ` - 1, 40)), ` + cap +
		`::float8) * interval '1 microsecond'`
}

// MaxTeardownError is the most of a failed try's error an owed teardown
// keeps (FieldTeardownError: cut on a rune boundary, made safe).
const MaxTeardownError = 2048

// leads returns ErrDeposed unless term is the leader row's and its lease
// runs at now; a refusal is the fence's refusal of write (Refused).
func (s *Store) leads(ctx context.Context, write string, term int64, now time.Time) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // nothing written
	ok, seen, err := s.fence(ctx, tx, term, now)
	switch {
	case err != nil:
		return err
	case !ok:
		s.refused(ctx, write, term, now, seen)
		return ErrDeposed
	}
	return nil
}

// DueTeardowns returns up to limit owed teardowns whose next try is due at
// now, the longest due first, for the leader of term to try again. It
// returns ErrDeposed when term does not lead at now.
func (s *Store) DueTeardowns(ctx context.Context, term int64, now time.Time, limit int) ([]OwedTeardown, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	if err := s.leads(ctx, "due teardowns", term, now); err != nil {
		return nil, fmt.Errorf("board: due teardowns: %w", err)
	}
	rows, err := s.pool.Query(ctx, `SELECT `+owedColumns+`,
    CASE WHEN o.task_id IS NULL THEN coalesce(r.state = '`+sdk.RunRunning+`', false)
         ELSE coalesce(ti.try_number = o.try_number AND ti.attempt_epoch = o.attempt_epoch
                       AND ti.state IN `+executingStates+`, false)
    END
    FROM owed_teardowns o
    LEFT JOIN task_instances ti ON ti.run_id = o.run_id AND ti.task_id = o.task_id
    LEFT JOIN runs r ON r.run_id = o.run_id
    WHERE o.next_try_at <= $1 ORDER BY o.next_try_at, o.id LIMIT $2`, now, pageLimit(limit))
	if err != nil {
		return nil, fmt.Errorf("board: due teardowns: %w", err)
	}
	out, err := collectOwed(rows, true)
	if err != nil {
		return nil, fmt.Errorf("board: due teardowns: %w", err)
	}
	return out, nil
}

// fencedOwed is the leader row, share-locked, for the writes of a retry.
const fencedOwed = `
WITH lead AS (
    SELECT term, expires_at FROM leader WHERE ` + leaderRow + ` FOR SHARE
)`

// fencedTerm is true when $2 is the leader row's term and its lease runs at
// $3.
const fencedTerm = `$2::bigint = (SELECT term FROM lead) AND $3::timestamptz < (SELECT expires_at FROM lead)`

// TeardownDone removes the owed teardown id: a retry of term at now
// completed it. It reports whether the row was there; ErrDeposed when term
// does not lead at now (nothing is removed).
func (s *Store) TeardownDone(ctx context.Context, id, term int64, now time.Time) (bool, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	tag, err := s.pool.Exec(ctx, fencedOwed+`
DELETE FROM owed_teardowns WHERE id = $4 AND `+fencedTerm, s.fenceKey(), term, now, id)
	if err != nil {
		return false, fmt.Errorf("board: owed teardown %d done: %w", id, err)
	}
	if tag.RowsAffected() == 1 {
		return true, nil
	}
	if err := s.leads(ctx, "owed teardown done", term, now); err != nil {
		return false, fmt.Errorf("board: owed teardown %d done: %w", id, err)
	}
	return false, nil
}

// TeardownFailed records one more failed try of the owed teardown id, by
// term at now, with its error: the next is due b.After(tries) later. It
// returns the row, and ErrNotFound when the row is gone; ErrDeposed when
// term does not lead at now (nothing is written).
func (s *Store) TeardownFailed(ctx context.Context, id, term int64, now time.Time, failure string, b TeardownBackoff) (OwedTeardown, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	o, err := scanOwed(s.pool.QueryRow(ctx, fencedOwed+`
UPDATE owed_teardowns o SET tries = o.tries + 1, last_tried_at = $3::timestamptz, last_error = $5, term = $2,
    next_try_at = $3::timestamptz + `+backoffSQL("o.tries + 1", "$6", "$7")+`
WHERE id = $4 AND `+fencedTerm+`
RETURNING `+owedColumns, s.fenceKey(), term, now, id, s.Safe(FieldTeardownError, failure), b.Base.Microseconds(), b.Cap.Microseconds()))
	if errors.Is(err, pgx.ErrNoRows) {
		if ferr := s.leads(ctx, "owed teardown failed", term, now); ferr != nil {
			return OwedTeardown{}, fmt.Errorf("board: owed teardown %d failed again: %w", id, ferr)
		}
		return OwedTeardown{}, fmt.Errorf("board: owed teardown %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return OwedTeardown{}, fmt.Errorf("board: owed teardown %d failed again: %w", id, err)
	}
	return o, nil
}

// OwedTeardownCount is how many teardowns are owed.
func (s *Store) OwedTeardownCount(ctx context.Context) (int, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM owed_teardowns`).Scan(&n); err != nil {
		return 0, fmt.Errorf("board: count owed teardowns: %w", err)
	}
	return n, nil
}

// OwedTeardownsFor returns the teardowns owed for a task instance (any of
// its attempts) and for its run as a whole, oldest first. With taskID empty
// it returns every one of the run.
func (s *Store) OwedTeardownsFor(ctx context.Context, runID, taskID string) ([]OwedTeardown, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT `+owedColumns+` FROM owed_teardowns o
    WHERE o.run_id = $1 AND ($2 = '' OR o.task_id = $2 OR o.task_id IS NULL) ORDER BY o.id`, runID, taskID)
	if err != nil {
		return nil, fmt.Errorf("board: owed teardowns of %s/%s: %w", runID, taskID, err)
	}
	out, err := collectOwed(rows, false)
	if err != nil {
		return nil, fmt.Errorf("board: owed teardowns of %s/%s: %w", runID, taskID, err)
	}
	return out, nil
}

// OwedTeardownOf returns the teardown owed for attempt a itself (not its
// run's, not another attempt's of its task); ok is false when none is. It
// reads by the attempt's unique index (owed_teardowns_attempt_idx): the
// kube runner asks it for every mark past the confirmation valve.
func (s *Store) OwedTeardownOf(ctx context.Context, a sdk.Attempt) (o OwedTeardown, ok bool, err error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	o, err = scanOwed(s.pool.QueryRow(ctx, owedOfSQL, a.RunID, a.TaskID, a.Try, a.Epoch))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return OwedTeardown{}, false, nil
	case err != nil:
		return OwedTeardown{}, false, fmt.Errorf("board: owed teardown of %s: %w", a, err)
	}
	return o, true, nil
}

// owedOfSQL reads the row of one attempt ($1..$4: run, task, try, epoch).
// The predicate repeats the partial index's, so that even a generic plan
// proves it.
const owedOfSQL = `SELECT ` + owedColumns + ` FROM owed_teardowns o
    WHERE o.run_id = $1 AND o.task_id = $2 AND o.try_number = $3 AND o.attempt_epoch = $4 AND o.task_id IS NOT NULL`
