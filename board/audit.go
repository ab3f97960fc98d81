package board

import (
	"context"
	"fmt"
	"time"

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
	"applied", "dry_run", "detail", "evidence_packed", "scored"}

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
	for i, d := range ds {
		if d.Label == "" {
			return fmt.Errorf("board: record decisions: decision %d has no label", i)
		}
	}
	// An agentlost decision's evidence packs into about 300 bytes.
	src := &auditRows{at: (*timeElem)(&at), term: term, ds: ds, packer: s.packer, ev: make(byteaElem, 0, 512),
		row: make([]any, len(auditColumns))}
	for start := 0; start < len(ds); start += AuditChunk {
		src.i, src.end = start-1, min(start+AuditChunk, len(ds))
		if err := s.copyDecisions(ctx, src); err != nil {
			return &PartialAuditError{Written: start, Total: len(ds), Err: err}
		}
	}
	return nil
}

// auditRows is the COPY source of the decisions ds[i+1:end]: one row
// slice, filled again for every row, and one buffer its evidence is
// packed into again for every row (COPY encodes a row before it asks for
// the next, and asks for each row once).
//
// A row's time, strings and evidence go in as pointers (timeElem and
// textElem from params.go, byteaElem), not as the values themselves: an
// any holding a time, a string or a slice is an allocation, seven a row,
// where one holding a pointer is none. pgx encodes the same timestamptz,
// text and bytea.
type auditRows struct {
	at     any // the time and the term, the same in every row
	term   any
	ds     []sdk.Decision
	packer evidencePacker
	ev     byteaElem // the packed evidence of the row being encoded
	row    []any
	i, end int
}

// byteaElem is a bytea value handed to pgx through a pointer.
type byteaElem []byte

func (b *byteaElem) BytesValue() ([]byte, error) { return *b, nil }

func (r *auditRows) Next() bool {
	r.i++
	return r.i < r.end
}

func (r *auditRows) Err() error { return nil }

func (r *auditRows) Values() ([]any, error) {
	d := &r.ds[r.i]
	var run, task, try, epoch any // NULL unless about a run or a task instance
	if d.Attempt.RunID != "" {
		run = (*textElem)(&d.Attempt.RunID)
	}
	if d.Attempt.TaskID != "" {
		task, try, epoch = (*textElem)(&d.Attempt.TaskID), d.Attempt.Try, d.Attempt.Epoch
	}
	r.ev = r.packer.appendPacked(r.ev[:0], d.Evidence)
	row := r.row
	row[0], row[1], row[2], row[3], row[4], row[5] = r.at, r.term, (*textElem)(&d.Reaper), (*textElem)(&d.Label), run, task
	row[6], row[7], row[8], row[9], row[10], row[11] = try, epoch, d.Applied, d.DryRun, (*textElem)(&d.Detail), &r.ev
	row[12] = Scored(*d)
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

// DecisionsFor returns the audit of one task instance, oldest first: every
// decision about it, and the run-level decisions about its run (an orphan
// reap, say). With taskID empty it returns every decision about the run.
// limit <= 0 means all.
func (s *Store) DecisionsFor(ctx context.Context, runID, taskID string, limit int) ([]AuditRecord, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	sql := `SELECT id, at, term, reaper, label, run_id, task_id, try_number, attempt_epoch,
        applied, dry_run, detail, evidence_packed, evidence, verdict, verdict_at, verdict_term, verdict_evidence
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
			packed, ev []byte
		)
		err := row.Scan(&r.ID, &r.At, &r.Term, &r.Reaper, &r.Label, &run, &task, &try, &epoch,
			&r.Applied, &r.DryRun, &r.Detail, &packed, &ev, &word, &vat, &vterm, &r.Verdict.Evidence)
		if err != nil {
			return r, err
		}
		if r.Evidence, err = readEvidence(packed, ev); err != nil {
			return r, fmt.Errorf("decision %d: %w", r.ID, err)
		}
		r.Attempt = attemptOf(run, task, try, epoch)
		r.Verdict.Word, r.Verdict.At = deref(word), timeOrZero(vat)
		if vterm != nil {
			r.Verdict.Term = *vterm
		}
		return r, nil
	})
	if err != nil {
		return nil, fmt.Errorf("board: read decisions of %s/%s: %w", runID, taskID, err)
	}
	return recs, nil
}

// AuditRetentionDefault is how long the audit of decisions is kept (the
// host's maintenance.audit_retention): three times the attempt history's,
// far past the shadow scorer's horizon, so that explain tells an attempt's
// decisions for as long as its history is kept and longer.
const AuditRetentionDefault = 90 * 24 * time.Hour

// AuditPruneBatchDefault is the most rows one PruneDecisions call deletes:
// a statement of some tens of milliseconds at 10,000,000 decisions
// (test/scale's BenchmarkScaleAudit), so that a backlog is worked through
// over many short statements, none holding the vacuum or the writers back.
const AuditPruneBatchDefault = 10000

// PruneDecisions deletes at most limit audit rows made before before
// (limit <= 0: AuditPruneBatchDefault), oldest first by reap_decisions_at_idx,
// and says how many it deleted. What is younger stays whole: every
// decision explain tells, and every one the shadow scorer may still judge
// while the retention is longer than its horizon.
func (s *Store) PruneDecisions(ctx context.Context, before time.Time, limit int) (int64, error) {
	return s.pruneBatch(ctx, "decisions", `DELETE FROM reap_decisions WHERE id IN (
        SELECT id FROM reap_decisions WHERE at < $1 ORDER BY at LIMIT $2)`, before, limit, AuditPruneBatchDefault)
}

// PruneWarmClaims deletes at most limit warm_worker_claims rows claimed
// before before (limit <= 0: AuditPruneBatchDefault): the last claims of
// workers that have not claimed since, gone for that long. The kube
// sweep reads a claim only to confirm a mark made before it; a worker
// with no claim row is one whose claim is unknown, and a mark on it stays
// provisional, so a pruned claim never confirms nor fails anything.
func (s *Store) PruneWarmClaims(ctx context.Context, before time.Time, limit int) (int64, error) {
	return s.pruneBatch(ctx, "warm worker claims", `DELETE FROM warm_worker_claims WHERE worker IN (
        SELECT worker FROM warm_worker_claims WHERE claimed_at < $1 LIMIT $2)`, before, limit, AuditPruneBatchDefault)
}

// pruneBatch runs a retention's DELETE of at most limit rows from before
// $1 (limit <= 0: batch), $2 its limit, and says how many it deleted.
func (s *Store) pruneBatch(ctx context.Context, what, sql string, before time.Time, limit, batch int) (int64, error) {
	if limit <= 0 {
		limit = batch
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	tag, err := s.pool.Exec(ctx, sql, before, limit)
	if err != nil {
		return 0, fmt.Errorf("board: prune %s: %w", what, err)
	}
	return tag.RowsAffected(), nil
}
