package board

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/dexaflow/reaper/sdk"
)

// AuditRecord is one row of reap_decisions.
type AuditRecord struct {
	ID   int64
	At   time.Time
	Term int64
	sdk.Decision
}

const recordDecisionsSQL = `
INSERT INTO reap_decisions (at, term, reaper, label, run_id, task_id, try_number, attempt_epoch,
    applied, dry_run, detail, evidence)
SELECT $1, $2, d.reaper, d.label, NULLIF(d.run_id, ''), NULLIF(d.task_id, ''), d.try_number, d.attempt_epoch,
    d.applied, d.dry_run, d.detail, d.evidence::jsonb
FROM unnest($3::text[], $4::text[], $5::text[], $6::text[], $7::int4[], $8::int4[],
    $9::bool[], $10::bool[], $11::text[], $12::text[])
    WITH ORDINALITY AS d(reaper, label, run_id, task_id, try_number, attempt_epoch,
        applied, dry_run, detail, evidence, ord)
ORDER BY d.ord`

// RecordDecisions writes a batch of decisions to the audit in one statement,
// all stamped at and term. It is not fenced: what a deposed leader decided is
// history too. The try and epoch are stored only for decisions about a task
// instance.
func (s *Store) RecordDecisions(ctx context.Context, term int64, at time.Time, ds []sdk.Decision) error {
	if len(ds) == 0 {
		return nil
	}
	n := len(ds)
	reapers, labels, runIDs, taskIDs := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	details, evidence := make([]string, n), make([]string, n)
	tries, epochs := make([]pgtype.Int4, n), make([]pgtype.Int4, n)
	applied, dry := make([]bool, n), make([]bool, n)
	for i, d := range ds {
		if d.Label == "" {
			return fmt.Errorf("board: record decisions: decision %d has no label", i)
		}
		ev := d.Evidence
		if ev == nil {
			ev = map[string]string{}
		}
		b, err := json.Marshal(ev)
		if err != nil {
			return fmt.Errorf("board: record decisions: encode evidence: %w", err)
		}
		reapers[i], labels[i], runIDs[i], taskIDs[i] = d.Reaper, d.Label, d.Attempt.RunID, d.Attempt.TaskID
		if d.Attempt.TaskID != "" {
			tries[i] = pgtype.Int4{Int32: d.Attempt.Try, Valid: true}
			epochs[i] = pgtype.Int4{Int32: d.Attempt.Epoch, Valid: true}
		}
		applied[i], dry[i], details[i], evidence[i] = d.Applied, d.DryRun, d.Detail, string(b)
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	if _, err := s.pool.Exec(ctx, recordDecisionsSQL, at, term, reapers, labels, runIDs, taskIDs,
		tries, epochs, applied, dry, details, evidence); err != nil {
		return fmt.Errorf("board: record decisions: %w", err)
	}
	return nil
}

// DecisionsFor returns the audit of one task instance, oldest first: every
// decision about it, and the run-level decisions about its run (an orphan
// reap, say). With taskID empty it returns every decision about the run.
// limit <= 0 means all.
func (s *Store) DecisionsFor(ctx context.Context, runID, taskID string, limit int) ([]AuditRecord, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	sql := `SELECT id, at, term, reaper, label, run_id, task_id, try_number, attempt_epoch,
        applied, dry_run, detail, evidence
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
		)
		err := row.Scan(&r.ID, &r.At, &r.Term, &r.Reaper, &r.Label, &run, &task, &try, &epoch,
			&r.Applied, &r.DryRun, &r.Detail, &r.Evidence)
		r.Attempt.RunID, r.Attempt.TaskID = deref(run), deref(task)
		if try != nil {
			r.Attempt.Try = *try
		}
		if epoch != nil {
			r.Attempt.Epoch = *epoch
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
