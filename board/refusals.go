package board

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dexaflow/reaper/sdk"
)

// The fence's refusals, kept (migration 20). A call the fence refused
// wrote nothing; what it was refused is then written on its own, unfenced,
// to fence_refusals: the write, the term and holder the writer claimed,
// the writer's time, the attempts it named and the leader row as the
// refusing fence saw it (LeaderSeen; where that fence does not say, as the
// recording statement finds it). A refused batch is one row. Recording is
// best effort: a row that cannot be written is told to the observer
// (RefusalUnrecorded) and the caller gets the refusal it would have got
// anyway. The leader keeps the table to the audit's retention
// (PruneRefusals), so it stays bounded.

// MaxRefusalAttempts is the most attempts a refusal's row names; its
// Requests counts them all.
const MaxRefusalAttempts = 64

// Why a refusal was refused, read from its row (FenceRefusal.Why): which
// clause of the fence the writer failed, as the leader row stood when the
// refusal was recorded.
const (
	RefusedNoLeader = "no_leader" // the board has no leader row of that name
	RefusedTerm     = "term"      // the leader row holds another term
	RefusedHolder   = "holder"    // the same term, held by another replica
	RefusedResigned = "resigned"  // the writer's term, resigned
	RefusedLease    = "lease"     // the writer's term and holder, its lease run out at the write's time
	// RefusedUnexplained: the leader row, read after the refusal, shows
	// none of the above (it changed in between, or the write's time is
	// not known).
	RefusedUnexplained = "unexplained"
)

// FenceRefusal is one row of fence_refusals: one call the fence refused.
type FenceRefusal struct {
	ID int64
	// At is when it was recorded, by the database's clock.
	At time.Time
	// Write names the call ("mark", "append log", "prune decisions", a
	// runner write such as "queue", ...).
	Write string
	// Term and Holder are what the writer claimed to lead as (Holder ""
	// for a store or writer without one).
	Term   int64
	Holder string
	// WriteAt is the writer's own time, which the lease was compared with;
	// zero when the call had none.
	WriteAt time.Time
	// Attempts are the first MaxRefusalAttempts attempts the call named
	// (one with only RunID for a run); Requests counts every one.
	Attempts []sdk.Attempt
	Requests int
	// The leader row as the refusing fence saw it, or where that fence did
	// not say, as the recording statement found it: LeadFound false when
	// there was none; LeadHolder "" and LeadExpiresAt zero when resigned.
	LeadFound     bool
	LeadTerm      int64
	LeadHolder    string
	LeadExpiresAt time.Time
}

// Why says which clause of the fence the refusal failed, as its row shows
// the leader row (one of the Refused words).
func (r FenceRefusal) Why() string {
	switch {
	case !r.LeadFound:
		return RefusedNoLeader
	case r.LeadTerm != r.Term:
		return RefusedTerm
	case r.LeadHolder == "" || r.LeadExpiresAt.IsZero():
		return RefusedResigned
	case r.Holder != "" && r.LeadHolder != r.Holder:
		return RefusedHolder
	case !r.WriteAt.IsZero() && !r.LeadExpiresAt.After(r.WriteAt):
		return RefusedLease
	}
	return RefusedUnexplained
}

// refusalAttempt is an attempt in fence_refusals.attempts.
type refusalAttempt struct {
	RunID  string `json:"run_id"`
	TaskID string `json:"task_id,omitempty"`
	Try    int32  `json:"try,omitempty"`
	Epoch  int32  `json:"epoch,omitempty"`
}

// LeaderSeen is the leader row as the fence that refused a call saw it.
type LeaderSeen struct {
	Found     bool // false: no leader row of the store's name
	Term      int64
	Holder    string    // "": resigned
	ExpiresAt time.Time // zero: resigned
}

// Refused is what a fenced call does when the fence refused it: it tells
// the observer (Deposed, with told as the write), then records the
// refusal in fence_refusals, unfenced, with write, term, the writer's time
// at and the attempts named (this store's holder is the writer's), and
// the leader row as seen: by the refusing fence when the caller knows it
// (seen), else as the recording statement finds it. A refusal that cannot
// be recorded is told to the observer (RefusalUnrecorded), never
// returned: the caller's answer is the refusal itself. It waits for the
// record for at most the store's query timeout, even when ctx is done (a
// refusal met as the caller gives up is kept).
func (s *Store) Refused(ctx context.Context, told, write string, term int64, at time.Time, attempts []sdk.Attempt, seen *LeaderSeen) {
	deposed(s.observer, told, term)
	if err := s.recordRefusal(context.WithoutCancel(ctx), write, term, at, attempts, seen); err != nil && s.observer != nil {
		s.observer.RefusalUnrecorded(write, term, err)
	}
}

// refused is Refused for the board's own calls, told as write.
func (s *Store) refused(ctx context.Context, write string, term int64, at time.Time, seen *LeaderSeen, attempts ...sdk.Attempt) {
	s.Refused(ctx, write, write, term, at, attempts, seen)
}

// seenHolding is what a fence that picks the leader row by this store's
// holder saw when it found the row (term non-nil): the row, held by this
// holder. Nil when it did not find it (no row, or another holder's) or the
// store has no holder (the row's holder is not known then).
func (s *Store) seenHolding(term *int64, expires *time.Time) *LeaderSeen {
	if term == nil || s.holder == "" {
		return nil
	}
	seen := &LeaderSeen{Found: true, Term: *term, Holder: s.holder, ExpiresAt: timeOrZero(expires)}
	if expires == nil {
		seen.Holder = "" // resigned
	}
	return seen
}

func (s *Store) recordRefusal(ctx context.Context, write string, term int64, at time.Time, attempts []sdk.Attempt, seen *LeaderSeen) error {
	named := make([]refusalAttempt, 0, min(len(attempts), MaxRefusalAttempts))
	for _, a := range attempts[:min(len(attempts), MaxRefusalAttempts)] {
		named = append(named, refusalAttempt{RunID: a.RunID, TaskID: a.TaskID, Try: a.Try, Epoch: a.Epoch})
	}
	js, err := json.Marshal(named)
	if err != nil {
		return fmt.Errorf("board: record the fence's refusal of %s: %w", write, err)
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	args := []any{safeText(s.observer, FieldName, write), term, s.holder, nullTime(at), string(js), len(attempts)}
	lead := `l.term, l.holder, l.expires_at FROM (SELECT 1) one LEFT JOIN leader l ON l.name = $7`
	if seen != nil {
		// What the refusing fence saw: a later read may find it changed
		// (a renewal that committed in between).
		var term *int64
		if seen.Found {
			term = &seen.Term
		}
		args = append(args, term, nullText(seen.Holder), nullTime(seen.ExpiresAt))
		lead = `$7::bigint, $8::text, $9::timestamptz`
	} else {
		args = append(args, s.leader)
	}
	sql := `INSERT INTO fence_refusals (at, write, term, holder, write_at, attempts, requests,
        lead_term, lead_holder, lead_expires_at)
    SELECT clock_timestamp(), $1, $2, $3, $4, $5::jsonb, $6, ` + lead
	_, err = s.pool.Exec(ctx, sql, args...)
	if err != nil {
		return fmt.Errorf("board: record the fence's refusal of %s: %w", write, err)
	}
	return nil
}

// FenceRefusals returns the refusals recorded after the one with id after
// (0: from the first), oldest first, at most limit (<= 0: a page).
func (s *Store) FenceRefusals(ctx context.Context, after int64, limit int) ([]FenceRefusal, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT `+refusalColumns+` FROM fence_refusals WHERE id > $1 ORDER BY id LIMIT $2`,
		after, pageLimit(limit))
	if err != nil {
		return nil, fmt.Errorf("board: read the fence's refusals: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanRefusal)
	if err != nil {
		return nil, fmt.Errorf("board: read the fence's refusals: %w", err)
	}
	return out, nil
}

// RefusalSummary is what the fence refused since a time: how many calls,
// and the last of them (nil when none).
type RefusalSummary struct {
	Count int
	Last  *FenceRefusal
}

// RecentRefusals counts the refusals recorded at or after since (by the
// database's clock) and returns the last of them.
func (s *Store) RecentRefusals(ctx context.Context, since time.Time) (RefusalSummary, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	var sum RefusalSummary
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM fence_refusals WHERE at >= $1`, since).Scan(&sum.Count); err != nil {
		return sum, fmt.Errorf("board: count the fence's refusals: %w", err)
	}
	if sum.Count == 0 {
		return sum, nil
	}
	rows, err := s.pool.Query(ctx, `SELECT `+refusalColumns+` FROM fence_refusals WHERE at >= $1 ORDER BY id DESC LIMIT 1`, since)
	if err != nil {
		return sum, fmt.Errorf("board: read the fence's last refusal: %w", err)
	}
	last, err := pgx.CollectRows(rows, scanRefusal)
	if err != nil {
		return sum, fmt.Errorf("board: read the fence's last refusal: %w", err)
	}
	if len(last) == 1 {
		sum.Last = &last[0]
	}
	return sum, nil
}

// PruneRefusals deletes at most limit refusals recorded before before
// (limit <= 0: AuditPruneBatchDefault), fenced like the audit's prune:
// only while term, held by this store's holder, leads the board at now.
func (s *Store) PruneRefusals(ctx context.Context, term int64, now, before time.Time, limit int) (int64, error) {
	return s.pruneBatch(ctx, "fence refusals", `DELETE FROM fence_refusals WHERE id IN (
        SELECT id FROM fence_refusals WHERE at < $2 ORDER BY at LIMIT $3)`, term, now, before, limit, AuditPruneBatchDefault)
}

const refusalColumns = `id, at, write, term, holder, write_at, attempts, requests, lead_term, lead_holder, lead_expires_at`

func scanRefusal(row pgx.CollectableRow) (FenceRefusal, error) {
	var (
		r                FenceRefusal
		writeAt, expires *time.Time
		attempts         []byte
		leadTerm         *int64
		leadHolder       *string
	)
	if err := row.Scan(&r.ID, &r.At, &r.Write, &r.Term, &r.Holder, &writeAt, &attempts, &r.Requests,
		&leadTerm, &leadHolder, &expires); err != nil {
		return r, err
	}
	var named []refusalAttempt
	if err := json.Unmarshal(attempts, &named); err != nil {
		return r, fmt.Errorf("refusal %d: attempts: %w", r.ID, err)
	}
	for _, a := range named {
		r.Attempts = append(r.Attempts, sdk.Attempt{RunID: a.RunID, TaskID: a.TaskID, Try: a.Try, Epoch: a.Epoch})
	}
	r.WriteAt, r.LeadExpiresAt = timeOrZero(writeAt), timeOrZero(expires)
	if leadTerm != nil {
		r.LeadFound, r.LeadTerm, r.LeadHolder = true, *leadTerm, deref(leadHolder)
	}
	return r, nil
}

// nullText is v as a query argument: NULL when empty.
func nullText(v string) *string {
	if v == "" {
		return nil
	}
	return &v
}
