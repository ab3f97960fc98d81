package board

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/dexaflow/reaper/sdk"
)

// AuditRecord is one row of reap_decisions.
type AuditRecord struct {
	ID   int64
	At   time.Time
	Term int64
	sdk.Decision
	// Verdict is the shadow verdict on the decision (migration 012); its
	// Word is "" while unscored, and for a decision never scored.
	Verdict Verdict
}

// auditColumns are the columns RecordDecisions copies into reap_decisions
// (id is generated).
var auditColumns = []string{"at", "term", "reaper", "label", "run_id", "task_id", "try_number", "attempt_epoch",
	"applied", "dry_run", "detail", "evidence"}

// AuditChunk is the most decisions RecordDecisions copies in one COPY; each
// chunk has the store's query timeout to itself, so a mass recovery's audit
// is not lost to a bound sized for a page.
const AuditChunk = 5_000

// RecordDecisions writes a batch of decisions to the audit with COPY (the
// bulk path of the protocol, in order), AuditChunk at a time, all stamped at
// and term. It is not fenced: what a deposed leader decided is history too.
// The try and epoch are stored only for decisions about a task instance. On
// an error the chunks before the failing one are kept, and the error says
// how many decisions were written.
func (s *Store) RecordDecisions(ctx context.Context, term int64, at time.Time, ds []sdk.Decision) error {
	if len(ds) == 0 {
		return nil
	}
	// The evidence of every row goes into one buffer, one object after the
	// other; ends[i] is where row i's ends.
	var (
		buf  = make([]byte, 0, 768*len(ds)) // an agentlost decision's evidence is about 600 bytes
		ends = make([]int, len(ds))
	)
	for i, d := range ds {
		if d.Label == "" {
			return fmt.Errorf("board: record decisions: decision %d has no label", i)
		}
		var err error
		if buf, err = appendEvidence(buf, d.Evidence); err != nil {
			return fmt.Errorf("board: record decisions: encode evidence: %w", err)
		}
		ends[i] = len(buf)
	}
	src := &auditRows{at: at, term: term, ds: ds, buf: buf, ends: ends, row: make([]any, len(auditColumns))}
	for start := 0; start < len(ds); start += AuditChunk {
		src.i, src.end = start-1, min(start+AuditChunk, len(ds))
		if err := s.copyDecisions(ctx, src); err != nil {
			return &PartialAuditError{Written: start, Total: len(ds), Err: err}
		}
	}
	return nil
}

// auditRows is the COPY source of the decisions ds[i+1:end]: one row
// slice, filled again for every row (COPY encodes a row before it asks
// for the next).
type auditRows struct {
	at     any // the time and the term, the same in every row
	term   any
	ds     []sdk.Decision
	buf    []byte
	ends   []int
	row    []any
	i, end int
}

func (r *auditRows) Next() bool {
	r.i++
	return r.i < r.end
}

func (r *auditRows) Err() error { return nil }

func (r *auditRows) Values() ([]any, error) {
	d := &r.ds[r.i]
	var run, task, try, epoch any // NULL unless about a run or a task instance
	if d.Attempt.RunID != "" {
		run = d.Attempt.RunID
	}
	if d.Attempt.TaskID != "" {
		task, try, epoch = d.Attempt.TaskID, d.Attempt.Try, d.Attempt.Epoch
	}
	start := 0
	if r.i > 0 {
		start = r.ends[r.i-1]
	}
	end := r.ends[r.i]
	row := r.row
	row[0], row[1], row[2], row[3], row[4], row[5] = r.at, r.term, d.Reaper, d.Label, run, task
	row[6], row[7], row[8], row[9], row[10], row[11] = try, epoch, d.Applied, d.DryRun, d.Detail, r.buf[start:end:end]
	return row, nil
}

// PartialAuditError is RecordDecisions failing part way: the first Written
// decisions of the batch are in the audit, the rest are not.
type PartialAuditError struct {
	Written, Total int
	Err            error
}

func (e *PartialAuditError) Error() string {
	return fmt.Sprintf("board: record decisions (%d of %d written): %v", e.Written, e.Total, e.Err)
}

func (e *PartialAuditError) Unwrap() error { return e.Err }

// AuditWritten is how many decisions of the batch are in the audit.
func (e *PartialAuditError) AuditWritten() int { return e.Written }

func (s *Store) copyDecisions(ctx context.Context, rows pgx.CopyFromSource) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	_, err := s.pool.CopyFrom(ctx, pgx.Identifier{"reap_decisions"}, auditColumns, rows)
	return err
}

// appendEvidence appends ev as a JSON object, without reflection, its keys
// in the map's order: the column is jsonb, which keeps an object's keys in
// an order of its own, so sorting them first would be work thrown away. A
// string that is not valid UTF-8 is left to encoding/json, which replaces
// what is invalid.
func appendEvidence(buf []byte, ev map[string]string) ([]byte, error) {
	buf = append(buf, '{')
	first := true
	for k, v := range ev {
		if !first {
			buf = append(buf, ',')
		}
		first = false
		var err error
		if buf, err = appendJSONString(buf, k); err != nil {
			return buf, err
		}
		buf = append(buf, ':')
		if buf, err = appendJSONString(buf, v); err != nil {
			return buf, err
		}
	}
	return append(buf, '}'), nil
}

// appendJSONString appends s as a JSON string: the bytes that need no
// escape are copied a run at a time.
func appendJSONString(buf []byte, s string) ([]byte, error) {
	if !utf8.ValidString(s) {
		b, err := json.Marshal(s)
		return append(buf, b...), err
	}
	const hex = "0123456789abcdef"
	buf = append(buf, '"')
	from := 0 // s[from:i] needs no escape and is not appended yet
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '"' && c != '\\' && c >= 0x20 {
			continue
		}
		buf = append(buf, s[from:i]...)
		from = i + 1
		if c < 0x20 {
			buf = append(buf, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		} else {
			buf = append(buf, '\\', c)
		}
	}
	buf = append(buf, s[from:]...)
	return append(buf, '"'), nil
}

// DecisionsFor returns the audit of one task instance, oldest first: every
// decision about it, and the run-level decisions about its run (an orphan
// reap, say). With taskID empty it returns every decision about the run.
// limit <= 0 means all.
func (s *Store) DecisionsFor(ctx context.Context, runID, taskID string, limit int) ([]AuditRecord, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	sql := `SELECT id, at, term, reaper, label, run_id, task_id, try_number, attempt_epoch,
        applied, dry_run, detail, evidence, verdict, verdict_at, verdict_term, verdict_evidence
    FROM reap_decisions
    WHERE run_id = $1 AND ($2 = '' OR task_id = $2 OR task_id IS NULL)
    ORDER BY id`
	args := []any{runID, taskID}
	if limit > 0 {
		// The newest limit rows, still returned oldest first.
		sql = `SELECT * FROM (` + sql + ` DESC LIMIT $3) newest ORDER BY id`
		args = append(args, limit)
	}
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("board: read decisions of %s/%s: %w", runID, taskID, err)
	}
	recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (AuditRecord, error) {
		var (
			r          AuditRecord
			run, task  *string
			try, epoch *int32
			word       *string
			vat        *time.Time
			vterm      *int64
		)
		err := row.Scan(&r.ID, &r.At, &r.Term, &r.Reaper, &r.Label, &run, &task, &try, &epoch,
			&r.Applied, &r.DryRun, &r.Detail, &r.Evidence, &word, &vat, &vterm, &r.Verdict.Evidence)
		r.Attempt = attemptOf(run, task, try, epoch)
		r.Verdict.Word, r.Verdict.At = deref(word), timeOrZero(vat)
		if vterm != nil {
			r.Verdict.Term = *vterm
		}
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("board: read decisions of %s/%s: %w", runID, taskID, err)
	}
	return recs, nil
}

// PruneDecisions deletes audit rows older than before and says how many.
func (s *Store) PruneDecisions(ctx context.Context, before time.Time) (int64, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	tag, err := s.pool.Exec(ctx, "DELETE FROM reap_decisions WHERE at < $1", before)
	if err != nil {
		return 0, fmt.Errorf("board: prune decisions: %w", err)
	}
	return tag.RowsAffected(), nil
}
