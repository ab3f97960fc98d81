package board

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dexaflow/reaper/sdk"
)

// AuditRecord is one row of reap_decisions.
type AuditRecord struct {
	ID   int64
	At   time.Time
	Term int64
	// Holder is the replica that wrote the decision (its
	// board.Options.Holder, reaperd's leader identity); "" for a writer
	// without one and for the rows before migration 20.
	Holder string
	sdk.Decision
	// Scored: the audit wrote the decision as one the shadow scorer judges
	// (reap_decisions.scored, by the Scoring of the store that wrote it:
	// the kill and provisional labels its reaper declared).
	Scored bool
	// Verdict is the shadow verdict on the decision (migration 012); its
	// Word is "" while unscored, and for a decision never scored.
	Verdict Verdict
}

// auditColumns are the columns RecordDecisions copies into reap_decisions
// (id is generated), in the order auditCopy.appendRow writes them.
var auditColumns = []string{"at", "term", "reaper", "label", "run_id", "task_id", "try_number", "attempt_epoch",
	"applied", "dry_run", "detail", "evidence_packed", "scored", "holder", "kill"}

// AuditChunk is the most decisions RecordDecisions copies in one COPY; each
// chunk has the store's query timeout to itself, so a mass recovery's audit
// is not lost to a bound sized for a page.
const AuditChunk = 5_000

// RecordDecisions writes a batch of decisions to the audit with COPY (the
// bulk path of the protocol, in order), AuditChunk at a time, all stamped at
// and term, and with the store's holder (NULL without one). It is not
// fenced: what a deposed leader decided is history too.
// The try and epoch are stored only for decisions about a task instance.
// The text of each decision (names, detail, evidence) is made safe as it is
// encoded (Safe); a chunk PostgreSQL refuses for one row's data is copied
// again one decision at a time, and only that one is left out (told to the
// observer). On another error the chunks before the failing one are kept,
// and the error says how many decisions were written.
func (s *Store) RecordDecisions(ctx context.Context, term int64, at time.Time, ds []sdk.Decision) error {
	if len(ds) == 0 {
		return nil
	}
	for i, d := range ds {
		if d.Label == "" {
			return fmt.Errorf("board: record decisions: decision %d has no label", i)
		}
	}
	src := &auditCopy{at: pgTime(at), term: term, holder: safeText(s.observer, FieldName, s.holder), ds: ds, packer: s.packer, obs: s.observer, scoring: s.scoring,
		// auditCopyBuffer, and room for the row that crosses it; an
		// agentlost decision's evidence packs into about 300 bytes.
		buf: make([]byte, 0, auditCopyBuffer+4<<10), ev: make([]byte, 0, 512)}
	for start := 0; start < len(ds); start += AuditChunk {
		end := min(start+AuditChunk, len(ds))
		src.reset(start, end)
		err := s.copyDecisions(ctx, src)
		switch {
		case err == nil:
		case IsRowError(err):
			if err := s.copyOneByOne(ctx, src, start, end); err != nil {
				return err
			}
		default:
			return &PartialAuditError{Written: start, Total: len(ds), Err: err}
		}
	}
	return nil
}

// copyOneByOne copies ds[start:end] one decision at a time, after their
// chunk was refused for a row's data: a decision refused alone too is
// left out (told to the observer), the others are written. The text of
// every row is made safe as it is encoded, so what is left for a row to
// fail on is the schema's own checks.
func (s *Store) copyOneByOne(ctx context.Context, src *auditCopy, start, end int) error {
	for i := start; i < end; i++ {
		src.reset(i, i+1)
		err := s.copyDecisions(ctx, src)
		switch {
		case err == nil:
		case IsRowError(err):
			if s.observer != nil {
				s.observer.RowRefused("record decisions", src.ds[i].Attempt, err)
			}
		default:
			return &PartialAuditError{Written: i, Total: len(src.ds), Err: err}
		}
	}
	return nil
}

// auditCopy is the COPY of the decisions ds[next:end] into
// reap_decisions, in PostgreSQL's binary COPY format ("COPY" in the
// server's documentation: a header, then for each row its number of
// columns and each column as its length and its bytes, -1 for NULL, then
// -1), written here rather than by pgx's CopyFrom. pgx looks up an
// encoding plan for every value of every row (fourteen a row) and needs
// each value boxed in an any; the audit's columns are few and fixed
// (auditColumns), so each is written directly, in the same binary form
// pgx sends for it. It is read as the COPY's data: the rows are encoded
// as they are read, into one buffer used again and again.
//
// pgconn reads it on a goroutine of its own, which a failed COPY may
// leave running for a moment after CopyFrom returns; close (under mu,
// which Read holds) makes sure that nothing reads the decisions once
// RecordDecisions has returned.
type auditCopy struct {
	mu      sync.Mutex
	closed  bool
	at      int64 // the time (pgTime), the term and the holder, the same in every row
	term    int64
	holder  string // "": NULL
	ds      []sdk.Decision
	packer  evidencePacker
	obs     Observer // told of text made safe
	scoring Scoring  // which rows are scored, and which kills
	ev      []byte   // the evidence of the row being encoded
	buf     []byte   // encoded and not read yet: buf[off:]
	off     int
	next    int // the next row to encode
	end     int
	header  bool // the header is written
}

// reset makes the copy that of ds[start:end].
func (c *auditCopy) reset(start, end int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.next, c.end, c.buf, c.off, c.header, c.closed = start, end, c.buf[:0], 0, false, false
}

// close ends the copy: Read, once any read under way is over, reads
// nothing more.
func (c *auditCopy) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
}

// auditCopyBuffer is how much of the COPY is encoded ahead of its reads.
const auditCopyBuffer = 64 << 10

// pgCopyHeader and pgCopyTrailer open and close a binary COPY (no flags,
// no header extension).
var (
	pgCopyHeader  = []byte("PGCOPY\n\377\r\n\000\000\000\000\000\000\000\000\000")
	pgCopyTrailer = []byte{0xff, 0xff}
)

func (c *auditCopy) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, errAuditCopyClosed
	}
	if c.off == len(c.buf) {
		c.buf, c.off = c.buf[:0], 0
		if !c.header {
			c.buf, c.header = append(c.buf, pgCopyHeader...), true
		}
		for c.next < c.end && len(c.buf) < auditCopyBuffer {
			c.buf = c.appendRow(c.buf, &c.ds[c.next])
			c.next++
		}
		if c.next == c.end {
			c.buf, c.next = append(c.buf, pgCopyTrailer...), c.end+1
		}
		if len(c.buf) == 0 {
			return 0, io.EOF
		}
	}
	n := copy(p, c.buf[c.off:])
	c.off += n
	return n, nil
}

var errAuditCopyClosed = errors.New("audit copy closed")

// appendRow appends one decision's row: the columns of auditColumns, in
// their order.
func (c *auditCopy) appendRow(buf []byte, d *sdk.Decision) []byte {
	// Every text column is made safe as it is encoded (safeText: nothing
	// allocated for clean text), so no row's text can fail the COPY.
	c.ev = c.packer.appendPacked(c.ev[:0], d.Evidence, c.obs)
	buf = binary.BigEndian.AppendUint16(buf, uint16(len(auditColumns)))
	buf = appendInt8(buf, c.at)   // at (timestamptz)
	buf = appendInt8(buf, c.term) // term
	buf = appendBytes(buf, safeText(c.obs, FieldName, d.Reaper))
	buf = appendBytes(buf, safeText(c.obs, FieldName, d.Label))
	// run_id, then task_id, try_number and attempt_epoch: NULL unless
	// about a run or a task instance.
	if d.Attempt.RunID != "" {
		buf = appendBytes(buf, safeText(c.obs, FieldName, d.Attempt.RunID))
	} else {
		buf = appendNull(buf)
	}
	if d.Attempt.TaskID != "" {
		buf = appendBytes(buf, safeText(c.obs, FieldName, d.Attempt.TaskID))
		buf = appendInt4(buf, d.Attempt.Try)
		buf = appendInt4(buf, d.Attempt.Epoch)
	} else {
		buf = appendNull(appendNull(appendNull(buf)))
	}
	buf = appendBool(buf, d.Applied)
	buf = appendBool(buf, d.DryRun)
	buf = appendBytes(buf, safeText(c.obs, FieldDetail, d.Detail))
	buf = appendBytes(buf, c.ev) // evidence_packed (bytea)
	buf = appendBool(buf, c.scoring.Scored(*d))
	if c.holder == "" {
		buf = appendNull(buf)
	} else {
		buf = appendBytes(buf, c.holder)
	}
	return appendBool(buf, c.scoring.Kill(*d)) // kill
}

// The binary forms of the columns' types, each after its length: text
// and bytea as their bytes, integers big-endian, a boolean as one byte,
// a timestamptz as the microseconds since 2000-01-01 UTC (an int8).
func appendNull(buf []byte) []byte { return binary.BigEndian.AppendUint32(buf, math.MaxUint32) } // -1

func appendBytes[T string | []byte](buf []byte, v T) []byte {
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(v)))
	return append(buf, v...)
}

func appendInt4(buf []byte, v int32) []byte {
	return binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(buf, 4), uint32(v))
}

func appendInt8(buf []byte, v int64) []byte {
	return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint32(buf, 8), uint64(v))
}

func appendBool(buf []byte, v bool) []byte {
	b := byte(0)
	if v {
		b = 1
	}
	return append(binary.BigEndian.AppendUint32(buf, 1), b)
}

// pgTime is t as a timestamptz's binary form: microseconds since
// 2000-01-01 UTC (as pgx encodes a time.Time).
func pgTime(t time.Time) int64 {
	const y2k = 946_684_800 * 1_000_000 // 2000-01-01 in microseconds since 1970
	return t.Unix()*1_000_000 + int64(t.Nanosecond())/1000 - y2k
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

// copyAuditSQL is the COPY statement of auditCopy.
var copyAuditSQL = "COPY reap_decisions (" + strings.Join(auditColumns, ", ") + ") FROM STDIN (FORMAT binary)"

func (s *Store) copyDecisions(ctx context.Context, rows *auditCopy) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	_, err = conn.Conn().PgConn().CopyFrom(ctx, rows, copyAuditSQL)
	rows.close()
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
        applied, dry_run, detail, evidence_packed, evidence, verdict, verdict_at, verdict_term, verdict_evidence,
        coalesce(holder, ''), scored
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
			&r.Applied, &r.DryRun, &r.Detail, &packed, &ev, &word, &vat, &vterm, &r.Verdict.Evidence, &r.Holder, &r.Scored)
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
func (s *Store) PruneDecisions(ctx context.Context, term int64, now, before time.Time, limit int) (int64, error) {
	return s.pruneBatch(ctx, "decisions", `DELETE FROM reap_decisions WHERE id IN (
        SELECT id FROM reap_decisions WHERE at < $2 ORDER BY at LIMIT $3)`, term, now, before, limit, AuditPruneBatchDefault)
}

// PruneWarmClaims deletes at most limit warm_worker_claims rows claimed
// before before (limit <= 0: AuditPruneBatchDefault): the last claims of
// workers that have not claimed since, gone for that long. The kube
// sweep reads a claim only to confirm a mark made before it; a worker
// with no claim row is one whose claim is unknown, and a mark on it stays
// provisional, so a pruned claim never confirms nor fails anything.
func (s *Store) PruneWarmClaims(ctx context.Context, term int64, now, before time.Time, limit int) (int64, error) {
	return s.pruneBatch(ctx, "warm worker claims", `DELETE FROM warm_worker_claims WHERE worker IN (
        SELECT worker FROM warm_worker_claims WHERE claimed_at < $2 LIMIT $3)`, term, now, before, limit, AuditPruneBatchDefault)
}

// pruneBatch runs a retention's DELETE of at most limit rows from before
// ($2 in sql; limit <= 0: batch; $3 in sql), fenced like every leader
// write: it deletes only while term, held by this store's holder, leads
// the board at now ($4, $5), and otherwise deletes nothing and returns
// ErrDeposed. It says how many rows it deleted.
func (s *Store) pruneBatch(ctx context.Context, what, sql string, term int64, now, before time.Time, limit, batch int) (int64, error) {
	if limit <= 0 {
		limit = batch
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	var (
		n       int64
		lead    bool
		seen    *int64
		expires *time.Time
	)
	err := s.pool.QueryRow(ctx, `WITH lead AS (
    SELECT term, expires_at FROM leader WHERE `+leaderRow+` FOR SHARE
), fenced AS (
    SELECT 1 FROM lead WHERE term = $4 AND expires_at > $5::timestamptz
), gone AS (
    `+sql+` AND EXISTS (SELECT 1 FROM fenced)
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone), EXISTS (SELECT 1 FROM fenced), (SELECT term FROM lead), (SELECT expires_at FROM lead)`,
		s.fenceKey(), before, limit, term, now).Scan(&n, &lead, &seen, &expires)
	if err != nil {
		return 0, fmt.Errorf("board: prune %s: %w", what, err)
	}
	if !lead {
		s.refused(ctx, "prune "+what, term, now, s.seenHolding(seen, expires))
		return 0, fmt.Errorf("board: prune %s: term %d: %w", what, term, ErrDeposed)
	}
	return n, nil
}
