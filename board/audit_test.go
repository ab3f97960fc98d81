package board_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
)

func TestAudit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("EveryColumnIsWrittenAsGiven", func(t *testing.T) {
		// RecordDecisions writes COPY's binary form itself (auditCopy):
		// every column of every shape of decision reads back as given, the
		// time to the microsecond (before 2000 too), NULLs where there is
		// no run or task instance.
		t.Parallel()
		b := setup(t)
		at := time.Date(1999, 12, 31, 23, 59, 59, 123456789, time.FixedZone("east", 3600))
		const term = int64(1) << 40
		ds := []sdk.Decision{
			{Reaper: "agentlost", Label: sdk.LabelAgentLost, Applied: true, Detail: "café ☕",
				Attempt:  sdk.Attempt{RunID: "run", TaskID: "task", Try: 300, Epoch: 70000},
				Evidence: map[string]string{"policy": "hold", "not_a_packed_key": "x"}},
			{Reaper: "dispatchlost", Label: sdk.LabelDispatchLost, DryRun: true, Attempt: sdk.Attempt{RunID: "run", TaskID: "dry", Try: 1}},
			{Reaper: "orphanrun", Label: sdk.LabelOrphanReapNoop, Attempt: sdk.Attempt{RunID: "run"}},
			{Reaper: "host", Label: sdk.LabelSettlingSkip},
		}
		if err := b.store.RecordDecisions(ctx, term, at, ds); err != nil {
			t.Fatal(err)
		}
		rows, err := b.store.Pool().Query(ctx, `SELECT at, term, reaper, label, run_id, task_id, try_number, attempt_epoch,
                applied, dry_run, detail, scored FROM reap_decisions ORDER BY id`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		i := 0
		for ; rows.Next(); i++ {
			var (
				gotAt                   time.Time
				gotTerm                 int64
				reaper, label, detail   string
				run, task               *string
				try, epoch              *int32
				applied, dryRun, scored bool
			)
			if err := rows.Scan(&gotAt, &gotTerm, &reaper, &label, &run, &task, &try, &epoch,
				&applied, &dryRun, &detail, &scored); err != nil {
				t.Fatal(err)
			}
			d := ds[i]
			if !gotAt.Equal(at.Truncate(time.Microsecond)) || gotTerm != term || reaper != d.Reaper || label != d.Label ||
				applied != d.Applied || dryRun != d.DryRun || detail != d.Detail || scored != board.Scored(d) {
				t.Fatalf("row %d: %v %d %q %q %v %v %q %v, want %+v", i, gotAt, gotTerm, reaper, label, applied, dryRun, detail, scored, d)
			}
			if (run == nil) != (d.Attempt.RunID == "") || run != nil && *run != d.Attempt.RunID {
				t.Fatalf("row %d: run %v, want %q", i, run, d.Attempt.RunID)
			}
			if d.Attempt.TaskID == "" {
				if task != nil || try != nil || epoch != nil {
					t.Fatalf("row %d: task %v try %v epoch %v, want NULL", i, task, try, epoch)
				}
			} else if task == nil || *task != d.Attempt.TaskID || try == nil || *try != d.Attempt.Try || epoch == nil || *epoch != d.Attempt.Epoch {
				t.Fatalf("row %d: task %v try %v epoch %v, want %+v", i, task, try, epoch, d.Attempt)
			}
		}
		if err := rows.Err(); err != nil || i != len(ds) {
			t.Fatalf("%d rows, want %d: %v", i, len(ds), err)
		}
		recs, err := b.store.DecisionsFor(ctx, "run", "task", 0)
		if err != nil || len(recs) != 2 || len(recs[0].Evidence) != 2 || recs[0].Evidence["not_a_packed_key"] != "x" {
			t.Fatalf("records %+v %v", recs, err)
		}
	})

	t.Run("AFailedChunkKeepsTheChunksBefore", func(t *testing.T) {
		// The server fails the second chunk's COPY for something else than
		// a row's data (a trigger raising, standing in for a failure part
		// way): the first chunk stays, and the error says so.
		t.Parallel()
		b := setup(t)
		b.exec(t, `CREATE FUNCTION fail_boom() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN IF NEW.detail = 'boom' THEN RAISE EXCEPTION 'boom'; END IF; RETURN NEW; END $$`)
		b.exec(t, `CREATE TRIGGER fail_boom BEFORE INSERT ON reap_decisions FOR EACH ROW EXECUTE FUNCTION fail_boom()`)
		ds := make([]sdk.Decision, board.AuditChunk+1)
		for i := range ds {
			ds[i] = sdk.Decision{Reaper: "agentlost", Label: sdk.LabelAgentLost, Attempt: sdk.Attempt{RunID: "run", TaskID: id("t", i)}}
		}
		ds[board.AuditChunk].Detail = "boom"
		err := b.store.RecordDecisions(ctx, b.term, base, ds)
		var partial *board.PartialAuditError
		if !errors.As(err, &partial) || partial.Written != board.AuditChunk || partial.Total != len(ds) {
			t.Fatalf("error %v, want a partial write of %d", err, board.AuditChunk)
		}
		var n int
		if err := b.store.Pool().QueryRow(ctx, "SELECT count(*) FROM reap_decisions").Scan(&n); err != nil || n != board.AuditChunk {
			t.Fatalf("%d rows %v, want %d", n, err, board.AuditChunk)
		}
	})

	t.Run("RecordsABatchAndExplainsATaskInstance", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := sdk.Attempt{RunID: "run", TaskID: "task", Try: 2, Epoch: 3}
		ds := []sdk.Decision{
			{Reaper: "agentlost", Label: sdk.LabelAgentLostProcessAlive, Attempt: a, Detail: "agent alive",
				Evidence: map[string]string{"heartbeat_age": "2m", "liveness": "alive"}},
			{Reaper: "agentlost", Label: sdk.LabelAgentLost, Attempt: a, Applied: true},
			{Reaper: "dispatchlost", Label: sdk.LabelDispatchLost, Attempt: sdk.Attempt{RunID: "run", TaskID: "other", Try: 1}, DryRun: true},
			{Reaper: "orphanrun", Label: sdk.LabelOrphanReapNoop, Attempt: sdk.Attempt{RunID: "run"}},
			{Reaper: "host", Label: sdk.LabelSettlingSkip},
		}
		if err := b.store.RecordDecisions(ctx, b.term, base, ds); err != nil {
			t.Fatal(err)
		}
		recs, err := b.store.DecisionsFor(ctx, "run", "task", 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) != 3 {
			t.Fatalf("%d records for run/task, want its two and the run-level one: %+v", len(recs), recs)
		}
		r0 := recs[0]
		if r0.Label != sdk.LabelAgentLostProcessAlive || r0.Attempt != a || r0.Term != b.term || !r0.At.Equal(base) ||
			r0.Evidence["heartbeat_age"] != "2m" || r0.Detail != "agent alive" || r0.Applied {
			t.Fatalf("first record %+v", r0)
		}
		if !recs[1].Applied || recs[2].Label != sdk.LabelOrphanReapNoop || recs[2].Attempt.TaskID != "" {
			t.Fatalf("records %+v", recs)
		}
		newest, err := b.store.DecisionsFor(ctx, "run", "task", 1)
		if err != nil || len(newest) != 1 || newest[0].Label != sdk.LabelOrphanReapNoop {
			t.Fatalf("newest record: %+v %v", newest, err)
		}
		all, err := b.store.DecisionsFor(ctx, "run", "", 0)
		if err != nil || len(all) != 4 {
			t.Fatalf("run records: %d %v", len(all), err)
		}
		if n, err := b.store.PruneDecisions(ctx, b.term, base, base.Add(time.Second), 0); err != nil || n != 5 {
			t.Fatalf("pruned %d %v, want 5", n, err)
		}
	})

	t.Run("EvidenceOfAnyTextIsKeptAsWrittenInvalidUTF8MadeSafe", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := sdk.Attempt{RunID: "run", TaskID: "task", Try: 1}
		ev := map[string]string{
			"quote": `say "dead"`, "backslash": `C:\tmp\x`, "control": "tab\there\nnewline\x01",
			"html": "<a> & </a>", "unicode": "héllo ✓", "invalid": "bad\xffbyte", "": "empty key",
		}
		ds := []sdk.Decision{
			{Reaper: "agentlost", Label: sdk.LabelAgentLost, Attempt: a, Evidence: ev},
			{Reaper: "agentlost", Label: sdk.LabelAgentLostProcessAlive, Attempt: a}, // no evidence: {}
		}
		if err := b.store.RecordDecisions(ctx, b.term, base, ds); err != nil {
			t.Fatal(err)
		}
		recs, err := b.store.DecisionsFor(ctx, "run", "task", 0)
		if err != nil || len(recs) != 2 {
			t.Fatalf("records %+v %v", recs, err)
		}
		for k, want := range ev { // byte for byte, invalid UTF-8 made safe (sdk.SafeText)
			if k == "invalid" {
				want = "bad\uFFFDbyte"
			}
			if got := recs[0].Evidence[k]; got != want {
				t.Errorf("evidence %q read back %q, want %q", k, got, want)
			}
		}
		if len(recs[0].Evidence) != len(ev) || len(recs[1].Evidence) != 0 {
			t.Fatalf("evidence read back %v and %v", recs[0].Evidence, recs[1].Evidence)
		}
	})

	t.Run("AnAuditLargerThanAChunkIsWrittenWholeInOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ds := make([]sdk.Decision, 2*board.AuditChunk+1)
		for i := range ds {
			ds[i] = sdk.Decision{Reaper: "agentlost", Label: sdk.LabelAgentLost, Applied: true,
				Attempt:  sdk.Attempt{RunID: "run", TaskID: fmt.Sprintf("task%05d", i), Try: 1},
				Evidence: map[string]string{"n": strconv.Itoa(i)}}
		}
		if err := b.store.RecordDecisions(ctx, b.term, base, ds); err != nil {
			t.Fatal(err)
		}
		recs, err := b.store.DecisionsFor(ctx, "run", "", 0)
		if err != nil || len(recs) != len(ds) {
			t.Fatalf("%d records (%v), want %d", len(recs), err, len(ds))
		}
		for i, r := range recs {
			if r.Attempt != ds[i].Attempt || r.Evidence["n"] != strconv.Itoa(i) {
				t.Fatalf("record %d is %+v, want the decision about %s", i, r, ds[i].Attempt)
			}
		}
	})

	t.Run("DecisionWithoutLabelIsRejected", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if err := b.store.RecordDecisions(ctx, b.term, base, []sdk.Decision{{Reaper: "x"}}); err == nil {
			t.Fatal("no error")
		}
	})
}

func TestAttemptLog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("AppendsInOrderUnderTheCurrentTerm", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.run(t, "run", "task")
		a := first("run", "task")
		if err := b.w.AppendLog(ctx, []sdk.LogLine{{Attempt: a, At: base, Line: "task started"}}); err != nil {
			t.Fatal(err)
		}
		if err := b.store.AppendLog(ctx, b.term, []sdk.LogLine{
			{Attempt: a, At: base.Add(time.Second), Line: "killed: credential_ceiling"},
			{Attempt: a, At: base.Add(time.Second), Line: "second"},
		}); err != nil {
			t.Fatal(err)
		}
		lines, err := b.store.AttemptLog(ctx, "run", "task")
		if err != nil {
			t.Fatal(err)
		}
		if len(lines) != 3 || lines[0].Line != "task started" || lines[1].Line != "killed: credential_ceiling" ||
			lines[2].Line != "second" || lines[1].Attempt != a {
			t.Fatalf("log %+v", lines)
		}
	})

	t.Run("DeposedTermWritesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.run(t, "run", "task")
		err := b.store.AppendLog(ctx, b.term+1, []sdk.LogLine{{Attempt: first("run", "task"), At: base, Line: "x"}})
		if !errors.Is(err, board.ErrDeposed) {
			t.Fatalf("err = %v, want ErrDeposed", err)
		}
		// A lease that expired before the line's time is not current either.
		err = b.store.AppendLog(ctx, b.term, []sdk.LogLine{{Attempt: first("run", "task"), At: base.Add(2 * leaseTTL), Line: "x"}})
		if !errors.Is(err, board.ErrDeposed) {
			t.Fatalf("err = %v, want ErrDeposed", err)
		}
		if lines, err := b.store.AttemptLog(ctx, "run", "task"); err != nil || len(lines) != 0 {
			t.Fatalf("log %+v %v", lines, err)
		}
	})
}
